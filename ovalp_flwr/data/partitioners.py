"""The partition schemes, each a flwr-datasets `Partitioner`.

Each plugs into `FederatedDataset` or is used on its own: set `.dataset` to a
`datasets.Dataset` with a "label" column and call `load_partition(i)`. Kept apart from
`partition.py` because importing flwr-datasets takes seconds (it pulls in seaborn): the
ClientApp of a node that has its rows already never needs these classes.
"""

from __future__ import annotations

import inspect
from abc import abstractmethod
from collections.abc import Callable

import numpy as np
from datasets import Dataset
from flwr_datasets.partitioner import IidPartitioner, Partitioner

from ovalp_flwr.data.options import SET_BY_THE_RUN
from ovalp_flwr.options import ConfigError

# ---------------------------------------------------------------------------- helpers


def _apportion(
    weights: np.ndarray, total: int, minimum: int = 0, cap: np.ndarray | None = None
) -> np.ndarray:
    """Integers proportional to `weights` that sum to `total`, each in [minimum, cap].

    Largest-remainder rounding: floor the quotas, then hand out (or take back) single
    units where the rounding error is largest. The caller guarantees feasibility.
    """
    weights = np.asarray(weights, dtype=np.float64)
    if cap is None:
        cap = np.full(len(weights), np.iinfo(np.int64).max)
    quota = total * weights / weights.sum()
    counts = np.clip(np.floor(quota).astype(np.int64), minimum, cap)
    while counts.sum() < total:  # at most len(weights) rounds
        counts[np.argmax(np.where(counts < cap, quota - counts, -np.inf))] += 1
    while counts.sum() > total:  # only after raising to `minimum`
        counts[np.argmax(np.where(counts > minimum, counts - quota, -np.inf))] -= 1
    return counts


# ------------------------------------------------------------------------ partitioners


