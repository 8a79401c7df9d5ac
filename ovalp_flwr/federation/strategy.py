"""FedAvg that runs OvA-LP's two-stage schedule and records what each round cost.

The server owns the schedule: every train message carries the stage for its round
(1 = positives only, 2 = all heads), so clients never guess it. Sampling of clients is
seeded by (run seed, round) over the clients ordered by partition id, so a seed fixes
who trains when. Replies with zero examples (empty clients) carry no information and
are kept out of the average — weighting by sample counts would give them zero weight
anyway, but a round of only empty clients would otherwise divide by zero.

The staging lives in a mixin, `Staged`, so it runs on top of Flower's own FedAvg or
FedAdam (`StagedFedAvg`, `StagedFedAdam`). Two variants for label skew combined with
quantity skew (README, "Quantity skew") are options of the mixin: uniform instead of
sample-weighted averaging, and SCAFFOLD's drift correction with the control variates
kept on the server (`ControlVariates`).

For faults, the mixin runs Flower's round loop itself (`Staged.start`) so that a run can write
a checkpoint after each round and go on from one (`ovalp_flwr.federation.checkpoint`), and it screens
every train reply before the average (`check_reply`, `ovalp_flwr.federation.validation`): a refused reply
is recorded with its reason and left out, as if it never came.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAdam, FedAvg, Result
from flwr.serverapp.strategy.fedopt import FedOpt
from flwr.supercore import log

from ovalp_flwr.federation.checkpoint import pack, unpack
from ovalp_flwr.federation.protocol import (ACCURACY, ARRAYS, CORRECTION, METRICS, NUM_EXAMPLES,
                                            STAGE, TRAIN_LOSS, TRAIN_SECONDS, describe_failures,
                                            from_record, to_record)
from ovalp_flwr.federation.scaffold import ControlVariates
from ovalp_flwr.ops.console import say

# (node, arrays, metrics, the global arrays it was sent) -> why the train reply is refused, or None
ReplyCheck = Callable[[int, dict[str, np.ndarray], dict, dict[str, np.ndarray]], "str | None"]


def message_bytes(content: RecordDict) -> int:
    """Payload bytes of a message: serialized arrays, metrics and config (no framing)."""
    records = [*content.array_records.values(), *content.metric_records.values()]
    return (sum(record.count_bytes() for record in records)
            + sum(config_bytes(record) for record in content.config_records.values()))


def config_bytes(record: ConfigRecord) -> int:
    """ConfigRecord.count_bytes's rule (keys and str/bytes by length, numbers 8 bytes, bools 1),
    for every record: Flower's raises on an empty list, "" or b"" (SecAgg+ sends them)."""
    def size(value) -> int:
        if isinstance(value, (str, bytes)):
            return len(value)
        return 1 if isinstance(value, bool) else 8

    return sum(len(key) + (sum(map(size, value)) if isinstance(value, list) else size(value))
               for key, value in record.items())


