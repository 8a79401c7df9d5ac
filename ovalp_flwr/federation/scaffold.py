"""SCAFFOLD's server half: the control variates the strategy keeps and sends with every train
message (`federation.strategy` applies them)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from flwr.app import Message

from ovalp_flwr.federation.checkpoint import unpack
from ovalp_flwr.federation.protocol import ARRAYS, LOCAL_STEPS, from_record


class ControlVariates:
    """SCAFFOLD's control variates (Karimireddy et al., 2020, option II), kept on the server.

    Each client trains on g_i(y) + (c - c_i), where c_i estimates its own gradient and c
    the federation's, so a client that holds few classes no longer pulls every other
    head towards "absent". The server sends c - c_i with the round's weights and, from
    the reply, sets c_i = (x - y_i) / (K_i * lr) - (c - c_i): the client's mean gradient
    along its K_i SGD steps. Clients keep no state, so a restarted node loses nothing,
    and the upload is the plain FedAvg reply; the download doubles. What the server
    learns is each client's mean local gradient, which FedAvg's update already carries
    (x - y_i) divided by a known constant. Variates are gradients of one stage's loss,
    so a change of stage starts them afresh.
    """

    def __init__(self, learning_rate: float) -> None:
        self.learning_rate = learning_rate
        self.stage: int | None = None
        self.clients: dict[int, tuple[float, dict[str, np.ndarray]]] = {}  # node -> (weight, c_i)
        self.sent: dict[int, dict[str, np.ndarray]] = {}  # node -> c - c_i sent this round

    def corrections(self, stage: int, node_ids: list[int]) -> dict[int, dict[str, np.ndarray]]:
        """c - c_i for each node; empty until some client has reported in this stage."""
        if stage != self.stage:
            self.stage, self.clients = stage, {}
        self.sent = {}
        if not self.clients:
            return {}
        total = sum(weight for weight, _ in self.clients.values())
        keys = next(iter(self.clients.values()))[1].keys()
        shared = {key: sum(weight * variate[key] for weight, variate in self.clients.values()) / total
                  for key in keys}
        for node in node_ids:
            own = self.clients.get(node, (0.0, None))[1]  # never reported: c_i = 0
            self.sent[node] = shared if own is None else {k: shared[k] - own[k] for k in keys}
        return self.sent

    def state(self, partition_of: Callable[[int], int]) -> tuple[dict[str, np.ndarray], dict]:
        """The variates by partition id (node ids change when nodes reconnect): for a checkpoint."""
        arrays = {f"{partition_of(node)}/{key}": value
                  for node, (_, variate) in self.clients.items() for key, value in variate.items()}
        weights = {str(partition_of(node)): weight for node, (weight, _) in self.clients.items()}
        return arrays, {"stage": self.stage, "weights": weights}

    def restore(self, arrays: dict[str, np.ndarray], state: dict,
                node_of: Callable[[int], int]) -> None:
        """Back from `state`, each partition's variate under the node that holds it now."""
        self.stage = state["stage"]
        self.clients = {node_of(int(pid)): (weight, unpack(pid, arrays))
                        for pid, weight in state["weights"].items()}

    def update(self, global_arrays: dict[str, np.ndarray], replies: list[Message],
               weight_of: Callable[[Message], float]) -> None:
        """Each trained client's new c_i from its reply."""
        for message in replies:
            node = message.metadata.src_node_id
            local = from_record(message.content[ARRAYS])
            steps = float(next(iter(message.content.metric_records.values()))[LOCAL_STEPS])
            sent = self.sent.get(node)
            variate = {}
            for key, start in global_arrays.items():
                mean_step = (start - local[key]) / (steps * self.learning_rate)
                variate[key] = mean_step if sent is None else mean_step - sent[key]
            self.clients[node] = (weight_of(message), variate)
