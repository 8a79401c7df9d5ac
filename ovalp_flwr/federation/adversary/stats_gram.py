"""`stats-gram`: its Gram matrix and square norms times 10, as if its rows were √10 times
longer."""

from __future__ import annotations

from ovalp_flwr.federation.adversary.base import FORGERY, Attack


class StatsGram(Attack):
    name = "stats-gram"

    def statistics(self, arrays):
        return {**arrays, **{key: (FORGERY * arrays[key]).astype(arrays[key].dtype)
                             for key in ("square-norms", "gram-triu") if key in arrays}}
