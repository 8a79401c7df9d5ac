"""FedAvg that runs OvA-LP's two-stage schedule and records what each round cost.

The server owns the schedule: every train message carries the stage for its round
(1 = positives only, 2 = all heads), so clients never guess it. Sampling of clients is
seeded by (run seed, round) over the clients ordered by partition id, so a seed fixes
who trains when. Replies with zero examples (empty clients) carry no information and
are kept out of the average — weighting by sample counts would give them zero weight
anyway, but a round of only empty clients would otherwise divide by zero.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from logging import INFO

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.supercore import log

from ovalp_flwr.protocol import NUM_EXAMPLES, STAGE, TRAIN_LOSS, TRAIN_SECONDS



def message_bytes(content: RecordDict) -> int:
    """Payload bytes of a message: serialized arrays, metrics and config (no framing)."""
    records = [*content.array_records.values(), *content.metric_records.values(),
               *content.config_records.values()]
    return sum(record.count_bytes() for record in records)


class StagedFedAvg(FedAvg):
    """Flower's FedAvg plus the stage schedule, seeded sampling and per-round costs."""

    def __init__(
        self,
        *,
        stage_for_round: Callable[[int], int],
        seed: int,
        node_order: list[int] | None = None,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 0.0,
        extra_train_config: dict | None = None,
        admit: Callable[[Grid, list[int]], list[int]] | None = None,
    ) -> None:
        """admit(grid, new_node_ids) -> node ids in sampling order: how nodes that connect
        after the run started join it (the ServerApp describes, checks and briefs them);
        without it, the nodes at the start are the federation for the whole run."""
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=1,
            min_evaluate_nodes=1 if fraction_evaluate > 0 else 0,
            min_available_nodes=1,
            weighted_by_key=NUM_EXAMPLES,
        )
        self.stage_for_round = stage_for_round
        self.seed = seed
        self.node_order = node_order
        self.admit = admit
        self._seen = set(node_order or [])  # nodes admitted or refused so far
        self.extra_train_config = dict(extra_train_config or {})
        self.rounds: dict[int, dict] = {}  # per-round costs, read by the ServerApp

    def sample(self, grid: Grid, server_round: int, fraction: float, purpose: int) -> list[int]:
        """A seeded subset of the nodes: same seed and round, same clients."""
        nodes = self.node_order or sorted(grid.get_node_ids())
        count = max(1, int(round(len(nodes) * fraction)))
        if count >= len(nodes):
            return list(nodes)
        rng = np.random.default_rng([self.seed, server_round, purpose])
        chosen = rng.choice(len(nodes), size=count, replace=False)
        return [nodes[i] for i in sorted(chosen)]

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send the global head with this round's stage to a seeded sample of clients."""
        self._admit_late_nodes(grid, server_round)
        node_ids = self.sample(grid, server_round, self.fraction_train, purpose=0)
        round_config = ConfigRecord(dict(config))  # a copy: the same object comes every round
        round_config.update(self.extra_train_config)
        round_config["server-round"] = server_round
        round_config[STAGE] = self.stage_for_round(server_round)
        content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: round_config})
        self.rounds[server_round] = {
            "stage": round_config[STAGE],
            "clients_sampled": len(node_ids),
            "bytes_sent_per_client": message_bytes(content),
        }
        log(INFO, "configure_train: round %s, stage %s, %s clients", server_round,
            round_config[STAGE], len(node_ids))
        return self._construct_messages(content, node_ids, MessageType.TRAIN)

    def _admit_late_nodes(self, grid: Grid, server_round: int) -> None:
        """Nodes that connected since the last round join from this one, if `admit` takes them."""
        if self.admit is None or self.node_order is None:
            return
        new = sorted(set(grid.get_node_ids()) - self._seen)
        if new:
            self._seen.update(new)
            before = len(self.node_order)
            self.node_order = self.admit(grid, new)
            log(INFO, "round %s: %s node(s) connected late, %s admitted; %s in the federation",
                server_round, len(new), len(self.node_order) - before, len(self.node_order))

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Client-side (local) evaluation on a seeded sample, if fraction-evaluate > 0."""
        if self.fraction_evaluate == 0.0:
            return []
        node_ids = self.sample(grid, server_round, self.fraction_evaluate, purpose=1)
        round_config = ConfigRecord(dict(config))
        round_config["server-round"] = server_round
        content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: round_config})
        return self._construct_messages(content, node_ids, MessageType.EVALUATE)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Sample-weighted FedAvg over the clients that trained on data."""
        replies = list(replies)
        ok = [m for m in replies if not m.has_error()]
        trained = _with_data(ok)
        start = time.perf_counter()
        arrays, metrics = super().aggregate_train(server_round, trained) if trained else (None, None)
        record = self.rounds.setdefault(server_round, {})
        record.update(_reply_costs(ok, trained, len(replies) - len(ok)))
        record["server_aggregate_seconds"] = time.perf_counter() - start
        return arrays, metrics

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Sample-weighted local accuracy over clients that have data."""
        with_data = _with_data(replies)
        return super().aggregate_evaluate(server_round, with_data) if with_data else None


def _metric(message: Message, key: str) -> float:
    metrics = next(iter(message.content.metric_records.values()))
    return float(metrics[key])


def _reply_costs(ok: list[Message], trained: list[Message], failures: int) -> dict:
    """Per-round client costs: who trained, how long, how many bytes came back."""
    seconds = [_metric(m, TRAIN_SECONDS) for m in trained]
    examples = np.array([_metric(m, NUM_EXAMPLES) for m in trained])
    losses = np.array([_metric(m, TRAIN_LOSS) for m in trained])
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


def _with_data(replies: Iterable[Message]) -> list[Message]:
    """Replies that carry no error and at least one example."""
    return [m for m in replies if not m.has_error() and _metric(m, NUM_EXAMPLES) > 0]
