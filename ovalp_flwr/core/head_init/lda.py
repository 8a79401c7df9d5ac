"""GH-OFL's closed-form LDA head (Turazza et al., "The Gaussian-Head OFL Family", ICLR 2026),
as its code builds it (github.com/FabioTur-dev/One-Shot-FL, `server/GH_OFL_server.py`): one
Gaussian per class with a pooled covariance, shrunk toward its mean variance,
    Σ = (XᵀX − Σ_c N_c μ_c μ_cᵀ) / (N − K),   S = (1 − α)Σ + α (tr Σ / D) I + 10⁻⁶ I,
    w_c = S⁻¹μ_c,   b_c = −½ μ_cᵀS⁻¹μ_c + log π_c        (π_c = N_c / N)
from the class sums, counts and Gram matrix (the same statistics as Fed3R's). Its other
closed-form heads are not linear in x (GH-NBdiag: a diagonal variance per class; GH-QDAfull: a
full covariance per class, K·D² floats), so they cannot start OvA-LP's linear heads.
"""

from __future__ import annotations

import numpy as np

from ovalp_flwr.core.head_init.base import Head, HeadInit

MIN_EPS = 1e-6  # GH-OFL's jitter on the shrunk covariance


class LDAInit(HeadInit):
    """GH-LDA's head; `lda_shrinkage` is its α (its configs' `lda_shrink`, 0.05). Scored as
    its code scores it: the raw weights and biases, not scaled to unit rows (the log priors
    in the biases would no longer match)."""

    name = "lda"
    statistics = "gram"

    def __init__(self, lda_shrinkage: float = 0.05) -> None:
        self.shrinkage = lda_shrinkage

    def linear_head(self, stats, num_features, num_classes, seed) -> Head:
        counts = stats.counts
        held = counts > 0
        means = stats.class_means
        covariance = pooled_covariance(stats)
        shrunk = ((1 - self.shrinkage) * covariance + (self.shrinkage * np.trace(covariance)
                  / num_features + MIN_EPS) * np.eye(num_features))
        weight = np.linalg.solve(shrunk, means.T).T
        log_prior = np.log(np.maximum(counts / counts.sum(), 1e-12))  # GH-OFL's floor
        bias = -0.5 * np.einsum("kd,kd->k", means, weight) + log_prior
        weight[~held], bias[~held] = 0.0, log_prior[~held]  # a class nobody holds: its prior only
        return weight, bias


def pooled_covariance(stats) -> np.ndarray:
    """The within-class covariance, pooled over the classes, from the federation's sums:
    (XᵀX − Σ_c S_c S_cᵀ / N_c) / (N − K)."""
    held = stats.counts > 0
    scatter = stats.gram - (stats.sums[held].T / stats.counts[held]) @ stats.sums[held]
    return (scatter + scatter.T) / 2 / max(stats.counts.sum() - stats.num_classes, 1.0)
