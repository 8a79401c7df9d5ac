"""Robust aggregation of the heads' updates: what a round does with clients that send finite,
well-formed, hostile updates (scaled, sign-flipped, trained on flipped labels).

FedAvg's mean lets one client move the global model as far as it likes. Each rule here bounds
that, from the replies of one round (`robust-aggregation`):

- `median`: the coordinate-wise median of the clients' models (Flower's `aggregate_median`;
  unweighted, as Flower's `FedMedian`);
- `trimmed-mean`: per coordinate, the mean after cutting `robust-fraction` of the clients at
  each end (Flower's `aggregate_trimmed_avg`, as `FedTrimmedAvg`); a round where that cuts
  int(fraction · n) = 0 clients (the plain mean) is refused, and the run ends saying why;
- `multi-krum`: the sample-weighted mean of the n - f clients whose models are closest to
  their n - f - 2 nearest neighbours, f = ⌈robust-fraction · n⌉ (Blanchard et al. 2017; the
  score Flower's `MultiKrum` uses); a round with n ≤ 2f + 2, where Krum's guarantee does not
  hold, is refused the same way;
- `norm-clip`: each client's update (its model minus the global one) clipped to the round's
  median update norm, then FedAvg's weighted mean: a client moves the model no further than a
  typical one (no fixed bound to tune).

SCAFFOLD: the server derives each client's control variate from its update, so a hostile update
would poison the shared variate c and, through it, every client's next round. Every rule
therefore hands the variates `admitted` replies: their updates clipped to the median norm, and,
under Multi-Krum, only the clients it kept (the others keep their last c_i, as if not sampled).
The two-stage schedule needs nothing more: the rule sees whichever heads the stage trains.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np
from flwr.server.strategy.aggregate import aggregate_median, aggregate_trimmed_avg

from ovalp_flwr.config import ROBUST_AGGREGATIONS
from ovalp_flwr.federation.errors import FederationError
from ovalp_flwr.federation.replies import TrainReply, weighted_mean

Arrays = dict[str, np.ndarray]


def updates(replies: Sequence[TrainReply], global_arrays: Arrays) -> list[Arrays]:
    """Each reply's model minus the global one, in float64."""
    return [{key: reply.arrays[key].astype(np.float64) - global_arrays[key] for key in global_arrays}
            for reply in replies]


def norm(arrays: Arrays) -> float:
    return math.sqrt(sum(float(np.sum(value * value)) for value in arrays.values()))


def clipped(replies: Sequence[TrainReply], global_arrays: Arrays) -> list[TrainReply]:
    """The replies with their updates scaled down to the round's median update norm."""
    deltas = updates(replies, global_arrays)
    norms = [norm(delta) for delta in deltas]
    bound = float(np.median(norms))
    out = []
    for reply, delta, size in zip(replies, deltas, norms):
        if size <= bound:
            out.append(reply)
            continue
        scale = bound / size
        arrays = {key: (global_arrays[key] + scale * delta[key]).astype(reply.arrays[key].dtype)
                  for key in global_arrays}
        out.append(dataclasses.replace(reply, arrays=arrays))
    return out


class RefusedRound(FederationError):
    """A round the rule cannot defend with the clients it has: it would not do what it says."""


def check_defended(kind: str, fraction: float, n: int, server_round: int) -> None:
    """Refuse a round where the trimmed mean would trim no one, or Multi-Krum's n ≤ 2f + 2."""
    if kind == "trimmed-mean" and int(fraction * n) == 0:
        raise RefusedRound(f"round {server_round}: trimmed-mean with robust-fraction={fraction} "
                           f"cuts int({fraction} x {n}) = 0 of the {n} clients at each end, the "
                           f"plain mean; use robust-fraction >= {1 / n:.3g} or more clients a round")
    if kind == "multi-krum" and n <= 2 * math.ceil(fraction * n) + 2:
        f = math.ceil(fraction * n)
        raise RefusedRound(f"round {server_round}: multi-krum with robust-fraction={fraction} "
                           f"assumes f = {f} hostile of the {n} clients, and Krum needs "
                           f"n > 2f + 2 = {2 * f + 2}; use a smaller robust-fraction or more "
                           "clients a round")


def krum_kept(replies: Sequence[TrainReply], fraction: float) -> list[TrainReply]:
    """The n - f replies with the lowest Krum scores (the summed squared distances to their
    n - f - 2 nearest neighbours), in their original order (n > 2f + 2: `check_defended`)."""
    n = len(replies)
    f = math.ceil(fraction * n)
    flat = np.stack([np.concatenate([reply.arrays[key].astype(np.float64).ravel()
                                     for key in sorted(reply.arrays)]) for reply in replies])
    squared = np.sum(flat ** 2, axis=1)
    distances = np.maximum(squared[:, None] + squared[None, :] - 2.0 * flat @ flat.T, 0.0)
    closest = max(1, n - f - 2)
    scores = np.sort(distances, axis=1)[:, 1:closest + 1].sum(axis=1)
    kept = sorted(np.argsort(scores, kind="stable")[:n - f])
    return [replies[i] for i in kept]


def _flower(rule: Callable, replies: Sequence[TrainReply], *args) -> Arrays:
    """A Flower aggregate function over the replies' arrays (a list per reply, keys sorted)."""
    keys = sorted(replies[0].arrays)
    results = [([reply.arrays[key] for key in keys], int(reply.weight)) for reply in replies]
    return dict(zip(keys, rule(results, *args)))


@dataclasses.dataclass(frozen=True)
class RobustAggregation:
    """`kind` (one of ROBUST_AGGREGATIONS but "none") with its `fraction` of assumed attackers."""

    kind: str
    fraction: float = 0.1

    def __call__(self, replies: Sequence[TrainReply], global_arrays: Arrays,
                 server_round: int = 0, sampled: int = 0) -> tuple[Arrays, list[TrainReply]]:
        """The round's robust combination of the replies' models, and the replies the control
        variates may learn from (`admitted`). The round and the clients sampled are
        `privacy.PrivateRounds`'s, which is called here too."""
        check_defended(self.kind, self.fraction, len(replies), server_round)
        admitted = clipped(replies, global_arrays)
        if self.kind == "median":
            combined = _flower(aggregate_median, replies)
        elif self.kind == "trimmed-mean":
            combined = _flower(aggregate_trimmed_avg, replies, self.fraction)
        elif self.kind == "multi-krum":
            kept = {reply.node for reply in krum_kept(replies, self.fraction)}
            combined = weighted_mean([r for r in replies if r.node in kept])
            admitted = [r for r in admitted if r.node in kept]
        elif self.kind == "norm-clip":
            combined = weighted_mean(admitted)
        else:
            raise ValueError(f"robust-aggregation={self.kind!r} is not allowed; use one of "
                             f"{', '.join(ROBUST_AGGREGATIONS)}")
        dtypes = {key: value.dtype for key, value in replies[0].arrays.items()}
        return {key: np.asarray(value, dtypes[key]) for key, value in combined.items()}, admitted
