"""What a server step is: the new global model from the round's combined update, and the state
a checkpoint keeps of it."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, MetricRecord

from ovalp_flwr.federation.options import RoundOptions


class ServerStep:
    """The new global model from `combined` (what the round's replies combine to) and the
    arrays that were sent (`sent`); FedAvg's takes `combined` as it is."""

    @classmethod
    def from_options(cls, rounds: RoundOptions) -> "ServerStep":
        """The step with the knobs of the run's rounds it reads (none here)."""
        return cls()

    def __call__(self, server_round: int, combined: ArrayRecord, metrics: MetricRecord,
                 sent: dict[str, np.ndarray]) -> ArrayRecord:
        return combined

    def state(self) -> dict[str, np.ndarray]:
        """What a checkpoint keeps of the step (flat named arrays); nothing for a stateless one."""
        return {}

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        """Back to what `state` gave (the checkpoint's arrays, others' included)."""
