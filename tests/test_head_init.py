"""Closed-form starts: the clients' summed statistics, the heads built from them, whole runs."""


import dataclasses
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ovalp_flwr.features.cache import load_or_build
from ovalp_flwr.config import ConfigError, RunConfig
from ovalp_flwr.core.options import HEAD_INITS
from ovalp_flwr.core.head_init import HEAD_INITS as REGISTRY
from ovalp_flwr.core.head_init import ClassStatistics, make_head_init
from ovalp_flwr.core.head_init.calibration import ScoreModel
from ovalp_flwr.core.head_init.statistics import ClientSums, unpack_symmetric, wire_bytes
from ovalp_flwr.federation.local_grid import run_local
from ovalp_flwr.core.normalize import FeatureMoments, NormStats, normalize
from ovalp_flwr.data.partition import PartitionSpec, partition_indices
from ovalp_flwr.federation.results import read_summary

CLIENTS = 20


@pytest.fixture(scope="module")
def digits(cache_dir):
    """Standardised training and test features of digits, as a run normalises them."""
    cache = load_or_build("digits", "pixels", cache_dir, progress=False)
    stats = NormStats.from_moments(FeatureMoments.of(cache.train.x))
    return (normalize("standardize", cache.train.x, stats), cache.train.y.astype(np.int64),
            normalize("standardize", cache.test.x, stats), cache.test.y.astype(np.int64))


def statistics(features, labels, with_gram=True):
    return ClassStatistics.of(torch.from_numpy(features), torch.from_numpy(labels), 10, with_gram)


def over_the_wire(stats):
    return ClassStatistics.from_arrays(stats.to_arrays())


@pytest.mark.parametrize("kind", ["iid", "shard", "bernoulli-dirichlet", "zipf", "feature-skew"])
def test_summed_client_statistics_are_the_centralised_ones_on_every_partition(digits, kind):
    x, y, _, _ = digits
    parts = partition_indices(PartitionSpec(kind, seed=3), y, CLIENTS, x)
    sent = [over_the_wire(statistics(x[rows], y[rows])) for rows in parts if len(rows)]
    merged = ClassStatistics.merge(sent)
    x64, onehot = x.astype(np.float64), np.eye(10)[y]
    np.testing.assert_array_equal(merged.counts, onehot.sum(0))
    # float32 on the wire: each client's sums are rounded once
    np.testing.assert_allclose(merged.sums, onehot.T @ x64, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(merged.gram, x64.T @ x64, rtol=1e-5, atol=1e-2)
    np.testing.assert_allclose(merged.square_norms, onehot.T @ (x64 ** 2).sum(1), rtol=1e-5)


def test_the_lambda_path_scores_every_penalty_as_its_own_solve_would(digits):
    """One eigendecomposition for the whole grid: each penalty's accuracy is that of the ridge
    start solved at it; the chosen penalty is the best, the largest of equals."""
    from ovalp_flwr.core.head_init.ridge import LAMBDA_GRID, LambdaPath, RidgeInit, lambda_path

    x, y, _, _ = digits
    held, kept = np.arange(len(y)) % 5 == 0, np.arange(len(y)) % 5 != 0
    stats = statistics(x[kept], y[kept])
    path = lambda_path(stats, x[held], y[held])
    assert path.grid == LAMBDA_GRID and len(set(path.accuracy)) > 3  # the penalty matters
    for lam, acc in zip(path.grid[::6], path.accuracy[::6]):
        weight, bias = RidgeInit(lam).linear_head(stats, 64, 10, 0)
        assert acc == pytest.approx(np.mean(np.argmax(x[held] @ weight.T + bias, 1) == y[held]),
                                    abs=1.5 / held.sum())  # a row's argmax may flip on rounding
    assert max(path.accuracy) == path.accuracy[path.grid.index(path.chosen)]
    assert LambdaPath((0.1, 1.0, 10.0), (0.5, 0.9, 0.9)).chosen == 10.0


def test_the_gram_matrix_travels_as_its_upper_triangle():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(5, 5))
    symmetric = a + a.T
    np.testing.assert_array_equal(unpack_symmetric(symmetric[np.triu_indices(5)], 5), symmetric)
    with pytest.raises(ValueError, match="has 15 entries; got shape \\(14,\\)"):
        unpack_symmetric(np.zeros(14), 5)
    stats = statistics(rng.normal(size=(30, 5)).astype(np.float32), np.arange(30) % 10)
    arrays = stats.to_arrays()
    assert arrays["gram-triu"].shape == (15,)
    assert sum(a.nbytes for a in arrays.values()) == wire_bytes("gram", 10, 5)


