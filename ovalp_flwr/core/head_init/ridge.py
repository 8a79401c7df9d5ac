"""Fed3R (Fanì et al., ICML 2024): ridge regression onto one-hot labels, solved in closed form."""

from __future__ import annotations

import numpy as np

from ovalp_flwr.core.head_init.base import Head, HeadInit, unit_rows


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

    def __init__(self, ridge_lambda: float) -> None:
        self.ridge_lambda = ridge_lambda

    def linear_head(self, stats, num_features, num_classes, seed) -> Head:
        n = stats.counts.sum()
        total = stats.total
        system = np.block([[stats.gram, total[:, None]], [total[None, :], np.array([[n]])]])
        system += n * self.ridge_lambda * np.eye(num_features + 1)
        targets = np.vstack([stats.sums.T, stats.counts[None, :]])  # X̃ᵀY: [D + 1, K]
        solution = np.linalg.solve(system, targets)
        return unit_rows(solution[:-1].T, solution[-1])
