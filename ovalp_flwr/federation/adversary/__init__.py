"""The attacks a run can rehearse (`attack`), one file each, found by name.

A new attack is its file here (an `Attack` subclass, `base.py`: it changes what it lies about,
the labels it trains on, its update, its statistics or the count it states) and its line in
`ATTACKS`. This module imports neither torch nor Flower, so `config` reads the names from it;
which clients attack, and the ClientApp mod that applies an attack, are `federation/attacks.py`.
"""

from __future__ import annotations

import importlib

ATTACKS = {  # attack -> "module:class" in this package
    "scale-10": "scaled:ScaleTen",
    "scale-100": "scaled:ScaleHundred",
    "sign-flip": "scaled:SignFlip",
    "label-flip": "label_flip:LabelFlip",
    "stats-flip": "stats_flip:StatsFlip",
    "stats-gram": "stats_gram:StatsGram",
    "stats-count": "stats_count:StatsCount",
}
UPDATES_ONLY = ("scale-10", "scale-100", "sign-flip")  # what the fine-tuning path can rehearse


def attack(kind: str):
    """The attack `kind` (an `Attack`)."""
    if kind not in ATTACKS:
        raise ValueError(f"attack={kind!r} is not allowed; use one of "
                         f"{', '.join(['none', *ATTACKS])}")
    module, name = ATTACKS[kind].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)()
