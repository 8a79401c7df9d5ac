"""The staged FedAvg: the server decides the stage, weights by samples, skips empty clients."""

import numpy as np
from flwr.app import ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from ovalp_flwr.federation import protocol as p
from ovalp_flwr.config import RunConfig
from ovalp_flwr.ops.console import MARK
from ovalp_flwr.federation.local_grid import InProcessGrid
from ovalp_flwr.federation.rounds import make_strategy, weight_cap
from ovalp_flwr.federation.scaffold import ControlVariates
from ovalp_flwr.federation.steps.fedadam import FedAdamStep
from ovalp_flwr.federation.strategy import StagedFedAvg


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


def reply(request: Message, weight: float | np.ndarray, num_examples: int, steps: int = 1) -> Message:
    content = RecordDict({
        p.ARRAYS: p.to_record({"weight": np.broadcast_to(np.float32(weight), (2, 3))}),
        p.METRICS: MetricRecord({p.NUM_EXAMPLES: num_examples, p.TRAIN_LOSS: float(np.mean(weight)),
                                 p.TRAIN_SECONDS: 0.01, p.LOCAL_STEPS: steps}),
    })
    return Message(content=content, reply_to=request)


def requests(n, strategy=None, server_round=1, start=0.0):
    grid, strategy = make_grid(n), strategy or strategy_for(RunConfig())
    arrays = p.to_record({"weight": np.full((2, 3), start, np.float32)})
    return strategy, list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))


def test_fedavg_weights_by_sample_count_and_ignores_empty_clients():
    strategy, sent = requests(3)
    replies = [reply(sent[0], 1.0, 1), reply(sent[1], 4.0, 3), reply(sent[2], 100.0, 0)]
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert np.allclose(arrays["weight"].numpy(), (1 * 1 + 4 * 3) / 4)
    assert strategy.rounds[1]["clients_trained"] == 2
    assert strategy.rounds[1]["clients_replied"] == 3
    assert np.isclose(strategy.rounds[1]["train_loss"], (1 * 1 + 4 * 3) / 4)


def test_failed_replies_are_counted_and_the_first_reason_is_logged(caplog):
    """A round whose clients all fail must say why, not pass for a round that trained."""
    strategy, sent = requests(3)
    failed = [Message(Error(code=0, reason=f"TypeError: boom {i}"), reply_to=m)
              for i, m in enumerate(sent[1:])]
    arrays, _ = strategy.aggregate_train(1, [reply(sent[0], 2.0, 5), *failed])
    assert np.allclose(arrays["weight"].numpy(), 2.0)
    assert (strategy.rounds[1]["clients_failed"], strategy.rounds[1]["clients_trained"]) == (2, 1)
    said = [r.getMessage() for r in caplog.records if "client(s) failed" in r.getMessage()]
    assert said == [f"{MARK}round 1: 2 client(s) failed; node {sent[1].metadata.dst_node_id} said: "
                    "TypeError: boom 0"]


def test_round_of_only_empty_clients_keeps_the_global_model():
    strategy, sent = requests(2)
    arrays, _ = strategy.aggregate_train(1, [reply(sent[0], 1.0, 0), reply(sent[1], 2.0, 0)])
    assert arrays is None
    assert strategy.rounds[1]["clients_trained"] == 0


def test_uniform_weights_count_every_client_with_data_once():
    strategy, sent = requests(3, strategy_for(RunConfig(), aggregation_weights="uniform"))
    replies = [reply(sent[0], 1.0, 1), reply(sent[1], 4.0, 3), reply(sent[2], 100.0, 0)]
    arrays, _ = strategy.aggregate_train(1, replies)
    assert np.allclose(arrays["weight"].numpy(), (1.0 + 4.0) / 2)
    assert np.isclose(strategy.rounds[1]["train_loss"], (1 * 1 + 4 * 3) / 4)  # still per sample


def test_a_stated_count_buys_at_most_the_cap_in_the_mean():
    strategy, sent = requests(3, strategy_for(RunConfig(), max_weight=2.0))
    replies = [reply(sent[0], 1.0, 1), reply(sent[1], 4.0, 30), reply(sent[2], 100.0, 0)]
    arrays, _ = strategy.aggregate_train(1, replies)
    assert np.allclose(arrays["weight"].numpy(), (1.0 * 1 + 4.0 * 2) / 3)  # 30 counts as 2


def test_the_cap_is_a_multiple_of_the_median_count_described_by_nodes_with_data():
    sizes = {1: 100, 2: 100, 3: 1000, 4: 0, 5: 80}  # a forger's 1000 and an empty node
    assert weight_cap(2.0, sizes) == 200.0
    assert weight_cap(0.0, sizes) is None and weight_cap(2.0, {1: 0}) is None
    assert make_strategy(RunConfig(weight_cap=2.0), sizes=sizes).screen.max_weight == 200.0
    assert make_strategy(RunConfig(), sizes=sizes).screen.max_weight is None


