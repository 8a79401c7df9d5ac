"""Differential privacy (`federation.privacy`): the accountant's ε against the Gaussian
mechanism's RDP worked by hand, the noise calibrated to an ε, the clipped noisy mean of a round,
the noisy statistics at their replace-one sensitivities, the keys a private run refuses, one
accountant per run, and noise that two runs of the same seed do not share."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from ovalp_flwr.config import ConfigError, RunConfig
from ovalp_flwr.core.head_init.statistics import ClassStatistics
from flwr.clientapp import ClientApp

from ovalp_flwr.federation.local_grid import InProcessGrid, run_local
from ovalp_flwr.federation.rounds import make_strategy
from ovalp_flwr.federation.privacy import (INFINITE, PrivateRounds, Releases, clip_rows, composed_epsilon,
                                           epsilon_spent, gram_shift, noise_multiplier_for,
                                           privacy_report, private_statistics, rounds_releases,
                                           statistics_noise_share, uncovered_fields)
from ovalp_flwr.federation.replies import TrainReply
from ovalp_flwr.federation.results import read_summary
from safetensors.numpy import load_file


def report_of(config: RunConfig, population: int = 1) -> dict:
    """What summary.json says of the privacy `config` spends over `population` nodes."""
    return privacy_report(config.privacy, config.rounds, config.data_releases,
                          config.statistics_aggregation == "secagg+", population)


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
    heads, admitted = PrivateRounds(1e-9, 1.0)(replies, sent, server_round=1, sampled=4)
    # clipped to norm 1: (0.6, 0.8) and (0.3, 0.4); over the 4 sampled, unweighted
    assert np.allclose(heads["weight"], [0.9 / 4, 1.2 / 4], atol=1e-6) and admitted == []


def test_a_private_rounds_noise_has_flowers_std_at_twice_the_clip_and_is_never_drawn_twice():
    sent = {"weight": np.zeros(100_000, np.float32)}
    replies = [reply(1, [0.0] * 100_000)]
    rounds = PrivateRounds(2.0, 0.5)
    noise = rounds(replies, sent, server_round=1, sampled=10)[0]["weight"]
    # replacing one client's data moves its clipped update by up to 2·clip
    assert noise.std() == pytest.approx(2.0 * 2 * 0.5 / 10, rel=0.02)
    again = rounds(replies, sent, server_round=1, sampled=10)[0]["weight"]
    assert np.abs(noise - again).min() > 0  # the same round, the same call: fresh noise


def test_the_statistics_noise_is_scaled_per_block_by_what_replacing_one_example_changes():
    d, k, clip = 300, 4, 2.0
    stats = ClassStatistics(np.full(k, 1e6), np.zeros((k, d)), np.full(k, 10.0),
                            np.zeros((d, d)))
    noisy = private_statistics(stats, 1.5, clip=clip)
    scale = 1.5 * math.sqrt(4)  # four blocks, each of sensitivity 1 once scaled
    assert noisy.sums.std() == pytest.approx(scale * 2 * clip, rel=0.1)  # x -> x': 2C
    gram_std = scale * math.sqrt(2) * clip ** 2  # ‖xxᵀ - x'x'ᵀ‖_F ≤ √2·C²
    noise = noisy.gram - gram_shift(gram_std, d) * np.eye(d)
    assert noise[np.triu_indices(d, 1)].std() == pytest.approx(gram_std, rel=0.05)
    # the noise's spectrum reaches down to about -shift; the shift lifts its bottom to about 0
    # (Tracy-Widom's spread around the semicircle's edge: ±2.5% of the shift at D = 300)
    shift = gram_shift(gram_std, d)
    assert np.linalg.eigvalsh(noise).min() < -0.9 * shift
    assert np.linalg.eigvalsh(noisy.gram).min() > -0.1 * shift
    assert np.allclose(noisy.gram, noisy.gram.T)
    again = private_statistics(stats, 1.5, clip=clip)
    assert np.abs(noisy.sums - again.sums).min() > 0 and not np.array_equal(noisy.gram, again.gram)


def test_each_feature_vector_is_clipped_to_the_bound():
    rows = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    assert torch.allclose(clip_rows(rows, 1.0), torch.tensor([[0.6, 0.8], [0.3, 0.4]]))


PRIVATE = {"feature-norm": "l2", "drift-correction": "none"}


@pytest.mark.parametrize("overrides,key", [
    ({"dp-rounds-epsilon": 1.0}, "feature-norm"),
    ({"dp-rounds-epsilon": 1.0, "feature-norm": "l2"}, "drift-correction"),
    ({"dp-statistics-epsilon": -1.0}, "dp-statistics-epsilon"),
    ({"dp-delta": 1.0}, "dp-delta"),
    ({"dp-clip": 0.0}, "dp-clip"),
    # what leaves the clients without noise beside a private release
    ({"dp-rounds-epsilon": 1.0, **PRIVATE}, "head-init"),  # a start from exact statistics
    ({"dp-statistics-epsilon": 1.0, **PRIVATE}, "num-server-rounds"),  # rounds without noise
    ({"dp-statistics-epsilon": 1.0, **PRIVATE, "num-server-rounds": 0, "fraction-evaluate": 0.5},
     "fraction-evaluate"),
    ({"dp-rounds-epsilon": 1.0, **PRIVATE, "head-init": "zeros", "personalize": "ft"},
     "personalize"),
    ({"dp-rounds-epsilon": 1.0, **PRIVATE, "head-init": "zeros", "dp-uncovered": "maybe"},
     "dp-uncovered"),
    ({"dp-rounds-epsilon": 1.0, **PRIVATE, "head-init": "zeros", "weight-cap": 2.0}, "weight-cap"),
    # an ε with nothing to protect
    ({"dp-statistics-epsilon": 1.0, **PRIVATE, "head-init": "zeros"}, "dp-statistics-epsilon"),
    ({"dp-rounds-epsilon": 1.0, **PRIVATE, "num-server-rounds": 0}, "dp-rounds-epsilon"),
])
def test_a_private_run_refuses_what_its_noise_does_not_cover(overrides, key):
    with pytest.raises(ConfigError, match=key):
        RunConfig.from_mapping(overrides)


def test_one_accountant_composes_the_run_and_a_level_not_covered_is_infinite():
    config = RunConfig.from_mapping({"dp-statistics-epsilon": 2.0, "dp-rounds-epsilon": 4.0,
                                     **PRIVATE, "num-server-rounds": 10})
    report = report_of(config)
    assert report["statistics"]["epsilon"] == pytest.approx(2.0, rel=1e-3)
    assert report["rounds"]["epsilon"] == pytest.approx(4.0, rel=1e-3)
    assert report["rounds"]["releases"] == 10 and report["rounds"]["delta"] == 1e-5
    run = report["run"]
    composed = composed_epsilon([Releases(report["statistics"]["noise_multiplier"]),
                                 Releases(report["rounds"]["noise_multiplier"], 10)], 1e-5)
    assert run["example_epsilon"] == pytest.approx(composed) and 4.0 < composed < 6.0
    assert run["client_epsilon"] == INFINITE  # the statistics' noise covers one example only
    assert run["uncovered"] == []
    rounds_only = report_of(RunConfig.from_mapping({"dp-rounds-epsilon": 4.0, **PRIVATE,
                                                         "head-init": "zeros"}))
    assert rounds_only["run"]["client_epsilon"] == pytest.approx(4.0, rel=1e-3)
    assert rounds_only["run"]["example_epsilon"] == rounds_only["run"]["client_epsilon"]
    mixed = report_of(RunConfig.from_mapping({"dp-statistics-epsilon": 2.0, **PRIVATE,
                                                   "dp-uncovered": "allow"}))
    assert mixed["run"]["uncovered"] == ["rounds"]
    assert mixed["run"]["example_epsilon"] == mixed["run"]["client_epsilon"] == INFINITE
    assert float(INFINITE) == math.inf


def test_two_dp_runs_of_the_same_seed_draw_different_noise(cache_dir, tmp_path):
    options = {"encoder": "pixels", "feature-cache-dir": str(cache_dir), "partition": "iid",
               "results-dir": str(tmp_path), "num-server-rounds": 3, **PRIVATE,
               "dp-statistics-epsilon": 2.0, "dp-rounds-epsilon": 2.0, "dp-clip": 0.5}
    first, second = (run_local({**options, "run-name": name}, 10) for name in ("a", "b"))
    heads = [load_file(str(run / "checkpoint.safetensors")) for run in (first, second)]
    assert heads[0].keys() == heads[1].keys()
    assert all(not np.array_equal(heads[0][key], heads[1][key]) for key in heads[0])
    summary = read_summary(first)
    assert summary["privacy"]["rounds"]["epsilon"] == pytest.approx(2.0, rel=1e-3)
    assert summary["privacy"]["run"]["client_epsilon"] == INFINITE
    assert all(r["train_loss"] is None for r in summary["rounds"])  # no client's loss released
    assert "seed" not in " ".join(summary["privacy"]["noise"].split())


def test_shares_of_the_noise_add_up_to_one_release():
    d, k, clip, shares = 60, 3, 1.0, 16
    zero = ClassStatistics(np.zeros(k), np.zeros((k, d)), np.zeros(k), np.zeros((d, d)))
    summed = ClassStatistics.merge([statistics_noise_share(zero, 1.5, clip, shares)
                                    for _ in range(shares)])
    central = statistics_noise_share(zero, 1.5, clip)

    def entries(stats):  # the sums' entries and the Gram's, the latter scaled √2·C² -> 2C
        return np.concatenate([stats.sums.ravel(), stats.gram[np.triu_indices(d)] * math.sqrt(2)])

    expected = 1.5 * math.sqrt(4) * 2 * clip  # the sums' std in one release
    assert entries(summed).std() == pytest.approx(expected, rel=0.1)  # 2,010 entries each
    assert entries(central).std() == pytest.approx(expected, rel=0.1)


def distributed_release(cache_dir, tmp_path, monkeypatch, **overrides):
    """A distributed-DP start under SecAgg+ (12 clients) and the same run without noise: the
    summary, and the noisy sum's deviation from the exact one in units of one release's std
    (σ · √2 · 2C on the class sums); the server's own noise fails the test."""
    from ovalp_flwr.ova import server

    received, starts = [], []
    monkeypatch.setattr(server, "statistics_noise_share", lambda *a, **k: pytest.fail("central"))
    postprocessed, initial_head = server.postprocessed, server.initial_head
    monkeypatch.setattr(server, "postprocessed",
                        lambda noisy, *args: received.append(noisy) or postprocessed(noisy, *args))
    monkeypatch.setattr(server, "initial_head", lambda config, init, summed, cache: (
        starts.append(summed.total) or initial_head(config, init, summed, cache)))
    options = {"encoder": "pixels", "feature-cache-dir": str(cache_dir), "partition": "iid",
               "results-dir": str(tmp_path), "num-server-rounds": 0, **PRIVATE,
               "statistics-aggregation": "secagg+", "dp-statistics-epsilon": 1.0, **overrides}
    summary = read_summary(run_local({**options, "run-name": "secure"}, 12))
    run_local({**options, "run-name": "exact", "dp-statistics-epsilon": 0.0}, 12)
    (noisy,), exact = received, starts[1]
    sigma = summary["privacy"]["statistics"]["noise_multiplier"]
    deviation = (noisy.sums - exact.sums).ravel()  # SecAgg+'s quantisation: ~1e-5 of this
    return summary, deviation.std() / (sigma * math.sqrt(4) * 2 * 1.0)


