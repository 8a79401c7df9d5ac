"""The attacks a run can rehearse (`attack`), one file each, found by name.

A new attack is one file here: an `Attack` subclass (`base.py`) with its `name`, changing what
it lies about (the labels it trains on, its update, its statistics or the count it states).
Every file of this folder is imported once, and each named subclass registers itself. Neither
torch nor Flower is imported, so `config` reads the names from here; which clients attack, and
the ClientApp mod that applies an attack, are `federation/attacks.py`.
"""

from __future__ import annotations

import importlib
import pkgutil

from ovalp_flwr.federation.adversary.base import REGISTRY, Attack

NOT_ATTACKS = ("base", "options")  # this folder's files that define none


def _found() -> dict[str, type[Attack]]:
    """Every attack of this folder's files, by name, in file order."""
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if module.name not in NOT_ATTACKS:
            importlib.import_module(f"{__name__}.{module.name}")
    return dict(REGISTRY)


ATTACKS = _found()
UPDATES_ONLY = tuple(name for name, cls in ATTACKS.items() if cls.updates_only)  # the encoder
# path can rehearse these: its clients send updates, never statistics or labels of theirs


def attack(kind: str) -> Attack:
    """The attack `kind`."""
    if kind not in ATTACKS:
        raise ValueError(f"attack={kind!r} is not allowed; use one of "
                         f"{', '.join(['none', *ATTACKS])}")
    return ATTACKS[kind]()
