"""SCAFFOLD's server half: the control variates the strategy keeps and sends with every train
message (`federation.strategy` applies them)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ovalp_flwr.federation.checkpoint import unpack
from ovalp_flwr.federation.protocol import LOCAL_STEPS
from ovalp_flwr.federation.replies import TrainReply


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
        # node -> the arrays its c - c_i is written into, round after round: new memory for
        # every client every round costs more (page faults) than the arithmetic
        self._buffers: dict[int, dict[str, np.ndarray]] = {}

    def corrections(self, stage: int, node_ids: list[int]) -> dict[int, dict[str, np.ndarray]]:
        """c - c_i for each node; empty until some client has reported in this stage."""
        if stage != self.stage:
            self.stage, self.clients = stage, {}
        self.sent = {}
        if not self.clients:
            return {}
        shared = self._shared()
        for node in node_ids:
            own = self.clients.get(node, (0.0, None))[1]  # never reported: c_i = 0
            self.sent[node] = shared if own is None else {
                key: np.subtract(shared[key], own[key], out=_reusable(self._buffers, node, key,
                                                                      shared[key]))
                for key in shared}
        return self.sent

    def _shared(self) -> dict[str, np.ndarray]:
        """c = sum_i w_i c_i / sum_i w_i, added up in place in the clients' order (from 0, as
        Python's sum() did: the same bits)."""
        total = sum(weight for weight, _ in self.clients.values())
        first = next(iter(self.clients.values()))[1]
        shared = {key: np.zeros_like(value) for key, value in first.items()}
        scratch = {key: np.empty_like(value) for key, value in first.items()}
        for weight, variate in self.clients.values():
            for key, value in variate.items():
                np.multiply(value, weight, out=scratch[key])
                shared[key] += scratch[key]
        for value in shared.values():
            value /= total
        return shared

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

    def update(self, global_arrays: dict[str, np.ndarray], trained: list[TrainReply]) -> None:
        """Each trained client's new c_i from its decoded reply, weighted as the average weighs
        it: (x - y_i) / (K_i * lr) - (c - c_i), in place on one new array per key."""
        for reply in trained:
            steps = float(reply.metrics[LOCAL_STEPS])
            sent = self.sent.get(reply.node)
            old = self.clients.get(reply.node, (0.0, {}))[1]
            variate = {}
            for key, start in global_arrays.items():
                value = np.subtract(start, reply.arrays[key], out=_reusable(old, None, key, start))
                value /= steps * self.learning_rate
                if sent is not None:
                    value -= sent[key]
                variate[key] = value
            self.clients[reply.node] = (float(reply.weight), variate)


def _reusable(pool: dict, node: int | None, key: str, like: np.ndarray) -> np.ndarray:
    """An array shaped like `like` to write into: the one `pool` keeps (under `node`, if given)
    when it fits and may be written, else a new one, kept there."""
    arrays = pool.setdefault(node, {}) if node is not None else pool
    array = arrays.get(key)
    if array is None or array.shape != like.shape or array.dtype != like.dtype \
            or not array.flags.writeable:
        array = arrays[key] = np.empty_like(like)
    return array
