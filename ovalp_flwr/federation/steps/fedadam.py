"""FedAdam's server step (Reddi et al., 2021): Flower's own FedAdam on the round's mean."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdam

from ovalp_flwr.federation.checkpoint import pack, unpack
from ovalp_flwr.federation.options import RoundOptions
from ovalp_flwr.federation.protocol import ARRAYS, METRICS, NUM_EXAMPLES, to_record
from ovalp_flwr.federation.steps.base import ServerStep


class FedAdamStep(ServerStep):
    """Flower's `FedAdam` (`eta`: the server's rate, `server-learning-rate`), given the round's
    mean as its one reply of weight 1 (its FedAvg multiplies it by 1.0: unchanged); its moments
    are the step's state."""

    def __init__(self, eta: float = 0.1) -> None:
        self.flower = FedAdam(eta=eta, weighted_by_key=NUM_EXAMPLES)

    @classmethod
    def from_options(cls, rounds: RoundOptions) -> "FedAdamStep":
        return cls(eta=rounds.server_learning_rate)

    def __call__(self, server_round: int, combined: ArrayRecord, metrics: MetricRecord,
                 sent: dict[str, np.ndarray]) -> ArrayRecord:
        """Kept in the head's dtype: Flower's FedAdam scales by a NumPy float64, which under
        NumPy 2 promotes float32 weights to float64 and would double every later message."""
        self.flower.current_arrays = sent  # what FedOpt.configure_train would have set
        content = RecordDict({ARRAYS: combined,
                              METRICS: MetricRecord({**metrics, NUM_EXAMPLES: 1})})
        averaged = Message(content=content, message_type=MessageType.TRAIN, dst_node_id=0)
        arrays, _ = self.flower.aggregate_train(server_round, [averaged])
        return to_record({key: value.numpy().astype(sent[key].dtype, copy=False)
                          for key, value in arrays.items()})

    def state(self) -> dict[str, np.ndarray]:
        if self.flower.m_t is None:
            return {}
        return {**pack("fedopt-m", self.flower.m_t), **pack("fedopt-v", self.flower.v_t)}

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        if unpack("fedopt-m", arrays):
            self.flower.m_t, self.flower.v_t = unpack("fedopt-m", arrays), unpack("fedopt-v", arrays)
