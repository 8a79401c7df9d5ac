"""The personalization phase end to end in process: client-wise test splits, the metrics'
definitions, every method through the real ClientApp, reproducibility, saved models."""

import csv
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from client_app import app as flower_client_app
from ovalp_flwr.core.model import model_from_numpy
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.node import node_data, node_rows, node_test_rows
from ovalp_flwr.config import RunConfig
from ovalp_flwr.federation.local_grid import InProcessGrid, app_config, run_local
from ovalp_flwr.personalize import METHODS
from ovalp_flwr.personalize.metrics import (CrossScores, ServerScores, per_client,
                                            per_client_on_server, summarize)
from ovalp_flwr.personalize.store import read_model
from ovalp_flwr.federation.results import read_summary
from server_app import run_server


LABEL_SHIFT = {"partition": "bernoulli-dirichlet", "dirichlet-p": 1.0, "dirichlet-alpha": 0.1}
SMALL_PFT = {"adapter-dim": 16, "head-init": "random", "num-server-rounds": 2, "pft-epochs": 3,
             "personalize-curve": "1 3", "pft.lss.models": 3, "pft.lp-ft.lp-epochs": 1}


def test_client_test_splits_follow_their_training_classes_and_never_hold_a_training_row(cache_dir):
    config = RunConfig.from_mapping({**app_config(), "encoder": "pixels",
                                     "feature-cache-dir": str(cache_dir), **LABEL_SHIFT})
    data = node_data(config)
    sizes = []
    for pid in range(5):
        train = node_rows(data, pid, 5)
        test_x, test_y = node_test_rows(data, pid, 5)
        train_classes, counts = np.unique(train.labels, return_counts=True)
        assert set(np.unique(test_y)) == set(train_classes)  # its own label distribution
        shares = np.array([np.mean(test_y == c) for c in train_classes])
        assert np.allclose(shares, counts / counts.sum(), atol=0.05)
        seen = {row.tobytes() for row in train.features}
        assert not any(row.tobytes() in seen for row in test_x)  # disjoint from training
        again = node_test_rows.__wrapped__(data, pid, 5)
        assert np.array_equal(again[0], test_x)  # seeded: the same split every time
        sizes.append(len(test_y))
    assert abs(sum(sizes) - 360) <= 25  # each client holds its share of the 360 test rows


def test_metrics_follow_their_definitions_on_a_hand_computed_case():
    # 3 clients; client i's model scored on client j's test split (10, 20, 0 rows)
    scores = CrossScores(clients=[0, 1, 2],
                         correct=np.array([[9, 10, 0], [5, 18, 0], [7, 14, 0]], float),
                         distance=np.array([[3, 6, 0], [0, 0, 0], [30, 60, 0]], float),
                         num_test=np.array([10, 20, 0]))
    rows = per_client(scores)
    assert [r["local"] for r in rows] == [0.9, 0.9, None]  # client 2 has no test split
    assert [r["global"] for r in rows] == [0.5, 0.5, pytest.approx(0.7)]  # (7/10 + 14/20) / 2
    assert [r["distortion"] for r in rows] == [0.3, 0.0, 3.0]  # distance / 30 test rows
    summary = summarize(rows)
    assert summary["local"] == pytest.approx(0.9) and summary["worst"] == pytest.approx(0.9)
    assert summary["c_std"] == pytest.approx(0.0)
    assert summary["global"] == pytest.approx((0.5 + 0.5 + 0.7) / 3)
    assert summary["average"] == pytest.approx((0.9 + 1.7 / 3) / 2)
    assert summary["distortion"] == pytest.approx(1.1)
    worse = summarize([{**rows[0], "local": 0.5}, rows[1], rows[2]])
    assert worse["worst"] == 0.5 and worse["c_std"] == pytest.approx(0.2)


