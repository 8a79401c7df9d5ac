"""SCAFFOLD's client half: the offset a node trains with, and the c_i it keeps and uploads."""

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from ovalp_flwr.config import RunConfig
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.local_grid import InProcessGrid
from ovalp_flwr.federation.scaffold import next_variate
from ovalp_flwr.federation.scaffold_client import VariateMismatch, drift_offset, reply_variate

START = {"weight": np.full((2, 3), 1.0, np.float32)}


@pytest.fixture(autouse=True)
def task_identity():
    """Messages need the run's identity, which a grid sets (as test_replies does)."""
    InProcessGrid(ClientApp(), 1, run_config={})


def train_message(server_round: int, **records) -> Message:
    content = RecordDict({p.ARRAYS: p.to_record(START),
                          p.CONFIG: ConfigRecord({"server-round": server_round}), **records})
    return Message(content=content, message_type="train", dst_node_id=1)


def context() -> Context:
    return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})


def test_the_offset_is_what_the_server_sent_or_c_minus_the_c_i_the_node_holds():
    node = context()
    assert drift_offset(train_message(1), node) is None  # the start of a stage
    sent = {"weight": np.arange(6, dtype=np.float32).reshape(2, 3)}
    got = drift_offset(train_message(1, **{p.CORRECTION: p.to_record(sent)}), node)
    assert np.array_equal(got["weight"], sent["weight"])
    shared = {"weight": np.full((2, 3), 0.3, np.float32)}
    held = train_message(2, **{p.SHARED_VARIATE: p.to_record(shared),
                               p.VARIATE_ROUND: ConfigRecord({p.VARIATE_ROUND: 1})})
    with pytest.raises(VariateMismatch, match="c_i from round 1, but the node holds none"):
        drift_offset(held, node)
    own = {"weight": np.full((2, 3), 0.1, np.float32)}
    node.state[p.VARIATE] = p.to_record(own)
    node.state[p.VARIATE_ROUND] = ConfigRecord({p.VARIATE_ROUND: 1})
    assert np.array_equal(drift_offset(held, node)["weight"],
                          np.subtract(shared["weight"], own["weight"]))
    node.state[p.VARIATE_ROUND] = ConfigRecord({p.VARIATE_ROUND: 3})  # a reply the server lost
    with pytest.raises(VariateMismatch, match="holds the one from round 3"):
        drift_offset(held, node)


def test_the_node_keeps_and_uploads_its_c_i_only_when_the_run_says_so():
    trained = {"weight": np.full((2, 3), 0.5, np.float32)}
    sent = {"weight": np.full((2, 3), 0.25, np.float32)}
    message = train_message(4)
    server_side = RunConfig(learning_rate=0.05)
    assert reply_variate(server_side.rounds, server_side.learning_rate, context(), message,
                         trained, 2, sent) is None
    clients = RunConfig(learning_rate=0.05, scaffold_variates="clients")
    node = context()
    assert reply_variate(clients.rounds, clients.learning_rate, node, message, trained, 0,
                         sent) is None  # no data, no steps
    record = reply_variate(clients.rounds, clients.learning_rate, node, message, trained, 2, sent)
    expected = next_variate(START, trained, 2.0, 0.05, sent)  # what the server computes
    assert np.array_equal(record["weight"].numpy(), expected["weight"])
    assert np.array_equal(node.state[p.VARIATE]["weight"].numpy(), expected["weight"])
    assert node.state[p.VARIATE_ROUND][p.VARIATE_ROUND] == 4