class Staged:
    """The OvA-LP schedule, seeded sampling and per-round costs, on top of a Flower strategy."""

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
        aggregation_weights: str = "samples",
        control_variates: ControlVariates | None = None,
        check_reply: ReplyCheck | None = None,
        exclude_after: int = 0,
        left_out: Iterable[int] = (),
        **strategy_options,
    ) -> None:
        """admit(grid, new_node_ids) -> node ids in sampling order: how nodes that connect
        after the run started join it (the ServerApp describes, checks and briefs them);
        without it, the nodes at the start are the federation for the whole run.
        aggregation_weights: "samples" (FedAvg) or "uniform" (every client with data counts
        once). check_reply(node, arrays, metrics, global_arrays) -> why a train reply is refused,
        or None (`validation`); exclude_after: a node whose replies were refused that many times
        is no longer sampled (0: never); left_out: nodes connected at the start but refused by
        the set-up (not to be admitted later as new ones). strategy_options go to the Flower
        strategy (e.g. FedAdam's eta)."""
        if aggregation_weights not in ("samples", "uniform"):
            raise ValueError(f"aggregation-weights={aggregation_weights!r} is not allowed; "
                             "choose samples or uniform")
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=1,
            min_evaluate_nodes=1 if fraction_evaluate > 0 else 0,
            min_available_nodes=1,
            weighted_by_key=NUM_EXAMPLES,
            **strategy_options,
        )
        self.stage_for_round = stage_for_round
        self.seed = seed
        self.node_order = node_order
        self.admit = admit
        self.aggregation_weights = aggregation_weights
        self.variates = control_variates
        self.check_reply = check_reply
        self.exclude_after = exclude_after
        self.rejected: dict[int, int] = {}  # node -> replies refused so far
        self.excluded: set[int] = set()  # nodes no longer sampled: too many refused replies
        self._seen = set(node_order or []) | set(left_out)  # nodes admitted or refused so far
        self._global: dict[str, np.ndarray] = {}  # the arrays sent this round
        self.extra_train_config = dict(extra_train_config or {})
        self.rounds: dict[int, dict] = {}  # per-round costs, read by the ServerApp

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
              *, resume: Result | None = None, first_round: int = 1,
              after_round: Callable[[int, ArrayRecord, Result], None] | None = None) -> Result:
        """Flower's round loop (`Strategy.start`: train, client-side evaluation, the server's
        evaluation), with two additions: `after_round(round, arrays, result)` once a round is
        scored (the run's checkpoint), and a start at `first_round` from `resume`, the result
        of the rounds before it (then `initial_arrays` are its last round's)."""
        train_config = train_config or ConfigRecord()
        evaluate_config = evaluate_config or ConfigRecord()
        result = resume or Result()
        arrays = initial_arrays
        if resume is None and evaluate_fn is not None:
            self._record(result.evaluate_metrics_serverapp, 0, evaluate_fn(0, arrays))
        for server_round in range(first_round, num_rounds + 1):
            log(INFO, "[ROUND %s/%s]", server_round, num_rounds)
            replies = grid.send_and_receive(
                self.configure_train(server_round, arrays, train_config, grid), timeout=timeout)
            new_arrays, train_metrics = self.aggregate_train(server_round, replies)
            if new_arrays is not None:
                result.arrays = arrays = new_arrays
            self._record(result.train_metrics_clientapp, server_round, train_metrics)
            replies = grid.send_and_receive(
                self.configure_evaluate(server_round, arrays, evaluate_config, grid), timeout=timeout)
            self._record(result.evaluate_metrics_clientapp, server_round,
                         self.aggregate_evaluate(server_round, replies))
            if evaluate_fn is not None:
                self._record(result.evaluate_metrics_serverapp, server_round,
                             evaluate_fn(server_round, arrays))
            if after_round is not None:
                after_round(server_round, arrays, result)
        return result

    @staticmethod
    def _record(history: dict[int, MetricRecord], server_round: int,
                metrics: MetricRecord | None) -> None:
        """Keep and log a round's metrics, as Flower's loop does (its lines go to the run log)."""
        if metrics is not None:
            log(INFO, "\t└──> Aggregated MetricRecord: %s", metrics)
            history[server_round] = metrics

    def state(self, partition_of: Callable[[int], int]) -> tuple[dict[str, np.ndarray], dict]:
        """What a checkpoint needs of the strategy, nodes named by partition id: its per-round
        records, the control variates, FedAdam's moments, refused and excluded nodes."""
        arrays: dict[str, np.ndarray] = {}
        state = {"rounds": self.rounds,
                 "rejected": {str(partition_of(n)): count for n, count in self.rejected.items()},
                 "excluded": sorted(partition_of(n) for n in self.excluded)}
        if self.variates is not None:
            variates, state["variates"] = self.variates.state(partition_of)
            arrays.update(pack("variates", variates))
        if isinstance(self, FedOpt) and self.m_t is not None:
            arrays.update(pack("fedopt-m", self.m_t))
            arrays.update(pack("fedopt-v", self.v_t))
        return arrays, state

    def restore(self, arrays: dict[str, np.ndarray], state: dict,
                node_of: Callable[[int], int]) -> None:
        """Back to what `state` saved, each partition's entries under the node holding it now."""
        self.rounds = {int(r): record for r, record in state["rounds"].items()}
        self.rejected = {node_of(int(pid)): count for pid, count in state["rejected"].items()}
        self.excluded = {node_of(pid) for pid in state["excluded"]}
        if self.variates is not None:
            self.variates.restore(unpack("variates", arrays), state["variates"], node_of)
        if isinstance(self, FedOpt) and unpack("fedopt-m", arrays):
            self.m_t, self.v_t = unpack("fedopt-m", arrays), unpack("fedopt-v", arrays)

    def sample(self, grid: Grid, server_round: int, fraction: float, purpose: int) -> list[int]:
        """A seeded subset of the nodes: same seed and round, same clients."""
        nodes = [n for n in self.node_order or sorted(grid.get_node_ids()) if n not in self.excluded]
        if not nodes:
            return []
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
        self._global = {key: array.numpy() for key, array in arrays.items()}
        if isinstance(self, FedOpt):
            self.current_arrays = self._global  # what FedOpt.configure_train would have set
        round_config = ConfigRecord(dict(config))  # a copy: the same object comes every round
        round_config.update(self.extra_train_config)
        round_config["server-round"] = server_round
        round_config[STAGE] = self.stage_for_round(server_round)
        content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: round_config})
        corrections = ({} if self.variates is None
                       else self.variates.corrections(round_config[STAGE], node_ids))
        messages = [self._train_message(content, node, corrections.get(node)) for node in node_ids]
        self.rounds[server_round] = {
            "stage": round_config[STAGE],
            "clients_sampled": len(node_ids),
            "bytes_sent_per_client": float(np.mean([message_bytes(m.content) for m in messages]))
            if messages else message_bytes(content),
            "drift_correction": bool(corrections),
        }
        log(INFO, "configure_train: round %s, stage %s, %s clients%s", server_round,
            round_config[STAGE], len(node_ids), ", SCAFFOLD-corrected" if corrections else "")
        return messages

    def _train_message(self, content: RecordDict, node_id: int,
                       correction: dict[str, np.ndarray] | None) -> Message:
        """The round's train message for one node, with its SCAFFOLD correction if any."""
        if correction is not None:
            content = RecordDict({**content, CORRECTION: to_record(correction)})
        return Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node_id)

    def _admit_late_nodes(self, grid: Grid, server_round: int) -> None:
        """Nodes that connected since the last round join from this one, if `admit` takes them."""
        if self.admit is None or self.node_order is None:
            return
        new = sorted(set(grid.get_node_ids()) - self._seen)
        if new:
            self._seen.update(new)
            self.node_order = self.admit(grid, new)
            # counted by id: a node that takes an offline node's partition replaces it
            admitted = len(set(new) & set(self.node_order))
            say(INFO, "round %s: %s node(s) connected late, %s admitted; %s in the federation",
                server_round, len(new), admitted, len(self.node_order))

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
        """FedAvg (or the base strategy's step) over the clients that trained on data, added up
        in the clients' partition order, not their replies' arrival order: floating-point sums
        then come out the same under Ray, in deployment and in process, bit for bit."""
        replies = sorted(replies, key=self._position)
        ok = [m for m in replies if not m.has_error()]
        if len(ok) < len(replies):  # a round whose clients all failed must say why
            say(WARNING, "round %s: %s", server_round,
                describe_failures([m for m in replies if m.has_error()]))
        accepted, rejections = self._screen(server_round, ok)
        trained = _with_data(accepted)
        start = time.perf_counter()
        weighted = [self._reweighted(m) for m in trained]
        arrays, metrics = super().aggregate_train(server_round, weighted) if trained else (None, None)
        if self.variates is not None and trained:
            self.variates.update(self._global, trained, lambda m: _metric(self._reweighted(m), NUM_EXAMPLES))
        record = self.rounds.setdefault(server_round, {})
        record.update(_reply_costs(ok, trained, len(replies) - len(ok)))  # rejected: replied
        record["clients_timed_out"] = record.get("clients_sampled", len(replies)) - len(replies)
        record["clients_rejected"] = len(rejections)
        record["rejections"] = rejections
        record["server_aggregate_seconds"] = time.perf_counter() - start
        return arrays, metrics

    def _screen(self, server_round: int, replies: list[Message]) -> tuple[list[Message], list[dict]]:
        """The replies that pass `check_reply`, and {node, reason} for each one refused. A node's
        first refusal is logged; after `exclude_after` of them it is no longer sampled."""
        accepted, rejections = [], []
        for message in replies:
            node = message.metadata.src_node_id
            reason = self._refusal(message)
            if reason is None:
                accepted.append(message)
                continue
            rejections.append({"node": node, "reason": reason})
            self.rejected[node] = self.rejected.get(node, 0) + 1
            if self.rejected[node] == 1:
                say(WARNING, "round %s: reply of node %s rejected (not averaged): %s",
                    server_round, node, reason)
            if self.exclude_after and self.rejected[node] >= self.exclude_after:
                self.excluded.add(node)
                say(WARNING, "node %s excluded from sampling after %s rejected replies", node,
                    self.rejected[node])
        return accepted, rejections

    def _refusal(self, message: Message) -> str | None:
        """Why a train reply must not be averaged, or None."""
        content = message.content
        if ARRAYS not in content.array_records or METRICS not in content.metric_records:
            return f"the reply lacks its {ARRAYS!r} or {METRICS!r} record"
        try:
            arrays = from_record(content[ARRAYS])
        except (ValueError, TypeError) as err:
            return f"its arrays do not deserialize ({err})"
        if self.check_reply is None:
            return None
        return self.check_reply(message.metadata.src_node_id, arrays, dict(content[METRICS]),
                                self._global)

    def _position(self, message: Message) -> tuple[int, int]:
        """Where a reply's node stands in the sampling order (nodes outside it: last)."""
        node = message.metadata.src_node_id
        order = self.node_order or []
        return (order.index(node) if node in order else len(order), node)

    def _reweighted(self, message: Message) -> Message:
        """The reply as the average should weigh it: as is, or counting once (uniform)."""
        if self.aggregation_weights == "samples":
            return message
        metrics = MetricRecord({**_metrics(message), NUM_EXAMPLES: 1})
        content = RecordDict({**message.content.array_records, METRICS: metrics})
        return Message(content=content, message_type=message.metadata.message_type,
                       dst_node_id=message.metadata.src_node_id)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Sample-weighted local accuracy over clients that have data (and a plausible score)."""
        with_data = [m for m in _with_data(replies) if _plausible_score(m)]
        return super().aggregate_evaluate(server_round, with_data) if with_data else None


def _metrics(message: Message) -> MetricRecord:
    """The reply's one MetricRecord."""
    return next(iter(message.content.metric_records.values()))