def test_ridge_start_is_the_centralised_ridge_solution_whatever_the_partition(digits):
    x, y, _, _ = digits
    ridge = make_head_init("ridge", ridge_lambda=0.001)
    centralised = ridge.linear_head(statistics(x, y), 64, 10, 0)
    parts = partition_indices(PartitionSpec("shard", seed=1), y, CLIENTS)
    federated = ClassStatistics.merge([over_the_wire(statistics(x[r], y[r])) for r in parts])
    weight, bias = ridge.linear_head(federated, 64, 10, 0)
    np.testing.assert_allclose(weight, centralised[0], atol=1e-5)
    np.testing.assert_allclose(bias, centralised[1], atol=1e-5)
    # and it is ridge regression onto one-hot labels, the bias a penalised feature, λ per sample
    augmented = np.hstack([x, np.ones((len(x), 1))]).astype(np.float64)
    penalty = 0.001 * len(x) * np.eye(65)
    direct = np.linalg.solve(augmented.T @ augmented + penalty, augmented.T @ np.eye(10)[y])
    norms = np.linalg.norm(direct[:-1], axis=0)  # the Gram matrix above is float32's: 1e-5
    np.testing.assert_allclose(weight, (direct[:-1] / norms).T, atol=1e-5)
    np.testing.assert_allclose(bias, direct[-1] / norms, atol=1e-5)


def test_class_means_start_is_the_cosine_nearest_class_mean(digits):
    x, y, test_x, _ = digits
    weight, bias = make_head_init("class-means").linear_head(statistics(x, y, False), 64, 10, 0)
    means = np.stack([x[y == c].mean(0) for c in range(10)])
    cosine = (test_x / np.linalg.norm(test_x, axis=1, keepdims=True)) @ (
        means / np.linalg.norm(means, axis=1, keepdims=True)).T
    assert ((test_x @ weight.T + bias).argmax(1) == cosine.argmax(1)).all()
    assert not bias.any()


@pytest.mark.parametrize("name,head", [("class-means", "ova"), ("ridge", "ova"),
                                       ("ridge", "softmax")])
def test_calibration_keeps_the_argmax_and_lowers_the_training_loss(digits, name, head):
    x, y, test_x, _ = digits
    init = make_head_init(name)
    stats = statistics(x, y, init.statistics == "gram")
    raw = init.linear_head(stats, 64, 10, 0)
    calibrated = init.build(stats, 64, 10, 0, head)
    scores = lambda w, b: test_x @ w.T + b
    assert (scores(*raw).argmax(1) == scores(*calibrated).argmax(1)).all()
    loss = lambda w, b: float(training_loss(head, torch.from_numpy(x @ w.T + b), y))
    assert loss(*calibrated) < 0.7 * loss(*raw)


@pytest.mark.parametrize("head", ["ova", "softmax"])
def test_calibration_for_a_penalised_objective_lowers_that_objective(digits, head):
    """What `server-optimizer = "lbfgs"` starts from: the scale chosen with the weight decay in
    the loss is smaller, and the penalised objective lower, than the scale chosen without."""
    x, y, _, _ = digits
    stats = statistics(x, y)
    init, lam = make_head_init("ridge"), 0.05
    plain, penalised = (init.build(stats, 64, 10, 0, head, weight_decay)
                        for weight_decay in (0.0, lam))

    def objective(w, b):
        return float(training_loss(head, torch.from_numpy(x @ w.T + b), y)) + \
            0.5 * lam * float(np.sum(w.astype(np.float64) ** 2))

    assert np.linalg.norm(penalised[0]) < np.linalg.norm(plain[0])
    assert objective(*penalised) < objective(*plain)


