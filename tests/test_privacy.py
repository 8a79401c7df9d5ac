"""Differential privacy (`federation.privacy`): the accountant's ε against the Gaussian
mechanism's RDP worked by hand, the noise calibrated to an ε, the clipped noisy mean of a round,
the noisy statistics, the keys a private run refuses, and a DP run reproduced from its seed."""

import math

import numpy as np
import pytest
import torch

from ovalp_flwr.config import ConfigError, RunConfig
from ovalp_flwr.core.head_init.statistics import ClassStatistics
from ovalp_flwr.federation.local_grid import run_local
from ovalp_flwr.federation.privacy import (PrivateRounds, clip_rows, epsilon_spent, gram_shift,
                                           noise_multiplier_for, privacy_report,
                                           private_statistics)
from ovalp_flwr.federation.replies import TrainReply
from ovalp_flwr.federation.results import read_summary


def rdp_by_hand(sigma: float, releases: int, delta: float) -> float:
    """The Gaussian mechanism's RDP, T·α/(2σ²), turned into ε at δ by the conversion of
    Canonne-Kamath-Steinke (2020), minimised over a fine grid of orders α."""
    alpha = np.linspace(1.001, 600.0, 2_000_000)
    return float(np.min(releases * alpha / (2 * sigma ** 2) + np.log((alpha - 1) / alpha)
                        - (math.log(delta) + np.log(alpha)) / (alpha - 1)))


@pytest.mark.parametrize("sigma,releases", [(4.0, 1), (1.0, 1), (18.0, 20), (2.0, 5)])
def test_the_accountants_epsilon_is_the_gaussian_mechanisms_by_hand(sigma, releases):
    assert epsilon_spent(sigma, releases, 1e-5) == pytest.approx(rdp_by_hand(sigma, releases, 1e-5),
                                                                rel=2e-3)


@pytest.mark.parametrize("epsilon,releases", [(1.0, 1), (8.0, 1), (2.0, 20)])
def test_the_noise_is_the_least_that_spends_the_epsilon_asked(epsilon, releases):
    sigma = noise_multiplier_for(epsilon, releases, 1e-5)
    assert epsilon_spent(sigma, releases, 1e-5) <= epsilon
    assert epsilon_spent(sigma * 0.999, releases, 1e-5) > epsilon
    assert noise_multiplier_for(epsilon, 20, 1e-5) > noise_multiplier_for(epsilon, 1, 1e-5)


def reply(node: int, weight: list[float], examples: int = 10) -> TrainReply:
    return TrainReply(node=node, arrays={"weight": np.asarray(weight, np.float32)},
                      metrics={"num-examples": examples}, weight=examples, message=None)


def test_a_private_round_is_the_clipped_unweighted_mean_over_the_clients_sampled():
    sent = {"weight": np.zeros(2, np.float32)}
    replies = [reply(1, [3.0, 4.0], 1000), reply(2, [0.3, 0.4], 1)]  # norms 5 and 0.5
    heads, admitted = PrivateRounds(1e-9, 1.0, seed=0)(replies, sent, server_round=1, sampled=4)
    # clipped to norm 1: (0.6, 0.8) and (0.3, 0.4); over the 4 sampled, unweighted
    assert np.allclose(heads["weight"], [0.9 / 4, 1.2 / 4], atol=1e-6) and admitted == []


def test_a_private_rounds_noise_has_the_std_flower_computes_and_comes_from_the_seed():
    sent = {"weight": np.zeros(100_000, np.float32)}
    replies = [reply(1, [0.0] * 100_000)]
    rounds = PrivateRounds(2.0, 0.5, seed=3)
    noise = rounds(replies, sent, server_round=1, sampled=10)[0]["weight"]
    assert noise.std() == pytest.approx(2.0 * 0.5 / 10, rel=0.02)
    assert np.array_equal(noise, rounds(replies, sent, server_round=1, sampled=10)[0]["weight"])
    assert not np.array_equal(noise, rounds(replies, sent, server_round=2, sampled=10)[0]["weight"])