def _metric(message: Message, key: str) -> float:
    return float(_metrics(message)[key])


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
    return [m for m in replies if not m.has_error() and _examples(m) > 0]


def _examples(message: Message) -> float:
    """The reply's num-examples; 0 when it has none to read (a malformed reply)."""
    records = message.content.metric_records
    value = next(iter(records.values())).get(NUM_EXAMPLES) if records else None
    return float(value) if isinstance(value, (int, float)) and np.isfinite(value) else 0.0


def _plausible_score(message: Message) -> bool:
    """An evaluate reply whose accuracy is a fraction (a wrong one would skew the average)."""
    accuracy = _metrics(message).get(ACCURACY)
    return isinstance(accuracy, float) and 0.0 <= accuracy <= 1.0


class StagedFedAvg(Staged, FedAvg):
    """The recipe: Flower's FedAvg with the stage schedule."""


class StagedFedAdam(Staged, FedAdam):
    """Flower's FedAdam (Reddi et al., 2021) on the averaged update, with the stage schedule."""

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """FedAdam's step, kept in the head's dtype.

        Flower's FedAdam scales by a NumPy float64, which under NumPy 2 promotes float32
        weights to float64 and would double every later message.
        """
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is not None:
            arrays = to_record({key: value.numpy().astype(self._global[key].dtype, copy=False)
                                for key, value in arrays.items()})
        return arrays, metrics
