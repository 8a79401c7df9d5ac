"""`server-optimizer = "lbfgs"` through the real ServerApp and ClientApp, in process: the same
objective on every partition round after round (the gradient is exact), the regularised
centralised optimum reached, reproducible from the seed, every round scored on the heads the
server holds (the last accepted point), and a round missing a client's rows repeats its point
instead of stepping on a wrong gradient, until the client has missed `lbfgs-patience` rounds."""

import logging

import numpy as np
import pytest
import torch
from flwr.app import Error, Message
from scipy.optimize import minimize

from ovalp_flwr.config import ConfigError, RunConfig
from ovalp_flwr.core.options import WEIGHT_DECAY_PATH
from ovalp_flwr.core.normalize import FeatureMoments, NormStats, normalize
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.features.cache import load_or_build
from ovalp_flwr.federation.local_grid import app_config
from test_validation import faulty_run, in_training  # tests/ is on sys.path under pytest

LAM = 0.01
OPTIONS = {"server-optimizer": "lbfgs", "weight-decay": LAM}


def run(cache_dir, tmp_path, name, fault=None, rounds=12, **overrides):
    _, summary = faulty_run(cache_dir, tmp_path, fault or (lambda m, r: r), rounds, name,
                            **{**OPTIONS, **overrides})
    return summary


def optimum(cache_dir) -> float:
    """F* of the OvA objective on all training rows, by SciPy, normalised as the runs are."""
    cache = load_or_build("digits", "pixels", cache_dir, progress=False)
    stats = NormStats.from_moments(FeatureMoments.of(cache.train.x))
    x = torch.from_numpy(normalize("standardize", cache.train.x, stats)).double()
    k, d = cache.num_classes, x.shape[1]
    targets = torch.nn.functional.one_hot(torch.from_numpy(cache.train.y.astype(np.int64)), k).double()

    def f(flat):
        point = torch.tensor(flat.reshape(k, d + 1), requires_grad=True)
        logits = x @ point[:, :-1].T + point[:, -1]
        value = torch.nn.functional.binary_cross_entropy_with_logits(
            logits, targets, reduction="sum") / len(x) + 0.5 * LAM * (point[:, :-1] ** 2).sum()
        value.backward()
        return float(value.detach()), point.grad.numpy().ravel()

    return minimize(f, np.zeros(k * (d + 1)), jac=True, method="L-BFGS-B",
                    options={"maxiter": 5000, "ftol": 0.0, "gtol": 1e-9}).fun


def objectives(summary):
    return np.array([r["objective"] for r in summary["rounds"]])


def test_every_partition_descends_the_same_objective_to_the_centralised_optimum(cache_dir, tmp_path):
    runs = {kind: run(cache_dir, tmp_path, kind, partition=kind)
            for kind in ("iid", "shard", "bernoulli-dirichlet")}
    trails = {kind: objectives(summary) for kind, summary in runs.items()}
    # one objective, whatever the partition: equal up to float32 sums
    for kind in ("shard", "bernoulli-dirichlet"):
        np.testing.assert_allclose(trails[kind], trails["iid"], rtol=1e-5)
    best = optimum(cache_dir)
    assert trails["iid"][0] - best > 1e-2  # the start is not the optimum
    assert trails["iid"][-1] - best < 1e-4
    assert all(r["server_step"] in ("first", "accepted", "shortened")
               for r in runs["iid"]["rounds"])
    assert runs["iid"]["head_init"]["statistics"] == "gram"


def test_a_run_is_reproducible_from_its_seed(cache_dir, tmp_path):
    first, second = (run(cache_dir, tmp_path, name, rounds=4, partition="shard")
                     for name in ("a", "b"))
    keys = ("objective", "accuracy", "gradient_norm", "server_step")
    assert [[r[k] for k in keys] for r in first["rounds"]] == \
        [[r[k] for k in keys] for r in second["rounds"]]


