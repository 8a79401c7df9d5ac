"""`server-optimizer = "lbfgs"`: rounds in which the clients send their full-batch gradient and
the server takes L-BFGS steps on the centralised objective (`core.quasi_newton`).

A round: every client gets the heads and `gradient = 1` in its config; it replies with the
mean loss, gradient and heads' curvature on all its rows (`ova.client._gradient_reply`). The
replies pass the same screen as trained ones (shapes, sample counts, finiteness), their
sample-weighted mean is the centralised gradient, and the server adds the weight decay once. A
round whose replies do not cover every row the federation described (a node timed out, or a
reply was refused) would give a wrong gradient: the server sends the same heads again instead.
The rows are those the nodes' `describe` replies counted (not the summed statistics, which DP
noise or a forger may change). A node missing `lbfgs-patience` rounds in a row is dropped from
the objective with one warning naming it, and L-BFGS starts again from the heads it holds: the
run goes on over the other nodes' rows instead of repeating the same point forever.

The model the server holds after a round is L-BFGS's last accepted point (`held`), not the
trial point it sends next, which the next round's line search may take back: every round is
scored on the held heads, the trial point's accuracy beside it.

With `weight-decay = "auto"` the rounds walk a path of weight decays first (`core.decay_path`):
at the end of each value's rounds the held heads are scored on the server's validation rows,
and L-BFGS starts again at the next value from them; the run goes on at the best.

With `statistics-aggregation = "secagg+"` the gradients are averaged under Flower's SecAgg+ as
the statistics are (`secure_sum.secure_average`): the server sees only the federation's mean
gradient, loss and curvature, quantised (`GRADIENT_CLIPPING`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from ovalp_flwr.core.decay_path import DecayPath
from ovalp_flwr.core.heads import FullBatchGradient
from ovalp_flwr.core.quasi_newton import ServerLBFGS
from ovalp_flwr.federation.checkpoint import pack, unpack
from ovalp_flwr.federation.exchange import CountingGrid
from ovalp_flwr.federation.protocol import (CURVATURE, LOSSES, NUM_EXAMPLES, TRAIN_LOSS,
                                            to_record)
from ovalp_flwr.federation.replies import TrainReply, weighted_metrics
from ovalp_flwr.federation.secure_sum import secure_average
from ovalp_flwr.federation.costs import message_bytes
from ovalp_flwr.federation.strategy import Staged
from ovalp_flwr.ops.console import say

# |entry| a client's mean gradient, loss or curvature may have under SecAgg+: standardised
# features keep a mean gradient entry far below it; the quantisation step is 2·64 / 2^24 ≈ 8e-6
GRADIENT_CLIPPING = 64.0


class StagedLBFGS(Staged, FedAvg):
    """The round loop, sampling, screening and checkpoints of `Staged`; the server's step is
    L-BFGS on the exact gradient. `sizes`: each node's sample count as its `describe` reply
    gave it, the rows the objective is over; `patience`: the rounds in a row a node may miss
    before it is dropped from the objective (`lbfgs-patience`)."""

    def __init__(self, *, optimizer: ServerLBFGS, weight_decay: float, sizes: dict[int, int],
                 secure: bool = False, patience: int = 3, path: DecayPath | None = None,
                 **options) -> None:
        super().__init__(**options)
        self.optimizer = optimizer
        self.weight_decay = weight_decay
        self.path = path  # weight-decay "auto": the walk, scored by `score_validation`
        self.score_validation: Callable[[ArrayRecord], float] | None = None
        self.secure, self.sizes = secure, dict(sizes)
        self.patience = patience
        self.missed: dict[int, int] = {}  # node -> rounds in a row its gradient was missing
        self.dropped: list[int] = []  # nodes no longer in the objective, in the order dropped

    @property
    def total_examples(self) -> int:
        """The rows the objective is over: every node's still in it, as described."""
        return sum(self.sizes.values())

    def held(self, arrays: ArrayRecord) -> ArrayRecord:
        """L-BFGS's last accepted point: the heads the server would return (the point sent
        next is a trial the line search may take back)."""
        base = self.optimizer.base
        if base is None:
            return arrays
        return to_record({"weight": base.point[:, :-1].astype(np.float32),
                          "bias": base.point[:, -1].astype(np.float32)})

    def _combine(self, server_round: int, trained: list[TrainReply],
                 mean: dict[str, np.ndarray]) -> tuple[ArrayRecord, MetricRecord]:
        metrics = weighted_metrics(trained)
        counted = {reply.node: int(reply.metrics[NUM_EXAMPLES]) for reply in trained}
        return self._step(server_round, mean, metrics, counted), metrics

    def _step(self, server_round: int, mean: dict[str, np.ndarray], metrics: MetricRecord,
              counted: dict[int, int]) -> ArrayRecord:
        """The next heads from the mean gradient, loss and curvature over the rows `counted`
        (node -> rows): the same heads again unless they are every row of the objective."""
        record = self.rounds.setdefault(server_round, {})
        missing = self._missing(server_round, counted)
        if missing:
            record["server_step"] = "repeated"  # a partial sum is not the gradient
            if not self._drop_lasting(server_round, missing):
                return to_record(self._global)
            record["server_step"] = "restarted"  # from the held heads, on the rows still in it
            restart = self.held(to_record(self._global))
            self.optimizer.restart()
            return restart
        weight = self._global["weight"].astype(np.float64)
        point = np.column_stack([weight, self._global["bias"].astype(np.float64)])
        objective, gradient = self._penalised(point, mean, metrics)
        curvature = np.asarray(metrics[CURVATURE], np.float64)
        following, status = self.optimizer.next_point(point, objective, gradient, curvature)
        record.update(objective=float(objective.sum()), server_step=status,
                      gradient_norm=float(np.linalg.norm(gradient)),
                      steps_shortened=self.optimizer.shortened,
                      held_objective=float(self.optimizer.base.objective.sum()))
        if self.path is not None:
            record["weight_decay"] = self.weight_decay
            if self.path.tick():
                following = self._next_value(server_round, record, following, curvature)
        return to_record({"weight": following[:, :-1].astype(np.float32),
                          "bias": following[:, -1].astype(np.float32)})

    def _penalised(self, point: np.ndarray, mean: dict[str, np.ndarray], metrics: MetricRecord
                   ) -> tuple[np.ndarray, np.ndarray]:
        """F (per head under OvA, else one number) and ∇F at `point` from the clients' mean
        loss and gradient of the data term: the weight decay is the server's to add."""
        weight = point[:, :-1]
        gradient = np.column_stack([mean["weight"] + self.weight_decay * weight, mean["bias"]])
        penalty = 0.5 * self.weight_decay * np.sum(weight ** 2, axis=1)  # per head
        objective = (np.asarray(metrics[LOSSES], np.float64) + penalty  # F per head (OvA)
                     if self.optimizer.separable
                     else np.array([float(metrics[TRAIN_LOSS]) + penalty.sum()]))
        return objective, gradient

    def _next_value(self, server_round: int, record: dict, following: np.ndarray,
                    curvature: np.ndarray) -> np.ndarray:
        """The walk's step: the held heads scored on the validation rows, and the next weight
        decay (or the best, when the walk ends). Going on from the heads it holds, L-BFGS keeps
        its pairs, moved to the new penalty (`repenalise`), and takes its next step from there,
        so a switch costs no round; back to an earlier value's heads, it starts again there."""
        assert self.path is not None and self.score_validation is not None
        held = self.optimizer.base.point  # this round's replies judged the last step
        score = self.score_validation(self.held(to_record(self._global)))
        start = self.path.record(score, held)
        old, new = self.weight_decay, self.path.value
        say(INFO, "round %s: weight decay %.3g scores %.4f on the validation rows; %s %.3g",
            server_round, old, score,
            "the walk ends: going on at" if not self.path.walking else "next:", new)
        record.update(server_step="path", path_val_accuracy=score, next_weight_decay=new)
        if np.array_equal(start, held) and new == old:
            return following  # the walk ended at the value it was at
        self.weight_decay = new
        self.optimizer.preconditioner = self.optimizer.preconditioner.at(new)
        if np.array_equal(start, held):
            self.optimizer.repenalise(new - old)
            return self.optimizer.redirect(curvature)
        self.optimizer.restart()  # an earlier value's heads: no pair or point holds there
        return start

    def train_round(self, grid: Grid, server_round: int, arrays: ArrayRecord,
                    train_config: ConfigRecord, timeout: float
                    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Under SecAgg+, the round is one secure average of every node's gradient vector."""
        if not self.secure:
            return super().train_round(grid, server_round, arrays, train_config, timeout)
        started = time.perf_counter()
        self._global = {key: array.numpy() for key, array in arrays.items()}
        nodes = [n for n in self.sample(grid, server_round, 1.0, purpose=0) if n in self.sizes]
        counted = CountingGrid(grid)
        request = {**dict(train_config), **self.extra_train_config, "server-round": server_round}
        average = secure_average(counted, nodes, request, self.sizes,
                                 [self._global["weight"], self._global["bias"]],
                                 clipping_range=GRADIENT_CLIPPING)
        record = self.rounds.setdefault(server_round, {})
        record.update(stage=2, clients_sampled=len(nodes), aggregation="secagg+",
                      clients_failed=len(counted.errors),
                      bytes_sent_per_client=sum(map(message_bytes, counted.sent)) / max(len(nodes), 1),
                      bytes_received_per_client=sum(map(message_bytes, counted.received))
                      / max(len(nodes), 1), server_aggregate_seconds=time.perf_counter() - started)
        if average is None:  # the protocol halted: the same heads next round
            record.update(clients_replied=0, clients_trained=0, server_step="repeated")
            return None, None
        k, d = self._global["weight"].shape
        result = FullBatchGradient.from_vector(average.vector, k, d)
        record.update(clients_replied=len(average.contributors),
                      clients_trained=len(average.contributors), train_loss=result.loss)
        metrics = MetricRecord({TRAIN_LOSS: result.loss,
                                CURVATURE: [float(h) for h in result.curvature],
                                LOSSES: [float(loss) for loss in result.losses]})
        mean = {"weight": result.weight, "bias": result.bias}
        counted = {n: self.sizes[n] for n in average.contributors}
        return self._step(server_round, mean, metrics, counted), metrics

    def _missing(self, server_round: int, counted: dict[int, int]) -> list[int]:
        """The objective's nodes whose rows this round's sum lacks (each one's missed rounds
        in a row counted), or every node when the sum holds rows it should not."""
        expected = {node: rows for node, rows in self.sizes.items() if rows > 0}
        missing = [node for node in expected if counted.get(node) != expected[node]]
        strangers = [node for node in counted if counted[node] and node not in expected]
        for node in expected:
            self.missed[node] = self.missed.get(node, 0) + 1 if node in missing else 0
        return missing + strangers

    def _drop_lasting(self, server_round: int, missing: Iterable[int]) -> bool:
        """Drop from the objective every node that has now missed `patience` rounds in a row;
        whether any was. Its rows leave the objective, so L-BFGS's pairs no longer hold."""
        lasting = [node for node in missing if self.missed.get(node, 0) >= self.patience]
        for node in lasting:
            say(WARNING, "round %s: node %s missed %s rounds in a row: its %s rows leave the "
                "server's objective (lbfgs-patience), and L-BFGS restarts from the heads it "
                "holds", server_round, node, self.missed[node], self.sizes[node])
            self.sizes.pop(node)
            self.missed.pop(node)
            self.screen.excluded.add(node)  # no longer sampled: a gradient from it would not fit
            self.dropped.append(node)
        if lasting:
            self.rounds[server_round]["dropped_from_objective"] = lasting
        return bool(lasting)

    def state(self, partition_of: Callable[[int], int]) -> tuple[dict[str, np.ndarray], dict]:
        arrays, state = super().state(partition_of)
        optimizer_arrays, state["lbfgs"] = self.optimizer.state()
        state["lbfgs"]["missed"] = {str(partition_of(n)): count for n, count in self.missed.items()}
        state["lbfgs"]["dropped"] = [partition_of(n) for n in self.dropped]
        arrays.update(pack("lbfgs", optimizer_arrays))
        if self.path is not None:
            path_arrays, state["lbfgs"]["path"] = self.path.state()
            arrays.update(pack("path", path_arrays))
            state["lbfgs"]["weight_decay"] = self.weight_decay
        return arrays, state

    def restore(self, arrays: dict[str, np.ndarray], state: dict,
                node_of: Callable[[int], int]) -> None:
        super().restore(arrays, state, node_of)
        numbers = state["lbfgs"]
        self.optimizer.restore(unpack("lbfgs", arrays), numbers)
        self.missed = {node_of(int(pid)): count for pid, count in numbers.get("missed", {}).items()}
        self.dropped = [node_of(pid) for pid in numbers.get("dropped", [])]
        for node in self.dropped:
            self.sizes.pop(node, None)
        if self.path is not None:
            self.path.restore(unpack("path", arrays), numbers["path"])
            self.weight_decay = float(numbers["weight_decay"])
            self.optimizer.preconditioner = self.optimizer.preconditioner.at(self.weight_decay)
