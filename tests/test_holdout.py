"""Validation rows (`data.holdout`): a seeded, stratified share no client trains on, kept by the
server or by the clients (federated validation), and the run's choices made on them, never on
the test split."""

import dataclasses

import numpy as np
import pytest

from ovalp_flwr.config import ConfigError, RunConfig
from ovalp_flwr.data.holdout import training_rows, validation_rows
from ovalp_flwr.features.cache import load_or_build
from ovalp_flwr.federation.local_grid import run_local
from ovalp_flwr.federation.checkpoint import read_checkpoint, unpack
from ovalp_flwr.federation.node import all_partitions, held_rows, node_data, node_validation_rows
from ovalp_flwr.federation.results import read_summary
from ovalp_flwr.ova import server


def test_every_stratum_gives_its_share_and_keeps_a_row():
    labels = np.repeat([0, 1, 2, 3], [100, 40, 5, 1])
    domains = np.tile([0, 1], len(labels) // 2)
    held = validation_rows(labels, domains, 0.1, seed=0)
    assert np.all(np.diff(held) > 0)  # sorted, no row twice
    for domain in (0, 1):
        for label, share in ((0, 5), (1, 2), (2, 0)):  # round(0.1 x 50), round(0.1 x 20), 0
            in_stratum = (labels[held] == label) & (domains[held] == domain)
            assert in_stratum.sum() == share
    assert 3 not in labels[held]  # a stratum's last row stays with the clients
    assert np.array_equal(held, validation_rows(labels, domains, 0.1, seed=0))
    assert not np.array_equal(held, validation_rows(labels, domains, 0.1, seed=1))
    assert len(validation_rows(labels, None, 0.0, seed=0)) == 0
    assert np.array_equal(training_rows(len(labels), held),
                          np.setdiff1d(np.arange(len(labels)), held))
    with pytest.raises(ValueError, match="validation fraction 1.0 is not allowed"):
        validation_rows(labels, None, 1.0, seed=0)


def test_the_clients_partition_every_row_but_the_validation_rows(cache_dir):
    config = RunConfig.from_mapping({"encoder": "pixels", "feature-cache-dir": str(cache_dir),
                                     "validation-fraction": 0.2, "partition": "shard"})
    cache = load_or_build("digits", "pixels", cache_dir, progress=False)
    held = held_rows(cache, node_data(config).spec)
    parts = all_partitions(node_data(config), 10)
    trained = np.concatenate(parts)
    assert len(np.intersect1d(trained, held)) == 0
    assert len(trained) + len(held) == len(cache.train.y) and len(set(trained)) == len(trained)
    assert abs(len(held) - 0.2 * len(cache.train.y)) < 10  # per class rounding
    unheld = dataclasses.replace(config, validation_fraction="auto")
    assert sum(map(len, all_partitions(node_data(unheld), 10))) == len(cache.train.y)  # chooses nothing


def test_clients_keep_a_share_of_their_own_partition_where_they_keep_the_rows(cache_dir):
    """validation-rows = "clients": nothing is held back before the partition; each client
    holds back its share of its own rows, by (domain, class), in a draw of its own."""
    config = RunConfig.from_mapping({"encoder": "pixels", "feature-cache-dir": str(cache_dir),
                                     "validation-rows": "clients", "partition": "shard"})
    cache = load_or_build("digits", "pixels", cache_dir, progress=False)
    assert config.validation_share == 0.1 and len(held_rows(cache, node_data(config).spec)) == 0
    # the partition of every row (the server keeps none: "auto" resolves to 0 there)
    whole = all_partitions(node_data(dataclasses.replace(config, validation_rows="server")), 10)
    trained = all_partitions(node_data(config), 10)
    kept = [node_validation_rows(node_data(config), client, 10) for client in range(10)]
    for part, everything, (_, labels) in zip(trained, whole, kept):
        assert set(part) <= set(everything) and len(part) + len(labels) == len(everything)
    for part, (features, labels) in zip(trained, kept):
        assert set(labels) <= set(cache.train.y[part])  # its own classes: its own rows
        for label in set(labels):  # about a tenth of each class it holds
            total = np.sum(cache.train.y[part] == label) + np.sum(labels == label)
            assert np.sum(labels == label) == min(total - 1, round(0.1 * total))
        assert not any((features == cache.train.x[row]).all(axis=1).any() for row in part[:20])


def test_federated_validation_is_the_exact_sum_of_what_each_client_keeps(cache_dir, tmp_path):
    """Every round the server asks every client to score the heads it holds on the rows it
    keeps; the weighted mean of their replies is the accuracy of those heads on all of them."""
    options = {"encoder": "pixels", "feature-cache-dir": str(cache_dir), "partition": "shard",
               "results-dir": str(tmp_path), "num-server-rounds": 3, "validation-rows": "clients",
               "feature-norm": "none", "head-init": "random", "run-name": "federated"}
    summary = read_summary(run_local(options, 10))
    config = RunConfig.from_mapping(options)
    kept = [node_validation_rows(node_data(config), client, 10) for client in range(10)]
    features = np.concatenate([x for x, _ in kept])
    labels = np.concatenate([y for _, y in kept])
    heads = unpack("global", read_checkpoint(tmp_path / "federated").arrays)
    right = np.argmax(features @ heads["weight"].T + heads["bias"], axis=1) == labels
    last = summary["rounds"][-1]
    assert last["val_rows"] == len(labels) and last["val_clients"] == 10
    assert last["val_accuracy"] == pytest.approx(right.mean(), abs=1e-6)
    assert summary["validation"] == {"fraction": 0.1, "rows": len(labels), "kept_by": "clients",
                                     "initial_accuracy": summary["validation"]["initial_accuracy"],
                                     "final_accuracy": last["val_accuracy"]}
    scored = [summary["validation"]["initial_accuracy"], *(r["val_accuracy"]
                                                           for r in summary["rounds"])]
    assert summary["best_val_round"] == max(range(1, 4), key=lambda r: (scored[r], -r))
    assert all(r["val_loss"] > 0 for r in summary["rounds"])


def test_validation_fraction_resolves_where_the_run_chooses_and_refuses_what_cannot_be():
    assert RunConfig().validation_share == 0.0  # the default run chooses nothing: as it was
    assert RunConfig.from_mapping({"robust-start": "leave-out"}).validation_share == 0.1
    assert RunConfig.from_mapping({"validation-fraction": 0.25}).validation_share == 0.25
    for value, why in ((0.6, r"use \"auto\" or a share in \[0, 0.5\]"),
                       ("some", r"use \"auto\" or a share")):
        with pytest.raises(ConfigError, match=f"validation-fraction={value!r} is not allowed; {why}"):
            RunConfig.from_mapping({"validation-fraction": value})
    with pytest.raises(ConfigError, match="robust-start is chosen on validation rows"):
        RunConfig.from_mapping({"validation-fraction": 0, "robust-start": "leave-out"})
    with pytest.raises(ConfigError, match="robust-start and ridge-lambda are chosen on validation"):
        RunConfig.from_mapping({"validation-fraction": 0, "robust-start": "leave-out",
                                "ridge-lambda": "auto"})
    assert RunConfig.from_mapping({"ridge-lambda": "auto"}).validation_share == 0.1
    # a penalty no start uses is no choice
    assert RunConfig.from_mapping({"ridge-lambda": "auto", "head-init": "zeros"}).choices == ()
    with pytest.raises(ConfigError, match="the encoder path holds no validation rows"):
        RunConfig.from_mapping({"validation-fraction": 0.1, "finetune": "lp",
                                "encoder": "efficientnet-lite0"})
    # rows the clients keep: scored by an exchange each round, so nothing that scores many
    # models on the server's own rows, nor an evaluate exchange that does something else
    federated = {"validation-rows": "clients"}
    assert RunConfig.from_mapping(federated).validation_share == 0.1
    for extra, refused in (({"robust-start": "leave-out"}, "validation-rows='clients'"),
                           ({"validation-fraction": 0.0}, "validation-fraction=0.0"),
                           ({"fraction-evaluate": 0.5}, "fraction-evaluate=0.5"),
                           ({"validation-rows": "everyone"}, "validation-rows='everyone'")):
        with pytest.raises(ConfigError, match=f"{refused} is not allowed"):
            RunConfig.from_mapping({**federated, **extra})


def with_test_labels_permuted(monkeypatch):
    """The server's cache with its test labels shuffled: a choice that reads them moves."""
    def load(*args, **kwargs):
        cache = load_or_build(*args, **kwargs)
        labels = np.random.default_rng(7).permutation(cache.test.y)
        return dataclasses.replace(cache, test=dataclasses.replace(cache.test, y=labels))
    monkeypatch.setattr(server, "load_or_build", load)


def test_permuting_the_test_labels_changes_no_choice_a_run_makes(cache_dir, tmp_path, monkeypatch):
    """A forger the start check finds (its class sums negated, in classes two clients hold: no
    consensus sees it, its own moments do) and mends or leaves out, and the best round: all
    chosen on validation rows, so the test split's labels, shuffled, move the scores and
    nothing else."""
    options = {"encoder": "pixels", "feature-cache-dir": str(cache_dir), "num-server-rounds": 3,
               "results-dir": str(tmp_path), "partition": "shard", "attack": "stats-flip",
               "attack-fraction": 0.1, "ridge-lambda": 0.001, "robust-start": "leave-out",
               "head-init": "ridge"}
    honest = read_summary(run_local({**options, "run-name": "honest"}, 10))
    with_test_labels_permuted(monkeypatch)
    shuffled = read_summary(run_local({**options, "run-name": "shuffled"}, 10))

    def choices(summary):
        start = summary["head_init"]
        return (start["screened"], start["screen_gain"], start["repair_gain"],
                start["screen_repaired"], start["screened_out"], start["left_out"], start["gains"],
                start["check_accuracy"], summary["best_val_round"],
                [r["val_accuracy"] for r in summary["rounds"]], summary["validation"])
    (forger,) = honest["head_init"]["screened"]  # there was a choice to make: mend it or not
    assert forger["why"].startswith("class sums off the total its moments give")
    assert honest["head_init"]["screen_repaired"]
    assert honest["head_init"]["checked_on"] == "validation"
    assert choices(shuffled) == choices(honest)
    assert shuffled["final_accuracy"] < honest["final_accuracy"] - 0.3  # the test split did move
    test_curve = [honest["initial_accuracy"], *(r["accuracy"] for r in honest["rounds"])]
    assert honest["accuracy_at_best_val_round"] == test_curve[honest["best_val_round"]]

    def penalty(name):  # ridge-lambda "auto": the penalty chosen on validation rows
        return read_summary(run_local({**options, "attack": "none", "robust-start": "none",
                                       "ridge-lambda": "auto", "run-name": name}, 10))
    shuffled = penalty("auto-shuffled")
    monkeypatch.undo()
    chosen = penalty("auto")
    assert chosen["head_init"]["lambda_path"] == shuffled["head_init"]["lambda_path"]
    assert chosen["head_init"]["ridge_lambda"] == shuffled["head_init"]["ridge_lambda"]
    assert chosen["initial_accuracy"] != shuffled["initial_accuracy"]

    def decay(name):  # weight-decay "auto": the server's L-BFGS walks its path on validation rows
        return read_summary(run_local({**options, "attack": "none", "robust-start": "none",
                                       "server-optimizer": "lbfgs", "weight-decay": "auto",
                                       "lbfgs-path-rounds": 1, "num-server-rounds": 9,
                                       "run-name": name}, 10))
    walked = decay("decay")
    with_test_labels_permuted(monkeypatch)
    shuffled = decay("decay-shuffled")
    assert walked["weight_decay_path"] == shuffled["weight_decay_path"]
    assert len(walked["weight_decay_path"]["val_accuracy"]) >= 3  # a walk, not one value
    assert walked["final_accuracy"] != shuffled["final_accuracy"]

    def head(name):  # head-init "auto": the ridge or LDA head the validation rows prefer
        return read_summary(run_local({**options, "attack": "none", "robust-start": "none",
                                       "head-init": "auto", "run-name": name}, 10))
    shuffled = head("head-shuffled")
    monkeypatch.undo()
    chosen = head("head")
    assert chosen["head_init"]["lda_path"] == shuffled["head_init"]["lda_path"]
    assert chosen["head_init"]["chosen_head"] == shuffled["head_init"]["chosen_head"]
    assert chosen["initial_accuracy"] != shuffled["initial_accuracy"]