def test_a_round_without_every_clients_gradient_repeats_its_point(cache_dir, tmp_path):
    def lose_round_2(message, reply):  # the node's round-2 reply carries a NaN: refused
        if message.metadata.message_type == "train" and \
                int(message.content[p.CONFIG]["server-round"]) == 2:
            arrays = p.from_record(reply.content[p.ARRAYS])
            arrays["weight"][0, 0] = np.nan
            reply.content[p.ARRAYS] = p.to_record(arrays)
        return reply

    faulty = run(cache_dir, tmp_path, "faulty", fault=lose_round_2, rounds=4)
    clean = run(cache_dir, tmp_path, "clean", rounds=3)
    rounds = faulty["rounds"]
    assert rounds[1]["server_step"] == "repeated" and rounds[1]["clients_rejected"] == 1
    assert rounds[1]["accuracy"] == rounds[0]["accuracy"]  # the same heads again
    # then it goes on as the clean run, a round late
    assert [r["objective"] for r in rounds[2:]] == [r["objective"] for r in clean["rounds"][1:]]


def test_every_round_scores_the_heads_the_server_holds_and_the_trial_point_beside_them(
        cache_dir, tmp_path):
    """The point sent next is a trial the line search may take back: a round's accuracy is the
    last accepted point's (round 1's is the start's), the trial's is recorded beside it, and
    an accepted trial is the next round's held point."""
    summary = run(cache_dir, tmp_path, "held", rounds=6, partition="shard")
    rounds = summary["rounds"]
    assert rounds[0]["server_step"] == "first"
    assert rounds[0]["accuracy"] == summary["initial_accuracy"]  # nothing accepted yet
    assert rounds[0]["trial_accuracy"] != rounds[0]["accuracy"]
    accepted = [r for r in range(1, 6) if rounds[r]["server_step"] == "accepted"]
    assert accepted  # every head's step taken: the trial point became the held one
    for r in accepted:
        assert rounds[r]["accuracy"] == rounds[r - 1]["trial_accuracy"]
        assert rounds[r]["held_objective"] == rounds[r]["objective"]  # held = evaluated
    assert summary["final_accuracy"] == rounds[-1]["accuracy"]
    # F of the heads held: the start's after round 1, then only ever lower (every head accepts
    # a step only if it lowers its own loss + penalty)
    held = [r["held_objective"] for r in rounds]
    assert held[0] == rounds[0]["objective"] and all(b <= a for a, b in zip(held, held[1:]))


def test_a_node_that_stops_answering_leaves_the_objective_after_its_patience(cache_dir, tmp_path,
                                                                            caplog):
    """From round 2 one node's replies fail: rounds 2-3 send the same heads again, round 4 (its
    third miss) drops its rows with one warning and L-BFGS starts again from the held heads;
    the rounds after it descend the objective over the other nodes' rows."""
    gone = in_training(lambda r, message, reply: reply if r < 2 else Message(
        error=Error(code=0, reason="gone"), reply_to=message))
    caplog.set_level(logging.WARNING)
    grid, summary = faulty_run(cache_dir, tmp_path, gone, 8, "gone", **OPTIONS)
    steps = [r["server_step"] for r in summary["rounds"]]
    assert steps[:5] == ["first", "repeated", "repeated", "restarted", "first"]
    assert summary["rounds"][3]["dropped_from_objective"] == [grid.bad]
    assert set(steps[5:]) <= {"accepted", "shortened"}
    assert [r["clients_sampled"] for r in summary["rounds"][4:]] == [3] * 4  # not asked again
    warned = [r.getMessage() for r in caplog.records if "lbfgs-patience" in r.getMessage()]
    assert len(warned) == 1 and f"node {grid.bad} missed 3 rounds in a row" in warned[0]
    objective = [r["objective"] for r in summary["rounds"][4:]]
    assert objective[-1] < objective[0]
    assert summary["rounds"][3]["accuracy"] == summary["rounds"][2]["accuracy"]  # held heads


