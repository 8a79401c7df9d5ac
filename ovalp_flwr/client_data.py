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

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ovalp_flwr.cache import CachedFeatures, load_or_build
from ovalp_flwr.config import RunConfig
from ovalp_flwr.noise import NoiseSpec, noisy_labels
from ovalp_flwr.partition import PartitionSpec, partition_indices

NODE_PATH_KEYS = ("data-dir", "feature-cache-dir")


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


def feature_source(config: RunConfig, node_config: Mapping[str, Any] | None = None) -> FeatureSource:
    """The run's cache, or the node's own one if its node config names a data or cache dir."""
    node = dict(node_config or {})
    for key in NODE_PATH_KEYS:
        if key in node and (not isinstance(node[key], str) or not node[key]):
            raise ValueError(
                f"node config: {key}={node[key]!r} is not allowed; use a non-empty path string "
                f'(--node-config "{key}=\'/path\'")'
            )
    return FeatureSource(
        dataset=config.dataset,
        encoder=config.encoder,
        cache_dir=node.get("feature-cache-dir", config.feature_cache_dir),
        data_dir=node.get("data-dir", config.data_dir),
        own_data=any(key in node for key in NODE_PATH_KEYS),
        device=config.device,
    )


@lru_cache(maxsize=2)
def node_features(source: FeatureSource) -> CachedFeatures:
    """The verified cache; built here first if this node has none yet (own data, first run)."""
    return load_or_build(source.dataset, source.encoder, resolve_path(source.cache_dir),
                         data_dir=source.data_dir or None, device=source.device)


def partition_spec(config: RunConfig) -> PartitionSpec:
    return PartitionSpec(config.partition, config.seed, config.classes_per_client,
                         config.dirichlet_p, config.dirichlet_alpha, config.zipf_s)


def noise_spec(config: RunConfig) -> NoiseSpec:
    return NoiseSpec(config.label_noise, config.noise_rate, config.seed)


@lru_cache(maxsize=4)
def train_labels(source: FeatureSource, noise: NoiseSpec) -> np.ndarray:
    """The training labels clients see: the cache's, with the run's label noise applied."""
    cached = node_features(source)
    return noisy_labels(cached.train.y, cached.num_classes, noise)


@lru_cache(maxsize=4)
def _partition(source: FeatureSource, spec: PartitionSpec, noise: NoiseSpec,
               num_partitions: int) -> tuple[np.ndarray, ...]:
    """Partitioned on the noisy labels: noise comes first, as in the benchmarks."""
    cached = node_features(source)
    features = cached.train.x if spec.kind == "feature-skew" else None
    return tuple(partition_indices(spec, train_labels(source, noise), num_partitions, features))


def all_partitions(config: RunConfig, num_partitions: int) -> tuple[np.ndarray, ...]:
    """Every client's row indices of the run's shared cache (the server's partition summary)."""
    return _partition(feature_source(config), partition_spec(config), noise_spec(config),
                      num_partitions)


def client_rows(source: FeatureSource, spec: PartitionSpec, noise: NoiseSpec, partition_id: int,
                num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """(features, labels) of one client's partition of the training split; noisy labels."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id={partition_id} is not allowed; use 0..{num_partitions - 1}")
    cached = node_features(source)
    if source.own_data and num_partitions > len(cached.train.y):  # the server checks the run's
        raise ValueError(
            f"node config: num-partitions={num_partitions} is not allowed; this node's training "
            f"split ({source.dataset} in data-dir {source.data_dir!r}) has only "
            f"{len(cached.train.y)} samples")
    rows = _partition(source, spec, noise, num_partitions)[partition_id]
    return cached.train.x[rows], train_labels(source, noise)[rows]


def noisy_count(source: FeatureSource, spec: PartitionSpec, noise: NoiseSpec, partition_id: int,
                num_partitions: int) -> int:
    """How many of this client's labels the noise changed (for the run's realised rate)."""
    rows = _partition(source, spec, noise, num_partitions)[partition_id]
    return int(np.sum(train_labels(source, noise)[rows] != node_features(source).train.y[rows]))
