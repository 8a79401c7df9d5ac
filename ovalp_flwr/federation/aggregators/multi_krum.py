"""`multi-krum`: the sample-weighted mean of the n - f clients whose models are closest to their
n - f - 2 nearest neighbours, f = ⌈robust-fraction · n⌉ (Blanchard et al. 2017; the score
Flower's `MultiKrum` uses); a round with n ≤ 2f + 2, where Krum's guarantee does not hold, is
refused. Only the clients it keeps pass their updates on to the control variates."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ovalp_flwr.federation.aggregators.base import Aggregator, flattened
from ovalp_flwr.federation.replies import TrainReply, weighted_mean


def krum_kept(replies: Sequence[TrainReply], fraction: float) -> list[TrainReply]:
    """The n - f replies with the lowest Krum scores (the summed squared distances to their
    n - f - 2 nearest neighbours), in their original order (n > 2f + 2: `MultiKrum.check`)."""
    n = len(replies)
    f = math.ceil(fraction * n)
    flat = flattened(replies)
    squared = np.sum(flat ** 2, axis=1)
    distances = np.maximum(squared[:, None] + squared[None, :] - 2.0 * flat @ flat.T, 0.0)
    closest = max(1, n - f - 2)
    scores = np.sort(distances, axis=1)[:, 1:closest + 1].sum(axis=1)
    kept = sorted(np.argsort(scores, kind="stable")[:n - f])
    return [replies[i] for i in kept]


class MultiKrum(Aggregator):
    def too_few(self, n):
        f = math.ceil(self.fraction * n)
        if n > 2 * f + 2:
            return None
        return (f"multi-krum with robust-fraction={self.fraction} assumes f = {f} hostile of "
                f"the {n} clients, and Krum needs n > 2f + 2 = {2 * f + 2}; use a smaller "
                "robust-fraction or more clients a round")

    def combine(self, replies, global_arrays, admitted):
        kept = {reply.node for reply in krum_kept(replies, self.fraction)}
        return (weighted_mean([r for r in replies if r.node in kept]),
                [r for r in admitted if r.node in kept])
