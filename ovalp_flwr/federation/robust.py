"""Robust aggregation of the heads' updates: what a round does with clients that send finite,
well-formed, hostile updates (scaled, sign-flipped, trained on flipped labels).

FedAvg's mean lets one client move the global model as far as it likes. Each rule in
`aggregators/` (one file each: median, trimmed mean, Multi-Krum, norm clipping, geometric
median) bounds that, from the replies of one round (`robust-aggregation`); this module runs
the chosen one.

SCAFFOLD: the server derives each client's control variate from its update, so a hostile update
would poison the shared variate c and, through it, every client's next round. Every rule
therefore hands the variates `admitted` replies: their updates clipped to the median norm, and,
under Multi-Krum, only the clients it kept (the others keep their last c_i, as if not sampled).
The two-stage schedule needs nothing more: the rule sees whichever heads the stage trains.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ovalp_flwr.federation.aggregators import aggregator
from ovalp_flwr.federation.aggregators.base import Arrays, RefusedRound, clipped
from ovalp_flwr.federation.replies import TrainReply

__all__ = ["RefusedRound", "RobustAggregation"]


@dataclasses.dataclass(frozen=True)
class RobustAggregation:
    """`kind` (a rule of `aggregators.RULES`) with its `fraction` of assumed attackers."""

    kind: str
    fraction: float = 0.1

    def __call__(self, replies: Sequence[TrainReply], global_arrays: Arrays,
                 server_round: int = 0, sampled: int = 0) -> tuple[Arrays, list[TrainReply]]:
        """The round's robust combination of the replies' models, and the replies the control
        variates may learn from (`admitted`). The round and the clients sampled: the rule's
        check reads the round (`privacy.PrivateRounds`, in the same place, reads both)."""
        rule = aggregator(self.kind, self.fraction)
        rule.check(len(replies), server_round)
        combined, admitted = rule.combine(replies, global_arrays,
                                          clipped(replies, global_arrays))
        dtypes = {key: value.dtype for key, value in replies[0].arrays.items()}
        return {key: np.asarray(value, dtypes[key]) for key, value in combined.items()}, admitted
