"""SCAFFOLD's server half: the control variates the strategy keeps and sends with every train
message (`federation.strategy` applies them), and the variate arithmetic both halves share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord

from ovalp_flwr.federation.checkpoint import unpack
from ovalp_flwr.federation.protocol import LOCAL_STEPS, VARIATE, record_of, view_record
from ovalp_flwr.federation.replies import TrainReply
from ovalp_flwr.federation.validation import check_arrays, check_finite


@dataclass(frozen=True)
class HeldVariate:
    """The node holds the c_i the server holds for it, from its reply to `server_round`: it is
    sent c and computes c - c_i itself (`scaffold-variates = "clients"`)."""

    server_round: int


Correction = dict[str, np.ndarray] | HeldVariate
Variates = dict[int, tuple[float, dict[str, np.ndarray]]]  # node -> (weight, c_i)


def next_variate(start: dict[str, np.ndarray], trained: dict[str, np.ndarray], steps: float,
                 learning_rate: float, sent: dict[str, np.ndarray] | None,
                 out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """SCAFFOLD's option II: c_i = (x - y_i) / (K_i * lr) - (c - c_i), in float32, in place
    (into `out`'s arrays where they fit). The server and, with `scaffold-variates = "clients"`,
    the clients both call it: the same operations, so the same bits."""
    variate = {}
    for key, value in start.items():
        new = np.subtract(value, trained[key],
                          out=None if out is None else _reusable(out, None, key, value))
        new /= steps * learning_rate
        if sent is not None:
            new -= sent[key]
        variate[key] = new
    return variate


class ControlVariates:
    """SCAFFOLD's control variates (Karimireddy et al., 2020, option II).

    Each client trains on g_i(y) + (c - c_i), where c_i estimates its own gradient and c
    the federation's, so a client that holds few classes no longer pulls every other
    head towards "absent". Variates are gradients of one stage's loss, so a change of stage
    starts them afresh. Where c_i is computed (`scaffold-variates`):

    - `server` (default): the server sends c - c_i with the round's weights and, from the
      reply, sets c_i = (x - y_i) / (K_i * lr) - (c - c_i), the client's mean gradient along
      its K_i SGD steps. Clients keep no state, so a restarted node loses nothing; the upload
      is the plain FedAvg reply, the download doubles, and the server does four passes over
      memory per client and round against the average's one.
    - `clients` (the paper's own protocol): a node computes its c_i with the same operations
      (`next_variate`), keeps it in its Context and uploads it beside y_i; the server keeps a
      view of the reply's bytes and sends c, one array for every node, to each node whose
      c_i it holds too. The upload doubles, the download does not grow, and the server's
      work per client is one pass (c's sum). A node whose last reply the server did not
      take (refused, late, a new node id, a resumed run) is sent c - c_i as in `server`.
      The global model is the same, bit for bit (tests/test_scaffold.py).

    Either way the server learns each client's mean local gradient, which FedAvg's update
    already carries ((x - y_i) divided by a known constant).
    """

    def __init__(self, learning_rate: float, held_by_clients: bool = False) -> None:
        self.learning_rate = learning_rate
        self.held_by_clients = held_by_clients
        self.stage: int | None = None
        self.clients: Variates = {}  # node -> (weight, c_i), in the order they first reported
        self.sent: dict[int, Correction] = {}  # node -> what it was sent this round
        self.shared: dict[str, np.ndarray] = {}  # c over `clients`; {} until computed
        self.held: dict[int, int] = {}  # node -> round of the reply whose c_i it and we hold
        self._reported: dict[int, dict[str, np.ndarray]] = {}  # node -> c_i of its reply
        self._candidate: tuple[list[int], dict[str, np.ndarray]] | None = None  # see non_finite
        # node -> the arrays its c - c_i is written into, round after round: new memory for
        # every client every round costs more (page faults) than the arithmetic
        self._buffers: dict[int, dict[str, np.ndarray]] = {}

    def corrections(self, stage: int, node_ids: list[int]) -> dict[int, Correction]:
        """What each node is sent: c - c_i, or (clients mode) `HeldVariate` where the node
        holds the c_i we hold; empty until some client has reported in this stage."""
        if stage != self.stage:
            self.stage, self.clients, self.held, self.shared = stage, {}, {}, {}
        self.sent = {}
        if not self.clients:
            return {}
        shared = self.shared = self.shared or _shared(self.clients)
        for node in node_ids:
            held_round = self.held.pop(node, None)  # it holds it until it answers anew
            own = self.clients.get(node, (0.0, None))[1]  # never reported: c_i = 0
            if held_round is not None:
                self.sent[node] = HeldVariate(held_round)
            else:
                self.sent[node] = shared if own is None else {
                    key: np.subtract(shared[key], own[key], out=_reusable(self._buffers, node, key,
                                                                          shared[key]))
                    for key in shared}
        return self.sent

    def state(self, partition_of: Callable[[int], int]) -> tuple[dict[str, np.ndarray], dict]:
        """The variates by partition id (node ids change when nodes reconnect): for a checkpoint."""
        arrays = {f"{partition_of(node)}/{key}": value
                  for node, (_, variate) in self.clients.items() for key, value in variate.items()}
        weights = {str(partition_of(node)): weight for node, (weight, _) in self.clients.items()}
        return arrays, {"stage": self.stage, "weights": weights}

    def restore(self, arrays: dict[str, np.ndarray], state: dict,
                node_of: Callable[[int], int]) -> None:
        """Back from `state`, each partition's variate under the node that holds it now. The
        nodes of a resumed run hold no variate: each is sent c - c_i until it reports."""
        self.stage, self.held, self.shared = state["stage"], {}, {}
        self.clients = {node_of(int(pid)): (weight, unpack(pid, arrays))
                        for pid, weight in state["weights"].items()}

    def check(self, reply: TrainReply, global_arrays: dict[str, np.ndarray]) -> str | None:
        """Clients mode: why a trained reply's c_i is refused (absent, not of the heads'
        shapes), or None, its arrays then kept (views of the reply's bytes). Finiteness is
        `non_finite`'s."""
        if not self.held_by_clients:
            return None
        record = record_of(reply.message.content, VARIATE, ArrayRecord)
        if record is None:
            return f"the reply lacks its {VARIATE!r} record (scaffold-variates = \"clients\")"
        try:
            variate = view_record(record)
        except (ValueError, TypeError) as err:
            return f"its {VARIATE!r} arrays do not deserialize ({err})"
        reason = check_arrays(variate, global_arrays, VARIATE, finite=False)
        if reason is None:
            self._reported[reply.node] = variate
        return reason

    def non_finite(self, replies: list[TrainReply]) -> dict[int, str]:
        """Clients mode: node -> why its c_i is refused (non-finite values), for the replies
        about to be averaged. c over the variates as they would be with these replies' is
        computed here, once: finite (weights > 0), it clears every c_i, and it is next
        round's c if these replies are the ones taken (`update`). Only a non-finite c makes
        each c_i be checked."""
        self._candidate = None
        if not self.held_by_clients or not replies:
            return {}
        candidate = dict(self.clients)
        for reply in replies:
            candidate[reply.node] = (float(reply.weight), self._reported[reply.node])
        shared = _shared(candidate)
        if check_finite(shared) is None:
            self._candidate = ([reply.node for reply in replies], shared)
            return {}
        reasons = {reply.node: check_finite(self._reported[reply.node], VARIATE)
                   for reply in replies}
        return {node: reason for node, reason in reasons.items() if reason}

    def update(self, global_arrays: dict[str, np.ndarray], trained: list[TrainReply],
               server_round: int) -> None:
        """Each trained client's new c_i, weighted as the average weighs it: computed here
        (`next_variate`, into the array of its last c_i), or the one its reply carried."""
        for reply in trained:
            if self.held_by_clients:
                variate = self._reported[reply.node]
                self.held[reply.node] = server_round
            else:
                steps = float(reply.metrics[LOCAL_STEPS])
                sent = self.sent.get(reply.node)
                old = self.clients.get(reply.node, (0.0, {}))[1]
                variate = next_variate(global_arrays, reply.arrays, steps, self.learning_rate,
                                       sent, out=old)
            self.clients[reply.node] = (float(reply.weight), variate)
        candidate, self._candidate, self._reported = self._candidate, None, {}
        taken = candidate is not None and candidate[0] == [reply.node for reply in trained]
        self.shared = candidate[1] if taken else {}  # else computed when next needed


def _shared(clients: Variates) -> dict[str, np.ndarray]:
    """c = sum_i w_i c_i / sum_i w_i, added up in place in the clients' order (from 0, as
    Python's sum() did: the same bits)."""
    total = sum(weight for weight, _ in clients.values())
    first = next(iter(clients.values()))[1]
    shared = {key: np.zeros_like(value) for key, value in first.items()}
    scratch = {key: np.empty_like(value) for key, value in first.items()}
    for weight, variate in clients.values():
        for key, value in variate.items():
            np.multiply(value, weight, out=scratch[key])
            shared[key] += scratch[key]
    for value in shared.values():
        value /= total
    return shared


def _reusable(pool: dict, node: int | None, key: str, like: np.ndarray) -> np.ndarray:
    """An array shaped like `like` to write into: the one `pool` keeps (under `node`, if given)
    when it fits and may be written, else a new one, kept there."""
    arrays = pool.setdefault(node, {}) if node is not None else pool
    array = arrays.get(key)
    if array is None or array.shape != like.shape or array.dtype != like.dtype \
            or not array.flags.writeable:
        array = arrays[key] = np.empty_like(like)
    return array