def test_server_scored_metrics_follow_their_definitions_on_a_hand_computed_case():
    # 3 clients; Local from their own splits (10, 20, 0 rows), Global on the server's 50 rows
    scores = ServerScores(clients=[4, 5, 6], own_correct=np.array([9, 10, 0]),
                          num_test=np.array([10, 20, 0]), correct=np.array([40.0, 25.0, 10.0]),
                          distance=np.array([5.0, 0.0, 50.0]), num_server_test=50)
    rows = per_client_on_server(scores)
    assert [r["partition"] for r in rows] == [4, 5, 6]
    assert [r["local"] for r in rows] == [0.9, 0.5, None]
    assert [r["global"] for r in rows] == [0.8, 0.5, 0.2]  # a client without a split has one
    assert [r["distortion"] for r in rows] == [0.1, 0.0, 1.0]
    summary = summarize(rows)
    assert summary["local"] == pytest.approx(0.7) and summary["worst"] == 0.5
    assert summary["global"] == pytest.approx(0.5) and summary["average"] == pytest.approx(0.6)
    assert summary["c_std"] == pytest.approx(0.2)


def personalized_run(cache_dir, tmp_path, name, **extra):
    return read_summary(run_local({
        "encoder": "pixels", "feature-cache-dir": str(cache_dir), "results-dir": str(tmp_path),
        "run-name": name, **LABEL_SHIFT, **SMALL_PFT, "personalize": " ".join(METHODS), **extra},
        4))


@pytest.mark.slow
def test_every_method_runs_after_federation_with_per_client_rows_and_is_reproducible(
        cache_dir, tmp_path):
    summary = personalized_run(cache_dir, tmp_path, "pft")
    phase = summary["personalization"]
    assert list(phase["methods"]) == ["global", *METHODS]
    assert phase["clients"] == [0, 1, 2, 3]
    for method, result in phase["methods"].items():
        assert set(result["summary"]) == {"local", "global", "c_std", "worst", "average",
                                          "distortion"}
        assert [row["partition"] for row in result["clients"]] == [0, 1, 2, 3]
        if method != "global":
            curve = result["curve"]
            trajectory = method not in ("soup", "lss")  # soups score their soup only
            assert len(curve["local"]) == (3 if trajectory else 1)
            assert set(curve["global"]) == ({"1", "3"} if trajectory else {"3"})
            # the last snapshot is the final model: the curve ends where the table is
            assert curve["global"]["3"] == pytest.approx(result["summary"]["global"])
    methods = phase["methods"]
    # the global model is everybody's model: its Global is the run's final accuracy (the
    # server's test split: pft-global = "server"), and nothing is distorted
    assert phase["pft_global"] == "server"
    assert methods["global"]["summary"]["global"] == pytest.approx(summary["final_accuracy"])
    assert methods["global"]["summary"]["distortion"] == 0.0
    for features_kept in ("lp", "own-heads"):
        assert methods[features_kept]["summary"]["distortion"] == 0.0
    assert methods["ft"]["summary"]["distortion"] > 0
    assert methods["ft"]["summary"]["local"] > methods["global"]["summary"]["local"]
    with open(tmp_path / "pft" / "personalization.csv") as handle:
        assert len(list(csv.DictReader(handle))) == 4 * (len(METHODS) + 1)
    again = personalized_run(cache_dir, tmp_path, "pft-again")["personalization"]
    assert {m: r["summary"] for m, r in again["methods"].items()} == \
        {m: r["summary"] for m, r in methods.items()}


