"""A client's own rows of the cached features, loaded once per process.

In simulation every virtual client reads the same cache; each process keeps the cache
and the partition in memory (Ray reuses a few worker processes for all clients), so a
round only slices arrays. No Flower here.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from ovalp_flwr.cache import CachedFeatures, load_features
from ovalp_flwr.config import RunConfig
from ovalp_flwr.partition import PartitionSpec, partition_indices


def resolve_path(path: str) -> Path:
    """Relative paths in the run config are relative to the directory the run started in."""
    return Path(path).expanduser().resolve()


@lru_cache(maxsize=2)
def _features(dataset: str, encoder: str, cache_dir: str) -> CachedFeatures:
    return load_features(dataset, encoder, resolve_path(cache_dir))


def partition_spec(config: RunConfig) -> PartitionSpec:
    return PartitionSpec(config.partition, config.seed, config.classes_per_client,
                         config.dirichlet_p, config.dirichlet_alpha, config.zipf_s)


@lru_cache(maxsize=4)
def _partition(source: tuple[str, str, str], spec: PartitionSpec,
               num_partitions: int) -> tuple[np.ndarray, ...]:
    cached = _features(*source)
    features = cached.train.x if spec.kind == "feature-skew" else None
    return tuple(partition_indices(spec, cached.train.y, num_partitions, features))


def feature_source(config: RunConfig) -> tuple[str, str, str]:
    """(dataset, encoder, cache dir): which cache a run reads."""
    return config.dataset, config.encoder, config.feature_cache_dir


def all_partitions(config: RunConfig, num_partitions: int) -> tuple[np.ndarray, ...]:
    """Every client's row indices (the server uses this only for the printed summary)."""
    return _partition(feature_source(config), partition_spec(config), num_partitions)


def client_rows(config: RunConfig, partition_id: int, num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """(features, labels) of one client's partition of the training split."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id={partition_id} is not allowed; use 0..{num_partitions - 1}")
    cached = _features(*feature_source(config))
    rows = all_partitions(config, num_partitions)[partition_id]
    return cached.train.x[rows], cached.train.y[rows]
