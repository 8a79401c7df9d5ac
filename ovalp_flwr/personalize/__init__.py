"""Personalization after federation: each client fine-tunes the final global model on its own
data, once (the study's PFT). One small module per method, each a `Personalizer` subclass
declaring its own hyperparameters; `METHODS` is the registry a run config names them from.

Importing this package does not import torch: the names that need it (`METHODS`,
`make_personalizer`, `LocalData`, `Personalizer`, `Task`) load on first use, so a run config
is validated against `ovalp_flwr.personalize.hyperparameters` alone.
"""

from __future__ import annotations

import importlib
from typing import Any

from ovalp_flwr.personalize.hyperparameters import FineTuning, HyperparameterError

# name -> the module (of this package) that defines it, imported on first access
_LAZY = {"METHODS": "methods", "make_personalizer": "methods", "LocalData": "base",
         "Personalizer": "base", "Task": "base"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = ["METHODS", "FineTuning", "HyperparameterError", "LocalData", "Personalizer", "Task",
           "make_personalizer"]