def test_under_secagg_each_client_adds_its_share_and_the_server_sees_only_the_noisy_sum(
        cache_dir, tmp_path, monkeypatch):
    """Distributed DP: the sum SecAgg+ hands the server is off the exact one by one release's
    noise, and the server adds none of its own."""
    summary, releases_std = distributed_release(cache_dir, tmp_path, monkeypatch)
    assert summary["privacy"]["statistics"]["trust"] == "distributed"
    assert set(summary["privacy"]["trust"]) == {"distributed"}
    assert summary["head_init"]["noise_releases"] == 1.0
    assert releases_std == pytest.approx(1.0, rel=0.15)


def test_noise_shares_are_sized_for_the_fewest_survivors_drop_outs_allow(cache_dir, tmp_path,
                                                                         monkeypatch):
    """With 45% of the clients allowed to drop out (SecAgg+ allows under a half), each share
    is sized for 12 - floor(5.4) = 7 of 12: the seven fewest still make one release; all twelve
    back make 12/7 releases' variance (1.31 times the std)."""
    summary, releases_std = distributed_release(cache_dir, tmp_path, monkeypatch,
                                                **{"secagg-dropouts": 0.45})
    assert summary["head_init"]["noise_releases"] == pytest.approx(12 / 7)
    assert summary["head_init"]["secagg_dropped"] == []
    assert releases_std == pytest.approx(math.sqrt(12 / 7), rel=0.15)