@pytest.mark.parametrize("head", ["ova", "softmax"])
def test_calibration_steps_exactly_as_torch_optim_lbfgs(digits, head, monkeypatch):
    """`StepOnlyLBFGS` leaves out Optimizer's set-up (it imports torch._dynamo), not its step:
    the calibrated start is torch.optim.LBFGS's to the last bit (the fresh-process check:
    tests/test_training.py)."""
    from ovalp_flwr.core.head_init import calibration

    x, y, _, _ = digits
    stats, init = statistics(x, y), make_head_init("ridge")
    ours = init.build(stats, 64, 10, 0, head, 0.01)
    monkeypatch.setattr(calibration, "StepOnlyLBFGS", torch.optim.LBFGS)
    theirs = init.build(stats, 64, 10, 0, head, 0.01)
    assert all(np.array_equal(mine, its) for mine, its in zip(ours, theirs))


def training_loss(head, logits, labels):
    labels = torch.from_numpy(labels)
    if head == "softmax":
        return F.cross_entropy(logits, labels)
    return F.binary_cross_entropy_with_logits(logits, F.one_hot(labels, 10).double(),
                                              reduction="none").sum(1).mean()


def test_the_score_model_has_the_exact_class_means_and_pooled_covariance(digits):
    x, y, _, _ = digits
    rng = np.random.default_rng(0)
    weight, bias = rng.normal(size=(10, 64)), rng.normal(size=10)
    model = ScoreModel.of(weight, bias, statistics(x.astype(np.float64), y))
    scores = x.astype(np.float64) @ weight.T + bias
    means = np.stack([scores[y == c].mean(0) for c in range(10)])
    np.testing.assert_allclose(model.means, means, rtol=1e-4, atol=1e-4)
    centred = scores - means[y]
    np.testing.assert_allclose(model.covariance, centred.T @ centred / len(y), rtol=1e-3, atol=1e-3)


def test_every_start_named_in_the_config_is_registered_and_bad_values_say_what_is_allowed():
    assert set(HEAD_INITS) == set(REGISTRY)
    with pytest.raises(ConfigError) as err:
        RunConfig.from_mapping({"head-init": "qda"})
    assert str(err.value) == ("run config: head-init='qda' is not allowed; choose one of: "
                              "random, zeros, class-means, fedcof, fed3r, lda, ridge, low-rank, auto")
    with pytest.raises(ConfigError, match="gram-rank=-1 is not allowed; use a whole number >= 0"):
        RunConfig.from_mapping({"gram-rank": -1})
    with pytest.raises(ConfigError, match="ridge-lambda=0.0 is not allowed; use a value > 0"):
        RunConfig.from_mapping({"ridge-lambda": 0.0})
    with pytest.raises(ConfigError, match="num-server-rounds=-1 is not allowed"):
        RunConfig.from_mapping({"num-server-rounds": -1})


# ------------------------------------------------------------------------------ whole runs


def run(cache_dir, tmp_path, clients=CLIENTS, **overrides):
    config = {"encoder": "pixels", "feature-cache-dir": str(cache_dir),
              "results-dir": str(tmp_path / "results"), "num-server-rounds": 3,
              "run-name": "t", **overrides}
    return read_summary(run_local(config, clients))


def centralised_accuracy(digits, name, **options):
    x, y, test_x, test_y = digits
    init = make_head_init(name, **options)
    weight, bias = init.linear_head(statistics(x, y, init.statistics == "gram"), 64, 10, 0)
    return float(((test_x @ weight.T + bias).argmax(1) == test_y).mean())


