"""What every start is, and the two that need no statistics: torch's random init and zeros."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ovalp_flwr.core.head_init.calibration import calibrate
from ovalp_flwr.core.head_init.statistics import ClassStatistics
from ovalp_flwr.core.heads import build_head
from ovalp_flwr.core.model import model_to_numpy

Head = tuple[np.ndarray, np.ndarray]  # weight [K, D] float32, bias [K] float32


class HeadInit:
    """Where the K heads start. A subclass names the statistics it needs from the clients
    (`statistics.KINDS`), its hyperparameters (as constructor arguments, from the run config)
    and how it turns the federation's sums into a linear head. Heads built from statistics
    are then calibrated for the run's loss (`calibration`), which keeps their argmax."""

    name: ClassVar[str]
    statistics: ClassVar[str] = "none"
    keeps_client_sums: ClassVar[bool] = False  # each client's class sums kept too (FedCOF)

    def linear_head(self, stats: ClassStatistics | None, num_features: int, num_classes: int,
                    seed: int) -> Head:
        raise NotImplementedError

    def build(self, stats: ClassStatistics | None, num_features: int, num_classes: int,
              seed: int, head: str, weight_decay: float = 0.0) -> Head:
        """The start the server sends in round 1 (the head scored as round 0); weight_decay:
        the L2 the calibration counts (the server optimiser's objective has it)."""
        if self.statistics != "none" and stats is None:
            raise ValueError(f"head-init={self.name!r} needs the clients' statistics; none came")
        weight, bias = self.linear_head(stats, num_features, num_classes, seed)
        if stats is None:
            return weight.astype(np.float32), bias.astype(np.float32)
        return calibrate(weight, bias, stats, head, seed, weight_decay)


class RandomInit(HeadInit):
    """torch's default `Linear` init, U(±1/√D), seeded: the paper's start."""

    name = "random"

    def linear_head(self, stats, num_features, num_classes, seed) -> Head:
        arrays = model_to_numpy(build_head(num_features, num_classes, seed))
        return arrays["weight"], arrays["bias"]


class ZerosInit(HeadInit):
    """All heads zero: every logit 0, so the first rounds' updates are not drowned by an init
    of full scale (under shard-1 FedAvg divides each head's stage-1 update by the clients)."""

    name = "zeros"

    def linear_head(self, stats, num_features, num_classes, seed) -> Head:
        return np.zeros((num_classes, num_features), np.float32), np.zeros(num_classes, np.float32)


def unit_rows(weight: np.ndarray, bias: np.ndarray, floor: float = 1e-6) -> Head:
    """Each head scaled to a unit weight vector, its bias with it (a class nobody holds stays 0)."""
    norms = np.maximum(np.linalg.norm(weight, axis=1), floor)
    return weight / norms[:, None], bias / norms
