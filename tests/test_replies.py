"""Train replies decoded once: the same arrays as Flower's decode, and Flower's FedAvg arithmetic."""

import numpy as np
import pytest
from flwr.app import Array, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords, aggregate_metricrecords

from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.local_grid import InProcessGrid
from ovalp_flwr.federation.replies import (UndecodableReply, decode_reply, weighted_mean,
                                           weighted_metrics)

def test_undecodable_arrays_are_refused_with_the_reason():
    grid_identity()
    good = Array(np.ones(3, np.float32))
    broken = Array(dtype="float32", shape=(3,), stype="numpy.ndarray", data=b"not np.save bytes")
    truncated = Array(dtype="float32", shape=(3,), stype="numpy.ndarray", data=good.data[:-4])
    for array, words in [(broken, "not np.save bytes"), (truncated, "do not deserialize")]:
        with pytest.raises(UndecodableReply, match=words):
            decode_reply(reply_with({"w": array}, 5))
    with pytest.raises(UndecodableReply, match="lacks"):
        decode_reply(Message(content=RecordDict({p.METRICS: MetricRecord({"a": 1})}),
                             reply_to=train_request()))


def grid_identity() -> None:
    InProcessGrid(ClientApp(), 1, run_config={})  # sets the task identity messages need


def train_request(node: int = 1) -> Message:
    return Message(content=RecordDict(), message_type="train", dst_node_id=node)


def reply_with(arrays: dict, examples, node: int = 1, **metrics) -> Message:
    record = p.ArrayRecord(arrays) if any(isinstance(a, Array) for a in arrays.values()) \
        else p.to_record(arrays)
    content = RecordDict({p.ARRAYS: record, p.METRICS: MetricRecord({p.NUM_EXAMPLES: examples,
                                                                    **metrics})})
    return Message(content=content, reply_to=train_request(node))


def random_replies(count: int, seed: int = 0) -> list[Message]:
    grid_identity()
    rng = np.random.default_rng(seed)
    return [reply_with({"weight": rng.standard_normal((10, 33)).astype(np.float32),
                        "bias": rng.standard_normal(10).astype(np.float32)},
                       int(rng.integers(1, 900)), node=i + 1,
                       **{p.TRAIN_LOSS: float(rng.random()), "curve": [float(rng.random())] * 3})
            for i in range(count)]


def test_the_mean_is_flowers_fedavg_bit_for_bit():
    messages = random_replies(13)
    ours = weighted_mean([decode_reply(m) for m in messages])
    flowers = aggregate_arrayrecords([m.content for m in messages], p.NUM_EXAMPLES)
    for key, value in flowers.items():
        assert np.array_equal(ours[key], value.numpy()) and ours[key].dtype == np.float32
    uniform = weighted_mean([decode_reply(m, uniform=True) for m in messages])
    heads = [p.from_record(m.content[p.ARRAYS]) for m in messages]
    assert np.allclose(uniform["weight"], np.mean([h["weight"] for h in heads], axis=0), atol=1e-6)


def test_the_metrics_are_flowers_weighted_metrics():
    messages = random_replies(9, seed=3)
    ours = weighted_metrics([decode_reply(m) for m in messages])
    flowers = aggregate_metricrecords([m.content for m in messages], p.NUM_EXAMPLES)
    assert dict(ours) == dict(flowers)
