"""The reply screen (`federation.screening`): which train replies enter the round's mean."""

import numpy as np
import pytest
from flwr.clientapp import ClientApp
from flwr.app import Message, MessageType, MetricRecord, RecordDict

from ovalp_flwr.federation.local_grid import InProcessGrid
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.screening import ReplyScreen
from ovalp_flwr.federation.replies import decode_reply

SENT = {"weight": np.zeros((2, 3), np.float32)}

@pytest.fixture(autouse=True)
def flower_task_identity():
    """Messages are built outside Flower's runtime: the in-process grid sets its identity."""
    InProcessGrid(ClientApp(), 1, run_config={})



def reply(node: int, value: float, examples: int) -> Message:
    """A train reply from `node`, as its ClientApp sends it."""
    request = Message(content=RecordDict({}), message_type=MessageType.TRAIN, dst_node_id=node)
    content = RecordDict({p.ARRAYS: p.to_record({"weight": np.full((2, 3), value, np.float32)}),
                          p.METRICS: MetricRecord({p.NUM_EXAMPLES: examples, p.TRAIN_LOSS: 0.1,
                                                   p.TRAIN_SECONDS: 0.01})})
    return Message(content=content, reply_to=request)


def test_a_refused_reply_is_recorded_and_its_node_excluded_after_enough_refusals():
    screen = ReplyScreen(check_reply=lambda node, arrays, metrics, sent: "odd" if node % 2 else None,
                         exclude_after=2)
    for server_round in (1, 2):
        accepted, rejections = screen(server_round, [reply(1, 1.0, 5), reply(2, 1.0, 5)], SENT)
        assert [r.node for r in accepted] == [2]
        assert rejections == [{"node": 1, "reason": "odd"}]
    assert screen.rejected == {1: 2} and screen.excluded == {1}


def test_the_weight_a_reply_states_is_capped():
    screen = ReplyScreen(max_weight=10.0)
    accepted, _ = screen(1, [reply(1, 1.0, 5), reply(2, 1.0, 1000)], SENT)
    assert [r.weight for r in accepted] == [5.0, 10.0]


def test_a_non_finite_reply_is_refused_and_the_mean_made_without_it():
    screen = ReplyScreen()
    replies = [decode_reply(reply(1, 1.0, 5), False), decode_reply(reply(2, np.inf, 5), False)]
    rejections: list[dict] = []
    kept, mean = screen.finite_mean(replies, 1, rejections)
    assert [r.node for r in kept] == [1] and np.all(mean["weight"] == 1.0)
    assert rejections and rejections[0]["node"] == 2
