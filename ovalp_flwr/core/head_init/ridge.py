"""Fed3R (Fanì et al., ICML 2024): ridge regression onto one-hot labels, solved in closed form."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from ovalp_flwr.core.head_init.base import Head, HeadInit, unit_rows
from ovalp_flwr.core.head_init.statistics import ClassStatistics

# ridge-lambda "auto": the penalties scored, 4 a decade from 1e-6 to 1e3 (0.2's decade included)
LAMBDA_GRID = tuple(float(x) for x in np.logspace(-6, 3, 37))


class RidgeInit(HeadInit):
    """[W; b] = (X̃ᵀX̃ + nλI)⁻¹ X̃ᵀY with X̃ = [X, 1], then every head scaled to unit length, as
    Fed3R's code scores it. The centralised solution on any partition: X̃ᵀX̃ and X̃ᵀY are sums.

    λ is per training sample (the system's penalty is nλ), so one value means the same on
    datasets of any size. Fed3R's published λ = 0.01 is absolute: λ = 0.01 / n here. Small λ
    gives the best ridge classifier; a larger one (the default) a start whose gradient rounds
    end higher (README, "Closed-form starts").

    Cost: each client sends its Gram matrix besides the class sums, D(D+1)/2 more floats
    (3.3 MB at D = 1280 in float32).
    """

    name = "ridge"
    statistics = "gram"

    def __init__(self, ridge_lambda: float = 0.2) -> None:  # the run config's default
        self.ridge_lambda = ridge_lambda

    def at(self, ridge_lambda: float) -> "RidgeInit":
        """This start at another penalty (`ridge-lambda = "auto"` chooses one)."""
        chosen = copy.copy(self)
        chosen.ridge_lambda = ridge_lambda
        return chosen

    def linear_head(self, stats, num_features, num_classes, seed) -> Head:
        system, targets = _system(stats)
        system += stats.counts.sum() * self.ridge_lambda * np.eye(num_features + 1)
        solution = np.linalg.solve(system, targets)
        return unit_rows(solution[:-1].T, solution[-1])


def _system(stats: ClassStatistics) -> tuple[np.ndarray, np.ndarray]:
    """X̃ᵀX̃ [D + 1, D + 1] and X̃ᵀY [D + 1, K] from the federation's sums."""
    n, total = stats.counts.sum(), stats.total
    system = np.block([[stats.gram, total[:, None]], [total[None, :], np.array([[n]])]])
    return system, np.vstack([stats.sums.T, stats.counts[None, :]])


@dataclass(frozen=True)
class LambdaPath:
    """ridge-lambda "auto": each penalty of the grid and the start's validation accuracy at it;
    `chosen` the best (the largest of equals: the smoother start)."""

    grid: tuple[float, ...]
    accuracy: tuple[float, ...]

    @property
    def chosen(self) -> float:
        best = max(self.accuracy)
        return max(lam for lam, acc in zip(self.grid, self.accuracy) if acc == best)


def lambda_path(stats: ClassStatistics, features: np.ndarray, labels: np.ndarray,
                grid: tuple[float, ...] = LAMBDA_GRID) -> LambdaPath:
    """The ridge start's accuracy on validation rows at every penalty of `grid`, from one
    eigendecomposition of X̃ᵀX̃ = QΛQᵀ: (X̃ᵀX̃ + nλI)⁻¹X̃ᵀY = Q (Λ + nλ)⁻¹ QᵀX̃ᵀY, a product
    per penalty instead of a solve. Scored as the start is (unit heads; calibration keeps the
    argmax)."""
    system, targets = _system(stats)
    eigenvalues, basis = np.linalg.eigh(system)
    eigenvalues = np.maximum(eigenvalues, 0.0)  # X̃ᵀX̃ is PSD: below 0 is rounding
    projected = basis.T @ targets  # QᵀX̃ᵀY [D + 1, K]
    n = stats.counts.sum()
    accuracy = []
    for lam in grid:
        solution = basis @ (projected / (eigenvalues + n * lam)[:, None])
        weight, bias = unit_rows(solution[:-1].T, solution[-1])
        logits = features @ weight.T + bias
        accuracy.append(float(np.mean(np.argmax(logits, axis=1) == labels)))
    return LambdaPath(tuple(grid), tuple(accuracy))
