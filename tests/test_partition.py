"""Partitions: cover the data exactly, reproduce from the seed, and have the skew they claim."""

import json

import numpy as np
import pytest

from ovalp_flwr.data.partition import (
    PartitionSpec,
    PARTITIONS, label_dataset, make_partitioner, partition_indices, summarize_partition,
)

NUM_CLASSES = 10
CLASS_SIZES = [180, 175, 170, 160, 150, 145, 140, 120, 107, 90]  # uneven, 1437 in all


def make_labels() -> np.ndarray:
    labels = np.repeat(np.arange(NUM_CLASSES), CLASS_SIZES)
    return np.random.default_rng(0).permutation(labels).astype(np.int64)


def make_blobs(num_blobs: int, per_blob: int, dim: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Well separated clusters in random order; returns features and each row's blob."""
    rng = np.random.default_rng(0)
    blob = rng.permutation(np.repeat(np.arange(num_blobs), per_blob))
    centers = rng.normal(scale=50.0, size=(num_blobs, dim))
    return (centers[blob] + rng.normal(size=(len(blob), dim))).astype(np.float32), blob


LABELS = make_labels()
FEATURES, BLOBS = make_blobs(num_blobs=20, per_blob=len(LABELS) // 20 + 1)
FEATURES, BLOBS = FEATURES[: len(LABELS)], BLOBS[: len(LABELS)]

CASES = {  # kind -> (num_partitions, spec options)
    "iid": (100, {}),
    "shard": (100, {"classes_per_client": 2}),
    "bernoulli-dirichlet": (100, {"dirichlet_p": 0.1, "dirichlet_alpha": 0.001}),
    "zipf": (100, {"zipf_s": 2.0}),
    "feature-skew": (20, {}),
    # 4 domains of unequal size, each split over its clients by a label skew of its own
    "domain": (30, {"within_domain": "bernoulli-dirichlet", "dirichlet_p": 0.5,
                    "dirichlet_alpha": 0.5}),
}
RANDOM_KINDS = ["iid", "shard", "bernoulli-dirichlet", "zipf", "domain"]
DOMAINS = np.minimum(BLOBS // 4, 3)  # blobs 0-3, 4-7, 8-11, 12-19: four domains


def split(kind: str, seed: int = 0, labels: np.ndarray = LABELS) -> list[np.ndarray]:
    n, options = CASES[kind]
    return partition_indices(PartitionSpec(kind, seed, **options), labels, n, features_for(kind),
                             domains_for(kind))


def features_for(kind: str) -> np.ndarray | None:
    return FEATURES if kind == "feature-skew" else None


def domains_for(kind: str) -> np.ndarray | None:
    return DOMAINS if kind == "domain" else None


def classes_per_client(parts: list[np.ndarray]) -> list[int]:
    return [len(np.unique(LABELS[p])) for p in parts]


def test_cases_cover_every_kind():
    assert set(CASES) == set(PARTITIONS)


@pytest.mark.parametrize("kind", PARTITIONS)
def test_partition_is_exact_cover(kind):
    parts = split(kind)
    assert len(parts) == CASES[kind][0]
    assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts)  # sorted, no repeats
    assert sum(len(p) for p in parts) == len(LABELS)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(LABELS)))


@pytest.mark.parametrize("kind", PARTITIONS)
def test_same_seed_same_partition(kind):
    assert all(np.array_equal(a, b) for a, b in zip(split(kind, seed=3), split(kind, seed=3)))


@pytest.mark.parametrize("kind", RANDOM_KINDS)
def test_other_seed_other_partition(kind):
    assert not all(np.array_equal(a, b) for a, b in zip(split(kind, seed=3), split(kind, seed=4)))


@pytest.mark.parametrize("kind", PARTITIONS)
def test_partitioner_load_partition_matches_indices(kind):
    n, options = CASES[kind]
    spec = PartitionSpec(kind, seed=1, **options)
    partitioner = make_partitioner(spec, n, features_for(kind), domains_for(kind))
    partitioner.dataset = label_dataset(LABELS)
    assert partitioner.num_partitions == n
    for i, expected in enumerate(partition_indices(spec, LABELS, n, features_for(kind),
                                                   domains_for(kind))):
        part = partitioner.load_partition(i)
        assert np.array_equal(np.asarray(part["index"]), expected)
        assert np.array_equal(np.asarray(part["label"]), LABELS[expected])


