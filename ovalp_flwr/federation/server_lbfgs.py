"""`server-optimizer = "lbfgs"`: rounds in which the clients send their full-batch gradient and
the server takes L-BFGS steps on the centralised objective (`core.quasi_newton`).

A round: every client gets the heads and `gradient = 1` in its config; it replies with the
mean loss, gradient and heads' curvature on all its rows (`ova.client._gradient_reply`). The
replies pass the same screen as trained ones (shapes, sample counts, finiteness), their
sample-weighted mean is the centralised gradient, and the server adds the weight decay once. A
round whose replies do not cover every row the federation described (a node timed out, or a
reply was refused) would give a wrong gradient: the server sends the same heads again instead.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp.strategy import FedAvg

from ovalp_flwr.core.quasi_newton import ServerLBFGS
from ovalp_flwr.federation.checkpoint import pack, unpack
from ovalp_flwr.federation.protocol import CURVATURE, NUM_EXAMPLES, TRAIN_LOSS, to_record
from ovalp_flwr.federation.replies import TrainReply, weighted_metrics
from ovalp_flwr.federation.strategy import Staged


class StagedLBFGS(Staged, FedAvg):
    """The round loop, sampling, screening and checkpoints of `Staged`; the server's step is
    L-BFGS on the exact gradient."""

    def __init__(self, *, optimizer: ServerLBFGS, weight_decay: float, total_examples: int,
                 **options) -> None:
        super().__init__(**options)
        self.optimizer = optimizer
        self.weight_decay = weight_decay
        self.total_examples = total_examples  # the rows the objective is over

    def _combine(self, server_round: int, trained: list[TrainReply],
                 mean: dict[str, np.ndarray]) -> tuple[ArrayRecord, MetricRecord]:
        metrics = weighted_metrics(trained)
        record = self.rounds.setdefault(server_round, {})
        examples = sum(int(reply.metrics[NUM_EXAMPLES]) for reply in trained)
        if examples != self.total_examples:
            record["server_step"] = "repeated"  # a partial sum is not the gradient
            return to_record(self._global), metrics
        weight = self._global["weight"].astype(np.float64)
        point = np.column_stack([weight, self._global["bias"].astype(np.float64)])
        gradient = np.column_stack([mean["weight"] + self.weight_decay * weight, mean["bias"]])
        objective = float(metrics[TRAIN_LOSS]) + 0.5 * self.weight_decay * float(np.sum(weight ** 2))
        curvature = np.asarray(metrics[CURVATURE], np.float64)
        following, status = self.optimizer.next_point(point, objective, gradient, curvature)
        record.update(objective=objective, gradient_norm=float(np.linalg.norm(gradient)),
                      server_step=status)
        return to_record({"weight": following[:, :-1].astype(np.float32),
                          "bias": following[:, -1].astype(np.float32)}), metrics

    def state(self, partition_of: Callable[[int], int]) -> tuple[dict[str, np.ndarray], dict]:
        arrays, state = super().state(partition_of)
        optimizer_arrays, state["lbfgs"] = self.optimizer.state()
        arrays.update(pack("lbfgs", optimizer_arrays))
        return arrays, state

    def restore(self, arrays: dict[str, np.ndarray], state: dict,
                node_of: Callable[[int], int]) -> None:
        super().restore(arrays, state, node_of)
        self.optimizer.restore(unpack("lbfgs", arrays), state["lbfgs"])
