"""Where the heads start: one small class per start (`head-init` in the run config).

- `random`: torch's default init (the paper's); `zeros`;
- `class-means`: FedNCM's class means;
- `fedcof`: FedCOF's head from the spread of the clients' class means (FedNCM's bytes);
- `fed3r`: Fed3R's ridge regression, as its code applies it (its absolute λ, no bias);
- `lda`: GH-OFL's closed-form LDA head (pooled covariance, shrunk; the Gram's bytes);
- `ridge`: ours, Fed3R's regression with a bias and λ per sample;
- `low-rank`: ours between the budgets, `ridge` on a Gram matrix each client sends in low rank;
- `auto`: ours at the Gram's bytes, ridge or LDA, whichever the validation rows prefer.

The starts from statistics are built by the server from sums the clients send once
(`statistics`) and calibrated for the run's loss (`calibration`). With `num-server-rounds = 0`
the start is the whole run: FedNCM, FedCOF or Fed3R as published, with no gradient rounds.
"""

from __future__ import annotations

import inspect

from ovalp_flwr.core.head_init.base import Head, HeadInit, RandomInit, ZerosInit
from ovalp_flwr.core.head_init.chosen import ChosenInit
from ovalp_flwr.core.head_init.class_means import ClassMeansInit
from ovalp_flwr.core.head_init.fed3r import Fed3RInit
from ovalp_flwr.core.head_init.fedcof import FedCOFInit
from ovalp_flwr.core.head_init.lda import LDAInit
from ovalp_flwr.core.head_init.low_rank import LowRankInit
from ovalp_flwr.core.head_init.ridge import RidgeInit
from ovalp_flwr.core.head_init.statistics import ClassStatistics

HEAD_INITS: dict[str, type[HeadInit]] = {init.name: init for init in (
    RandomInit, ZerosInit, ClassMeansInit, FedCOFInit, Fed3RInit, LDAInit, RidgeInit,
    LowRankInit, ChosenInit)}


def make_head_init(name: str, **hyperparameters: float) -> HeadInit:
    """The start named by `head-init`, given the hyperparameters its constructor names (of the
    run config's, by their snake_case names: ridge_lambda, fed3r_lambda, fedcof_shrinkage,
    lda_shrinkage, gram_rank); the others are ignored."""
    if name not in HEAD_INITS:
        raise ValueError(f"head-init={name!r} is not allowed; choose one of: {', '.join(HEAD_INITS)}")
    init = HEAD_INITS[name]
    own = inspect.signature(init.__init__).parameters
    return init(**{key: value for key, value in hyperparameters.items() if key in own})


__all__ = ["HEAD_INITS", "ClassStatistics", "Head", "HeadInit", "make_head_init"]
