"""Clients that differ in what they see: multi-domain datasets (digit styles, Office-Caltech-10,
CIFAR-10-C style corruptions, concept shift), their caches, the `domain` partition, per-client
test splits from the client's own domain, and per-domain accuracy in a run. Generated data for
the logic; small reads of the real files in ../shared/data where present."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ovalp_flwr.data import domains as dd
from ovalp_flwr.features.cache import CacheError, cache_path, load_features, load_or_build
from ovalp_flwr.federation.node import (FeatureSource, NodeData, local_test_split, node_rows,
                                        node_test_rows)
from ovalp_flwr.config import ConfigError, RunConfig
from ovalp_flwr.data.registry import load_dataset, missing_data
from ovalp_flwr.data.noise import NoiseSpec
from ovalp_flwr.data.partition import PartitionSpec, partition_indices, summarize_partition

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _real(*files: str) -> Path:
    for file in files:
        if not (DATA / file).is_file():
            pytest.skip(f"real data file {DATA / file} is absent (shared data not beside the repo)")
    return DATA


def _png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def _npz(path: Path, n_train: int, n_test: int, shape: tuple[int, ...], seed: int) -> None:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x_train=rng.integers(0, 256, (n_train, *shape), dtype=np.uint8),
             y_train=np.arange(n_train) % 10, x_test=rng.integers(0, 256, (n_test, *shape),
                                                                  dtype=np.uint8),
             y_test=np.arange(n_test) % 10)


@pytest.fixture
def digit_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The four digit domains' files, random pixels at their real shapes; 60 / 20 rows drawn."""
    monkeypatch.setattr(dd, "DIGIT_TRAIN", 60)
    monkeypatch.setattr(dd, "DIGIT_TEST", 20)
    _npz(tmp_path / "mnist.npz", 200, 50, (28, 28), 0)
    _npz(tmp_path / "digit-domains/usps.npz", 100, 40, (16, 16), 1)
    _npz(tmp_path / "digit-domains/mnistm.npz", 100, 40, (32, 32, 3), 2)
    _npz(tmp_path / "digit-domains/syn_roy.npz", 100, 40, (32, 32, 3), 3)
    return tmp_path


def _concept_cache(tmp_path: Path):
    return load_or_build("concept:digits", "pixels", tmp_path / "cache", progress=False)


# --- datasets -------------------------------------------------------------------------------


def test_digit_domains_one_resolution_rgb_and_a_domain_per_row(digit_files: Path) -> None:
    ds = load_dataset("digit-domains", digit_files)
    assert ds.domains == ("mnist", "usps", "mnist-m", "syn-digits")
    assert ds.train.images.shape == (240, 32, 32, 3) and ds.test.images.shape == (80, 32, 32, 3)
    assert np.bincount(ds.train.domains).tolist() == [60] * 4
    assert np.bincount(ds.test.domains).tolist() == [20] * 4
    for split in (ds.train, ds.test):  # stratified: every domain holds every class
        for d in range(4):
            assert len(np.unique(split.labels[split.domains == d])) == 10
    assert dd.num_domains("digit-domains") == 4 and dd.num_domains("cifar10") == 1
    usps = load_dataset("usps", digit_files)  # alone: its own resolution, one domain
    assert usps.train.images.shape == (100, 16, 16, 3) and usps.domains == ("usps",)


def test_mnist_domain_is_drawn_from_mnist_train_only(digit_files: Path) -> None:
    """MNIST-M's digits are MNIST test digits, so digit-domains' MNIST rows (train and test)
    must all come from MNIST's train split, and not overlap."""
    ds = load_dataset("digit-domains", digit_files)
    mnist_train = {x.tobytes() for x in ds.train.images[ds.train.domains == 0]}
    mnist_test = {x.tobytes() for x in ds.test.images[ds.test.domains == 0]}
    assert not mnist_train & mnist_test
    with np.load(digit_files / "mnist.npz") as npz:
        from_train = {x.tobytes() for x in dd._resize(dd._rgb(npz["x_train"]), 32)}
        from_test = {x.tobytes() for x in dd._resize(dd._rgb(npz["x_test"]), 32)}
    assert mnist_train | mnist_test <= from_train and not (mnist_train | mnist_test) & from_test


