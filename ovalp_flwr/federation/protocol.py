"""Names both apps agree on: message types and record keys.

A run is: one `query.describe` to every client (who is there, how much data, and the
feature moments if the normalisation needs global statistics), one `query.set_norm`
that gives every client the global mean/std, then the FedAvg rounds (`train`, and
`evaluate` if fraction-evaluate > 0). When the heads start from statistics, the last set-up
message (`set_norm`, or `describe` if the normalisation needs no global statistics) asks
for them (`STATISTICS_KIND`) and the reply carries them (`STATISTICS`): no extra exchange.
"""

from __future__ import annotations

import functools
import math
from io import BytesIO
from typing import TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

DESCRIBE = "query.describe"
SET_NORM = "query.set_norm"
PERSONALIZE = "train.personalize"  # fine-tune the global model with one method, once
SCORE_PERSONALIZED = "evaluate.personalized"  # score every client's model on the own test split

ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
MOMENTS = "moments"
NORM = "norm"
STATISTICS = "statistics"  # a client's class sums (and Gram matrix): head_init.statistics
CORRECTION = "correction"  # SCAFFOLD's c - c_i for this client, added to its local gradients
# scaffold-variates = "clients": the clients keep their own c_i (in context.state)
SHARED_VARIATE = "shared-variate"  # train message: SCAFFOLD's c, to a node that holds its c_i
VARIATE = "variate"  # train reply: the node's new c_i; context.state: the c_i it holds
VARIATE_ROUND = "variate-round"  # the round whose reply gave the c_i the node holds

NUM_EXAMPLES = "num-examples"
NOISY_EXAMPLES = "noisy-examples"  # labels the run's label noise changed
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
TRAIN_LOSS = "train-loss"
TRAIN_SECONDS = "train-seconds"
LOCAL_STEPS = "local-steps"  # optimiser steps the client took (SCAFFOLD's variate needs it)
ACCURACY = "accuracy"
VALIDATION = "validation"  # evaluate config: 1 = score the validation rows this client keeps
VALIDATION_LOSS = "validation-loss"  # evaluate reply: the mean loss on those rows
STAGE = "stage"
# server-optimizer = "lbfgs": a train message asks for the full-batch gradient, not local steps
GRADIENT = "gradient"  # train config: 1 = reply with the gradient at the heads sent
CURVATURE = "curvature"  # train reply: each head's mean loss curvature (a list, K floats)
LOSSES = "losses"  # train reply: train-loss split per head (OvA) or label (softmax), K floats
NORM_DIGEST = "norm-digest"
OWN_DATA = "own-data"  # 1: the node reads its own data dir / cache dir, not the run's
FEATURE_SPACE = "feature-space"  # digest of encoder identity + label set (CachedFeatures)
STATISTICS_KIND = "statistics-kind"  # what the server asks for: head_init.statistics.KINDS
NUM_CLASSES = "num-classes"  # the server's label set size, for the statistics' shape
GRAM_RANK = "gram-rank"  # low-rank statistics: the within-class scatter's directions a client sends
CLIPPING_RANGE = "secagg-clipping-range"  # |per-sample statistic| SecAgg+ can carry
NOISE_SHARES = "noise-shares"  # distributed DP: each client holding data adds 1/this of the noise
SECAGG_CONFIGS = "secaggplus_configs"  # flwr...secaggplus_constants.RECORD_KEY_CONFIGS
NORM_STATE = "ovalp-norm"  # key of the client's stored statistics in context.state
METHOD = "method"  # the personalization method a PERSONALIZE message asks for
RUN_NAME = "run-name"  # where a node files its personalized model (model-dir/<run>/<method>)
MODEL_PREFIX = "model:"  # SCORE_PERSONALIZED: one ArrayRecord per model to score, model:<name>
LOCAL_CURVE = "local-curve"  # Local accuracy after each PFT epoch
CURVE_EPOCHS = "curve-epochs"  # the epochs of the snapshots a PERSONALIZE reply carries
SNAPSHOT_PREFIX = "epoch:"  # PERSONALIZE reply: the model after epoch <e>, epoch:<e>
CORRECT_PREFIX = "correct:"  # SCORE_PERSONALIZED reply: right predictions of model <name>
DISTANCE_PREFIX = "distance:"  # ... and the sum of its features' L2 distances to the global's
NUM_TEST = "num-test"  # size of the client's own test split
NUMPY = "numpy.ndarray"  # flwr's SType.NUMPY: an Array whose data are np.save's bytes
OWN_CORRECT = "own-correct"  # PERSONALIZE reply: the final model's right predictions on it
GLOBAL_OWN_CORRECT = "global-own-correct"  # ... and the global model's, before fine-tuning


R = TypeVar("R", ArrayRecord, ConfigRecord, MetricRecord)
HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0,
                  (2, 0): np.lib.format.read_array_header_2_0}


def to_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({key: to_array(value) for key, value in arrays.items()})


def to_array(value: np.ndarray) -> Array:
    """`Array(value)`'s bytes (np.save's), with one copy where np.save's BytesIO makes two:
    the server encodes a SCAFFOLD correction per client per round."""
    value = np.ascontiguousarray(value)
    header = BytesIO()
    try:
        np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(value))
    except ValueError:  # a header over 64 KiB (millions of dimensions): np.save's version 2
        return Array(value)
    if value.dtype.hasobject:
        return Array(value)  # np.save's refusal, unchanged
    data = b"".join((header.getvalue(), value.reshape(-1).view(np.uint8)))
    return Array(dtype=str(value.dtype), shape=tuple(value.shape), stype=NUMPY, data=data)


def record_of(content: RecordDict, key: str, kind: type[R]) -> R | None:
    """content[key] if it is a `kind` record, else None; without `content.array_records` and
    its kind, which build a dict of every record on each call (70 us, per reply per round)."""
    found = content.get(key)
    return found if isinstance(found, kind) else None


def from_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    """What `Array.numpy()` gives, each array writable and its own: a copy of its view, without
    np.load's parse of the header on every call."""
    return {key: np.array(value, order="K") for key, value in view_record(record).items()}


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


def describe_failures(failed: list[Message]) -> str:
    """One line for a batch of error replies: how many, and the first one's node and reason."""
    first = failed[0]
    return (f"{len(failed)} client(s) failed; node {first.metadata.src_node_id} said: "
            f"{first.error.reason}")