def test_sampling_amplifies_the_rounds_as_the_strategy_draws_them():
    config = RunConfig.from_mapping({"dp-rounds-epsilon": 2.0, **PRIVATE, "head-init": "zeros",
                                     "num-server-rounds": 50, "fraction-train": 0.01})
    sampled = rounds_releases(config.privacy, config.rounds, 10_000)
    whole_rounds = dataclasses.replace(config.rounds, fraction_train=1.0)
    whole = rounds_releases(config.privacy, whole_rounds, 100)
    assert (sampled.sample, sampled.population) == (100, 10_000)
    assert (whole.sample, whole.population) == (100, 100)  # every client: no amplification
    unsampled = noise_multiplier_for(2.0, 50, 1e-5)
    assert sampled.noise_multiplier < unsampled / 5  # q = 1%: far less noise for the same ε
    assert epsilon_spent(sampled.noise_multiplier, 50, 1e-5, 100, 10_000) <= 2.0
    assert epsilon_spent(sampled.noise_multiplier, 50, 1e-5) > 2.0 * 5  # without sampling
    assert epsilon_spent(3.0, 10, 1e-5, 100, 100) == epsilon_spent(3.0, 10, 1e-5)  # q = 1
    report = report_of(config, 10_000)
    assert report["rounds"]["sampled"] == 100 and report["rounds"]["population"] == 10_000
    assert report["run"]["amplification_by_sampling"] is True
    assert report["rounds"]["epsilon"] == pytest.approx(2.0, rel=1e-3)
    assert make_strategy(config, sizes={n: 5 for n in range(10_000)}).privacy.noise_multiplier \
        == pytest.approx(sampled.noise_multiplier)


