"""The server's step: the new global model from the round's combined update (the replies'
mean, a robust rule's, or DP's). One file a step on `base.ServerStep`, found by name in
`STEPS` (`server-optimizer`). The server's L-BFGS is not a step on a mean but its own round
(exact gradients of every node, a line search): `server_lbfgs.StagedLBFGS`.

This module imports neither torch nor Flower; a step's module is imported when a run uses it.
"""

from __future__ import annotations

import importlib
from typing import Any

# server-optimizer -> (module of this package, class)
STEPS = {"fedavg": ("fedavg", "FedAvgStep"), "fedadam": ("fedadam", "FedAdamStep")}


def server_step(rounds: Any) -> Any:
    """The `server-optimizer` of `rounds` (the run's `RoundOptions`) as a `base.ServerStep`,
    built from the knobs it reads (`from_options`)."""
    module, cls = STEPS[rounds.server_optimizer]
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls).from_options(rounds)
