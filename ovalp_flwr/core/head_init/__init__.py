"""Where the heads start: one small class per start (`head-init` in the run config).

- `random`: torch's default init (the paper's); `zeros`;
- `class-means`: FedNCM's class means;
- `ridge`: Fed3R's closed-form ridge regression.

The last two are built by the server from sums the clients send once (`statistics`) and
calibrated for the run's loss (`calibration`). With `num-server-rounds = 0` the start is the
whole run: FedNCM or Fed3R as published, with no gradient rounds.
"""

from __future__ import annotations

from ovalp_flwr.core.head_init.base import Head, HeadInit, RandomInit, ZerosInit
from ovalp_flwr.core.head_init.class_means import ClassMeansInit
from ovalp_flwr.core.head_init.ridge import RidgeInit
from ovalp_flwr.core.head_init.statistics import ClassStatistics

HEAD_INITS: dict[str, type[HeadInit]] = {
    init.name: init for init in (RandomInit, ZerosInit, ClassMeansInit, RidgeInit)}


def make_head_init(name: str, ridge_lambda: float = 0.2) -> HeadInit:
    """The start named by `head-init`, with its hyperparameters from the run config."""
    if name not in HEAD_INITS:
        raise ValueError(f"head-init={name!r} is not allowed; choose one of: {', '.join(HEAD_INITS)}")
    if HEAD_INITS[name] is RidgeInit:
        return RidgeInit(ridge_lambda)
    return HEAD_INITS[name]()


__all__ = ["HEAD_INITS", "ClassStatistics", "Head", "HeadInit", "make_head_init"]
