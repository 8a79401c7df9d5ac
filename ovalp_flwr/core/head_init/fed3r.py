"""Fed3R (Fanì et al., ICML 2024) as its code applies it: W = (G + λI)⁻¹ S, with the Gram matrix
G = XᵀX and class sums S of the federation, an absolute λ (its published 0.01 whatever the
number of rows), no bias, each head scaled to unit length before it is scored."""

from __future__ import annotations

import numpy as np

from ovalp_flwr.core.head_init.base import Head, HeadInit, unit_rows


class Fed3RInit(HeadInit):
    """Fed3R's head with its own λ (`fed3r-lambda`). Ours, `ridge`, adds a bias and counts λ per
    sample (nλ), so that one value means the same on every dataset: at n rows, `ridge` with
    λ = 0.01 / n and no bias would be this head.

    Cost: the Gram matrix besides the class sums, D(D+1)/2 + K·(D + 2) floats a client.
    """

    name = "fed3r"
    statistics = "gram"

    def __init__(self, fed3r_lambda: float = 0.01) -> None:
        self.fed3r_lambda = fed3r_lambda

    def linear_head(self, stats, num_features, num_classes, seed) -> Head:
        system = stats.gram + self.fed3r_lambda * np.eye(num_features)
        weight = np.linalg.solve(system, stats.sums.T).T
        return unit_rows(weight, np.zeros(num_classes))