class IndexPartitioner(Partitioner):
    """A partitioner that computes every client's row indices once, on first use.

    Same convention as flwr-datasets' DirichletPartitioner: the split needs the whole
    label column, so it is done once and `load_partition` only selects rows.
    """

    def __init__(self, num_partitions: int, seed: int) -> None:
        super().__init__()
        if num_partitions < 1:
            raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
        self._num_partitions = num_partitions
        self._seed = seed
        self._indices: list[np.ndarray] | None = None

    @property
    def num_partitions(self) -> int:
        return self._num_partitions

    def load_partition(self, partition_id: int) -> Dataset:
        return self.dataset.select(self.all_indices()[partition_id])

    def all_indices(self) -> list[np.ndarray]:
        """Sorted int64 row indices (positions in `.dataset`) of every client."""
        if self._indices is None:
            # `[:]`: datasets 4 returns a lazy Column, which np.asarray would read row by row
            # (7 s for 50,000 labels instead of milliseconds)
            labels = np.asarray(self.dataset.with_format("numpy")["label"][:])
            parts = self._split(labels, np.random.default_rng(self._seed))
            self._indices = [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
        return self._indices

    @abstractmethod
    def _split(self, labels: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        """One index array per client; together a partition of range(len(labels))."""


class SeededIidPartitioner(IndexPartitioner):
    """flwr-datasets' IidPartitioner (contiguous equal shards) over a seeded shuffle.

    IidPartitioner itself does not shuffle, so on a label-sorted dataset it would give
    label-skewed clients. Sizes differ by at most one.
    """

    def _split(self, labels: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        inner = IidPartitioner(self.num_partitions)
        inner.dataset = Dataset.from_dict({"row": np.arange(len(labels))}).shuffle(seed=self._seed)
        return [np.asarray(inner.load_partition(i)["row"][:]) for i in range(self.num_partitions)]


class ClassShardPartitioner(IndexPartitioner):
    """Label skew where each client holds exactly `classes_per_client` (k) classes.

    S = N*k shards. Each class gets shards in proportion to its size (at least one, at
    most N and at most its sample count; largest remainder), its shuffled samples are
    split evenly over them, and each client takes one shard from each of the k classes
    with the most shards left (random tie-break). That greedy step never gets stuck: with
    r clients left, k*r shards remain and no class has more than r, so every class at r
    is among the k picked.

    When that is impossible (S < number of classes, e.g. 2 clients on 10 classes, or
    classes too small/few) it falls back to McMahan et al. (2017): sort by label, cut
    into S contiguous shards, give each client k random shards. Then a client may hold
    more than k classes, since a shard can straddle a class boundary.
    """

    def __init__(self, num_partitions: int, seed: int, classes_per_client: int = 1) -> None:
        super().__init__(num_partitions, seed)
        if classes_per_client < 1:
            raise ValueError(f"classes_per_client must be >= 1, got {classes_per_client}")
        self._k = classes_per_client

    def _split(self, labels: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        classes, counts = np.unique(labels, return_counts=True)
        num_shards = self.num_partitions * self._k
        cap = np.minimum(counts, self.num_partitions)
        if num_shards < len(classes) or cap.sum() < num_shards:
            return self._mcmahan(labels, rng)
        shards_per_class = _apportion(counts, num_shards, minimum=1, cap=cap)
        shards = [
            list(np.array_split(rng.permutation(np.flatnonzero(labels == c)), m))
            for c, m in zip(classes, shards_per_class)
        ]
        left = shards_per_class.copy()
        parts = []
        for _ in range(self.num_partitions):
            picked = np.lexsort((rng.random(len(classes)), -left))[: self._k]
            left[picked] -= 1
            parts.append(np.concatenate([shards[c].pop() for c in picked]))
        return [parts[i] for i in rng.permutation(self.num_partitions)]

    def _mcmahan(self, labels: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        perm = rng.permutation(len(labels))
        by_label = perm[np.argsort(labels[perm], kind="stable")]
        shards = np.array_split(by_label, self.num_partitions * self._k)
        owner = rng.permutation(len(shards)).reshape(self.num_partitions, self._k)
        return [np.concatenate([shards[s] for s in row]) for row in owner]


class BernoulliDirichletPartitioner(IndexPartitioner):
    """FedCorr's `non_iid_dirichlet_sampling` (Xu et al., CVPR 2022).

    Client-class matrix Phi ~ Bernoulli(p), all-zero rows redrawn; each class's samples go
    to its holders by one categorical draw per sample, with probabilities ~ Dirichlet(alpha)
    over the holders. A class nobody holds is given to one random client (FedCorr would
    crash there). Uses `default_rng`, whose Dirichlet stays finite at tiny alpha where the
    legacy `np.random.dirichlet` returns NaN. Clients may end up empty: a holder can draw
    zero samples when alpha is small.
    """

    def __init__(
        self, num_partitions: int, seed: int, p: float = 0.1, alpha: float = 0.001
    ) -> None:
        super().__init__(num_partitions, seed)
        if not 0 < p <= 1:
            raise ValueError(f"dirichlet_p must be in (0, 1], got {p}")
        if not alpha > 0:
            raise ValueError(f"dirichlet_alpha must be > 0, got {alpha}")
        self._p, self._alpha = p, alpha

    def _split(self, labels: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        classes = np.unique(labels)
        phi = rng.binomial(1, self._p, size=(self.num_partitions, len(classes)))
        while (empty := np.flatnonzero(phi.sum(axis=1) == 0)).size:
            phi[empty] = rng.binomial(1, self._p, size=(len(empty), len(classes)))
        for j in np.flatnonzero(phi.sum(axis=0) == 0):
            phi[rng.integers(self.num_partitions), j] = 1
        owner = np.empty(len(labels), dtype=np.int64)
        for j, c in enumerate(classes):
            rows = np.flatnonzero(labels == c)
            holders = np.flatnonzero(phi[:, j])
            probs = rng.dirichlet(np.full(len(holders), self._alpha))
            owner[rows] = rng.choice(holders, size=len(rows), p=probs)
        return [np.flatnonzero(owner == i) for i in range(self.num_partitions)]


class ZipfPartitioner(IndexPartitioner):
    """Quantity skew with IID labels: client i gets a share proportional to (i+1)^-s.

    Everyone gets at least one sample when there are enough; the rest is rounded by
    largest remainder, so sizes never increase with the client id.
    """

    def __init__(self, num_partitions: int, seed: int, s: float = 2.0) -> None:
        super().__init__(num_partitions, seed)
        if s < 0:
            raise ValueError(f"zipf_s must be >= 0, got {s}")
        self._s = s

    def _split(self, labels: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        n, total = self.num_partitions, len(labels)
        minimum = 1 if n <= total else 0
        weights = np.arange(1, n + 1, dtype=np.float64) ** -self._s
        sizes = minimum + _apportion(weights, total - n * minimum)
        return np.split(rng.permutation(total), np.cumsum(sizes)[:-1])


class FeatureSkewPartitioner(IndexPartitioner):
    """Feature (covariate) skew: k-means over the features, cluster j is client j.

    Labels are ignored; clusters, hence clients, can be small or very unequal.
    """

    def __init__(self, num_partitions: int, seed: int, features: np.ndarray) -> None:
        super().__init__(num_partitions, seed)
        self._features = np.asarray(features)

    def _split(self, labels: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        if len(self._features) != len(labels):
            raise ValueError(
                f"features have {len(self._features)} rows, the dataset {len(labels)}"
            )
        from sklearn.cluster import KMeans  # late: sklearn.cluster (~0.3 s); only this scheme

        kmeans = KMeans(n_clusters=self.num_partitions, random_state=self._seed, n_init=1)
        cluster = kmeans.fit_predict(self._features)
        return [np.flatnonzero(cluster == j) for j in range(self.num_partitions)]


# Flower Datasets' partitioners that split rows by a column into `num_partitions` clients
# (`flwr:<Name>`); the vertical ones split features, and `Partitioner`,
# `IdToSizeFncPartitioner` are the bases the others are made of
NOT_HORIZONTAL = ("Partitioner", "IdToSizeFncPartitioner", "VerticalEvenPartitioner",
                  "VerticalSizePartitioner")


def flower_partitioners() -> tuple[str, ...]:
    """The Flower Datasets partitioners `partition = "flwr:<Name>"` can name."""
    import flwr_datasets.partitioner as flower  # late: only a flwr: partition reads the list

    return tuple(name for name in flower.__all__ if name not in NOT_HORIZONTAL)


def flower_partitioner_class(name: str) -> type[Partitioner]:
    """Flower Datasets' partitioner `name`; a ConfigError listing them where it has none."""
    import flwr_datasets.partitioner as flower  # late: as above

    if name not in flower_partitioners():
        raise ConfigError("partition", f"flwr:{name}", "name one of Flower Datasets' "
                          f"partitioners: {', '.join(f'flwr:{n}' for n in flower_partitioners())}")
    return getattr(flower, name)


def flower_partitioner(name: str, args: dict, num_partitions: int, seed: int) -> Partitioner:
    """Flower Datasets' `name` made as a Flower user makes it, with `args`, the run's number of
    clients, `partition_by="label"` unless given, and the run's seed where it takes one; a
    ConfigError naming `partition-args` where its constructor refuses them."""
    cls = flower_partitioner_class(name)
    accepts = inspect.signature(cls.__init__).parameters
    unknown = sorted(set(args) - set(accepts) - {"self"})
    if unknown:
        takes = ", ".join(p for p in accepts if p not in ("self", *SET_BY_THE_RUN))
        raise ConfigError("partition-args", _pairs(args), f"flwr:{name} takes no {unknown[0]}; "
                          f"it takes: {takes}")
    kwargs = {**({"partition_by": "label"} if "partition_by" in accepts else {}), **args}
    kwargs.update({key: value for key, value in (("num_partitions", num_partitions),
                                                 ("seed", seed)) if key in accepts})
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError("partition-args", _pairs(args), f"flwr:{name}: {err}") from None


def _pairs(args: dict) -> str:
    return " ".join(f"{k}={v!r}" for k, v in args.items())


class FlowerPartitioner(IndexPartitioner):
    """A Flower Datasets partitioner (`partition = "flwr:<Name>"`), run as `FederatedDataset`
    runs it: the rows shuffled by the seed first (`FederatedDataset(shuffle=True, seed)`), then
    `load_partition(i)` for every client; each row keeps its index, so the clients get row
    indices like every other scheme here. `flwr:IidPartitioner` is then our `iid` exactly (the
    same shuffle, then Flower's contiguous equal shards: tests/test_partition.py)."""

    def __init__(self, num_partitions: int, seed: int, name: str, args: dict) -> None:
        super().__init__(num_partitions, seed)
        self.name, self.args = name, dict(args)
        self.flower = flower_partitioner(name, self.args, num_partitions, seed)  # checks args

    def _split(self, labels: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        rows = Dataset.from_dict({"label": labels, "index": np.arange(len(labels))})
        self.flower.dataset = rows.shuffle(seed=self._seed)
        try:
            made = self.flower.num_partitions
            if made != self.num_partitions:
                raise ValueError(f"it makes {made} partitions for {self.num_partitions} clients")
            return [np.asarray(self.flower.load_partition(i)["index"][:], dtype=np.int64)
                    for i in range(self.num_partitions)]
        except ValueError as err:  # e.g. Dirichlet's min_partition_size never met
            raise ConfigError("partition", f"flwr:{self.name}", f"{err}") from None


class DomainPartitioner(IndexPartitioner):
    """Each client holds one domain, or a share of one when there are more clients than
    domains (clients apportioned to domains by their training sizes, at least one each, in
    domain order: clients 0..c_0-1 hold domain 0, and so on), or several whole domains when there
    are fewer (client i: the domains d with d mod N = i). Inside a domain its clients split its
    rows by `inner(num_clients, seed, rows)`, a partitioner of their own (IID, label skew, ...),
    seeded by (seed, domain) so that the domains' splits are independent.
    """

    def __init__(self, num_partitions: int, seed: int, domains: np.ndarray,
                 inner: Callable[[int, int, np.ndarray], IndexPartitioner]) -> None:
        super().__init__(num_partitions, seed)
        self._domains = np.asarray(domains, dtype=np.int64)
        self._inner = inner

    def clients_per_domain(self) -> np.ndarray:
        """How many clients share each domain (0 where a client holds several)."""
        sizes = np.bincount(self._domains)
        if self.num_partitions < len(sizes):
            return np.zeros(len(sizes), dtype=np.int64)
        return _apportion(sizes, self.num_partitions, minimum=1)

    def _split(self, labels: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        if len(self._domains) != len(labels):
            raise ValueError(f"domains have {len(self._domains)} rows, the dataset {len(labels)}")
        num_domains = int(self._domains.max(initial=-1)) + 1
        if self.num_partitions < num_domains:
            return [np.flatnonzero(self._domains % self.num_partitions == i)
                    for i in range(self.num_partitions)]
        parts: list[np.ndarray] = []
        for d, clients in enumerate(self.clients_per_domain()):
            rows = np.flatnonzero(self._domains == d)
            seed = int(np.random.SeedSequence([self._seed, d]).generate_state(1)[0])
            inner = self._inner(int(clients), seed, rows)
            inner.dataset = Dataset.from_dict({"label": labels[rows]})
            parts += [rows[ix] for ix in inner.all_indices()]
        return parts


# -------------------------------------------------------------------------- public API


