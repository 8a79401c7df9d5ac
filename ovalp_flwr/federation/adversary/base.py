"""What an attack may change: each hook gets what an honest client would send and returns the
lie; the defaults are honest, so an attack overrides only what it lies about."""

from __future__ import annotations

import numpy as np

Arrays = dict[str, np.ndarray]
FORGERY = 10.0  # the statistics forgeries' factor
REGISTRY: dict[str, type[Attack]] = {}  # `attack` value -> its class, filled as files load


class Attack:
    """An attacker's behaviour (`attack`); which clients attack is `attacks.attackers`. A
    subclass that sets `name` is that `attack` value: defining it registers it."""

    name = ""  # the `attack` value that picks this class ("" : a base for others)
    trains_on_lies = False  # True: the client's own training changes (its labels), not a reply
    updates_only = False  # True: it lies only in its update, so the encoder path can rehearse it

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("name"):
            return
        if cls.name in REGISTRY and REGISTRY[cls.name].__qualname__ != cls.__qualname__:
            raise ValueError(f"attack {cls.name!r} is defined twice: "
                             f"{REGISTRY[cls.name].__module__} and {cls.__module__}")
        REGISTRY[cls.name] = cls

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
