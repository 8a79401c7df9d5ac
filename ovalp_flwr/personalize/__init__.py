"""Personalization after federation: each client fine-tunes the final global model on its own
data, once (the study's PFT). One small module per method, each a `Personalizer` subclass
declaring its own hyperparameters; `METHODS` is the registry a run config names them from.
"""

from __future__ import annotations

from typing import Any

from ovalp_flwr.personalize.base import (FineTuning, HyperparameterError, LocalData, Personalizer,
                                         Task, parse_hyperparameters)
from ovalp_flwr.personalize.ft import FT
from ovalp_flwr.personalize.lp import LP
from ovalp_flwr.personalize.lp_ft import LPFT
from ovalp_flwr.personalize.lss import LSS
from ovalp_flwr.personalize.own_heads import OwnHeads
from ovalp_flwr.personalize.proximal import Proximal
from ovalp_flwr.personalize.soup import Soup
from ovalp_flwr.personalize.sparse import Sparse

METHODS: dict[str, type[Personalizer]] = {
    cls.name: cls for cls in (FT, LP, LPFT, Proximal, Soup, Sparse, LSS, OwnHeads)
}


def make_personalizer(name: str, options: dict[str, Any] | None = None) -> Personalizer:
    """The method `name` with its hyperparameters (`{dash-name: value}`, defaults elsewhere)."""
    if name not in METHODS:
        raise HyperparameterError(None, "personalize", name,
                                  f"choose methods from: {', '.join(METHODS)}")
    cls = METHODS[name]
    return cls(parse_hyperparameters(cls, dict(options or {})))


__all__ = ["METHODS", "FineTuning", "HyperparameterError", "LocalData", "Personalizer", "Task",
           "make_personalizer"]
