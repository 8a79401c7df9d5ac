"""The staged FedAvg: the server decides the stage, weights by samples, skips empty clients."""

import numpy as np
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from ovalp_flwr import protocol as p
from ovalp_flwr.config import RunConfig
from ovalp_flwr.local_grid import InProcessGrid
from ovalp_flwr.strategy import StagedFedAvg


def make_grid(num_nodes=4):
    return InProcessGrid(ClientApp(), num_nodes, run_config={})


def strategy_for(config: RunConfig, **kwargs) -> StagedFedAvg:
    return StagedFedAvg(stage_for_round=config.stage_for_round, seed=config.seed, **kwargs)


def stages_sent(config: RunConfig, rounds: int) -> list[int]:
    grid, strategy = make_grid(), strategy_for(config)
    arrays = p.to_record({"weight": np.zeros((2, 3), np.float32)})
    stages = []
    for server_round in range(1, rounds + 1):
        messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
        sent = {int(m.content[p.CONFIG][p.STAGE]) for m in messages}
        assert len(sent) == 1 and len(messages) == 4
        stages.append(sent.pop())
    return stages


def test_two_stage_sends_stage1_in_round1_then_stage2():
    assert stages_sent(RunConfig(), 4) == [1, 2, 2, 2]
    assert stages_sent(RunConfig(stage1_rounds=2), 4) == [1, 1, 2, 2]


def test_single_stage_and_softmax_never_send_stage1():
    assert stages_sent(RunConfig(schedule="single-stage"), 3) == [2, 2, 2]
    assert stages_sent(RunConfig(head="softmax"), 3) == [2, 2, 2]


def test_round_config_does_not_leak_between_rounds():
    grid, strategy = make_grid(), strategy_for(RunConfig())
    shared = ConfigRecord({"lr": 0.1})
    arrays = p.to_record({"weight": np.zeros((2, 3), np.float32)})
    first = list(strategy.configure_train(1, arrays, shared, grid))[0]
    assert dict(shared) == {"lr": 0.1}
    assert first.content[p.CONFIG]["server-round"] == 1


def test_sampling_is_seeded_and_follows_fraction():
    grid = make_grid(10)

    def sampled(seed, server_round):
        strategy = strategy_for(RunConfig(seed=seed), fraction_train=0.3)
        return strategy.sample(grid, server_round, 0.3, purpose=0)

    assert len(sampled(0, 1)) == 3
    assert sampled(0, 1) == sampled(0, 1)
    assert {tuple(sampled(s, r)) for s in range(3) for r in range(1, 4)}.__len__() > 1


def reply(request: Message, weight: float, num_examples: int) -> Message:
    content = RecordDict({
        p.ARRAYS: p.to_record({"weight": np.full((2, 3), weight, np.float32)}),
        p.METRICS: MetricRecord({p.NUM_EXAMPLES: num_examples, p.TRAIN_LOSS: weight,
                                 p.TRAIN_SECONDS: 0.01}),
    })
    return Message(content=content, reply_to=request)


def requests(n):
    grid, strategy = make_grid(n), strategy_for(RunConfig())
    arrays = p.to_record({"weight": np.zeros((2, 3), np.float32)})
    return strategy, list(strategy.configure_train(1, arrays, ConfigRecord(), grid))


def test_fedavg_weights_by_sample_count_and_ignores_empty_clients():
    strategy, sent = requests(3)
    replies = [reply(sent[0], 1.0, 1), reply(sent[1], 4.0, 3), reply(sent[2], 100.0, 0)]
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert np.allclose(arrays["weight"].numpy(), (1 * 1 + 4 * 3) / 4)
    assert strategy.rounds[1]["clients_trained"] == 2
    assert strategy.rounds[1]["clients_replied"] == 3
    assert np.isclose(strategy.rounds[1]["train_loss"], (1 * 1 + 4 * 3) / 4)


def test_round_of_only_empty_clients_keeps_the_global_model():
    strategy, sent = requests(2)
    arrays, _ = strategy.aggregate_train(1, [reply(sent[0], 1.0, 0), reply(sent[1], 2.0, 0)])
    assert arrays is None
    assert strategy.rounds[1]["clients_trained"] == 0
