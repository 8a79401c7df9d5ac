"""Ours at the Gram's bytes, chosen on validation rows: of the heads the class sums and the Gram
matrix give, the one most accurate on the rows no client trains on.

The candidates are our ridge start along its penalty path (`ridge.LAMBDA_GRID`, one
eigendecomposition) and GH-OFL's LDA along a shrinkage path (`LDA_GRID`, a solve each): the
same statistics, so no more bytes. Neither family wins everywhere (docs/closed-form-starts.md):
LDA's shared within-class covariance and class priors beat the regression onto one-hot targets
on CIFAR-10 and AG News, ridge leads on digits. Ties go to ridge, then to the larger penalty or
shrinkage (the smoother head).
"""

from __future__ import annotations

import numpy as np

from ovalp_flwr.core.head_init.base import Head, HeadInit
from ovalp_flwr.core.head_init.lda import LDAInit
from ovalp_flwr.core.head_init.ridge import RidgeInit, lambda_path
from ovalp_flwr.core.head_init.statistics import ClassStatistics

LDA_GRID = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)  # α, GH-OFL's 0.05 among them


class ChosenInit(HeadInit):
    """`head-init = "auto"`: stands for the head `choose_head` picks once the validation rows
    are there; it builds nothing itself."""

    name = "auto"
    statistics = "gram"

    def linear_head(self, stats, num_features, num_classes, seed) -> Head:
        raise ValueError("head-init='auto' builds the head choose_head picks on validation rows")


def choose_head(stats: ClassStatistics, features: np.ndarray, labels: np.ndarray
                ) -> tuple[HeadInit, dict]:
    """The candidate most accurate on (features, labels), and what `summary.json` says of the
    choice: every candidate's validation accuracy."""
    path = lambda_path(stats, features, labels)
    # (accuracy, family: ridge 1 over LDA 0 on ties, its regularisation, the start)
    scored: list[tuple[float, int, float, HeadInit]] = [
        (accuracy, 1, lam, RidgeInit(lam)) for lam, accuracy in zip(path.grid, path.accuracy)]
    num_features, num_classes = stats.sums.shape[1], stats.num_classes
    for alpha in LDA_GRID:
        weight, bias = LDAInit(alpha).linear_head(stats, num_features, num_classes, 0)
        accuracy = float(np.mean(np.argmax(features @ weight.T + bias, axis=1) == labels))
        scored.append((accuracy, 0, alpha, LDAInit(alpha)))
    accuracy, _, value, init = max(scored, key=lambda c: c[:3])
    return init, {"chosen_head": init.name,
                  "ridge_lambda" if init.name == "ridge" else "lda_shrinkage": value,
                  "chosen_val_accuracy": accuracy,
                  "lambda_path": {"grid": list(path.grid), "val_accuracy": list(path.accuracy)},
                  "lda_path": {"grid": list(LDA_GRID),
                               "val_accuracy": [c[0] for c in scored if c[1] == 0]}}
