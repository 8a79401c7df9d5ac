"""Nodes that own their data (deployment): each builds and keeps the cache of its local data."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_digits

from ovalp_flwr.features.cache import cache_path, load_or_build
from ovalp_flwr.federation.node import feature_source
from ovalp_flwr.config import RunConfig
from ovalp_flwr.federation.local_grid import run_local
from ovalp_flwr.federation.results import read_summary
from ovalp_flwr.federation.exchange import FederationError


DATASET = "folder:digits"


def write_digits(root: Path, rows: np.ndarray, classes: range = range(10)) -> Path:
    """`root/digits/{train,test}/<class>/<i>.png` from sklearn's digits (8x8 grey PNGs)."""
    digits = load_digits()
    for i in rows:
        if digits.target[i] not in classes:
            continue
        split = "test" if i % 5 == 0 else "train"
        folder = root / "digits" / split / str(digits.target[i])
        folder.mkdir(parents=True, exist_ok=True)
        grey = np.rint(digits.images[i] * (255 / 16)).astype(np.uint8)
        Image.fromarray(grey).save(folder / f"{i}.png")
    return root


def config(tmp_path: Path, server_data: Path, **overrides) -> dict:
    return {"dataset": DATASET, "encoder": "pixels", "data-dir": str(server_data),
            "feature-cache-dir": str(tmp_path / "server-cache"),
            "results-dir": str(tmp_path / "results"), "num-server-rounds": 4, "run-name": "t",
            "partition": "iid", **overrides}


@pytest.fixture(scope="module")
def nodes(tmp_path_factory) -> list[Path]:
    """Three nodes, each with a different third of the digits as its own folder dataset."""
    base = tmp_path_factory.mktemp("nodes")
    rows = np.arange(len(load_digits().target))
    return [write_digits(base / f"node{i}" / "data", rows[i::3]) for i in range(3)]


def own(node: Path) -> dict:
    return {"data-dir": str(node), "feature-cache-dir": str(node.parent / "cache")}


def test_each_node_builds_its_own_cache_and_the_run_learns(nodes, tmp_path):
    summary = read_summary(run_local(config(tmp_path, nodes[0]), 3, [own(n) for n in nodes]))
    for node in nodes:
        assert cache_path(node.parent / "cache", DATASET, "pixels").is_dir()
    assert summary["final_accuracy"] > 0.8
    partition = summary["partition"]
    assert partition["kind"] == "iid of node-local data" and partition["classes"] == []
    # node i takes IID partition i of 3 of its own train split (num-partitions=1 would be "all")
    expected = [
        len(load_or_build(DATASET, "pixels", n.parent / "cache").train.y) // 3 for n in nodes
    ]
    assert [abs(s - e) <= 1 for s, e in zip(partition["sizes"], expected)] == [True] * 3


def test_a_node_with_another_label_set_is_refused(nodes, tmp_path):
    odd = write_digits(tmp_path / "odd" / "data", np.arange(300), classes=range(5))
    node_configs = [own(nodes[0]), own(nodes[1]), own(odd)]
    with pytest.raises(FederationError, match="1 node.*another encoder or label set"):
        run_local(config(tmp_path, nodes[0]), 3, node_configs)


def test_a_corrupted_node_cache_fails_that_node_with_a_clear_error(nodes, tmp_path):
    data = write_digits(tmp_path / "bad" / "data", np.arange(0, 1797, 3))
    load_or_build(DATASET, "pixels", tmp_path / "bad" / "cache", data_dir=data, progress=False)
    train_file = cache_path(tmp_path / "bad" / "cache", DATASET, "pixels") / "train.safetensors"
    blob = bytearray(train_file.read_bytes())
    blob[-1] ^= 0xFF
    train_file.write_bytes(bytes(blob))
    with pytest.raises(FederationError, match="CacheError.*sha256 mismatch"):
        run_local(config(tmp_path, nodes[0]), 2, [own(nodes[1]), own(data)])


def test_node_config_paths_override_the_run_config():
    run = RunConfig(data_dir="/run/data", feature_cache_dir="run-cache")
    shared = feature_source(run.data, "auto", {"partition-id": 0, "num-partitions": 2})
    assert (shared.data_dir, shared.cache_dir, shared.own_data) == ("/run/data", "run-cache", False)
    node = feature_source(run.data, "auto",
                          {"data-dir": "/node/data", "feature-cache-dir": "/node/cache"})
    assert (node.data_dir, node.cache_dir, node.own_data) == ("/node/data", "/node/cache", True)
    with pytest.raises(ValueError, match="node config: data-dir=3 is not allowed"):
        feature_source(run.data, "auto", {"data-dir": 3})