@pytest.mark.parametrize("name", ["class-means", "fed3r", "lda", "ridge"])
@pytest.mark.parametrize("partition", ["shard", "bernoulli-dirichlet"])
def test_a_run_without_rounds_is_the_published_classifier_on_any_partition(
        cache_dir, tmp_path, digits, name, partition):
    """FedNCM / Fed3R / ours: `num-server-rounds = 0` scores the start, the centralised
    classifier."""
    summary = run(cache_dir, tmp_path, partition=partition, **{"head-init": name,
                                                               "num-server-rounds": 0})
    assert summary["rounds"] == []
    assert summary["final_accuracy"] == summary["best_accuracy"] == summary["initial_accuracy"]
    assert summary["initial_accuracy"] == pytest.approx(centralised_accuracy(digits, name),
                                                        abs=1 / 360 + 1e-9)
    start = summary["head_init"]
    assert start["name"] == name and start["clients_sent"] == CLIENTS - summary["partition"]["num_empty"]
    kind = make_head_init(name).statistics
    assert start["statistics_bytes_per_client"] >= wire_bytes(kind, 10, 64)
    assert summary["setup"]["bytes_received"] > start["clients_sent"] * wire_bytes(kind, 10, 64)


@pytest.mark.parametrize("norm", ["standardize", "none"])
def test_rounds_from_a_statistics_start_begin_near_its_accuracy(cache_dir, tmp_path, norm):
    """Both set-up paths: statistics ride on set_norm (standardize) or on describe (none)."""
    summary = run(cache_dir, tmp_path, partition="shard", **{"head-init": "class-means",
                                                             "feature-norm": norm})
    random = run(cache_dir, tmp_path, partition="shard", **{"feature-norm": norm,
                                                            "head-init": "random"})
    assert summary["initial_accuracy"] > 0.7 > random["initial_accuracy"]
    assert summary["rounds"][0]["accuracy"] > 0.7 > random["rounds"][0]["accuracy"]


def test_zero_heads_start_at_chance_and_random_heads_are_the_seeded_torch_init(cache_dir, tmp_path,
                                                                             digits):
    zeros = run(cache_dir, tmp_path, **{"head-init": "zeros", "num-server-rounds": 1})
    assert zeros["initial_accuracy"] == pytest.approx(np.mean(
        load_or_build("digits", "pixels", cache_dir).test.y == 0))  # every logit 0: class 0
    from ovalp_flwr.core.heads import accuracy, build_head

    random = run(cache_dir, tmp_path, **{"head-init": "random", "num-server-rounds": 1})
    _, _, test_x, test_y = digits
    head = build_head(64, 10, seed=0)  # what every run before head-init started from
    assert random["initial_accuracy"] == pytest.approx(
        accuracy(head, torch.from_numpy(test_x), torch.from_numpy(test_y)))


def test_a_start_from_statistics_that_no_client_sent_is_refused(cache_dir):
    """Every sample lands on some client, so a partition cannot get here; the server checks."""
    from ovalp_flwr.federation.exchange import FederationError
    from ovalp_flwr.federation.setup import StatisticsSum
    from ovalp_flwr.ova.server import initial_head

    cache = load_or_build("digits", "pixels", cache_dir)
    config = RunConfig(encoder="pixels", head_init="ridge")
    with pytest.raises(FederationError, match="head-init='ridge': no client sent statistics"):
        initial_head(config, make_head_init("ridge"), StatisticsSum(), cache)
    with pytest.raises(ValueError, match="needs the clients' statistics; none came"):
        make_head_init("ridge").build(None, 64, 10, 0, "ova")


# ------------------------------------------------------------------------- FedCOF and Fed3R


def gaussian_clients(rng, covariance, sizes):
    """One class's rows on clients of `sizes` rows, every row from N(m, covariance)."""
    mean = rng.normal(size=len(covariance))
    rows = [rng.multivariate_normal(mean, covariance, size=n) for n in sizes]
    return ClientSums(np.zeros(len(sizes), np.int64), np.array(sizes, np.float64),
                      np.stack([r.sum(0) for r in rows]))


