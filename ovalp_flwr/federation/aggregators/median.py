"""`median`: the coordinate-wise median of the clients' models (Flower's `aggregate_median`;
unweighted, as Flower's `FedMedian`)."""

from __future__ import annotations

from flwr.server.strategy.aggregate import aggregate_median

from ovalp_flwr.federation.aggregators.base import Aggregator, with_flower


class Median(Aggregator):
    def combine(self, replies, global_arrays, admitted):
        return with_flower(aggregate_median, replies), admitted
