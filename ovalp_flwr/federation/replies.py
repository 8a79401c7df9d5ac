"""A train reply decoded once, and the sample-weighted mean over such replies.

Flower's `Array.numpy()` copies a reply's bytes into a new array on every call, and FedAvg,
the reply screen and SCAFFOLD each called it: three decodes of every reply per round, more time
than the average itself. Here a reply's arrays are read-only views of its message's bytes,
made once and read by all three. The mean does Flower's FedAvg arithmetic
(`aggregate_arrayrecords`: each array times w_i / sum(w), added up in the replies' order), in
place, so the global model is bit-identical to Flower's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord

from ovalp_flwr.federation.protocol import (ACCURACY, ARRAYS, METRICS, NUM_EXAMPLES, record_of,
                                            view_record)

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


# --- reading replies: counts and scores -------------------------------------------------------


def metric_record(message: Message) -> MetricRecord:
    """The reply's one MetricRecord."""
    return next(iter(message.content.metric_records.values()))


def replies_with_data(replies: Iterable[Message]) -> list[Message]:
    """Replies that carry no error and at least one example."""
    return [m for m in replies if not m.has_error() and examples(m) > 0]


def examples(message: Message) -> float:
    """The reply's num-examples; 0 when it has none to read (a malformed reply)."""
    records = message.content.metric_records
    return number(next(iter(records.values())).get(NUM_EXAMPLES) if records else None)


def number(value) -> float:
    """A finite number as a float; anything else 0."""
    return float(value) if isinstance(value, (int, float)) and np.isfinite(value) else 0.0


def plausible_score(message: Message) -> bool:
    """An evaluate reply whose accuracy is a fraction (a wrong one would skew the average)."""
    accuracy = metric_record(message).get(ACCURACY)
    return isinstance(accuracy, float) and 0.0 <= accuracy <= 1.0
