"""Seeded partitions of a labelled training set over N clients: what defines one, the row
indices it gives each client, and a summary of how skewed it is.

The schemes themselves are flwr-datasets `Partitioner` subclasses in `partitioners.py`,
imported only when indices are computed. The project keeps its data as numpy, so
`partition_indices` wraps labels as `{"label", "index"}` rows and returns one sorted
row-index array per client.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ovalp_flwr.data.options import PARTITIONS, flower_partitioner

if TYPE_CHECKING:
    from datasets import Dataset

    from ovalp_flwr.data.partitioners import IndexPartitioner


@dataclass(frozen=True)
class PartitionSpec:
    """Everything that defines a partition besides the data and the number of clients."""

    kind: str
    seed: int = 0
    classes_per_client: int = 1
    dirichlet_p: float = 0.1
    dirichlet_alpha: float = 0.001
    zipf_s: float = 2.0
    within_domain: str = "iid"  # partition "domain": how each domain's clients split its rows
    validation_fraction: float = 0.0  # held back before partitioning (data.holdout)
    validation_rows: str = "server"  # "clients": each client holds back its share instead
    # partition "flwr:<Name>": the partitioner's keyword arguments, sorted (hashable: lists as
    # tuples); `options.partition_args` parses them from the run config
    partition_args: tuple[tuple[str, Any], ...] = ()

    @staticmethod
    def frozen_args(args: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
        """`partition-args` parsed, as a spec holds them (sorted; lists as tuples)."""
        return tuple(sorted((name, tuple(value) if isinstance(value, list) else value)
                            for name, value in args.items()))


def make_partitioner(
    spec: PartitionSpec,
    num_partitions: int,
    features: np.ndarray | None = None,
    domains: np.ndarray | None = None,
) -> IndexPartitioner:
    """Build the partitioner for `spec`; the caller sets `.dataset` (flwr-datasets convention)."""
    # late: flwr-datasets + scikit-learn (~3 s); not in the ClientApp
    from ovalp_flwr.data.partitioners import (
        BernoulliDirichletPartitioner,
        ClassShardPartitioner,
        DomainPartitioner,
        FeatureSkewPartitioner,
        FlowerPartitioner,
        SeededIidPartitioner,
        ZipfPartitioner,
    )

    if spec.kind == "domain":
        if domains is None:
            raise ValueError("partition 'domain' needs every row's domain; got None")
        within = replace(spec, kind=spec.within_domain)
        return DomainPartitioner(
            num_partitions, spec.seed, domains,
            lambda clients, seed, rows: make_partitioner(
                replace(within, seed=seed), clients, None if features is None else features[rows]))
    if (name := flower_partitioner(spec.kind)) is not None:
        return FlowerPartitioner(num_partitions, spec.seed, name, dict(spec.partition_args))
    if spec.kind == "iid":
        return SeededIidPartitioner(num_partitions, spec.seed)
    if spec.kind == "shard":
        return ClassShardPartitioner(num_partitions, spec.seed, spec.classes_per_client)
    if spec.kind == "bernoulli-dirichlet":
        return BernoulliDirichletPartitioner(
            num_partitions, spec.seed, spec.dirichlet_p, spec.dirichlet_alpha
        )
    if spec.kind == "zipf":
        return ZipfPartitioner(num_partitions, spec.seed, spec.zipf_s)
    if spec.kind == "feature-skew":
        if features is None:
            raise ValueError("partition 'feature-skew' needs features for k-means; got None")
        return FeatureSkewPartitioner(num_partitions, spec.seed, features)
    raise ValueError(f"unknown partition {spec.kind!r}; expected one of: {', '.join(PARTITIONS)}")


def partition_indices(
    spec: PartitionSpec,
    labels: np.ndarray,
    num_partitions: int,
    features: np.ndarray | None = None,
    domains: np.ndarray | None = None,
) -> list[np.ndarray]:
    """One sorted int64 row-index array per client (possibly empty); disjoint, covering all rows."""
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    partitioner = make_partitioner(spec, num_partitions, features, domains)
    partitioner.dataset = label_dataset(labels)
    return partitioner.all_indices()


def label_dataset(labels: np.ndarray) -> Dataset:
    """The labels as a `datasets.Dataset`, with each row's original index in "index"."""
    from datasets import Dataset  # late: HF datasets (~0.7 s); not in the ClientApp

    labels = np.asarray(labels, dtype=np.int64)
    return Dataset.from_dict({"label": labels, "index": np.arange(len(labels), dtype=np.int64)})


# ---------------------------------------------------------------------------- summary


@dataclass(frozen=True)
class PartitionSummary:
    """How skewed a partition is, for logs and the results file."""

    kind: str
    num_clients: int
    num_samples: int
    num_empty: int
    sizes: tuple[int, ...]
    classes: tuple[int, ...]  # distinct labels held by each client
    domains: tuple[str, ...] = ()  # each client's domain ("a+b" for several); () if one domain

    def to_dict(self) -> dict:
        d = asdict(self)
        d["sizes"], d["classes"], d["domains"] = list(self.sizes), list(self.classes), \
            list(self.domains)
        return d

    def __str__(self) -> str:
        return (
            f"{self.kind}: {self.num_clients} clients, {self.num_empty} empty, "
            f"classes/client {_min_med_max(self.classes)}, "
            f"size {_min_med_max(self.sizes)} (min/median/max), {self.num_samples} samples"
            f"{self._domains_line()}"
        )

    def _domains_line(self) -> str:
        """'; clients per domain: mnist 5, usps 5' (in first-client order), if any; for many
        domains shared alike, their count ('19 domains, 1 client each'): `domains` names all."""
        if not self.domains:
            return ""
        counts = {d: self.domains.count(d) for d in dict.fromkeys(self.domains)}
        if len(counts) > 6 and len(set(counts.values())) == 1:
            each = next(iter(counts.values()))
            return f"; {len(counts)} domains, {each} client{'s' * (each > 1)} each"
        return "; clients per domain: " + ", ".join(f"{d} {n}" for d, n in counts.items())


def _min_med_max(values: tuple[int, ...]) -> str:
    if not values:
        return "-"
    return f"{min(values)}/{float(np.median(values)):g}/{max(values)}"


def summarize_sizes(kind: str, sizes: list[int]) -> PartitionSummary:
    """A summary from sample counts alone (classes unknown: nodes that own their data)."""
    return PartitionSummary(kind=kind, num_clients=len(sizes), num_samples=sum(sizes),
                            num_empty=sum(s == 0 for s in sizes), sizes=tuple(sizes), classes=())


def summarize_partition(
    kind: str,
    indices: list[np.ndarray],
    labels: np.ndarray,
    domains: np.ndarray | None = None,
    domain_names: tuple[str, ...] = (),
) -> PartitionSummary:
    """Sizes, classes and (with more than one domain) domains per client; counts over all
    clients, empty ones included."""
    labels = np.asarray(labels)
    sizes = tuple(int(len(ix)) for ix in indices)
    classes = tuple(int(len(np.unique(labels[ix]))) for ix in indices)
    held = ()
    if domains is not None and len(domain_names) > 1:
        held = tuple("+".join(domain_names[d] for d in np.unique(domains[ix])) or "-"
                     for ix in indices)
    return PartitionSummary(
        kind=kind,
        num_clients=len(indices),
        num_samples=sum(sizes),
        num_empty=sum(s == 0 for s in sizes),
        sizes=sizes,
        classes=classes,
        domains=held,
    )
