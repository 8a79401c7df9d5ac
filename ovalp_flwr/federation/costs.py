"""What a round costs, read from its messages: payload bytes (arrays, metrics, config) and the
clients' train seconds; and how many nodes a fraction samples."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from ovalp_flwr.federation.protocol import NUM_EXAMPLES, TRAIN_LOSS, TRAIN_SECONDS
from ovalp_flwr.federation.replies import TrainReply


def message_bytes(content: RecordDict) -> int:
    """Payload bytes of a message: serialized arrays, metrics and config (no framing). One pass
    over the records (RecordDict's typed views are rebuilt on every access)."""
    return sum(record_bytes(record) for record in content.values())


def sample_size(num_nodes: int, fraction: float) -> int:
    """How many of `num_nodes` a round with `fraction` samples: at least one, at most all."""
    return min(num_nodes, max(1, int(round(num_nodes * fraction))))


def bytes_sent(content: RecordDict, messages: list[Message]) -> float:
    """Mean payload per train message: the shared content plus what each message adds."""
    shared = message_bytes(content)
    if not messages:
        return float(shared)
    sizes: dict[int, int] = {}  # id(record) -> its bytes: one c goes to many nodes
    extra = [sum(sizes.get(id(record)) or sizes.setdefault(id(record), record_bytes(record))
                 for key, record in m.content.items() if key not in content)
             for m in messages]
    return float(shared + np.mean(extra))


def record_bytes(record: ArrayRecord | ConfigRecord | MetricRecord) -> int:
    return config_bytes(record) if isinstance(record, ConfigRecord) else record.count_bytes()


def config_bytes(record: ConfigRecord) -> int:
    """ConfigRecord.count_bytes's rule (keys and str/bytes by length, numbers 8 bytes, bools 1),
    for every record: Flower's raises on an empty list, "" or b"" (SecAgg+ sends them)."""
    def size(value) -> int:
        if isinstance(value, (str, bytes)):
            return len(value)
        return 1 if isinstance(value, bool) else 8

    return sum(len(key) + (sum(map(size, value)) if isinstance(value, list) else size(value))
               for key, value in record.items())


def reply_costs(ok: list[Message], trained: list[TrainReply], failures: int) -> dict:
    """Per-round client costs: who trained, how long, how many bytes came back."""
    seconds = [float(r.metrics[TRAIN_SECONDS]) for r in trained]
    examples = np.array([float(r.metrics[NUM_EXAMPLES]) for r in trained])
    losses = np.array([float(r.metrics[TRAIN_LOSS]) for r in trained])
    received = [message_bytes(m.content) for m in ok]
    return {
        "clients_replied": len(ok),
        "clients_trained": len(trained),
        "clients_failed": failures,
        "train_loss": float(examples @ losses / examples.sum()) if len(trained) else None,
        "client_train_seconds_mean": float(np.mean(seconds)) if seconds else None,
        "client_train_seconds_max": float(np.max(seconds)) if seconds else None,
        "bytes_received_per_client": float(np.mean(received)) if received else None,
    }
