"""What every robust rule shares: the interface the round calls, and the update arithmetic."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from ovalp_flwr.federation.errors import FederationError
from ovalp_flwr.federation.replies import TrainReply

Arrays = dict[str, np.ndarray]


class RefusedRound(FederationError):
    """A round the rule cannot defend with the clients it has: it would not do what it says."""


@dataclasses.dataclass(frozen=True)
class Aggregator:
    """One robust rule with its `fraction` of assumed attackers (`robust-fraction`)."""

    fraction: float = 0.1

    def too_few(self, n: int) -> str | None:
        """Why `n` clients in a round are too few for the rule to do what it says; None if
        they are not. The launchers ask it before Flower starts (`ops/preflight.py`)."""
        return None

    def check(self, n: int, server_round: int) -> None:
        """Raise `RefusedRound` where `n` clients are too few for the rule to hold."""
        if (reason := self.too_few(n)) is not None:
            raise RefusedRound(f"round {server_round}: {reason}")

    def combine(self, replies: Sequence[TrainReply], global_arrays: Arrays,
                admitted: list[TrainReply]) -> tuple[Arrays, list[TrainReply]]:
        """The round's combination of the replies' models (float64 is fine), and the replies
        the control variates may learn from (`admitted`: each update clipped to the round's
        median norm; a rule that keeps some clients passes only theirs on)."""
        raise NotImplementedError


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


def flattened(replies: Sequence[TrainReply]) -> np.ndarray:
    """One float64 row per reply: its arrays, keys sorted, raveled."""
    return np.stack([np.concatenate([reply.arrays[key].astype(np.float64).ravel()
                                     for key in sorted(reply.arrays)]) for reply in replies])


def unflattened(row: np.ndarray, like: Arrays) -> Arrays:
    """`flattened`'s inverse for one row, shaped as `like`."""
    out, start = {}, 0
    for key in sorted(like):
        size = like[key].size
        out[key] = row[start:start + size].reshape(like[key].shape)
        start += size
    return out


def with_flower(rule: Callable, replies: Sequence[TrainReply], *args) -> Arrays:
    """A Flower aggregate function over the replies' arrays (a list per reply, keys sorted)."""
    keys = sorted(replies[0].arrays)
    results = [([reply.arrays[key] for key in keys], int(reply.weight)) for reply in replies]
    return dict(zip(keys, rule(results, *args)))
