"""What a round costs (`federation.costs`): payload bytes and how many nodes a fraction samples."""

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp

from ovalp_flwr.federation.costs import bytes_sent, config_bytes, message_bytes, sample_size
from ovalp_flwr.federation.local_grid import InProcessGrid
from ovalp_flwr.federation.protocol import to_record


@pytest.fixture(autouse=True)
def flower_task_identity():
    """Messages are built outside Flower's runtime: the in-process grid sets its identity."""
    InProcessGrid(ClientApp(), 1, run_config={})


def test_a_fraction_samples_at_least_one_node_and_at_most_all():
    assert [sample_size(10, f) for f in (0.01, 0.5, 1.0)] == [1, 5, 10]
    assert sample_size(3, 2.0) == 3


def test_config_bytes_counts_what_flower_cannot():
    """Flower's count raises on an empty list, "" or b"" (SecAgg+ sends them)."""
    assert config_bytes(ConfigRecord({"a": "", "bb": b"", "c": [], "d": True, "e": 3})) == \
        1 + 2 + 1 + (1 + 1) + (1 + 8)


def test_a_record_shared_by_many_messages_counts_once_per_message():
    shared = RecordDict({"arrays": to_record({"w": np.zeros(4, np.float32)})})
    variate = to_record({"c": np.zeros(2, np.float32)})
    messages = [Message(content=RecordDict({**shared, "c": variate}),
                        message_type=MessageType.TRAIN, dst_node_id=n) for n in (1, 2)]
    assert bytes_sent(shared, messages) == message_bytes(shared) + variate.count_bytes()
    assert bytes_sent(shared, []) == message_bytes(shared)