def test_dp_rounds_draw_their_sample_from_os_entropy_and_evaluation_from_the_seed():
    config = RunConfig.from_mapping({"dp-rounds-epsilon": 2.0, **PRIVATE, "head-init": "zeros",
                                     "fraction-train": 0.01})
    grid = InProcessGrid(ClientApp(), 1000, run_config={})
    first, second = (make_strategy(config) for _ in range(2))
    assert first.secret_sampling and not make_strategy(RunConfig()).secret_sampling
    assert first.sample(grid, 1, 0.01, purpose=0) != second.sample(grid, 1, 0.01, purpose=0)
    assert first.sample(grid, 1, 0.01, purpose=1) == second.sample(grid, 1, 0.01, purpose=1)


def test_the_rounds_epsilon_is_composed_from_the_noise_as_drawn_and_checked_against_the_ask(
        cache_dir, tmp_path):
    """summary.json's rounds ε comes from each round's record of the σ drawn and the nodes
    sampled from, not recomputed from the config: a federation that shrank under the sampler
    (less amplification) spends more than was asked, and the report says so."""
    config = RunConfig.from_mapping({"dp-rounds-epsilon": 2.0, **PRIVATE, "head-init": "zeros",
                                     "num-server-rounds": 4, "fraction-train": 0.1})
    planned = rounds_releases(config.privacy, config.rounds, 100)
    as_planned = [dataclasses.replace(planned, count=1)] * 4
    shrunk = as_planned[:3] + [dataclasses.replace(planned, count=1, population=20)]

    def rounds_of(applied):
        return privacy_report(config.privacy, config.rounds, config.data_releases, False, 100,
                              applied)["rounds"]

    assert rounds_of(as_planned)["epsilon"] == pytest.approx(2.0, rel=1e-3)
    assert rounds_of(as_planned)["within_asked"] and rounds_of(as_planned)["releases"] == 4
    assert rounds_of(shrunk)["epsilon"] > 2.0 * 1.01 and not rounds_of(shrunk)["within_asked"]
    assert rounds_of(shrunk)["population"] == [20, 100]
    assert rounds_of(as_planned[:2])["epsilon"] < 2.0  # two rounds drawn of four: less spent
    # a run: every round's record holds its σ and population, and the report composes those
    out = run_local({"encoder": "pixels", "feature-cache-dir": str(cache_dir),
                     "results-dir": str(tmp_path), "run-name": "dp", "head-init": "zeros",
                     "num-server-rounds": 2, "dp-rounds-epsilon": 2.0, **PRIVATE}, 10)
    summary = read_summary(out)
    assert [r["dp_population"] for r in summary["rounds"]] == [10, 10]
    assert all(r["dp_noise_multiplier"] == summary["privacy"]["rounds"]["noise_multiplier"]
               for r in summary["rounds"])
    assert summary["privacy"]["rounds"]["as_drawn"] is True
    assert summary["privacy"]["rounds"]["epsilon"] == pytest.approx(2.0, rel=1e-3)


