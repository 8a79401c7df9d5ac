"""`stats-count`: its class counts times 10, and the sample count it describes and trains with
too, as if it held 10 times the rows, the extra ones zero: within what `describe` allows, and
ten times FedAvg's weight."""

from __future__ import annotations

from ovalp_flwr.federation.adversary.base import FORGERY, Attack


class StatsCount(Attack):
    name = "stats-count"

    def statistics(self, arrays):
        return {**arrays, "counts": (FORGERY * arrays["counts"]).astype(arrays["counts"].dtype)}

    def count(self, examples):
        return int(FORGERY * examples)
