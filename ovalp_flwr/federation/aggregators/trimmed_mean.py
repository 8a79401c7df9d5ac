"""`trimmed-mean`: per coordinate, the mean after cutting `robust-fraction` of the clients at
each end (Flower's `aggregate_trimmed_avg`, as `FedTrimmedAvg`); a round where that cuts
int(fraction · n) = 0 clients (the plain mean) is refused, and the run ends saying why."""

from __future__ import annotations

from flwr.server.strategy.aggregate import aggregate_trimmed_avg

from ovalp_flwr.federation.aggregators.base import Aggregator, RefusedRound, with_flower


class TrimmedMean(Aggregator):
    def check(self, n, server_round):
        if int(self.fraction * n) == 0:
            raise RefusedRound(
                f"round {server_round}: trimmed-mean with robust-fraction={self.fraction} cuts "
                f"int({self.fraction} x {n}) = 0 of the {n} clients at each end, the plain "
                f"mean; use robust-fraction >= {1 / n:.3g} or more clients a round")

    def combine(self, replies, global_arrays, admitted):
        return with_flower(aggregate_trimmed_avg, replies, self.fraction), admitted