def test_a_resumed_private_run_releases_its_statistics_once(cache_dir, tmp_path, monkeypatch):
    """Killed after round 1 and resumed: the second process reuses the noisy statistics its
    checkpoint kept, asks no client for statistics and draws no statistics noise; the
    released statistics are the first process's, bit for bit."""
    import ovalp_flwr.ova.client as client
    import ovalp_flwr.ova.server as server
    from ovalp_flwr.federation.checkpoint import read_checkpoint, unpack

    draws, asked = [], []
    noise_share, statistics_of = server.statistics_noise_share, client.client_statistics
    monkeypatch.setattr(server, "statistics_noise_share",
                        lambda *a, **k: draws.append(1) or noise_share(*a, **k))
    monkeypatch.setattr(client, "client_statistics", lambda *a, **k: (
        lambda stats: asked.append(stats is not None) or stats)(statistics_of(*a, **k)))
    config = {"encoder": "pixels", "feature-cache-dir": str(cache_dir),
              "results-dir": str(tmp_path), "run-name": "dp", "checkpoint-every": 1,
              "dp-statistics-epsilon": 4.0, "dp-rounds-epsilon": 4.0, **PRIVATE}
    first = run_local({**config, "num-server-rounds": 1}, 10)
    kept = unpack("released/statistics", read_checkpoint(first).arrays)
    assert len(draws) == 1 and sum(asked) == 10 and set(kept) >= {"counts", "gram-triu"}
    draws.clear(), asked.clear()
    resumed = run_local({**config, "num-server-rounds": 2, "resume": True}, 10)
    assert draws == [] and sum(asked) == 0  # no new release, and no client asked again
    again = unpack("released/statistics", read_checkpoint(resumed).arrays)
    assert all(np.array_equal(kept[key], again[key]) for key in kept)
    summary = read_summary(resumed)
    assert summary["resumes"][0]["round"] == 1 and summary["privacy"]["statistics"]["releases"] == 1