def test_the_statistics_noise_is_scaled_per_block_by_what_one_example_changes():
    d, k = 300, 4
    stats = ClassStatistics(np.full(k, 50.0), np.zeros((k, d)), np.full(k, 10.0),
                            np.zeros((d, d)))
    noisy = private_statistics(stats, 1.5, clip=2.0, seed=0)
    scale = 1.5 * math.sqrt(4)  # four blocks, each of sensitivity 1 once scaled
    assert noisy.sums.std() == pytest.approx(scale * 2.0, rel=0.05)
    noise = noisy.gram - gram_shift(scale * 4.0, d) * np.eye(d)
    assert noise[np.triu_indices(d, 1)].std() == pytest.approx(scale * 4.0, rel=0.05)
    assert np.linalg.eigvalsh(noisy.gram).min() > 0  # the shift keeps it positive definite
    assert np.allclose(noisy.gram, noisy.gram.T)
    again = private_statistics(stats, 1.5, clip=2.0, seed=0)
    assert np.array_equal(noisy.sums, again.sums) and np.array_equal(noisy.gram, again.gram)


def test_each_feature_vector_is_clipped_to_the_bound():
    rows = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    assert torch.allclose(clip_rows(rows, 1.0), torch.tensor([[0.6, 0.8], [0.3, 0.4]]))


@pytest.mark.parametrize("overrides,key", [
    ({"dp-rounds-epsilon": 1.0}, "feature-norm"),
    ({"dp-rounds-epsilon": 1.0, "feature-norm": "l2"}, "drift-correction"),
    ({"dp-rounds-epsilon": 1.0, "feature-norm": "l2", "drift-correction": "none",
      "robust-aggregation": "median"}, "robust-aggregation"),
    ({"dp-statistics-epsilon": -1.0}, "dp-statistics-epsilon"),
    ({"dp-delta": 1.0}, "dp-delta"),
    ({"dp-clip": 0.0}, "dp-clip"),
])
def test_a_private_run_refuses_what_its_noise_does_not_cover(overrides, key):
    with pytest.raises(ConfigError, match=key):
        RunConfig.from_mapping(overrides)


def test_the_report_gives_the_epsilon_spent_per_mechanism():
    config = RunConfig.from_mapping({"dp-statistics-epsilon": 2.0, "dp-rounds-epsilon": 4.0,
                                     "feature-norm": "l2", "drift-correction": "none",
                                     "num-server-rounds": 10})
    report = privacy_report(config)
    assert report["statistics"]["epsilon"] == pytest.approx(2.0, rel=1e-3)
    assert report["rounds"]["epsilon"] == pytest.approx(4.0, rel=1e-3)
    assert report["rounds"]["releases"] == 10 and report["rounds"]["delta"] == 1e-5


def test_a_dp_run_is_reproducible_from_its_seed(cache_dir, tmp_path):
    options = {"encoder": "pixels", "feature-cache-dir": str(cache_dir), "partition": "iid",
               "results-dir": str(tmp_path), "num-server-rounds": 3, "feature-norm": "l2",
               "drift-correction": "none", "dp-statistics-epsilon": 2.0,
               "dp-rounds-epsilon": 2.0, "dp-clip": 0.5}
    first = read_summary(run_local({**options, "run-name": "a"}, 10))
    second = read_summary(run_local({**options, "run-name": "b"}, 10))
    private = read_summary(run_local({**options, "run-name": "c", "dp-statistics-epsilon": 0.5,
                                      "dp-rounds-epsilon": 0.0}, 10))
    accuracies = [r["accuracy"] for r in first["rounds"]]
    assert accuracies == [r["accuracy"] for r in second["rounds"]]
    assert first["initial_accuracy"] != private["initial_accuracy"]  # the noise is there
    assert first["privacy"]["rounds"]["epsilon"] == pytest.approx(2.0, rel=1e-3)
