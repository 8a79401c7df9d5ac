"""`geometric-median`: the point that minimises the sample-weighted sum of Euclidean distances
to the clients' models (RFA, Pillutla, Kakade and Harchaoui 2022), by their smoothed Weiszfeld
iterations from the weighted mean. Its breakdown point is one half of the weight: attackers
holding less than half of it move the result a bounded distance, however far they send their
models, and unlike the coordinate-wise median it treats the model as one vector (rotation-
invariant). Not in Flower 1.42; the reference package (`geom_median`, GPL-3.0) cannot be a
dependency here, and the iteration is a few lines. `robust-fraction` is not read."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ovalp_flwr.federation.aggregators.base import Aggregator, flattened, unflattened

SMOOTHING = 1e-6  # ν: distances below it count as ν (Weiszfeld's step stays defined at a point)
ITERATIONS = 100  # at most; it stops once the objective moves by less than TOLERANCE
TOLERANCE = 1e-7  # relative change of the weighted distance sum


def geometric_median(points: np.ndarray, weights: Sequence[float]) -> np.ndarray:
    """The weighted geometric median of the rows of `points` (smoothed Weiszfeld)."""
    alphas = np.asarray(weights, np.float64) / float(np.sum(weights))
    median = alphas @ points
    objective = float(alphas @ np.linalg.norm(points - median, axis=1))
    for _ in range(ITERATIONS):
        betas = alphas / np.maximum(np.linalg.norm(points - median, axis=1), SMOOTHING)
        median = betas @ points / betas.sum()
        previous, objective = objective, float(alphas @ np.linalg.norm(points - median, axis=1))
        if abs(previous - objective) <= TOLERANCE * max(objective, 1e-30):
            break
    return median


class GeometricMedian(Aggregator):
    def combine(self, replies, global_arrays, admitted):
        median = geometric_median(flattened(replies), [reply.weight for reply in replies])
        return unflattened(median, replies[0].arrays), admitted