def test_iid_sizes_differ_by_at_most_one():
    sizes = [len(p) for p in split("iid")]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("k", [1, 2, 3])
def test_shard_gives_exactly_k_classes_per_client(k):
    parts = partition_indices(PartitionSpec("shard", 0, classes_per_client=k), LABELS, 100)
    assert classes_per_client(parts) == [k] * 100
    assert min(len(p) for p in parts) > 0


def test_shard_assignment_never_gets_stuck():
    """Many (clients, k, sizes), including ones where a class must go to every client."""
    for seed in range(12):
        for num_clients, k in [(7, 3), (10, 1), (13, 5), (30, 2)]:
            sizes = np.random.default_rng(seed).integers(1, 60, size=NUM_CLASSES)
            sizes[0] = 400  # one dominant class: capped at one shard per client
            labels = np.repeat(np.arange(NUM_CLASSES), sizes)
            parts = partition_indices(PartitionSpec("shard", seed, classes_per_client=k), labels, num_clients)
            assert [len(np.unique(labels[p])) for p in parts] == [k] * num_clients
            assert sum(len(p) for p in parts) == len(labels)


def test_shard_classes_get_shards_in_proportion_to_size():
    parts = partition_indices(PartitionSpec("shard", 0, classes_per_client=1), LABELS, 100)
    owners_per_class = np.bincount([LABELS[p[0]] for p in parts], minlength=NUM_CLASSES)
    assert owners_per_class.sum() == 100
    assert owners_per_class[0] > owners_per_class[-1]  # 180 samples vs 90
    np.testing.assert_allclose(owners_per_class, 100 * np.array(CLASS_SIZES) / len(LABELS), atol=1)


def test_shard_falls_back_to_mcmahan_with_few_clients():
    parts = partition_indices(PartitionSpec("shard", 0, classes_per_client=1), LABELS, 2)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(LABELS)))
    assert abs(len(parts[0]) - len(parts[1])) <= 1
    held = [set(LABELS[p].tolist()) for p in parts]
    assert len(held[0] & held[1]) <= 1  # label-sorted halves share at most the boundary class


def test_bernoulli_dirichlet_concentrates_classes_and_allows_empty_clients():
    parts = split("bernoulli-dirichlet")
    owner = np.full(len(LABELS), -1)
    for i, p in enumerate(parts):
        owner[p] = i
    assert (owner >= 0).all()
    top_share = [np.bincount(owner[LABELS == c]).max() / CLASS_SIZES[c] for c in range(NUM_CLASSES)]
    assert np.all(np.isfinite(top_share))
    assert sum(s >= 0.9 for s in top_share) >= 8
    summary = summarize_partition("bernoulli-dirichlet", parts, LABELS)
    assert summary.num_empty == sum(len(p) == 0 for p in parts) > 0
    assert summary.num_samples == len(LABELS)


def test_bernoulli_dirichlet_gives_unheld_class_to_someone():
    """p so small that some classes have no holder after the Bernoulli draw."""
    spec = PartitionSpec("bernoulli-dirichlet", seed=0, dirichlet_p=0.05, dirichlet_alpha=0.5)
    parts = partition_indices(spec, LABELS, 3)
    assert sum(len(p) for p in parts) == len(LABELS)


def test_zipf_sizes_decrease_with_a_heavy_head():
    sizes = np.array([len(p) for p in split("zipf")])
    assert np.all(np.diff(sizes) <= 0)
    assert sizes.min() >= 1
    assert sizes[0] > 20 * np.median(sizes)
    assert classes_per_client(split("zipf"))[0] == NUM_CLASSES  # labels stay IID


def test_zipf_more_clients_than_samples():
    parts = partition_indices(PartitionSpec("zipf"), LABELS[:5], 8)
    assert sum(len(p) for p in parts) == 5


def test_feature_skew_clients_are_the_clusters():
    parts = split("feature-skew")
    assert all(len(np.unique(BLOBS[p])) == 1 for p in parts)  # each client is one blob...
    assert sorted(int(BLOBS[p[0]]) for p in parts) == list(range(20))  # ...and each blob one client