def test_scaffold_sends_no_correction_until_clients_have_reported():
    strategy, sent = requests(2, strategy_for(RunConfig(), control_variates=ControlVariates(0.5)))
    assert all(p.CORRECTION not in m.content for m in sent)
    assert strategy.rounds[1]["drift_correction"] is False


def test_scaffold_variates_are_mean_local_gradients_and_corrections_sum_to_zero():
    """c_i = (x - y_i) / (K_i lr) - (c - c_i); with every client known, sum_i w_i (c - c_i) = 0."""
    lr = 0.5
    strategy = strategy_for(RunConfig(schedule="single-stage"), control_variates=ControlVariates(lr))
    strategy, sent = requests(2, strategy, server_round=1, start=1.0)
    # no correction in round 1: client 0 moved 1.0 -> 0.0 in 2 steps, client 1 1.0 -> 3.0 in 1
    strategy.aggregate_train(1, [reply(sent[0], 0.0, 1, steps=2), reply(sent[1], 3.0, 3, steps=1)])
    mean_gradients = {0: (1.0 - 0.0) / (2 * lr), 1: (1.0 - 3.0) / (1 * lr)}  # 1.0 and -4.0
    shared = (1 * mean_gradients[0] + 3 * mean_gradients[1]) / 4
    strategy, sent = requests(2, strategy, server_round=2, start=1.0)
    corrections = [m.content[p.CORRECTION]["weight"].numpy() for m in sent]
    assert np.allclose(corrections[0], shared - mean_gradients[0])
    assert np.allclose(corrections[1], shared - mean_gradients[1])
    assert np.allclose(1 * corrections[0] + 3 * corrections[1], 0.0)
    assert strategy.rounds[2]["bytes_sent_per_client"] > 2 * 2 * 3 * 4  # weights + correction
    # round 2 replies: c_i is the mean step minus the correction the client trained with
    strategy.aggregate_train(2, [reply(sent[0], 0.5, 1, steps=1), reply(sent[1], 0.5, 3, steps=1)])
    stored = strategy.variates.clients[sent[0].metadata.dst_node_id][1]["weight"]
    assert np.allclose(stored, (1.0 - 0.5) / lr - corrections[0])


def test_scaffold_starts_afresh_when_the_stage_changes():
    strategy = strategy_for(RunConfig(), control_variates=ControlVariates(0.1))  # stage 1, then 2
    strategy, sent = requests(2, strategy, server_round=1)
    strategy.aggregate_train(1, [reply(m, 1.0, 5) for m in sent])
    strategy, sent = requests(2, strategy, server_round=2)
    assert all(p.CORRECTION not in m.content for m in sent)  # stage-1 variates are not reused


def test_fedadam_keeps_the_head_dtype():
    strategy = StagedFedAvg(stage_for_round=lambda r: 2, seed=0, step=FedAdamStep(eta=0.1))
    strategy, sent = requests(2, strategy)
    arrays, _ = strategy.aggregate_train(1, [reply(m, 1.0, 5) for m in sent])
    assert arrays["weight"].numpy().dtype == np.float32
    assert np.all(arrays["weight"].numpy() > 0)  # moved towards the clients' 1.0


def test_run_config_picks_the_strategy():
    assert type(make_strategy(RunConfig())) is StagedFedAvg
    assert make_strategy(RunConfig()).variates.learning_rate == 0.05  # the default: SCAFFOLD
    assert make_strategy(RunConfig(local_optimizer="adamw", drift_correction="none")).variates is None
    adam = make_strategy(RunConfig(server_optimizer="fedadam", server_learning_rate=0.03))
    assert type(adam.step) is FedAdamStep and adam.step.flower.eta == 0.03
    scaffold = make_strategy(RunConfig(local_optimizer="sgd", drift_correction="scaffold",
                                       learning_rate=0.2, aggregation_weights="uniform"))
    assert scaffold.variates.learning_rate == 0.2 and scaffold.aggregation_weights == "uniform"


# --- each reply decoded once: the same numbers as Flower's FedAvg / FedAdam and the old SCAFFOLD ---


def random_replies(sent: list[Message], rng: np.random.Generator, steps: int = 3) -> list[Message]:
    replies = []
    for m in sent:
        content = RecordDict({
            p.ARRAYS: p.to_record({"weight": rng.standard_normal((2, 3)).astype(np.float32)}),
            p.METRICS: MetricRecord({p.NUM_EXAMPLES: int(rng.integers(1, 50)), p.TRAIN_LOSS: 0.1,
                                     p.TRAIN_SECONDS: 0.01, p.LOCAL_STEPS: steps})})
        replies.append(Message(content=content, reply_to=m))
    return replies