def test_fedcofs_covariance_from_client_means_is_unbiased_on_gaussian_clients():
    """The clients' means of n_k rows spread with covariance Σ / n_k: FedCOF's estimate, from
    the means and counts alone, averages to Σ (dividing by K, not K - 1, would not)."""
    from ovalp_flwr.core.head_init.fedcof import class_covariance

    rng = np.random.default_rng(0)
    root = rng.normal(size=(3, 3))
    covariance = root @ root.T + np.eye(3)
    sizes = [2, 3, 5, 8, 13, 4]
    estimates = np.stack([class_covariance(gaussian_clients(rng, covariance, sizes), 0)
                          for _ in range(4000)])
    error = np.abs(estimates.mean(0) - covariance).max() / np.abs(covariance).max()
    assert error < 0.03, error
    biased = estimates.mean(0) * (len(sizes) - 1) / len(sizes)
    assert np.abs(biased - covariance).max() / np.abs(covariance).max() > 0.1


def test_with_a_row_per_client_fedcofs_gram_is_the_gram_without_the_between_class_scatter(digits):
    """Each client holding one row of a class: its mean is the row, so the spread of the means
    is each class's scatter exactly, and FedCOF's Ĝ (γ = 0) is XᵀX less Σ_c N_c(μ_c - ḡ)(μ_c - ḡ)ᵀ,
    the between-class scatter its paper leaves out."""
    from ovalp_flwr.core.head_init.fedcof import estimated_gram

    x, y, _, _ = digits
    x = x.astype(np.float64)
    rows = ClientSums(y, np.ones(len(y)), x)
    means, grand = np.stack([x[y == c].mean(0) for c in range(10)]), x.mean(0)
    counts = np.bincount(y, minlength=10)
    between = sum(counts[c] * np.outer(means[c] - grand, means[c] - grand) for c in range(10))
    np.testing.assert_allclose(estimated_gram(rows, 10, 0.0), x.T @ x - between, atol=1e-6)
    shrunk = estimated_gram(rows, 10, 0.5) - estimated_gram(rows, 10, 0.0)
    np.testing.assert_allclose(shrunk, 0.5 * (len(y) - 10) * np.eye(64), atol=1e-6)


def test_fedcofs_head_is_its_solution_on_the_clients_means_and_fed3rs_its_own_ridge(digits):
    """FedCOF: W = Ĝ⁺S, unit rows, no bias, from each client's class sums (a partition's);
    Fed3R: W = (XᵀX + 0.01 I)⁻¹ S, its absolute λ, unit rows, no bias."""
    from ovalp_flwr.core.head_init.fedcof import estimated_gram

    x, y, _, _ = digits
    parts = [over_the_wire(statistics(x[rows], y[rows], False)) for rows in
             partition_indices(PartitionSpec("bernoulli-dirichlet", seed=3), y, CLIENTS, x) if len(rows)]
    stats = dataclasses.replace(ClassStatistics.merge(parts), clients=ClientSums.of_clients(parts))
    weight, bias = make_head_init("fedcof", fedcof_shrinkage=1.0).linear_head(stats, 64, 10, 0)
    direct = (np.linalg.pinv(estimated_gram(stats.clients, 10, 1.0)) @ stats.sums.T).T
    np.testing.assert_allclose(weight, direct / np.linalg.norm(direct, axis=1, keepdims=True),
                               atol=1e-6)
    assert not bias.any()
    weight, bias = make_head_init("fed3r").linear_head(statistics(x, y), 64, 10, 0)
    x64 = x.astype(np.float64)
    direct = np.linalg.solve(x64.T @ x64 + 0.01 * np.eye(64), x64.T @ np.eye(10)[y]).T
    np.testing.assert_allclose(weight, direct / np.linalg.norm(direct, axis=1, keepdims=True),
                               atol=1e-5)
    assert not bias.any()
    with pytest.raises(ValueError, match="needs each client's class sums"):
        make_head_init("fedcof").linear_head(ClassStatistics.merge(parts), 64, 10, 0)


