"""A train reply decoded once, and the sample-weighted mean over such replies.

Flower's `Array.numpy()` copies a reply's bytes into a new array on every call, and FedAvg,
the reply screen and SCAFFOLD each called it: three decodes of every reply per round, more time
than the average itself. Here a reply's arrays are read-only views of its message's bytes,
made once and read by all three. The mean does Flower's FedAvg arithmetic
(`aggregate_arrayrecords`: each array times w_i / sum(w), added up in the replies' order), in
place, so the global model is bit-identical to Flower's.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from io import BytesIO

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord

from ovalp_flwr.federation.protocol import ARRAYS, METRICS, NUM_EXAMPLES, NUMPY, record_of

HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0,
                  (2, 0): np.lib.format.read_array_header_2_0}


@dataclass(frozen=True)
class TrainReply:
    """One train reply: its node, its arrays (read-only views of the message's bytes), its
    metrics, and the weight the average gives it."""

    node: int
    arrays: dict[str, np.ndarray]
    metrics: dict
    weight: float
    message: Message  # the reply itself (FLoRA and the costs read it)


class UndecodableReply(ValueError):
    """A reply whose records are missing or whose arrays are not np.save bytes."""


def decode_reply(message: Message, uniform: bool = False) -> TrainReply:
    """The reply's arrays and metrics, each array decoded once; weight: its sample count, or 1
    (uniform). Raises UndecodableReply with the reason."""
    content = message.content
    record, metric_record = record_of(content, ARRAYS, ArrayRecord), record_of(content, METRICS,
                                                                                MetricRecord)
    if record is None or metric_record is None:
        raise UndecodableReply(f"the reply lacks its {ARRAYS!r} or {METRICS!r} record")
    try:
        arrays = view_record(record)
    except (ValueError, TypeError) as err:
        raise UndecodableReply(f"its arrays do not deserialize ({err})") from err
    metrics = dict(metric_record)
    weight = 1 if uniform else metrics.get(NUM_EXAMPLES, 0)
    return TrainReply(message.metadata.src_node_id, arrays, metrics, weight, message)


def view_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    """Every array of the record as a read-only view of its bytes (no copy)."""
    return {key: view_array(array) for key, array in record.items()}


def view_array(array: Array) -> np.ndarray:
    """What `Array.numpy()` returns, without copying: the np.save header read (once per distinct
    header: every reply of a round has the same), the rest viewed. Object arrays are refused,
    as np.load(allow_pickle=False) refuses them."""
    if array.stype != NUMPY:
        raise TypeError(f"unsupported serialization type {array.stype!r}")
    shape, fortran_order, dtype, offset = _header(bytes(array.data[:_header_end(array.data)]))
    count = math.prod(shape)
    values = np.frombuffer(array.data, dtype=dtype, count=count, offset=offset)
    return values.reshape(shape, order="F" if fortran_order else "C")


def _header_end(data: bytes) -> int:
    """Where np.save's header ends: magic (8 bytes), its length (2 or 4 bytes), the header."""
    if len(data) < 10 or data[:6] != b"\x93NUMPY":
        raise ValueError("the data are not np.save bytes")
    if data[6] == 1:
        return 10 + int.from_bytes(data[8:10], "little")
    return 12 + int.from_bytes(data[8:12], "little")


@functools.lru_cache(maxsize=256)
def _header(header: bytes) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran order, dtype, data offset) of one np.save header."""
    stream = BytesIO(header)
    version = np.lib.format.read_magic(stream)
    if version not in HEADER_READERS:
        raise ValueError(f"np.save format {version} is not read here")
    shape, fortran_order, dtype = HEADER_READERS[version](stream)
    if dtype.hasobject:
        raise ValueError("object arrays cannot be loaded without pickle")
    return shape, fortran_order, dtype, stream.tell()


def weighted_mean(replies: Sequence[TrainReply]) -> dict[str, np.ndarray]:
    """sum_i x_i * (w_i / sum w), accumulated in the replies' order: Flower's FedAvg, in place."""
    total = sum(reply.weight for reply in replies)
    factors = [reply.weight / total for reply in replies]
    first = replies[0].arrays
    mean = {key: value * factors[0] for key, value in first.items()}
    scratch = {key: np.empty_like(value) for key, value in mean.items()}
    for reply, factor in zip(replies[1:], factors[1:]):
        for key, value in reply.arrays.items():
            np.multiply(value, factor, out=scratch[key])
            mean[key] += scratch[key]
    return mean


def weighted_metrics(replies: Sequence[TrainReply]) -> MetricRecord:
    """The replies' metrics (all but num-examples) averaged under the arrays' weights: Flower's
    `aggregate_metricrecords` (FedAvg's default), without building a record per reply."""
    total = sum(reply.weight for reply in replies)
    mean: dict = {}
    for reply in replies:
        factor = reply.weight / total
        for key, value in reply.metrics.items():
            if key == NUM_EXAMPLES:
                continue
            scaled = [v * factor for v in value] if isinstance(value, list) else value * factor
            if key not in mean:
                mean[key] = scaled
            elif isinstance(value, list):
                mean[key] = [current + v for current, v in zip(mean[key], scaled, strict=True)]
            else:
                mean[key] = mean[key] + scaled
    return MetricRecord(mean)
