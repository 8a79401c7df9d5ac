"""What an attack may change: each hook gets what an honest client would send and returns the
lie; the defaults are honest, so an attack overrides only what it lies about."""

from __future__ import annotations

import numpy as np

Arrays = dict[str, np.ndarray]
FORGERY = 10.0  # the statistics forgeries' factor


class Attack:
    """An attacker's behaviour (`attack`); which clients attack is `attacks.attackers`."""

    trains_on_lies = False  # True: the client's own training changes (its labels), not a reply

    def labels(self, labels, num_classes: int):
        """The labels it trains on (a torch tensor)."""
        return labels

    def update(self, arrays: Arrays, sent: Arrays, gradient: bool) -> Arrays:
        """Its train reply's arrays (`sent`: the global ones; `gradient`: a full-batch
        gradient reply of the server's L-BFGS)."""
        return arrays

    def statistics(self, arrays: Arrays) -> Arrays:
        """Its class statistics, in wire form (`ClassStatistics.to_arrays`)."""
        return arrays

    def count(self, examples: int) -> int:
        """The sample count its replies state."""
        return examples
