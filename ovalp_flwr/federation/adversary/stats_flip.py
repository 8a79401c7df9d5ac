"""`stats-flip`: its class sums negated, as if each class's rows were reflected through the
origin (counts, square norms and Gram matrix are then unchanged)."""

from __future__ import annotations

from ovalp_flwr.federation.adversary.base import Attack


class StatsFlip(Attack):
    name = "stats-flip"

    def statistics(self, arrays):
        return {**arrays, "sums": -arrays["sums"]}
