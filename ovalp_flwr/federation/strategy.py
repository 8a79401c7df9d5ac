"""The round loop: FedAvg that runs OvA-LP's two-stage schedule and records what each round cost,
with its parts plugged in.

The server owns the schedule: every train message carries the stage for its round
(1 = positives only, 2 = all heads), so clients never guess it. Sampling of clients is
seeded by (run seed, round) over the clients ordered by partition id, so a seed fixes
who trains when. Replies with zero examples (empty clients) carry no information and
are kept out of the average — weighting by sample counts would give them zero weight
anyway, but a round of only empty clients would otherwise divide by zero.

A round calls its parts, each behind a small interface and given at construction:
- the reply screen (`screening.ReplyScreen`): which replies enter the mean, who is refused;
- the combination in place of the weighted mean: a robust rule (`robust`, `aggregators/`) or
  DP's clipped noisy mean (`privacy.PrivateRounds`), one or neither;
- the server's step from the combined update (`steps/`: FedAvg's, FedAdam's);
- the drift correction (`scaffold.ControlVariates`: SCAFFOLD's server half).
`Staged` is the loop (a mixin on Flower's FedAvg: `StagedFedAvg`); the server's L-BFGS
(`server_lbfgs`) and FLoRA (`finetune/flora`) are its subclasses. It runs Flower's round loop
itself (`Staged.start`) so that a run can write a checkpoint after each round and go on from
one (`checkpoint`); what it costs is read by `costs`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result
from flwr.supercore import log

from ovalp_flwr.federation.checkpoint import pack, unpack
from ovalp_flwr.federation.costs import bytes_sent, reply_costs, sample_size
from ovalp_flwr.federation.protocol import (ACCURACY, CORRECTION, NUM_EXAMPLES, SHARED_VARIATE,
                                            STAGE, TRAIN_LOSS, VALIDATION, VALIDATION_LOSS,
                                            VARIATE_ROUND, describe_failures, to_record)
from ovalp_flwr.federation.privacy import PrivateRounds
from ovalp_flwr.federation.replies import (TrainReply, metric_record, number, plausible_score,
                                           replies_with_data, weighted_metrics)
from ovalp_flwr.federation.robust import RobustAggregation
from ovalp_flwr.federation.scaffold import ControlVariates, Correction, HeldVariate
from ovalp_flwr.federation.screening import ReplyCheck, ReplyScreen
from ovalp_flwr.federation.steps.base import ServerStep
from ovalp_flwr.federation.steps.fedavg import FedAvgStep
from ovalp_flwr.ops.console import say



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
        robust: RobustAggregation | None = None,
        privacy: PrivateRounds | None = None,
        step: ServerStep | None = None,
        federated_validation: bool = False,
        max_weight: float | None = None,
        secret_sampling: bool = False,
        **strategy_options,
    ) -> None:
        """admit(grid, new_node_ids) -> node ids in sampling order: how nodes that connect
        after the run started join it (the ServerApp describes, checks and briefs them);
        without it, the nodes at the start are the federation for the whole run.
        aggregation_weights: "samples" (FedAvg) or "uniform" (every client with data counts
        once). check_reply(node, arrays, metrics, global_arrays) -> why a train reply is refused,
        or None (`validation`); exclude_after: a node whose replies were refused that many times
        is no longer sampled (0: never); left_out: nodes connected at the start but refused by
        the set-up (not to be admitted later as new ones). robust: the round's combination of
        the replies in place of their mean (`robust`), None for FedAvg's mean; privacy: DP's
        clipped, noisy mean in its place (`privacy.PrivateRounds`; the config allows one of the
        two). step: the server's step from the combined update to the new model
        (`steps/`: FedAvg's by default, FedAdam's).
        federated_validation: the clients keep the validation rows; every round (and the start)
        the server asks every node to score the heads it holds on them, and keeps the sums.
        max_weight: the most weight a reply can have in the mean, whatever count it states
        (`weight-cap`); None: no cap. secret_sampling: the train sample drawn from OS entropy,
        not the seed (DP rounds: `privacy`).
        strategy_options go to the Flower strategy (e.g. FedAdam's eta)."""
        if aggregation_weights not in ("samples", "uniform"):
            raise ValueError(f"aggregation-weights={aggregation_weights!r} is not allowed; "
                             "choose samples or uniform")
        super().__init__(
            fraction_train=fraction_train,
            # every node, every round, under federated validation (`configure_evaluate`)
            fraction_evaluate=1.0 if federated_validation else fraction_evaluate,
            min_train_nodes=1,
            min_evaluate_nodes=1 if fraction_evaluate > 0 or federated_validation else 0,
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
        self.robust = robust
        self.privacy = privacy
        self.step = step or FedAvgStep()
        self.secret_sampling = secret_sampling
        self.screen = ReplyScreen(check_reply, exclude_after, aggregation_weights == "uniform",
                                  max_weight)
        self._seen = set(node_order or []) | set(left_out)  # nodes admitted or refused so far
        self._global: dict[str, np.ndarray] = {}  # the arrays sent this round
        self.extra_train_config = dict(extra_train_config or {})
        self.rounds: dict[int, dict] = {}  # per-round costs, read by the ServerApp
        self.federated_validation = federated_validation
        # round -> the federation's validation accuracy, loss and rows (federated validation)
        self.validation_scores: dict[int, dict[str, float]] = {}

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
              *, resume: Result | None = None, first_round: int = 1,
              after_round: Callable[[int, ArrayRecord, Result], None] | None = None,
              trial_score: Callable[[ArrayRecord], float] | None = None) -> Result:
        """Flower's round loop (`Strategy.start`: train, client-side evaluation, the server's
        evaluation), with three additions: the server scores the heads it holds (`held`: the
        model it would return), and `trial_score` the point sent next where that differs;
        `after_round(round, arrays, result)` once a round is scored (the run's checkpoint);
        and a start at `first_round` from `resume`, the result of the rounds before it (then
        `initial_arrays` are its last round's). The result ends with the held heads."""
        train_config = train_config or ConfigRecord()
        evaluate_config = evaluate_config or ConfigRecord()
        result = resume or Result()
        arrays = initial_arrays
        if resume is None and self.federated_validation:  # the start's, as every round's
            self._evaluate_round(grid, 0, arrays, evaluate_config, timeout, result)
        if resume is None and evaluate_fn is not None:
            self._record(result.evaluate_metrics_serverapp, 0, evaluate_fn(0, arrays))
        for server_round in range(first_round, num_rounds + 1):
            log(INFO, "[ROUND %s/%s]", server_round, num_rounds)
            new_arrays, train_metrics = self.train_round(grid, server_round, arrays, train_config,
                                                         timeout)
            if new_arrays is not None:
                result.arrays = arrays = new_arrays
            self._record(result.train_metrics_clientapp, server_round, train_metrics)
            held = self.held(arrays)
            self._evaluate_round(grid, server_round, held, evaluate_config, timeout, result)
            if trial_score is not None and held is not arrays:
                self.rounds.setdefault(server_round, {})["trial_accuracy"] = trial_score(arrays)
            if evaluate_fn is not None:
                self._record(result.evaluate_metrics_serverapp, server_round,
                             evaluate_fn(server_round, held))
            if after_round is not None:
                after_round(server_round, arrays, result)
        result.arrays = self.held(arrays)
        return result

    def _evaluate_round(self, grid: Grid, server_round: int, held: ArrayRecord,
                        evaluate_config: ConfigRecord, timeout: float, result: Result) -> None:
        """The clients' evaluate exchange on the heads the server holds, where there is one
        (fraction-evaluate = 0 and no federated validation: none at all; Flower's grid would
        still pull once)."""
        evaluate = list(self.configure_evaluate(server_round, held, evaluate_config, grid))
        replies = grid.send_and_receive(evaluate, timeout=timeout) if evaluate else []
        self._record(result.evaluate_metrics_clientapp, server_round,
                     self.aggregate_evaluate(server_round, replies))

    def held(self, arrays: ArrayRecord) -> ArrayRecord:
        """The heads the server would return after a round that ends with `arrays` to send
        next: those heads themselves, for a strategy whose step is its model (FedAvg)."""
        return arrays

    def train_round(self, grid: Grid, server_round: int, arrays: ArrayRecord,
                    train_config: ConfigRecord, timeout: float
                    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """One round's train exchange and its aggregate (the new arrays, or None to keep them)."""
        replies = grid.send_and_receive(
            self.configure_train(server_round, arrays, train_config, grid), timeout=timeout)
        return self.aggregate_train(server_round, replies)

    @staticmethod
    def _record(history: dict[int, MetricRecord], server_round: int,
                metrics: MetricRecord | None) -> None:
        """Keep and log a round's metrics, as Flower's loop does (its lines go to the run log)."""
        if metrics is not None:
            log(INFO, "\t└──> Aggregated MetricRecord: %s", metrics)
            history[server_round] = metrics

    def state(self, partition_of: Callable[[int], int]) -> tuple[dict[str, np.ndarray], dict]:
        """What a checkpoint needs of the strategy, nodes named by partition id: its per-round
        records, the control variates, the server step's state, refused and excluded nodes."""
        arrays: dict[str, np.ndarray] = {}
        state = {"rounds": self.rounds,
                 "rejected": {str(partition_of(n)): count
                              for n, count in self.screen.rejected.items()},
                 "excluded": sorted(partition_of(n) for n in self.screen.excluded)}
        if self.variates is not None:
            variates, state["variates"] = self.variates.state(partition_of)
            arrays.update(pack("variates", variates))
        arrays.update(self.step.state())  # FedAdam's moments
        return arrays, state

    def restore(self, arrays: dict[str, np.ndarray], state: dict,
                node_of: Callable[[int], int]) -> None:
        """Back to what `state` saved, each partition's entries under the node holding it now."""
        self.rounds = {int(r): record for r, record in state["rounds"].items()}
        self.screen.rejected = {node_of(int(pid)): count
                                for pid, count in state["rejected"].items()}
        self.screen.excluded = {node_of(pid) for pid in state["excluded"]}
        if self.variates is not None:
            self.variates.restore(unpack("variates", arrays), state["variates"], node_of)
        self.step.restore(arrays)

    def sample(self, grid: Grid, server_round: int, fraction: float, purpose: int) -> list[int]:
        """A seeded subset of the nodes: same seed and round, same clients. With
        `secret_sampling`, the train sample is drawn from OS entropy instead: DP's amplification
        by sampling holds only for a sample no one can regenerate."""
        nodes = [n for n in self.node_order or sorted(grid.get_node_ids())
                 if n not in self.screen.excluded]
        if not nodes:
            return []
        count = sample_size(len(nodes), fraction)
        if purpose == 0 and self.privacy is not None:  # what the amplification is over, as drawn
            self.rounds.setdefault(server_round, {})["dp_population"] = len(nodes)
        if count >= len(nodes):
            return list(nodes)
        rng = np.random.default_rng() if self.secret_sampling and purpose == 0 else \
            np.random.default_rng([self.seed, server_round, purpose])
        chosen = rng.choice(len(nodes), size=count, replace=False)
        return [nodes[i] for i in sorted(chosen)]

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send the global head with this round's stage to a seeded sample of clients."""
        self._admit_late_nodes(grid, server_round)
        node_ids = self.sample(grid, server_round, self.fraction_train, purpose=0)
        self._global = {key: array.numpy() for key, array in arrays.items()}
        round_config = ConfigRecord(dict(config))  # a copy: the same object comes every round
        round_config.update(self.extra_train_config)
        round_config["server-round"] = server_round
        round_config[STAGE] = self.stage_for_round(server_round)
        content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: round_config})
        corrections = ({} if self.variates is None
                       else self.variates.corrections(round_config[STAGE], node_ids))
        shared = self._shared_variate(corrections)
        messages = [self._train_message(content, node, corrections.get(node), shared)
                    for node in node_ids]
        self.rounds[server_round] = {
            **self.rounds.get(server_round, {}),  # the sample's population (`sample`)
            "stage": round_config[STAGE],
            "clients_sampled": len(node_ids),
            "bytes_sent_per_client": bytes_sent(content, messages),
            "drift_correction": bool(corrections),
        }
        log(INFO, "configure_train: round %s, stage %s, %s clients%s", server_round,
            round_config[STAGE], len(node_ids), ", SCAFFOLD-corrected" if corrections else "")
        return messages

    def _shared_variate(self, corrections: dict[int, Correction]) -> ArrayRecord | None:
        """SCAFFOLD's c, encoded once for every node that holds its own c_i (clients mode)."""
        if not any(isinstance(c, HeldVariate) for c in corrections.values()):
            return None
        return to_record(self.variates.shared)

    def _train_message(self, content: RecordDict, node_id: int, correction: Correction | None,
                       shared: ArrayRecord | None = None) -> Message:
        """The round's train message for one node, with its SCAFFOLD correction if any: c - c_i,
        or c and the round of the c_i the node holds (`scaffold.HeldVariate`)."""
        if isinstance(correction, HeldVariate):
            content = RecordDict({**content, SHARED_VARIATE: shared, VARIATE_ROUND: ConfigRecord(
                {VARIATE_ROUND: correction.server_round})})
        elif correction is not None:
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
        """Client-side (local) evaluation on a seeded sample, if fraction-evaluate > 0; under
        federated validation, every node scores the validation rows it keeps."""
        if self.fraction_evaluate == 0.0:
            return []
        node_ids = self.sample(grid, server_round, self.fraction_evaluate, purpose=1)
        round_config = ConfigRecord(dict(config))
        round_config["server-round"] = server_round
        if self.federated_validation:
            round_config[VALIDATION] = 1
        content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: round_config})
        return self._construct_messages(content, node_ids, MessageType.EVALUATE)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """FedAvg (or the base strategy's step) over the clients that trained on data, added up
        in the clients' partition order, not their replies' arrival order: floating-point sums
        then come out the same under Ray, in deployment and in process, bit for bit. Each
        reply's arrays are decoded once (`replies.TrainReply`) and read by the screen, the
        average and SCAFFOLD."""
        start = time.perf_counter()
        rank = self._ranks()
        replies = sorted(replies, key=lambda m: rank(m.metadata.src_node_id))
        ok = [m for m in replies if not m.has_error()]
        if len(ok) < len(replies):  # a round whose clients all failed must say why
            say(WARNING, "round %s: %s", server_round,
                describe_failures([m for m in replies if m.has_error()]))
        accepted, rejections = self.screen(server_round, ok, self._global, self.variates)
        with_data = [r for r in accepted if number(r.metrics.get(NUM_EXAMPLES)) > 0]
        if self.variates is not None:  # clients mode: their c_i, finite
            refused = self.variates.non_finite(with_data)
            for node, reason in refused.items():
                self.screen.refuse(server_round, node, reason, rejections)
            with_data = [r for r in with_data if r.node not in refused]
        trained, mean = self.screen.finite_mean(with_data, server_round, rejections)
        admitted = trained
        combine = self.privacy or self.robust  # DP's clipped noisy mean, or a robust rule
        if combine is not None and trained:
            mean, admitted = combine(trained, self._global, server_round,
                                     self.rounds.get(server_round, {}).get("clients_sampled", 0))
        rejections.sort(key=lambda refused: rank(refused["node"]))  # the replies' order
        arrays, metrics = self._combine(server_round, trained, mean) if trained else (None, None)
        if self.variates is not None and admitted:
            self.variates.update(self._global, admitted, server_round)
        record = self.rounds.setdefault(server_round, {})
        record.update(reply_costs(ok, trained, len(replies) - len(ok)))
        if self.privacy is not None:  # no client's loss in the clear; the noise as drawn
            record["train_loss"] = None
            record.update(self.privacy.applied if trained else {})
        record["clients_timed_out"] = record.get("clients_sampled", len(replies)) - len(replies)
        record["clients_rejected"] = len(rejections)
        record["rejections"] = rejections
        record["server_aggregate_seconds"] = time.perf_counter() - start
        return arrays, metrics

    def _combine(self, server_round: int, trained: list[TrainReply],
                 mean: dict[str, np.ndarray]) -> tuple[ArrayRecord, MetricRecord]:
        """The new global model from the replies' combined update (the server's step), and
        their weighted metrics."""
        metrics = weighted_metrics(trained)
        if self.privacy is not None:  # DP rounds: no client's loss in the clear
            metrics = MetricRecord({key: value for key, value in metrics.items()
                                    if key != TRAIN_LOSS})
        return self.step(server_round, to_record(mean), metrics, self._global), metrics

    def _ranks(self) -> Callable[[int], tuple[int, int]]:
        """node -> where it stands in the sampling order (nodes outside it: last, by id)."""
        order = {node: i for i, node in enumerate(self.node_order or [])}
        return lambda node: (order.get(node, len(order)), node)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Sample-weighted local accuracy over clients that have data (and a plausible score);
        under federated validation, the federation's validation accuracy and mean loss (sums
        over the rows every node that answered keeps), recorded for the round."""
        scored = [m for m in replies_with_data(replies) if plausible_score(m)]
        if not scored:
            return None
        mean = super().aggregate_evaluate(server_round, scored)
        if self.federated_validation and mean is not None:
            rows = sum(int(metric_record(m)[NUM_EXAMPLES]) for m in scored)
            scores = {"accuracy": float(mean[ACCURACY]), "loss": float(mean[VALIDATION_LOSS]),
                      "rows": rows, "clients": len(scored)}
            self.validation_scores[server_round] = scores
            if server_round:  # the start's are the summary's
                self.rounds.setdefault(server_round, {}).update(
                    val_loss=scores["loss"], val_rows=rows, val_clients=len(scored))
        return mean


class StagedFedAvg(Staged, FedAvg):
    """The recipe: Flower's FedAvg with the stage schedule."""
