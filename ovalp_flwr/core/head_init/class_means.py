"""FedNCM (Legate et al., NeurIPS 2023): every head is its class's mean feature, unit length."""

from __future__ import annotations

import numpy as np

from ovalp_flwr.core.head_init.base import Head, HeadInit, unit_rows


class ClassMeansInit(HeadInit):
    """Head c = μ_c / ‖μ_c‖ with no bias: the nearest-class-mean classifier by cosine.

    Cost: each client sends its per-class counts, feature sums and square norms, K·(D + 2)
    floats (the size of one head). The means are of the run's normalised features, so with
    `standardize` they are centred on the federation's mean.
    """

    name = "class-means"
    statistics = "class-sums"

    def linear_head(self, stats, num_features, num_classes, seed) -> Head:
        return unit_rows(stats.class_means, np.zeros(num_classes))