def test_the_staged_average_is_flowers_fedavg_and_fedadam_bit_for_bit():
    from flwr.serverapp.strategy import FedAdam, FedAvg

    rng = np.random.default_rng(7)
    strategy, sent = requests(6, start=0.3)
    replies = random_replies(sent, rng)
    ours, metrics = strategy.aggregate_train(1, replies)
    flowers, flower_metrics = FedAvg(weighted_by_key=p.NUM_EXAMPLES).aggregate_train(1, replies)
    assert np.array_equal(ours["weight"].numpy(), flowers["weight"].numpy())
    assert dict(metrics) == dict(flower_metrics)
    adam, sent = requests(6, StagedFedAvg(stage_for_round=lambda r: 2, seed=0,
                                          step=FedAdamStep(eta=0.1)), start=0.3)
    flower_adam = FedAdam(eta=0.1, weighted_by_key=p.NUM_EXAMPLES)
    flower_adam.current_arrays = {"weight": np.full((2, 3), 0.3, np.float32)}
    for server_round in (1, 2):
        replies = random_replies(sent, rng)
        ours, _ = adam.aggregate_train(server_round, replies)
        flowers, _ = flower_adam.aggregate_train(server_round, replies)
        assert np.array_equal(ours["weight"].numpy(),
                              flowers["weight"].numpy().astype(np.float32))


def test_scaffold_variates_and_corrections_are_the_formulas_bit_for_bit_round_after_round():
    """Buffers reused from round to round (in place) give the old expressions' exact bits."""
    lr, rng = 0.05, np.random.default_rng(11)
    strategy = strategy_for(RunConfig(schedule="single-stage"), control_variates=ControlVariates(lr),
                            fraction_train=0.75)
    grid = make_grid(8)
    expected: dict[int, tuple[float, np.ndarray]] = {}  # node -> (weight, c_i), recomputed here
    global_weight = np.zeros((2, 3), np.float32)
    for server_round in range(1, 6):
        sent = list(strategy.configure_train(server_round, p.to_record({"weight": global_weight}),
                                             ConfigRecord(), grid))
        corrections = {}
        if expected:
            total = sum(w for w, _ in expected.values())
            shared = sum(w * c for w, c in expected.values()) / total
            for m in sent:
                node = m.metadata.dst_node_id
                corrections[node] = shared if node not in expected else shared - expected[node][1]
                got = m.content[p.CORRECTION]["weight"].numpy()
                assert np.array_equal(got, corrections[node]), (server_round, node)
        replies = random_replies(sent, rng, steps=server_round)
        arrays, _ = strategy.aggregate_train(server_round, replies)
        for m in replies:
            node = m.metadata.src_node_id
            local = m.content[p.ARRAYS]["weight"].numpy()
            variate = (global_weight - local) / (server_round * lr)
            if node in corrections:
                variate = variate - corrections[node]
            expected[node] = (float(m.content[p.METRICS][p.NUM_EXAMPLES]), variate)
        for node, (_, variate) in expected.items():
            assert np.array_equal(strategy.variates.clients[node][1]["weight"], variate)
        global_weight = arrays["weight"].numpy()


def test_a_non_finite_reply_is_refused_and_the_mean_is_the_others():
    """The strategy clears finiteness on the mean; a NaN anywhere sends it to each reply."""
    config = RunConfig(drift_correction="none", local_optimizer="adamw")
    for check in (None, True):
        strategy, sent = requests(3, strategy_for(config))
        if check:
            clients = {m.metadata.dst_node_id: {p.NUM_EXAMPLES: 5} for m in sent}
            strategy.screen.check_reply = lambda node, arrays, metrics, glob: None if node in clients \
                else "unknown"
        bad = np.ones((2, 3), np.float32)
        bad[1, 2] = np.nan
        replies = [reply(sent[0], 1.0, 5), reply(sent[1], bad, 5), reply(sent[2], 3.0, 5),
                   reply(sent[2], np.full((2, 3), np.inf, np.float32), 0)]  # empty, not finite
        arrays, _ = strategy.aggregate_train(1, replies)
        assert np.array_equal(arrays["weight"].numpy(), np.full((2, 3), 2.0, np.float32))
        reasons = [r["reason"] for r in strategy.rounds[1]["rejections"]]
        assert reasons == ["arrays 'weight' has 1 non-finite value(s)",
                           "arrays 'weight' has 6 non-finite value(s)"]