@pytest.mark.parametrize("partition", ["iid", "shard"])
def test_a_fedcof_run_builds_its_head_from_each_clients_means_at_fedncms_bytes(
        cache_dir, tmp_path, digits, partition):
    """Through the set-up exchange: the server keeps each client's class sums as they come, so
    the run's start is FedCOF's on that partition's clients, at class-means' bytes."""
    summary = run(cache_dir, tmp_path, partition=partition,
                  **{"head-init": "fedcof", "num-server-rounds": 0})
    x, y, test_x, test_y = digits
    parts = [statistics(x[rows], y[rows], False) for rows in partition_indices(
        PartitionSpec(partition, seed=0), y, CLIENTS, x) if len(rows)]
    stats = dataclasses.replace(ClassStatistics.merge(parts), clients=ClientSums.of_clients(parts))
    weight, bias = make_head_init("fedcof").linear_head(stats, 64, 10, 0)
    expected = float(((test_x @ weight.T + bias).argmax(1) == test_y).mean())
    assert summary["initial_accuracy"] == pytest.approx(expected, abs=1 / 360 + 1e-9)
    assert summary["head_init"]["name"] == "fedcof"
    assert summary["head_init"]["statistics_bytes_per_client"] < 1.2 * wire_bytes("class-sums", 10, 64)


@pytest.mark.parametrize("option,said", [
    ({"statistics-aggregation": "secagg+"}, "under statistics-aggregation='secagg+' the server sees only their sum"),
    ({"robust-start": "screen"}, "use robust-start='none'"),
    ({"dp-statistics-epsilon": 1.0}, "dp-statistics-epsilon noises only their sum")])
@pytest.mark.parametrize("name", ["fedcof", "low-rank"])
def test_starts_from_each_clients_statistics_are_refused_where_the_server_sees_only_sums(
        name, option, said):
    with pytest.raises(ConfigError, match=re.escape(said)):
        RunConfig.from_mapping({"head-init": name, **option})