def test_office_split_per_domain_without_duplicates(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    with zipfile.ZipFile(tmp_path / "office_caltech10.zip", "w") as zf:
        for d, domain in enumerate(dd.OFFICE_DOMAINS):
            for c in ("bike", "mug", "laptop"):
                for i in range(6 + d):
                    size = (40 + i, 30 + 2 * i)  # photos of any size
                    zf.writestr(f"{domain}/{c}/{i:04d}.png",
                                _png(rng.integers(0, 256, (*size, 3), dtype=np.uint8)))
        duplicate = zf.read("amazon/mug/0001.png")
        zf.writestr("amazon/mug/0099.png", duplicate)  # the release has such copies
    ds = load_dataset("office-caltech10", tmp_path)
    assert ds.class_names == ("bike", "laptop", "mug") and ds.domains == dd.OFFICE_DOMAINS
    assert ds.train.images.shape[1:] == (dd.OFFICE_SIZE, dd.OFFICE_SIZE, 3)
    per_domain = [(np.sum(ds.train.domains == d), np.sum(ds.test.domains == d)) for d in range(4)]
    assert [tr + te for tr, te in per_domain] == [3 * (6 + d) for d in range(4)]  # copy dropped
    assert all(te == 3 for _, te in per_domain[:2])  # 20% of 6-7 per class, every class
    train = {x.tobytes() for x in ds.train.images}
    assert not any(x.tobytes() in train for x in ds.test.images)
    again = load_dataset("office-caltech10", tmp_path)
    assert np.array_equal(again.test.images, ds.test.images)  # the split is fixed


def test_concept_swaps_labels_per_concept_and_keeps_inputs() -> None:
    base, ds = load_dataset("digits"), load_dataset("concept:digits")
    assert np.array_equal(base.train.images, ds.train.images)
    assert len(ds.domains) == dd.CONCEPTS == dd.num_domains("concept:digits")
    assert ds.domains[0] == "original"
    swaps = dd.Relabelling("digits").swaps(10)
    for split in ("train", "test"):
        before, after = getattr(base, split).labels, getattr(ds, split).labels
        concept = ds.split_domains(split)
        assert np.array_equal(after[concept == 0], before[concept == 0])
        for c in range(1, dd.CONCEPTS):
            moved = set(map(int, np.unique(before[(concept == c) & (after != before)])))
            assert moved == {k for pair in swaps[c] for k in pair}  # exactly its swapped classes
    assert len({tuple(s) for s in swaps[1:]}) == dd.CONCEPTS - 1  # every concept its own swaps


def test_derived_names_are_checked_in_one_line(tmp_path: Path) -> None:
    for name, words in (("cifar10-c:9", "severity in 1..5"), ("cifar10-c:fog:x", "use cifar10-c"),
                        ("cifar10-c:smog:3", "corruption 'smog' is not one of: gaussian-noise"),
                        ("concept:concept:digits", "not itself a concept shift")):
        with pytest.raises(ValueError, match=words) as err:
            load_dataset(name, tmp_path)
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"^run config: dataset='cifar10-c:9' is not allowed; "
                       r"use cifar10-c:<severity>"):
        RunConfig.from_mapping({"dataset": "cifar10-c:9"})  # refused before anything loads
    assert "cifar10-jpg.zip not found" in missing_data("cifar10-c:3", tmp_path)
    assert "usps.npz" in missing_data("digit-domains", tmp_path)
    assert missing_data("concept:digits", tmp_path) is None


