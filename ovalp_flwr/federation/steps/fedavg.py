"""FedAvg's server step: the round's combined update is the new model."""

from __future__ import annotations

from ovalp_flwr.federation.steps.base import ServerStep


class FedAvgStep(ServerStep):
    """The mean (or a robust rule's combination) as the new global model: the recipe."""