def test_a_node_with_a_model_dir_keeps_its_personalized_models(cache_dir, tmp_path):
    """Every kind of model a method leaves (heads moved alone, in two phases, only the own
    classes'); real SuperNodes keep theirs the same way (tests/test_deploy.py)."""
    methods = ("ft", "lp", "lp-ft", "own-heads")
    node_configs = [{"model-dir": str(tmp_path / f"node{i}")} for i in range(3)]
    summary = read_summary(run_local({
        "encoder": "pixels", "feature-cache-dir": str(cache_dir), "results-dir": str(tmp_path),
        "run-name": "kept", "num-server-rounds": 1, "pft-epochs": 2, "pft.lp-ft.lp-epochs": 1,
        "personalize": " ".join(methods)}, 3, node_configs))
    assert list(summary["personalization"]["methods"]) == ["global", *methods]
    for i in range(3):
        for method in methods:
            arrays, metadata = read_model(tmp_path / f"node{i}" / "kept" / f"{method}.safetensors")
            assert metadata["partition-id"] == str(i) and metadata["method"] == method
            assert arrays["weight"].shape == (10, 64)
    path = tmp_path / "node0" / "kept" / "ft.safetensors"
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 0xFF
    path.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match="sha256 mismatch"):
        read_model(path)


def test_a_client_failing_the_phase_leaves_the_federated_results_and_says_why(cache_dir, tmp_path,
                                                                              monkeypatch):
    from ovalp_flwr.personalize import client

    def broken(*_args, **_kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(client, "save_personalized", broken)
    summary = read_summary(run_local({
        "encoder": "pixels", "feature-cache-dir": str(cache_dir), "results-dir": str(tmp_path),
        "run-name": "failed", "num-server-rounds": 1, "pft-epochs": 1, "personalize": "ft"}, 3))
    assert summary["final_accuracy"] > 0.5 and len(summary["rounds"]) == 1
    assert "disk full" in summary["personalization"]["error"]
    assert not (tmp_path / "failed" / "personalization.csv").exists()


# ------------------------------------------------------------------ pft-global

REFERENCE = Path(__file__).parent / "data" / "pft_clients_reference.json"
REFERENCE_RUN = {**LABEL_SHIFT, "adapter-dim": 16, "head-init": "random", "num-server-rounds": 1,
                 "pft-epochs": 2, "personalize-curve": "1 2", "personalize": "ft lp soup",
                 "pft.soup.candidates": 2}


class RecordingGrid(InProcessGrid):
    """The in-process grid, remembering how many messages of each type went out and the
    models the clients sent back, by method and partition."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent: Counter = Counter()
        self.sent_global: dict = {}  # the global model the PERSONALIZE messages carried
        self.models: dict[str, dict[int, dict]] = {}  # method -> partition -> reply records

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = list(super().send_and_receive(messages, timeout=timeout))
        for message, reply in zip(messages, replies):
            self.sent[message.metadata.message_type] += 1
            if message.metadata.message_type == p.PERSONALIZE:
                method = str(message.content[p.CONFIG][p.METHOD])
                node = self.contexts[message.metadata.dst_node_id]
                self.sent_global = p.from_record(message.content[p.ARRAYS])
                self.models.setdefault(method, {})[node.node_config["partition-id"]] = {
                    key: p.from_record(record)
                    for key, record in reply.content.array_records.items()}
        return replies


def recorded_run(cache_dir, tmp_path, name, **extra):
    run_config = {**app_config(), "encoder": "pixels", "feature-cache-dir": str(cache_dir),
                  "results-dir": str(tmp_path), "run-name": name, **REFERENCE_RUN, **extra}
    config = RunConfig.from_mapping(run_config)
    grid = RecordingGrid(flower_client_app, 3, run_config, seed=config.seed)
    return read_summary(run_server(grid, config)), grid


def without_seconds(methods: dict) -> dict:
    return {m: {**r, "clients": [{k: v for k, v in row.items() if k != "seconds"}
                                 for row in r["clients"]]} for m, r in methods.items()}


def split_distortion(methods: dict) -> tuple[dict, list[float]]:
    """(the phase's figures without distortion, the distortions in a fixed order). Distortion is
    a mean of L2 distances between feature batches, whose last bits follow the CPU's BLAS kernel
    (the reference was recorded on another processor: 1e-8 apart here); every accuracy is a count
    and stays exact."""
    exact, distortions = {}, []
    for method, result in sorted(methods.items()):
        summary = dict(result["summary"])
        distortions.append(summary.pop("distortion", None))
        clients = []
        for row in result["clients"]:
            row = dict(row)
            distortions.append(row.pop("distortion", None))
            clients.append(row)
        exact[method] = {**result, "summary": summary, "clients": clients}
    return exact, distortions


def test_clients_mode_cross_scores_as_before_bit_for_bit(cache_dir, tmp_path):
    summary, grid = recorded_run(cache_dir, tmp_path, "clients", **{"pft-global": "clients"})
    phase = summary["personalization"]
    reference = json.loads(REFERENCE.read_text())["methods"]
    exact, distortions = split_distortion(without_seconds(phase["methods"]))
    reference_exact, reference_distortions = split_distortion(reference)
    assert exact == reference_exact
    assert distortions == pytest.approx(reference_distortions, rel=1e-6, abs=1e-9)
    assert phase["pft_global"] == "clients"
    # every model to every client: the global one, then each method's models and snapshots
    assert grid.sent[p.SCORE_PERSONALIZED] == 3 * 4 and grid.sent[p.PERSONALIZE] == 3 * 3


def test_server_mode_scores_each_model_once_on_the_servers_test_split(cache_dir, tmp_path,
                                                                      monkeypatch):
    from ovalp_flwr.ova import server as ova_server

    scorers = []

    class Recording(ova_server.FeatureScorer):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            scorers.append(self)

    monkeypatch.setattr(ova_server, "FeatureScorer", Recording)
    summary, grid = recorded_run(cache_dir, tmp_path, "server", **{"pft-global": "server"})
    phase = summary["personalization"]
    assert grid.sent[p.SCORE_PERSONALIZED] == 0 and grid.sent[p.PERSONALIZE] == 3 * 3
    assert phase["costs"]["messages"] == 3 * 3  # one upload per client and method, no more
    assert phase["pft_global"] == "server" and "server's test split" in phase["global_means"]
    features, labels = scorers[0].features, scorers[0].labels
    global_model = model_from_numpy(grid.sent_global, features.device)

    def direct(arrays: dict) -> tuple[float, float]:
        """Accuracy on the server's test rows, mean L2 distance to the global features."""
        model = model_from_numpy(arrays, features.device)
        with torch.no_grad():
            distance = torch.linalg.vector_norm(
                model.features(features) - global_model.features(features), dim=1)
            right = int((model(features).argmax(1) == labels).sum())
            return right / len(labels), float(distance.mean())

    reference = json.loads(REFERENCE.read_text())["methods"]
    methods = phase["methods"]
    assert methods["global"]["summary"]["global"] == pytest.approx(summary["final_accuracy"])
    for method, by_partition in grid.models.items():
        rows = methods[method]["clients"]
        for row in rows:
            accuracy, distortion = direct(by_partition[row["partition"]][p.ARRAYS])
            assert row["global"] == pytest.approx(accuracy, abs=1e-12)
            assert row["distortion"] == pytest.approx(distortion, rel=1e-5, abs=1e-6)
        if method != "soup":  # a soup is scored once, at its last epoch
            first = [direct(by_partition[row["partition"]][p.SNAPSHOT_PREFIX + "1"])[0]
                     for row in rows]
            assert methods[method]["curve"]["global"]["1"] == pytest.approx(np.mean(first))
        # Local is each client's own, whoever scores Global: the clients mode's, exactly
        for mode in (methods, reference):
            assert [r["local"] for r in mode[method]["clients"]] == \
                [r["local"] for r in reference[method]["clients"]]
        assert methods[method]["curve"]["local"] == reference[method]["curve"]["local"]
        timing = phase["timing"]["methods"][method]
        assert timing["fine_tuning_sum"] == pytest.approx(sum(r["seconds"] for r in rows))
        assert timing["fine_tuning_max"] == max(r["seconds"] for r in rows)
    assert [r["local"] for r in methods["global"]["clients"]] == \
        [r["local"] for r in reference["global"]["clients"]]
    assert phase["timing"]["phase"] == phase["seconds"] >= phase["timing"]["fine_tuning_sum"]