def test_cifar10_c_one_corruption_per_share_deterministic(tmp_path: Path) -> None:
    from ovalp_flwr.data.corruptions import CORRUPTIONS, corrupt

    rng = np.random.default_rng(0)
    with zipfile.ZipFile(tmp_path / "cifar10-jpg.zip", "w") as zf:
        for split, n in (("train", 40), ("test", 20)):
            for c in ("cat", "dog"):
                for i in range(n):
                    zf.writestr(f"{split}/{c}/{i:04d}.png",
                                _png(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)))
    clean = load_dataset("cifar10", tmp_path)
    ds = load_dataset("cifar10-c:3", tmp_path)
    assert ds.domains == tuple(f"{c}-3" for c in CORRUPTIONS)
    assert dd.num_domains("cifar10-c:3") == len(CORRUPTIONS) >= 15
    for split in ("train", "test"):
        domains = ds.split_domains(split)
        images, originals = getattr(ds, split).images, getattr(clean, split).images
        assert np.array_equal(getattr(ds, split).labels, getattr(clean, split).labels)
        for d, name in enumerate(CORRUPTIONS):  # each share is its originals under its type
            rows = np.flatnonzero(domains == d)
            expected = corrupt(originals[rows], name, 3, seed=("train", "test").index(split))
            assert np.array_equal(images[rows], expected)
    assert np.array_equal(load_dataset("cifar10-c:3", tmp_path).train.images, ds.train.images)
    one = load_dataset("cifar10-c:fog:5", tmp_path)
    assert one.domains == ("fog-5",) and not np.array_equal(one.train.images, clean.train.images)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["digit-domains", "office-caltech10"])
def test_real_domains_are_disjoint(name: str) -> None:
    files = {"digit-domains": ("mnist.npz", "digit-domains/usps.npz", "digit-domains/mnistm.npz",
                               "digit-domains/syn_roy.npz"),
             "office-caltech10": ("office_caltech10.zip",)}[name]
    ds = load_dataset(name, _real(*files))
    if name == "digit-domains":
        assert np.bincount(ds.train.domains).tolist() == [dd.DIGIT_TRAIN] * 4
        assert np.bincount(ds.test.domains).tolist() == [dd.DIGIT_TEST] * 4
    else:
        assert len(ds.train.labels) + len(ds.test.labels) == 2533 - 26  # the copies dropped
    for d in range(len(ds.domains)):  # no test image is also a training image of its domain
        train = {x.tobytes() for x in ds.train.images[ds.train.domains == d]}
        assert not any(x.tobytes() in train for x in ds.test.images[ds.test.domains == d])


# --- caches ---------------------------------------------------------------------------------


def test_concept_cache_reuses_the_base_features(tmp_path: Path) -> None:
    cached = _concept_cache(tmp_path)
    base = load_features("digits", "pixels", tmp_path / "cache")
    assert np.array_equal(cached.train.x, base.train.x)  # nothing encoded twice
    assert cached.manifest["derived_from"]["train_sha256"] == base.manifest["splits"]["train"][
        "sha256"]
    assert cached.domain_names == dd.Relabelling("digits").domain_names(base.manifest[
        "class_names"])
    assert base.domain_names == ("digits",) and not base.train.domain.any()
    again = load_features("concept:digits", "pixels", tmp_path / "cache")
    assert np.array_equal(again.train.domain, cached.train.domain)


def test_a_cache_whose_domains_do_not_verify_is_refused(tmp_path: Path) -> None:
    _concept_cache(tmp_path)
    folder = cache_path(tmp_path / "cache", "concept:digits", "pixels")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["domain_names"] = manifest["domain_names"][:2]  # rows now name unknown domains
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CacheError, match="domains outside"):
        load_features("concept:digits", "pixels", tmp_path / "cache")


# --- the domain partition -------------------------------------------------------------------


def _domains(sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    domains = np.repeat(np.arange(len(sizes)), sizes)
    return np.arange(len(domains)) % 5, domains  # labels 0..4 in every domain


def test_one_domain_per_client_or_a_share_of_one() -> None:
    labels, domains = _domains([40, 40, 80])
    for n, per_domain in ((3, [1, 1, 1]), (8, [2, 2, 4])):
        parts = partition_indices(PartitionSpec("domain"), labels, n, domains=domains)
        held = [set(domains[ix]) for ix in parts]
        assert all(len(h) == 1 for h in held)
        assert [sum(h == {d} for h in held) for d in range(3)] == per_domain
        assert sorted(np.concatenate(parts).tolist()) == list(range(len(labels)))
    fewer = partition_indices(PartitionSpec("domain"), labels, 2, domains=domains)
    assert [set(domains[ix]) for ix in fewer] == [{0, 2}, {1}]  # d mod N


def test_label_skew_inside_a_domain() -> None:
    labels, domains = _domains([100, 100])
    spec = PartitionSpec("domain", seed=3, classes_per_client=1, within_domain="shard")
    parts = partition_indices(spec, labels, 10, domains=domains)
    assert all(len(set(labels[ix])) == 1 and len(set(domains[ix])) == 1 for ix in parts)
    again = partition_indices(spec, labels, 10, domains=domains)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))  # seeded
    other = partition_indices(PartitionSpec("domain", seed=4, within_domain="shard"), labels, 10,
                              domains=domains)
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other))
    summary = summarize_partition("domain", parts, labels, domains, ("a", "b"))
    assert summary.domains == ("a",) * 5 + ("b",) * 5
    assert str(summary).endswith("clients per domain: a 5, b 5")


