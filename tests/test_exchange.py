"""Set-up exchanges: replies in the order asked (not of arrival), and in chunks."""

import pytest
from flwr.app import Error, Message, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from ovalp_flwr.federation.exchange import FederationError, SetupCosts, exchange, exchange_in_chunks


class ReversingGrid:
    """Answers every message, the replies in reverse order (as arrivals may come); records
    how many messages each send_and_receive carried."""

    def __init__(self, fail: set[int] = frozenset()) -> None:
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 0, SUPERLINK_NODE_ID, 0
        self.batches: list[int] = []
        self.fail = fail

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self.batches.append(len(messages))
        replies = []
        for m in messages:
            if m.metadata.dst_node_id in self.fail:
                replies.append(Message(error=Error(code=0, reason="boom"), reply_to=m))
            else:
                metrics = MetricRecord({"node": m.metadata.dst_node_id})
                replies.append(Message(content=RecordDict({"m": metrics}), reply_to=m))
        return replies[::-1]


def contents(nodes):
    return {n: RecordDict({"m": MetricRecord({"asked": n})}) for n in nodes}


def test_replies_come_back_in_the_order_asked_not_of_arrival():
    nodes = [7, 3, 9, 1]
    replies = exchange(ReversingGrid(), "query.describe", contents(nodes))
    assert list(replies) == nodes
    assert [int(r["m"]["node"]) for r in replies.values()] == nodes


def test_chunks_carry_at_most_chunk_nodes_and_keep_the_order():
    grid, costs = ReversingGrid(), SetupCosts()
    nodes = list(range(10, 0, -1))
    chunks = list(exchange_in_chunks(grid, "query.describe", contents(nodes), costs, chunk=4))
    assert grid.batches == [4, 4, 2]
    assert [n for chunk in chunks for n in chunk] == nodes
    assert costs.messages == 10


def test_no_chunk_is_one_exchange_and_a_bad_chunk_is_refused():
    grid = ReversingGrid()
    assert len(list(exchange_in_chunks(grid, "query.describe", contents([1, 2, 3])))) == 1
    assert grid.batches == [3]
    with pytest.raises(ValueError, match="chunk=0 is not allowed"):
        list(exchange_in_chunks(grid, "query.describe", contents([1]), chunk=0))


def test_a_failed_node_in_a_later_chunk_stops_the_exchange_there():
    grid = ReversingGrid(fail={5})
    chunks = exchange_in_chunks(grid, "query.describe", contents([1, 2, 5, 6]), chunk=2)
    assert list(next(chunks)) == [1, 2]
    with pytest.raises(FederationError, match="boom"):
        next(chunks)