def test_under_secagg_the_rounds_see_only_the_mean_and_descend_as_the_plain_ones(cache_dir,
                                                                               tmp_path):
    plain = run(cache_dir, tmp_path, "plain", rounds=6, partition="shard")
    secure = run(cache_dir, tmp_path, "secure", rounds=6, partition="shard",
                 **{"statistics-aggregation": "secagg+"})
    assert all(r["aggregation"] == "secagg+" and r["clients_trained"] == 4
               for r in secure["rounds"])
    # the same steps, to SecAgg+'s quantisation (about 1e-5 of each entry)
    np.testing.assert_allclose(objectives(secure), objectives(plain), rtol=1e-4)
    assert objectives(secure)[-1] < objectives(secure)[0] - 0.1


@pytest.mark.parametrize(("key", "value"), [("fraction-train", 0.5), ("adapter-dim", 8),
                                            ("aggregation-weights", "uniform"),
                                            ("lbfgs-memory", 0)])
def test_what_the_server_optimizer_cannot_work_with_is_refused_by_name(key, value):
    with pytest.raises(ConfigError) as refused:
        RunConfig.from_mapping({**app_config(), "server-optimizer": "lbfgs", key: value})
    assert key in str(refused.value)


def test_weight_decay_auto_walks_its_path_on_validation_rows_and_goes_on_at_the_best(cache_dir,
                                                                                    tmp_path):
    """Two rounds at each weight decay, strongest first, each value's held heads scored on the
    validation rows; the walk stops two values past the best and the run goes on there. Going
    on down the path, L-BFGS keeps its pairs (moved to the new penalty): no round restarts."""
    summary = run(cache_dir, tmp_path, "auto", rounds=18, **{"weight-decay": "auto"})
    path, rounds = summary["weight_decay_path"], summary["rounds"]
    scores = path["val_accuracy"]
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))
    assert path["grid"] == list(WEIGHT_DECAY_PATH[:len(scores)])
    assert path["chosen"] == WEIGHT_DECAY_PATH[best]
    assert len(scores) == len(WEIGHT_DECAY_PATH) or len(scores) - 1 - best == 2
    switches = [r for r in rounds if r["server_step"] == "path"]
    assert [r["round"] for r in switches] == [2 * (i + 1) for i in range(len(scores))]
    assert [r["path_val_accuracy"] for r in switches] == scores
    assert [r["next_weight_decay"] for r in switches[:-1]] == path["grid"][1:]
    by_round = {r["round"]: r for r in rounds}
    for switch in switches[:-1]:  # the next round judges a step taken at the new penalty
        assert by_round[switch["round"] + 1]["server_step"] in ("accepted", "shortened")
    back = by_round[switches[-1]["round"] + 1]["server_step"]  # to the best value's heads
    assert (back == "first") == (path["chosen"] != path["grid"][-1])
    after = [r for r in rounds if r["round"] > switches[-1]["round"]]
    assert after and all(r["weight_decay"] == path["chosen"] for r in after)
    assert summary["validation"]["fraction"] == 0.1  # "auto" holds rows back for the choice


@pytest.mark.parametrize(("overrides", "key"), [
    ({"server-optimizer": "fedavg"}, "weight-decay"),  # only the server walks a path
    ({"num-server-rounds": 14}, "num-server-rounds"),  # 7 values x 2 rounds, then the best
    ({"lbfgs-path-rounds": 0}, "lbfgs-path-rounds"),
])
def test_weight_decay_auto_is_refused_where_it_cannot_walk(overrides, key):
    with pytest.raises(ConfigError) as refused:
        RunConfig.from_mapping({**app_config(), **OPTIONS, "weight-decay": "auto",
                                "num-server-rounds": 20, **overrides})
    assert key in str(refused.value).split("=")[0]
    with pytest.raises(ConfigError, match="weight-decay"):
        RunConfig.from_mapping({**app_config(), **OPTIONS, "weight-decay": "strong"})
    chosen = RunConfig.from_mapping({**app_config(), **OPTIONS, "weight-decay": "auto",
                                     "num-server-rounds": 15})
    assert "weight-decay" in chosen.choices and chosen.validation_share == 0.1