def test_gh_ofls_lda_is_scikit_learns_lda_on_the_pooled_rows_with_its_unbiased_covariance(digits):
    """Unshrunk, GH-LDA is linear discriminant analysis: scikit-learn's (`lsqr`) on the pooled
    rows, whose covariance divides the within-class scatter by N, where GH-OFL's code divides by
    N - K (so its weights are (N - K) / N times sklearn's, and so is the quadratic part of its
    biases). Its shrinkage pulls the covariance toward its mean variance."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    from ovalp_flwr.core.head_init.lda import MIN_EPS, pooled_covariance

    x, y, test_x, _ = digits
    x64 = x.astype(np.float64)
    stats = statistics(x64, y)
    weight, bias = make_head_init("lda", lda_shrinkage=0.0).linear_head(stats, 64, 10, 0)
    sklearn = LinearDiscriminantAnalysis(solver="lsqr").fit(x64, y)
    scale = (len(y) - 10) / len(y)
    np.testing.assert_allclose(weight, scale * sklearn.coef_, rtol=1e-3, atol=1e-3 * np.abs(weight).max())
    log_prior = np.log(np.bincount(y) / len(y))
    np.testing.assert_allclose(bias, scale * (sklearn.intercept_ - log_prior) + log_prior,
                               rtol=1e-3, atol=1e-3)
    assert ((test_x @ weight.T + bias).argmax(1) == sklearn.predict(test_x)).mean() > 0.99
    covariance = pooled_covariance(stats)
    shrunk_weight, _ = make_head_init("lda", lda_shrinkage=0.3).linear_head(stats, 64, 10, 0)
    shrunk = 0.7 * covariance + (0.3 * np.trace(covariance) / 64 + MIN_EPS) * np.eye(64)
    np.testing.assert_allclose(shrunk_weight, np.linalg.solve(shrunk, stats.class_means.T).T,
                               rtol=1e-6, atol=1e-8)


def test_afls_absolute_aggregation_is_the_least_squares_solution_of_the_summed_statistics():
    """AFL (Zhuang et al., 2024; its code's `aggregation` and `clean_regularization`): each
    client solves its own ridge problem, the server merges the solutions two by two with the
    absolute-aggregation law and removes the K·γ its sum carries. The result is the centralised
    least-squares head (XᵀX)⁻¹XᵀY, on any partition: exactly what the federation's summed Gram
    and class sums give (`fed3r` at λ → 0, before its unit rows), so no second copy is kept."""
    rng = np.random.default_rng(1)
    dim, classes, gamma = 8, 3, 1.0
    clients = [(rng.normal(size=(n, dim)) + 0.3 * k, rng.integers(0, classes, size=n))
               for k, n in enumerate((5, 40, 12, 30))]  # the first has fewer rows than D
    local = []
    for x, y in clients:
        c = x.T @ x + gamma * np.eye(dim)
        local.append((np.linalg.solve(c, x.T @ np.eye(classes)[y]), np.linalg.inv(c), c))
    (w_t, _, c_t), rest = local[0], local[1:]
    r_t = np.linalg.inv(c_t)
    eye = np.eye(dim)
    for w_k, r_k, c_k in rest:  # AFL's AA law, as its `aggregation` applies it
        merged = np.linalg.inv(c_t + c_k)
        w_t = (eye - r_t @ c_k + r_t @ c_k @ merged @ c_k) @ w_t + \
              (eye - r_k @ c_t + r_k @ c_t @ merged @ c_t) @ w_k
        c_t = c_t + c_k
        r_t = np.linalg.inv(c_t)
    carried = len(clients) * gamma
    afl = w_t + carried * np.linalg.inv(c_t - carried * eye) @ w_t  # `clean_regularization`
    summed = ClassStatistics.merge([ClassStatistics.of(torch.from_numpy(x), torch.from_numpy(y),
                                                       classes, True) for x, y in clients])
    np.testing.assert_allclose(afl, np.linalg.solve(summed.gram, summed.sums.T), rtol=1e-8,
                               atol=1e-10)


# ------------------------------------------------------------------------- low-rank (ours)


def low_rank(features, labels, rank):
    return over_the_wire(ClassStatistics.of(torch.from_numpy(features), torch.from_numpy(labels),
                                            10, False, rank))


def within_class_scatter(features, labels):
    rows, onehot = features.astype(np.float64), np.eye(10)[labels]
    means = onehot.T @ rows / np.maximum(onehot.sum(0), 1)[:, None]
    centred = rows - onehot @ means
    return centred.T @ centred


@pytest.mark.parametrize("rows", [40, 300])  # fewer rows than D = 64 (a thin SVD), more (eigh)
def test_a_low_rank_factor_is_the_top_of_the_clients_within_class_scatter(digits, rows):
    x, y, _, _ = digits
    scatter = within_class_scatter(x[:rows], y[:rows])
    eigenvalues, vectors = np.linalg.eigh(scatter)
    top = (vectors[:, -5:] * eigenvalues[-5:]) @ vectors[:, -5:].T
    factor = low_rank(x[:rows], y[:rows], 5).scatter_factor
    assert factor.shape == (5, 64)
    np.testing.assert_allclose(factor.T @ factor, top, atol=1e-4 * eigenvalues[-1])


def test_a_low_rank_gram_is_exact_at_the_clients_rank_and_keeps_the_trace_below_it(digits):
    """Between the classes (from the class sums) and along the r directions the estimate is
    the client's Gram matrix; the rest of its trace, known from the square norms, is spread
    evenly over the other directions."""
    x, y, _, _ = digits
    rows = x[:40].astype(np.float64)
    exact = rows.T @ rows
    np.testing.assert_allclose(low_rank(x[:40], y[:40], 40).gram_estimate(), exact,
                               atol=1e-5 * np.abs(exact).max())
    for rank in (0, 3, 10):
        estimate = low_rank(x[:40], y[:40], rank).gram_estimate()
        assert np.trace(estimate) == pytest.approx(np.trace(exact), rel=1e-5)
        between = exact - within_class_scatter(x[:40], y[:40])
        factor = low_rank(x[:40], y[:40], rank).scatter_factor
        left = np.trace(exact - between) - (factor ** 2).sum()
        if rank == 0:
            np.testing.assert_allclose(estimate, between + left / 64 * np.eye(64),
                                       atol=1e-5 * np.abs(exact).max())


def test_low_rank_statistics_travel_at_their_bytes_and_refuse_a_factor_of_another_width():
    arrays = low_rank(np.random.default_rng(0).normal(size=(30, 5)).astype(np.float32),
                      np.arange(30) % 10, 2).to_arrays()
    assert sum(a.nbytes for a in arrays.values()) == wire_bytes("low-rank", 10, 5, rank=2)
    arrays["scatter-factor"] = np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match=re.escape("a scatter factor has shape (2, 4); "
                                                   "expected [r, 5]")):
        ClassStatistics.from_arrays(arrays)


def test_a_low_rank_run_is_the_ridge_start_at_full_rank_and_close_to_it_at_a_tenth_of_the_bytes(
        cache_dir, tmp_path):
    """Through the set-up exchange: at r = D each client's Gram matrix is rebuilt exactly, so
    the start is the ridge start; at r = 4 the clients send class sums and 4·D floats."""
    ridge = run(cache_dir, tmp_path, partition="shard", **{"head-init": "ridge",
                                                           "num-server-rounds": 0})
    full, low = (run(cache_dir, tmp_path, partition="shard", **{
        "head-init": "low-rank", "gram-rank": rank, "num-server-rounds": 0}) for rank in (64, 4))
    assert full["initial_accuracy"] == pytest.approx(ridge["initial_accuracy"], abs=1 / 360 + 1e-9)
    assert low["initial_accuracy"] > ridge["initial_accuracy"] - 0.05
    sent = low["head_init"]["statistics_bytes_per_client"]
    assert wire_bytes("low-rank", 10, 64, 4) <= sent < wire_bytes("gram", 10, 64)


# ------------------------------------------------------------------- auto (ours, chosen)


def test_the_auto_start_is_the_ridge_or_lda_head_most_accurate_on_the_validation_rows(digits):
    from ovalp_flwr.core.head_init.chosen import LDA_GRID, choose_head
    from ovalp_flwr.core.head_init.ridge import LAMBDA_GRID

    x, y, _, _ = digits
    train, held = np.arange(len(y)) % 5 != 0, np.arange(len(y)) % 5 == 0
    stats = statistics(x[train], y[train])

    def accuracy(name, **options):
        weight, bias = make_head_init(name, **options).linear_head(stats, 64, 10, 0)
        return float(((x[held] @ weight.T + bias).argmax(1) == y[held]).mean())

    candidates = {("ridge", lam): accuracy("ridge", ridge_lambda=lam) for lam in LAMBDA_GRID}
    candidates |= {("lda", a): accuracy("lda", lda_shrinkage=a) for a in LDA_GRID}
    init, info = choose_head(stats, x[held], y[held])
    value = info["ridge_lambda"] if init.name == "ridge" else info["lda_shrinkage"]
    assert info["chosen_val_accuracy"] == pytest.approx(max(candidates.values()))
    assert candidates[(init.name, value)] == pytest.approx(max(candidates.values()))
    assert info["lda_path"]["val_accuracy"] == pytest.approx([candidates[("lda", a)] for a in LDA_GRID])
    with pytest.raises(ValueError, match="builds the head choose_head picks"):
        make_head_init("auto").linear_head(stats, 64, 10, 0)


def test_an_auto_run_holds_rows_back_and_starts_from_the_head_they_chose(cache_dir, tmp_path, digits):
    assert RunConfig.from_mapping({"head-init": "auto"}).choices == ("head-init",)
    summary = run(cache_dir, tmp_path, partition="shard",
                  **{"head-init": "auto", "num-server-rounds": 0})
    start = summary["head_init"]
    assert start["name"] == start["chosen_head"] in ("ridge", "lda")
    assert summary["validation"]["rows"] > 0
    assert start["chosen_val_accuracy"] == max(start["lambda_path"]["val_accuracy"]
                                               + start["lda_path"]["val_accuracy"])
