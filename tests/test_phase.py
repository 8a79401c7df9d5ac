"""The personalization phase end to end in process: client-wise test splits, the metrics'
definitions, every method through the real ClientApp, reproducibility, saved models."""

import csv

import numpy as np
import pytest

from ovalp_flwr.federation.node import feature_source, node_rows, node_test_rows, noise_spec, \
    partition_spec
from ovalp_flwr.config import RunConfig
from ovalp_flwr.federation.local_grid import app_config, run_local
from ovalp_flwr.personalize import METHODS
from ovalp_flwr.personalize.metrics import CrossScores, per_client, summarize
from ovalp_flwr.personalize.store import read_model
from ovalp_flwr.federation.results import read_summary


LABEL_SHIFT = {"partition": "bernoulli-dirichlet", "dirichlet-p": 1.0, "dirichlet-alpha": 0.1}
SMALL_PFT = {"adapter-dim": 16, "head-init": "random", "num-server-rounds": 2, "pft-epochs": 3,
             "personalize-curve": "1 3", "pft.lss.models": 3, "pft.lp-ft.lp-epochs": 1}


def test_client_test_splits_follow_their_training_classes_and_never_hold_a_training_row(cache_dir):
    config = RunConfig.from_mapping({**app_config(), "encoder": "pixels",
                                     "feature-cache-dir": str(cache_dir), **LABEL_SHIFT})
    source, spec, noise = feature_source(config), partition_spec(config), noise_spec(config)
    sizes = []
    for pid in range(5):
        train = node_rows(source, spec, noise, pid, 5)
        test_x, test_y = node_test_rows(source, spec, noise, pid, 5)
        train_classes, counts = np.unique(train.labels, return_counts=True)
        assert set(np.unique(test_y)) == set(train_classes)  # its own label distribution
        shares = np.array([np.mean(test_y == c) for c in train_classes])
        assert np.allclose(shares, counts / counts.sum(), atol=0.05)
        seen = {row.tobytes() for row in train.features}
        assert not any(row.tobytes() in seen for row in test_x)  # disjoint from training
        again = node_test_rows.__wrapped__(source, spec, noise, pid, 5)
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


def personalized_run(cache_dir, tmp_path, name, **extra):
    return read_summary(run_local({
        "encoder": "pixels", "feature-cache-dir": str(cache_dir), "results-dir": str(tmp_path),
        "run-name": name, **LABEL_SHIFT, **SMALL_PFT, "personalize": " ".join(METHODS), **extra},
        4))


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
    # the global model is everybody's model: its Global is its Local, and nothing is distorted
    assert methods["global"]["summary"]["global"] == pytest.approx(
        methods["global"]["summary"]["local"])
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
