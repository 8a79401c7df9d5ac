"""`trimmed-mean`: per coordinate, the mean after cutting `robust-fraction` of the clients at
each end (Flower's `aggregate_trimmed_avg`, as `FedTrimmedAvg`); a round where that cuts
int(fraction · n) = 0 clients (the plain mean) is refused, and the run ends saying why."""

from __future__ import annotations

from flwr.server.strategy.aggregate import aggregate_trimmed_avg

from ovalp_flwr.federation.aggregators.base import Aggregator, with_flower


class TrimmedMean(Aggregator):
    def too_few(self, n):
        if int(self.fraction * n) > 0:
            return None
        return (f"trimmed-mean with robust-fraction={self.fraction} cuts int({self.fraction} x "
                f"{n}) = 0 of the {n} clients at each end, the plain mean; use "
                f"robust-fraction >= {1 / n:.3g} or more clients a round")

    def combine(self, replies, global_arrays, admitted):
        return with_flower(aggregate_trimmed_avg, replies, self.fraction), admitted
