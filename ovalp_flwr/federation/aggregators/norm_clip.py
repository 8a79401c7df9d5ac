"""`norm-clip`: each client's update (its model minus the global one) clipped to the round's
median update norm, then FedAvg's weighted mean: a client moves the model no further than a
typical one (no fixed bound to tune)."""

from __future__ import annotations

from ovalp_flwr.federation.aggregators.base import Aggregator
from ovalp_flwr.federation.replies import weighted_mean


class NormClip(Aggregator):
    def combine(self, replies, global_arrays, admitted):
        return weighted_mean(admitted), admitted
