"""A client's own rows of the cached features, loaded once per process.

Where a node's features come from: the run config's dataset and encoder, read from the run
config's `data-dir` / `feature-cache-dir`, unless the node's own `--node-config` sets
`data-dir` / `feature-cache-dir`. Then the node owns its data, as a SuperNode in a real
deployment does: it builds the cache of its local data on first use, keeps it in its own cache
dir, and takes partition `partition-id` of `num-partitions` of it (use `num-partitions=1` for
"all my data"; a copy of one dataset on every node plus N partitions is the demo case).

In simulation every virtual client reads the one shared cache the ServerApp built; each
process keeps the cache and the partition in memory (Ray reuses a few worker processes for
all clients), so a round only slices arrays. No Flower here.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from ovalp_flwr.config import RunConfig
from ovalp_flwr.core.durable import replace_durably
from ovalp_flwr.core.options import TrainingOptions
from ovalp_flwr.core.training import LocalSchedule
from ovalp_flwr.data.holdout import training_rows, validation_rows
from ovalp_flwr.data.options import DataOptions, partition_args
from ovalp_flwr.data.noise import NoiseSpec, noisy_labels
from ovalp_flwr.data.partition import PartitionSpec, partition_indices
from ovalp_flwr.features.cache import (CachedFeatures, CacheError, cache_path, feature_space,
                                       load_or_build, read_manifest)
from ovalp_flwr.federation import protocol as p

if TYPE_CHECKING:  # a handler's argument; this module itself needs no Flower
    from flwr.app import Context

NODE_PATH_KEYS = ("data-dir", "feature-cache-dir")
ROWS_DIR = ".rows"


def resolve_path(path: str) -> Path:
    """Relative paths in the run config are relative to the directory the run started in."""
    return Path(path).expanduser().resolve()


@dataclass(frozen=True)
class FeatureSource:
    """Which cache a node reads, and from which data it builds it if absent."""

    dataset: str
    encoder: str
    cache_dir: str
    data_dir: str  # "" = $OVALP_DATA_DIR, else ../shared/data
    own_data: bool  # the node config chose the data dir or cache dir: not the run's shared cache
    device: str = "auto"  # where a missing cache is built; not part of what is read
    limit_per_class: int | None = None  # the first N samples of each class per split
    image_size: int | None = None  # None: the encoder's default input size

    @property
    def options(self) -> dict[str, Any]:
        """What picks the cache besides dataset and encoder (`cache.cache_path`'s marks)."""
        return {"limit_per_class": self.limit_per_class, "image_size": self.image_size}


def feature_source(data: DataOptions, device: str = "auto",
                   node_config: Mapping[str, Any] | None = None) -> FeatureSource:
    """The run's cache, or the node's own one if its node config names a data or cache dir."""
    node = dict(node_config or {})
    for key in NODE_PATH_KEYS:
        if key in node and (not isinstance(node[key], str) or not node[key]):
            raise ValueError(
                f"node config: {key}={node[key]!r} is not allowed; use a non-empty path string "
                f'(--node-config "{key}=\'/path\'")'
            )
    return FeatureSource(
        dataset=data.dataset,
        encoder=data.encoder,
        cache_dir=node.get("feature-cache-dir", data.feature_cache_dir),
        data_dir=node.get("data-dir", data.data_dir),
        own_data=any(key in node for key in NODE_PATH_KEYS),
        device=device,
        **data.cache_options(),
    )


@dataclass(frozen=True)
class NodeData:
    """What a client's rows are made of: the cache it reads, the partition and the label noise.
    The client side's one reader of the whole run config builds it (`node_data`); the rows
    below take only this."""

    source: FeatureSource
    spec: PartitionSpec
    noise: NoiseSpec


def node_data(config: RunConfig, node_config: Mapping[str, Any] | None = None) -> NodeData:
    """The run's data, partition and noise groups (and its seed, device and validation share)
    as a client reads its rows; `node_config`: the node's own data or cache dir, if it names one."""
    parts, data = config.partitioning, config.data
    spec = PartitionSpec(parts.partition, config.seed, parts.classes_per_client,
                         parts.dirichlet_p, parts.dirichlet_alpha, parts.zipf_s,
                         parts.within_domain, config.validation_share, data.validation_rows,
                         PartitionSpec.frozen_args(partition_args(parts.partition_args)))
    return NodeData(feature_source(data, config.device, node_config), spec,
                    noise_spec(data, config.seed))


def noise_spec(data: DataOptions, seed: int) -> NoiseSpec:
    """The run's label noise, drawn by its seed."""
    return NoiseSpec(data.label_noise, data.noise_rate, seed)


@lru_cache(maxsize=2)
def node_features(source: FeatureSource) -> CachedFeatures:
    """The verified cache; built here first if this node has none yet (own data, first run)."""
    return load_or_build(source.dataset, source.encoder, resolve_path(source.cache_dir),
                         data_dir=source.data_dir or None, device=source.device, **source.options)


@lru_cache(maxsize=4)
def train_labels(data: NodeData) -> np.ndarray:
    """The training labels clients see: the cache's, with the run's label noise applied."""
    cached = node_features(data.source)
    return noisy_labels(cached.train.y, cached.num_classes, data.noise)


def held_rows(cached: CachedFeatures, spec: PartitionSpec) -> np.ndarray:
    """The training split's validation rows the server keeps (`data.holdout`): no client
    trains on them; the server scores its choices on them. None where the clients keep theirs."""
    if spec.validation_rows == "clients":
        return np.empty(0, np.int64)
    return validation_rows(cached.train.y, cached.train.domain, spec.validation_fraction,
                           spec.seed)


@lru_cache(maxsize=4)
def _split(data: NodeData, num_partitions: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Every client's (training rows, validation rows it keeps), indices of the whole training
    split. Partitioned on the noisy labels (noise comes first, as in the benchmarks), after the
    server's validation rows are held back; where the clients keep theirs, each holds back its
    share of its own partition, stratified by its (domain, clean label), its own draw."""
    cached, spec = node_features(data.source), data.spec
    rows = training_rows(len(cached.train.y), held_rows(cached, spec))
    needs_features = "feature-skew" in (spec.kind, spec.within_domain)
    parts = [rows[part] for part in partition_indices(
        spec, train_labels(data)[rows], num_partitions,
        cached.train.x[rows] if needs_features else None, cached.train.domain[rows])]
    if spec.validation_rows != "clients":
        return tuple((part, np.empty(0, np.int64)) for part in parts)
    split = []
    for client, part in enumerate(parts):
        kept = validation_rows(cached.train.y[part], cached.train.domain[part],
                               spec.validation_fraction, spec.seed, stream=client)
        split.append((part[training_rows(len(part), kept)], part[kept]))
    return tuple(split)


def all_partitions(data: NodeData, num_partitions: int) -> tuple[np.ndarray, ...]:
    """Every client's training rows, indices of the cache's training split (`_split`): the
    server's partition summary reads them for the run's shared cache."""
    return tuple(train for train, _ in _split(data, num_partitions))


def node_validation_rows(data: NodeData, partition_id: int,
                         num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """The validation rows this client keeps (validation-rows = "clients"): features and
    clean labels (the validation split scores; label noise is the training rows' fault)."""
    cached = node_features(data.source)
    rows = _split(data, num_partitions)[partition_id][1]
    return np.ascontiguousarray(cached.train.x[rows]), cached.train.y[rows].astype(np.int64)


@dataclass(frozen=True)
class NodeRows:
    """One client's partition: its features, its (noisy) labels and what `describe` reports."""

    features: np.ndarray  # float32 [n, D]
    labels: np.ndarray  # int64 [n], with the run's label noise
    noisy: int  # how many of those labels the noise changed
    feature_space: str  # CachedFeatures.feature_space() of the cache they come from


@lru_cache(maxsize=8)
def node_rows(data: NodeData, partition_id: int, num_partitions: int) -> NodeRows:
    """This client's rows, once per process. A node that owns its data also keeps them in a
    small verified file beside its cache, so the fresh process Flower's deployment runtime
    starts for every message reads a few MB instead of the whole cache (and never imports the
    partitioners)."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id={partition_id} is not allowed; use 0..{num_partitions - 1}")
    source = data.source
    if not source.own_data:
        return _rows_from_cache(data, partition_id, num_partitions)
    node_features_dir = resolve_path(source.cache_dir)
    folder = cache_path(node_features_dir, source.dataset, source.encoder, **source.options)
    if not folder.exists():
        node_features(source)  # first run on this node: build its cache
    manifest = read_manifest(node_features_dir, source.dataset, source.encoder, **source.options)
    request = {"partition": asdict(data.spec), "noise": asdict(data.noise),
               "partition_id": partition_id,
               "num_partitions": num_partitions, "train_sha256": manifest["splits"]["train"]["sha256"]}
    path = _rows_path(folder, request)
    if path.exists():
        return _read_rows(path, request, feature_space(manifest))
    rows = _rows_from_cache(data, partition_id, num_partitions)
    _write_rows(path, rows, request)
    return rows


def _rows_from_cache(data: NodeData, partition_id: int, num_partitions: int) -> NodeRows:
    source = data.source
    cached = node_features(source)
    if source.own_data and num_partitions > len(cached.train.y):  # the server checks the run's
        raise ValueError(
            f"node config: num-partitions={num_partitions} is not allowed; this node's training "
            f"split ({source.dataset} in data-dir {source.data_dir!r}) has only "
            f"{len(cached.train.y)} samples")
    rows = all_partitions(data, num_partitions)[partition_id]
    labels = train_labels(data)[rows]
    return NodeRows(np.ascontiguousarray(cached.train.x[rows]), labels,
                    int(np.sum(labels != cached.train.y[rows])), cached.feature_space())


def _rows_path(folder: Path, request: dict) -> Path:
    """`<cache_dir>/.rows/<cache folder>/<digest of the request>.safetensors` (hidden: not a cache)."""
    digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()[:20]
    return folder.parent / ROWS_DIR / folder.name / f"{digest}.safetensors"


def _rows_digest(features: np.ndarray, labels: np.ndarray) -> str:
    return hashlib.sha256(features.tobytes() + labels.tobytes()).hexdigest()


def _write_rows(path: Path, rows: NodeRows, request: dict) -> None:
    """Atomic: a temp file renamed into place, so a reader never sees half of one."""
    metadata = {"request": json.dumps(request, sort_keys=True), "noisy": str(rows.noisy),
                "feature_space": rows.feature_space,
                "sha256": _rows_digest(rows.features, rows.labels)}
    blob = st_save({"features": rows.features, "labels": rows.labels}, metadata=metadata)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_durably(path, blob)


def _read_rows(path: Path, request: dict, space: str) -> NodeRows:
    """The saved rows, if they are what this request would compute from this cache."""
    def stale(what: str) -> CacheError:
        return CacheError(f"node rows {path}: {what}; delete the file to recompute it")

    try:
        blob = path.read_bytes()
        tensors = st_load(blob)
        features, labels = tensors["features"], tensors["labels"]
        # safetensors: 8-byte little-endian header length, then the JSON header
        header = json.loads(blob[8:8 + int.from_bytes(blob[:8], "little")])
        metadata = header.get("__metadata__") or {}
    except (OSError, KeyError, ValueError, SafetensorError) as err:
        raise stale(f"unreadable ({err})") from None
    if metadata.get("request") != json.dumps(request, sort_keys=True):
        raise stale("it was made for another partition or cache")
    if metadata.get("feature_space") != space:
        raise stale(f"feature space {metadata.get('feature_space')} is not the cache's {space}")
    if metadata.get("sha256") != _rows_digest(features, labels):
        raise stale("sha256 mismatch (corrupted)")
    return NodeRows(features, labels, int(metadata["noisy"]), space)


@lru_cache(maxsize=8)
def node_test_rows(data: NodeData, partition_id: int,
                   num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """This client's own test split (personalization's Local accuracy): rows of its cache's test
    split drawn with the class counts of its training partition scaled by test/train size, from
    the domains it trains on, so it follows the client's own label distribution and inputs (its
    corruption, camera or concept) and holds its share of the test split. Seeded by (run seed,
    partition id); never a training row (another split); clean labels."""
    cached = node_features(data.source)
    train = node_rows(data, partition_id, num_partitions).labels
    domains = cached.train.domain[all_partitions(data, num_partitions)[partition_id]]
    return local_test_split(train, cached.test.y, np.bincount(cached.train.domain),  # scores
                            np.random.default_rng([data.spec.seed, partition_id, 0x7E57]),
                            cached.test.x, domains, cached.test.domain)  # scores


def local_test_split(train_labels: np.ndarray, test_labels: np.ndarray,
                     train_sizes: np.ndarray | int, rng: np.random.Generator,
                     test_features: np.ndarray, train_domains: np.ndarray | None = None,
                     test_domains: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per (domain, class) held: round(count x |test of the domain| / |train of the domain|) test
    rows of that class and domain (at least one, at most all), without replacement; returns
    their features and labels. `train_sizes`: the whole training split's size per domain."""
    train_domains = np.zeros(len(train_labels), np.int64) if train_domains is None \
        else np.asarray(train_domains)
    test_domains = np.zeros(len(test_labels), np.int64) if test_domains is None \
        else np.asarray(test_domains)
    train_sizes = np.atleast_1d(train_sizes)
    picks = []
    for domain in np.unique(train_domains):
        in_domain = test_domains == domain
        ratio = in_domain.sum() / max(int(train_sizes[domain]), 1)
        held = train_labels[train_domains == domain]
        for label, count in zip(*np.unique(held, return_counts=True)):
            pool = np.flatnonzero(in_domain & (test_labels == label))
            take = min(len(pool), max(1, round(count * ratio)))
            picks.append(rng.choice(pool, take, replace=False))
    rows = np.sort(np.concatenate(picks)) if picks else np.empty(0, np.int64)
    return np.ascontiguousarray(test_features[rows]), test_labels[rows].astype(np.int64)


def run_config(context: Context) -> RunConfig:
    """The run's config, parsed and validated once per process and run (every handler of every
    message asks for it)."""
    return _parsed(tuple(sorted(context.run_config.items())))


@lru_cache(maxsize=4)
def _parsed(items: tuple[tuple[str, Any], ...]) -> RunConfig:
    return RunConfig.from_mapping(dict(items))


def node_partition(context: Context) -> tuple[int, int]:
    """(partition-id, num-partitions): set by simulation, or by `--node-config` in deployment."""
    try:
        return int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    except KeyError as missing:
        raise ValueError(
            f"node config lacks {missing}; start the SuperNode with "
            '--node-config "partition-id=<i> num-partitions=<n>"'
        ) from None


def local_schedule(training: TrainingOptions, round_config: Mapping | None = None,
                   num_examples: int = 0) -> LocalSchedule:
    """The run's local optimiser; the steps come from `local-steps`, else from the server
    (epoch-size "equal-share" or "own-data-equal-steps": the same for every client), else from
    the client's epochs. Under "own-data-equal-steps" a client bigger than an equal share takes
    bigger batches, so that its epochs still pass over all of its data."""
    steps = training.local_steps or int((round_config or {}).get(p.LOCAL_STEPS, 0))
    batch = training.batch_size
    if training.epoch_size == "own-data-equal-steps" and steps and not training.local_steps:
        batch = max(batch, math.ceil(num_examples * training.local_epochs / steps))
    return LocalSchedule(training.local_epochs, batch, training.learning_rate,
                         training.first_weight_decay, training.local_optimizer, steps)