def test_summary_line_and_dict():
    parts = partition_indices(PartitionSpec("shard", 0, classes_per_client=1), LABELS, 100)
    summary = summarize_partition("shard", parts, LABELS)
    line = str(summary)
    assert "\n" not in line
    assert line.startswith("shard: 100 clients, 0 empty, classes/client 1/1/1, size ")
    assert line.endswith("(min/median/max), 1437 samples")
    d = json.loads(json.dumps(summary.to_dict()))
    assert d["num_clients"] == 100 and d["num_empty"] == 0 and sum(d["sizes"]) == 1437


def test_summary_counts_empty_clients():
    labels = np.array([0, 0, 1, 2])
    parts = [np.array([0, 1, 2]), np.array([], dtype=np.int64), np.array([3])]
    assert str(summarize_partition("x", parts, labels)) == (
        "x: 3 clients, 1 empty, classes/client 0/1/2, size 0/1/3 (min/median/max), 4 samples"
    )


def test_unknown_kind_and_missing_features_fail_clearly():
    allowed = "iid, shard, bernoulli-dirichlet, zipf, feature-skew"
    with pytest.raises(ValueError, match=rf"'dirichlet'.*{allowed}"):
        make_partitioner(PartitionSpec("dirichlet"), 10)
    with pytest.raises(ValueError, match="feature-skew.*features"):
        partition_indices(PartitionSpec("feature-skew"), LABELS, 10)


# --- Flower Datasets' partitioners (`partition = "flwr:<Name>"`) -------------------------------


def flower(name: str, num_partitions: int, seed: int = 0, **args) -> list[np.ndarray]:
    spec = PartitionSpec(f"flwr:{name}", seed=seed, partition_args=PartitionSpec.frozen_args(args))
    return partition_indices(spec, LABELS, num_partitions)


@pytest.mark.parametrize("num_partitions, seed", [(1, 0), (7, 0), (100, 42)])
def test_our_iid_is_flowers_iid_partitioner_as_federated_dataset_runs_it(num_partitions, seed):
    """The same seeded shuffle of the rows (FederatedDataset's), then Flower's contiguous equal
    shards: row for row the same clients."""
    ours = partition_indices(PartitionSpec("iid", seed=seed), LABELS, num_partitions)
    theirs = flower("IidPartitioner", num_partitions, seed)
    assert len(ours) == len(theirs) == num_partitions
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs))


@pytest.mark.parametrize("name, args, check", [
    ("DirichletPartitioner", {"alpha": 0.1, "min_partition_size": 0}, None),
    ("PathologicalPartitioner", {"num_classes_per_partition": 2}, 2),
    ("ShardPartitioner", {"num_shards_per_partition": 1}, None),
    ("LinearPartitioner", {}, None),
])
def test_a_flower_partitioner_gives_disjoint_seeded_row_indices(name, args, check):
    parts = flower(name, 20, seed=5, **args)
    rows = np.concatenate(parts)
    assert len(parts) == 20 and len(rows) == len(np.unique(rows)) <= len(LABELS)
    assert all(np.all(np.diff(part) > 0) for part in parts)  # sorted, as every scheme's
    again, other = flower(name, 20, seed=5, **args), flower(name, 20, seed=6, **args)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))  # the seed fixes it
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))
    if check is not None:
        assert {len(np.unique(LABELS[part])) for part in parts if len(part)} == {check}


def test_a_flower_partitioner_the_arguments_do_not_fit_is_one_config_error():
    from ovalp_flwr.options import ConfigError

    with pytest.raises(ConfigError, match="partition-args='alpah=0.3' is not allowed; "
                       "flwr:DirichletPartitioner takes no alpah; it takes: partition_by, alpha"):
        flower("DirichletPartitioner", 10, alpah=0.3)
    with pytest.raises(ConfigError, match="flwr:DirichletPartitioner: Alpha values should be "
                                          "strictly greater than zero"):
        flower("DirichletPartitioner", 10, alpha=-1.0)
    with pytest.raises(ConfigError, match="partition='flwr:NaturalIdPartitioner' is not allowed; "
                                          "it makes 10 partitions for 7 clients"):
        flower("NaturalIdPartitioner", 7)
    with pytest.raises(ConfigError, match="name one of Flower Datasets' partitioners: "
                                          "flwr:ContinuousPartitioner, flwr:Dirichlet"):
        flower("DirichletPartitoner", 7)
