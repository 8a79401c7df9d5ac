"""The registry of personalization methods: the `Personalizer` classes by run-config name, and
`make_personalizer`. Importing it imports torch; a run config is checked against the torch-free
`ovalp_flwr.personalize.hyperparameters` instead."""

from __future__ import annotations

from typing import Any

from ovalp_flwr.personalize.base import Personalizer
from ovalp_flwr.personalize.ft import FT
from ovalp_flwr.personalize.hyperparameters import METHOD_NAMES, parse_hyperparameters
from ovalp_flwr.personalize.lp import LP
from ovalp_flwr.personalize.lp_ft import LPFT
from ovalp_flwr.personalize.lss import LSS
from ovalp_flwr.personalize.own_heads import OwnHeads
from ovalp_flwr.personalize.proximal import Proximal
from ovalp_flwr.personalize.soup import Soup
from ovalp_flwr.personalize.sparse import Sparse

_CLASSES = {cls.name: cls for cls in (FT, LP, LPFT, Proximal, Soup, Sparse, LSS, OwnHeads)}
# in `hyperparameters.METHOD_NAMES`' order, which is the order runs and reports list them
METHODS: dict[str, type[Personalizer]] = {name: _CLASSES[name] for name in METHOD_NAMES}


def make_personalizer(name: str, options: dict[str, Any] | None = None) -> Personalizer:
    """The method `name` with its hyperparameters (`{dash-name: value}`, defaults elsewhere)."""
    hp = parse_hyperparameters(name, dict(options or {}))  # an unknown name fails here
    return METHODS[name](hp)
