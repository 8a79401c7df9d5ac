"""FedCOF (Goswami et al., "Covariances for free", NeurIPS 2025): a ridge-style head from class
means only. The server estimates each class's covariance from how the clients' means of that
class spread, and the Gram matrix from those covariances without the between-class scatter.

As its code (github.com/dipamgoswami/FedCOF, `federate_classes.FedCOFServer`) defines it:
    Σ̂_c = Σ_k n_kc (μ_kc − μ_c)(μ_kc − μ_c)ᵀ / (K_c − 1)      (K_c clients hold class c; 1 if K_c = 1)
    Ĝ   = Σ_c (N_c − 1)(Σ̂_c + γI) + N ḡḡᵀ                      (ḡ: the global mean)
    W   = Ĝ⁺ S,  each head scaled to unit length, no bias      (S: the class sums)
Σ̂_c is unbiased for the class covariance when every client's rows of a class come from one
distribution (the clients' means of n_kc rows then have covariance Σ_c / n_kc).
"""

from __future__ import annotations

import numpy as np

from ovalp_flwr.core.head_init.base import Head, HeadInit, unit_rows
from ovalp_flwr.core.head_init.statistics import ClientSums


class FedCOFInit(HeadInit):
    """FedCOF's head; `fedcof_shrinkage` is its γ (its code's `--gamma_shrink`, default 1).

    Cost: each client sends what FedNCM's does, its per-class counts and sums, K·(D + 2)
    floats; the server keeps each client's (not only their sum), so it cannot run under
    SecAgg+, and the class means it reads are each client's own.
    """

    name = "fedcof"
    statistics = "class-sums"
    keeps_client_sums = True

    def __init__(self, fedcof_shrinkage: float = 1.0) -> None:
        self.shrinkage = fedcof_shrinkage

    def linear_head(self, stats, num_features, num_classes, seed) -> Head:
        if stats.clients is None:
            raise ValueError("head-init='fedcof' needs each client's class sums; the server kept "
                             "only their sum")
        gram = estimated_gram(stats.clients, num_classes, self.shrinkage)
        weight = (np.linalg.pinv(gram, hermitian=True) @ stats.sums.T).T
        return unit_rows(weight, np.zeros(num_classes))


def class_covariance(clients: ClientSums, label: int) -> np.ndarray:
    """Σ̂_c from the spread of the clients' means of class `label` (zero for one client)."""
    rows = clients.labels == label
    counts, sums = clients.counts[rows], clients.sums[rows]
    mean = sums.sum(axis=0) / counts.sum()
    centred = (sums / counts[:, None] - mean) * np.sqrt(counts)[:, None]
    return centred.T @ centred / max(int(rows.sum()) - 1, 1)


def estimated_gram(clients: ClientSums, num_classes: int, shrinkage: float) -> np.ndarray:
    """Ĝ: the within-class covariances, shrunk, weighted by N_c − 1, plus N ḡḡᵀ."""
    dim = clients.sums.shape[1]
    counts = np.bincount(clients.labels, weights=clients.counts, minlength=num_classes)
    total = clients.sums.sum(axis=0)
    gram = np.outer(total, total) / counts.sum()  # N ḡḡᵀ
    for label in np.flatnonzero(counts > 0):
        gram += (counts[label] - 1) * (class_covariance(clients, label) + shrinkage * np.eye(dim))
    return gram