def test_a_node_with_its_own_data_holds_back_its_share_of_validation_rows(nodes, tmp_path):
    """Validation rows are carved from each node's own training split as from the shared one:
    the sizes it describes are its partition of the rest."""
    held = read_summary(run_local(config(tmp_path, nodes[0], **{"validation-fraction": 0.2,
                                                               "run-name": "held"}),
                                  3, [own(n) for n in nodes]))
    whole = [len(load_or_build(DATASET, "pixels", n.parent / "cache").train.y) for n in nodes]
    for size, rows in zip(held["partition"]["sizes"], whole):
        assert abs(size - 0.8 * rows / 3) <= 4  # a third of 80%, each class rounded
    assert held["validation"]["fraction"] == 0.2 and held["final_accuracy"] > 0.8


def test_a_node_with_fewer_samples_than_partitions_says_so(nodes, tmp_path):
    ones = np.flatnonzero(load_digits().target == 1)
    rows = [*[r for r in ones if r % 5][:2], *[r for r in ones if r % 5 == 0][:1]]
    tiny = write_digits(tmp_path / "tiny" / "data", np.array(rows))  # 2 train + 1 test image
    node_configs = [own(nodes[0]), own(nodes[1]), own(tiny)]
    with pytest.raises(FederationError, match="num-partitions=3 is not allowed.*only 2 samples"):
        run_local(config(tmp_path, nodes[0]), 3, node_configs)


def fresh_process_state():
    """What a new ClientApp process starts with: no per-process caches."""
    from ovalp_flwr.ova import client
    from ovalp_flwr.federation import node as client_data

    for cached in (client_data.node_features, client_data.node_rows, client_data.train_labels,
                   client_data._split):
        cached.cache_clear()
    client._ON_DEVICE.clear()


def rows_files(node: Path) -> list[Path]:
    return sorted((node.parent / "cache" / ".rows").rglob("*.safetensors"))


def test_a_fresh_process_reads_its_rows_file_not_the_cache(nodes, tmp_path, monkeypatch):
    before = [len(rows_files(n)) for n in nodes]
    run = config(tmp_path, nodes[0], seed=7)
    first = read_summary(run_local(run, 3, [own(n) for n in nodes]))
    assert [len(rows_files(n)) - b for n, b in zip(nodes, before)] == [1, 1, 1]
    fresh_process_state()

    def no_cache(*args, **kwargs):
        raise AssertionError("the whole cache was loaded")

    monkeypatch.setattr("ovalp_flwr.federation.node.load_or_build", no_cache)
    again = read_summary(run_local(run, 3, [own(n) for n in nodes]))
    assert again["final_accuracy"] == first["final_accuracy"]
    # another seed is another partition: a new file, computed from the cache
    monkeypatch.undo()
    run_local(config(tmp_path, nodes[0], seed=8), 3, [own(n) for n in nodes])
    assert [len(rows_files(n)) - b for n, b in zip(nodes, before)] == [2, 2, 2]


def test_a_corrupted_rows_file_is_an_error_naming_it(nodes, tmp_path):
    run_local(config(tmp_path, nodes[0], seed=5), 3, [own(n) for n in nodes])
    fresh_process_state()
    newest = max(rows_files(nodes[2]), key=lambda f: f.stat().st_mtime)
    blob = bytearray(newest.read_bytes())
    blob[-1] ^= 0xFF
    newest.write_bytes(bytes(blob))
    with pytest.raises(FederationError, match=r"node rows .*sha256 mismatch \(corrupted\)"):
        run_local(config(tmp_path, nodes[0], seed=5), 3, [own(n) for n in nodes])
    assert newest.exists()  # reported, never silently recomputed


@pytest.mark.slow
def test_the_apps_import_no_partitioner_encoder_or_accountant_library():
    """Every app process imports its app (a fresh `flwr-clientapp` per message, each Ray actor,
    each run's ServerApp): dp-accounting alone (with scipy) was 1.5-2 s of its CPU, for runs
    that are not private (federation/privacy.py imports it when it accounts)."""
    import subprocess
    import sys

    code = ("import sys, client_app, server_app; heavy = [m for m in ('flwr_datasets', 'sklearn', "
            "'timm', 'transformers', 'seaborn', 'datasets', 'dp_accounting', 'scipy', 'mlflow') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.strip() == "[]"
