"""Robust aggregation (`federation.robust` and the rules of `federation.aggregators`): each rule
computes what it claims on hand-made replies, bounds what one hostile client can do, and hands
SCAFFOLD only admitted updates."""

import numpy as np
import pytest

from ovalp_flwr.federation.replies import TrainReply, weighted_mean
from ovalp_flwr.config import ConfigError, RunConfig
from ovalp_flwr.federation.aggregators import RULES
from ovalp_flwr.federation.aggregators.base import clipped, norm
from ovalp_flwr.federation.aggregators.geometric_median import geometric_median
from ovalp_flwr.federation.aggregators.multi_krum import krum_kept
from ovalp_flwr.federation.robust import RefusedRound, RobustAggregation

GLOBAL = {"weight": np.zeros((2, 3), np.float32), "bias": np.zeros(2, np.float32)}


def reply(node, weight_value, bias_value=0.0, examples=10.0):
    arrays = {"weight": np.full((2, 3), weight_value, np.float32),
              "bias": np.full(2, bias_value, np.float32)}
    return TrainReply(node=node, arrays=arrays, metrics={}, weight=examples, message=None)


def honest_and_one_hostile(scale=100.0):
    rng = np.random.default_rng(0)
    replies = [reply(i, 1.0 + 0.1 * rng.normal(), 0.5 + 0.1 * rng.normal()) for i in range(9)]
    replies.append(reply(9, scale, -scale))
    return replies


def test_median_and_trimmed_mean_are_flowers_per_coordinate():
    replies = honest_and_one_hostile()
    stacked = np.stack([r.arrays["weight"] for r in replies])
    median, _ = RobustAggregation("median")(replies, GLOBAL)
    np.testing.assert_allclose(median["weight"], np.median(stacked, axis=0), rtol=1e-6)
    trimmed, _ = RobustAggregation("trimmed-mean", 0.1)(replies, GLOBAL)
    ordered = np.sort(stacked, axis=0)[1:-1]  # one cut at each end of ten
    np.testing.assert_allclose(trimmed["weight"], ordered.mean(axis=0), rtol=1e-6)
    assert median["weight"].dtype == np.float32 and set(median) == {"weight", "bias"}


def test_multi_krum_leaves_the_outlier_out_and_averages_the_rest_by_samples():
    replies = honest_and_one_hostile()
    kept = krum_kept(replies, 0.1)
    assert [r.node for r in kept] == list(range(9))
    combined, admitted = RobustAggregation("multi-krum", 0.1)(replies, GLOBAL)
    np.testing.assert_allclose(combined["weight"], weighted_mean(kept)["weight"], rtol=1e-6)
    assert [r.node for r in admitted] == list(range(9))  # SCAFFOLD learns from the kept only


def test_norm_clip_bounds_every_update_by_the_rounds_median_norm():
    replies = honest_and_one_hostile()
    admitted = clipped(replies, GLOBAL)
    norms = [norm({k: v.astype(np.float64) for k, v in r.arrays.items()}) for r in replies]
    bound = float(np.median(norms))
    assert max(norm({k: v.astype(np.float64) for k, v in r.arrays.items()}) for r in admitted) \
        == pytest.approx(bound, rel=1e-6)
    assert admitted[0] is replies[0] or norms[0] > bound  # the small ones pass untouched
    combined, _ = RobustAggregation("norm-clip")(replies, GLOBAL)
    np.testing.assert_allclose(combined["weight"], weighted_mean(admitted)["weight"], rtol=1e-6)


@pytest.mark.parametrize("kind", list(RULES))
def test_one_hostile_client_moves_the_robust_model_little_and_the_mean_far(kind):
    replies = honest_and_one_hostile(scale=1000.0)
    honest = weighted_mean(replies[:9])["weight"]
    mean = weighted_mean(replies)["weight"]
    robust, admitted = RobustAggregation(kind, 0.1)(replies, GLOBAL)
    assert np.abs(mean - honest).max() > 50  # FedAvg is dragged off
    assert np.abs(robust["weight"] - honest).max() < 0.5
    assert max(np.abs(r.arrays["weight"]).max() for r in admitted) < 2  # variates see no 1000


def test_an_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="robust-aggregation='mode' is not allowed"):
        RobustAggregation("mode")(honest_and_one_hostile(), GLOBAL)


@pytest.mark.parametrize("kind,fraction,clients,message", [
    ("trimmed-mean", 0.1, 9, r"cuts int\(0.1 x 9\) = 0 of the 9 clients .* >= 0.111"),
    ("multi-krum", 0.2, 6, r"f = 2 hostile of the 6 clients, and Krum needs n > 2f \+ 2 = 6"),
    ("multi-krum", 0.1, 4, r"f = 1 hostile of the 4 clients"),
])
def test_a_round_the_rule_cannot_defend_is_refused_in_one_line(kind, fraction, clients, message):
    replies = honest_and_one_hostile()[-clients:]
    with pytest.raises(RefusedRound, match=message) as refused:
        RobustAggregation(kind, fraction)(replies, GLOBAL, server_round=3)
    assert str(refused.value).startswith("round 3: ") and "\n" not in str(refused.value)


def test_the_smallest_rounds_each_rule_still_defends_are_aggregated():
    RobustAggregation("trimmed-mean", 0.1)(honest_and_one_hostile(), GLOBAL)  # 10: cuts 1
    RobustAggregation("multi-krum", 0.1)(honest_and_one_hostile()[-5:], GLOBAL)  # 5 > 2·1 + 2


@pytest.mark.parametrize("kind", ["trimmed-mean", "multi-krum"])
def test_a_rule_that_would_assume_no_attacker_is_refused(kind):
    with pytest.raises(ConfigError, match="robust-fraction"):
        RunConfig.from_mapping({"robust-aggregation": kind, "robust-fraction": 0.0})


def test_the_geometric_median_minimises_the_weighted_distance_sum():
    line = np.array([[0.0, 0.0], [1.0, 0.0], [10.0, 0.0]])
    np.testing.assert_allclose(geometric_median(line, [1, 1, 1]), [1.0, 0.0], atol=1e-4)
    np.testing.assert_allclose(geometric_median(line, [1, 1, 3]), [10.0, 0.0], atol=1e-4)
    rng = np.random.default_rng(0)
    points, weights = rng.normal(size=(7, 5)), rng.uniform(1, 5, 7)
    median = geometric_median(points, weights)

    def cost(z):
        return float(weights @ np.linalg.norm(points - z, axis=1))
    for _ in range(50):  # no nearby point does better
        assert cost(median) <= cost(median + 1e-3 * rng.normal(size=5)) + 1e-9


def test_a_rule_is_one_file_and_a_registry_line_the_config_reads():
    assert RULES["geometric-median"] == "geometric_median:GeometricMedian"
    assert RunConfig.from_mapping({"robust-aggregation": "geometric-median"})
    combined, _ = RobustAggregation("geometric-median")(honest_and_one_hostile(), GLOBAL)
    assert combined["weight"].dtype == np.float32 and combined["bias"].shape == (2,)