def test_within_domain_is_validated_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"within-domain='domain' is not allowed; choose one"):
        RunConfig.from_mapping({"within-domain": "domain"})


# --- per-client test splits -----------------------------------------------------------------


def test_test_split_follows_the_clients_domain_and_classes() -> None:
    rng = np.random.default_rng(0)
    test_labels, test_domains = np.arange(60) % 3, np.repeat([0, 1], 30)
    rows_x = np.arange(60, dtype=np.float32)[:, None]
    x, y = local_test_split(np.array([0, 0, 1, 1]), test_labels, np.array([40, 40]), rng, rows_x,
                            np.array([1, 1, 1, 1]), test_domains)
    assert set(x[:, 0].astype(int)) <= set(range(30, 60))  # its domain's test rows only
    assert set(y) == {0, 1}
    one = local_test_split(np.array([0, 0, 1]), test_labels, 40, np.random.default_rng(1), rows_x)
    legacy = local_test_split(np.array([0, 0, 1]), test_labels, np.array([40]),
                              np.random.default_rng(1), rows_x, np.zeros(3, int),
                              np.zeros(60, int))
    assert np.array_equal(one[0], legacy[0])  # one domain: the same draw as before domains


def test_node_test_split_carries_the_clients_concept(tmp_path: Path) -> None:
    cached = _concept_cache(tmp_path)
    data = NodeData(FeatureSource("concept:digits", "pixels", str(tmp_path / "cache"), "", False),
                    PartitionSpec("domain", seed=1), NoiseSpec("none", 0.0, 1))
    test_rows = {x.tobytes(): i for i, x in enumerate(cached.test.x)}
    for partition_id in range(dd.CONCEPTS):
        rows = node_rows(data, partition_id, dd.CONCEPTS)
        x, y = node_test_rows(data, partition_id, dd.CONCEPTS)
        where = np.array([test_rows[r.tobytes()] for r in x])
        assert set(cached.test.domain[where]) == {partition_id}  # its own concept's rows
        assert np.array_equal(y, cached.test.y[where])  # labelled as its concept labels them
        assert set(np.unique(rows.labels)) == set(np.unique(y))


# --- a run ----------------------------------------------------------------------------------


def test_a_run_reports_accuracy_per_domain_and_personalizes_per_concept(tmp_path: Path) -> None:
    from ovalp_flwr.federation.local_grid import run_local

    out = run_local({"dataset": "concept:digits", "encoder": "pixels", "partition": "domain",
                     "num-server-rounds": 2, "feature-cache-dir": str(tmp_path / "cache"),
                     "results-dir": str(tmp_path / "results"), "run-name": "r",
                     "adapter-dim": 16, "head-init": "random", "personalize": "lp",
                     "pft-epochs": 2}, dd.CONCEPTS)
    summary = json.loads((out / "summary.json").read_text())
    names = list(dd.Relabelling("digits").domain_names([str(c) for c in range(10)]))
    assert summary["partition"]["domains"] == names  # one client per concept, named
    assert list(summary["domain_accuracy"]["final"]) == names
    assert all(list(r["domain_accuracy"]) == names for r in summary["rounds"])
    cache = load_features("concept:digits", "pixels", tmp_path / "cache")
    counts = np.bincount(cache.test.domain)
    union = sum(counts[d] * a for d, a in enumerate(summary["domain_accuracy"]["final"].values()))
    assert union / counts.sum() == pytest.approx(summary["final_accuracy"], abs=1e-6)
    lp = summary["personalization"]["methods"]["lp"]["summary"]
    assert lp["local"] > summary["personalization"]["methods"]["global"]["summary"]["local"]