def _rule_names():
    from ovalp_flwr.federation.aggregators import RULES

    return sorted(RULES)


@pytest.mark.parametrize("rule", _rule_names())
def test_dp_rounds_run_each_robust_rule_inside_their_clipping(rule):
    """DP beside robust aggregation (Flower's DP is a wrapper round any strategy): the rule
    combines the clipped updates, unweighted, its update is projected into the clip ball, and
    the noise is sized for that ball (2·clip), not the mean's 2·clip / n."""
    from ovalp_flwr.federation.robust import RobustAggregation

    rng = np.random.default_rng(0)
    sent = {"weight": np.zeros(4, np.float32)}
    honest = [reply(n, list(rng.normal(0.1, 0.02, 4)), 10 * n) for n in range(1, 12)]
    hostile = [reply(99, [50.0, -50.0, 50.0, -50.0], 10_000)]  # far out: clipped, then resisted
    replies = honest + hostile
    inner = RobustAggregation(rule, 0.1)
    heads, _ = PrivateRounds(1e-9, 0.5, inner=inner)(replies, sent, server_round=1, sampled=12)
    clipped = [dataclasses.replace(r, weight=1.0, arrays={"weight": r.arrays["weight"] * min(
        1.0, 0.5 / np.linalg.norm(r.arrays["weight"]))}) for r in replies]
    by_hand, _ = inner(clipped, sent, 1, 12)
    expected = by_hand["weight"] * min(1.0, 0.5 / np.linalg.norm(by_hand["weight"]))
    assert np.allclose(heads["weight"], expected, atol=1e-5)
    assert np.linalg.norm(heads["weight"]) <= 0.5 + 1e-6
    wide = {"weight": np.zeros(100_000, np.float32)}
    rounds = PrivateRounds(2.0, 0.5, inner=inner)
    noise = rounds([reply(n, [0.0] * 100_000) for n in range(1, 12)], wide, 1, 11)[0]["weight"]
    assert noise.std() == pytest.approx(2.0 * 2 * 0.5, rel=0.02)  # the ball's diameter
    assert rounds.applied["dp_noise_std"] == pytest.approx(2.0)


def test_a_private_run_with_a_robust_rule_runs_and_accounts_as_dp_rounds(cache_dir, tmp_path):
    out = run_local({"encoder": "pixels", "feature-cache-dir": str(cache_dir),
                     "results-dir": str(tmp_path), "run-name": "dp-median", "head-init": "zeros",
                     "num-server-rounds": 2, "dp-rounds-epsilon": 4.0,
                     "robust-aggregation": "median", **PRIVATE}, 10)
    summary = read_summary(out)
    sigma = summary["privacy"]["rounds"]["noise_multiplier"]
    assert [r["dp_noise_std"] for r in summary["rounds"]] == pytest.approx([sigma * 2 * 0.05] * 2)
    assert summary["privacy"]["rounds"]["epsilon"] == pytest.approx(4.0, rel=1e-3)


def test_under_dp_the_summary_lists_what_it_carries_that_no_noise_covers(cache_dir, tmp_path):
    out = run_local({"encoder": "pixels", "feature-cache-dir": str(cache_dir),
                     "results-dir": str(tmp_path), "run-name": "dp", "num-server-rounds": 0,
                     "dp-statistics-epsilon": 4.0, "partition": "shard", **PRIVATE}, 10)
    fields = read_summary(out)["privacy"]["run"]["uncovered_fields"]
    assert any(f.startswith("partition.classes") for f in fields)
    assert not any(f.startswith("rounds[]") or f.startswith("label_noise") for f in fields)
    assert uncovered_fields({"rounds": [{"rejections": [{"node": 3}]}],
                             "label_noise": {"kind": "symmetric"}})[0].startswith("rounds[]")
