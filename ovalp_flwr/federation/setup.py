"""The set-up exchanges before round 1, shared by both paths: who the clients are (`describe`),
the global feature statistics (`set_norm`), the class statistics for the heads' start, and how a
node that connects mid-run joins. Every reply is checked before it is used (`validation`): a
node that describes itself impossibly is left out, with a warning."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from logging import WARNING

import numpy as np
from flwr.app import ConfigRecord, RecordDict
from flwr.serverapp import Grid

from ovalp_flwr.core.head_init.leave_out import changed, without
from ovalp_flwr.core.head_init.statistics import (ClassStatistics, ClientSums, class_rows,
                                                   upper_mask, wire_bytes)
from ovalp_flwr.core.normalize import (NEEDS_STATS, FeatureMoments, NormStats,
                                      standardized_totals)
from ovalp_flwr.features.cache import CachedFeatures
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.exchange import (CountingGrid, FederationError, SetupCosts,
                                            exchange_in_chunks)
from ovalp_flwr.federation.secure_sum import CLIPPING_RANGE, secure_statistics
from ovalp_flwr.federation.costs import message_bytes
from ovalp_flwr.federation.validation import check_description, check_moments, check_statistics
from ovalp_flwr.ops.console import say

# bytes of class statistics one set-up exchange may have in flight (`statistics_chunk`)
STATISTICS_BUDGET = 256 * 2**20


class StatisticsSum:
    """The federation's class statistics, added up reply by reply: no client's copy is kept
    (a Gram matrix is D² floats per client); or summed under SecAgg+ (`add_secure`). Plain
    replies are added in their wire form, the Gram matrix as its packed upper triangle, in
    float64: the same additions `ClassStatistics.merge` makes on the full matrices, so the
    same bits, without unpacking a D x D matrix per client (10 ms each at D = 784)."""

    def __init__(self, keep_parts: bool = False, keep_client_sums: bool = False) -> None:
        self.parts: dict[int, dict[str, np.ndarray]] | None = {} if keep_parts else None
        # FedCOF: each client's class sums, a row per class it holds (K·(D + 2) floats a client)
        self._client_rows: list[tuple[int, float, np.ndarray]] | None = \
            [] if keep_client_sums else None
        self._total: ClassStatistics | None = None
        self._packed: dict[str, np.ndarray] | None = None  # running float64 sums, wire form
        self.senders = 0
        self.wire_bytes = 0.0
        self.secure = False
        self.dropped: list[int] = []  # partitions holding data that dropped out of a secure sum
        self.noise_shares = 0  # distributed DP: the senders each share of the noise was sized for

    @property
    def total(self) -> ClassStatistics | None:
        """The sum so far (None before any client sent statistics)."""
        if self._total is None and self._packed is not None:
            self._total = ClassStatistics.from_arrays(self._packed)
            if self._client_rows is not None:
                self._total = dataclasses.replace(self._total, clients=ClientSums.of_rows(
                    self._client_rows, self._packed["sums"].shape[1]))
        return self._total

    @total.setter
    def total(self, value: ClassStatistics | None) -> None:
        self._total, self._packed = value, None

    def add_secure(self, grid: Grid, clients: dict[int, dict], request: dict, num_features: int,
                   costs: SetupCosts, clipping_range: float = CLIPPING_RANGE,
                   fewest: int | None = None) -> None:
        """Flower's SecAgg+ (`secure_sum`): only the sum and the sample counts are seen. With
        `fewest`, clients holding data may drop out while at least that many stay in the sum
        (`dropped` names their partitions)."""
        sizes = {node: int(c[p.NUM_EXAMPLES]) for node, c in clients.items()}
        counted = CountingGrid(grid)
        started = time.perf_counter()
        summed = secure_statistics(counted, list(clients), request, sizes, num_features,
                                   clipping_range, fewest)
        costs.add(counted.sent, counted.received, time.perf_counter() - started)
        if summed is None:
            said = f"; node {counted.errors[0][0]} said: {counted.errors[0][1]}" if counted.errors \
                else ""
            allowed = ("no client may drop out (secagg-dropouts = 0)" if fewest is None
                       else f"it needs {fewest} clients holding data back")
            raise FederationError(f"statistics-aggregation='secagg+': SecAgg+ did not complete; "
                                  f"{allowed} ({len(counted.errors)} client error(s)){said}")
        self.total, contributors = summed
        self.dropped = sorted(int(clients[node][p.PARTITION_ID]) for node in clients
                              if sizes[node] and node not in contributors)
        self.senders = sum(1 for node in contributors if sizes[node])
        self.noise_shares = int(request.get(p.NOISE_SHARES, 0))
        self.secure = True
        self.wire_bytes = sum(message_bytes(c) for c in counted.received) / max(len(clients), 1)

    def add(self, content: RecordDict, node: int = 0) -> None:
        """One client's statistics into the sum (and, with `keep_parts`, kept in wire form)."""
        if p.STATISTICS not in content:
            return
        record = content[p.STATISTICS]
        part = with_gram_estimate(p.from_record(record))
        if self.parts is not None:
            self.parts[node] = part
        if self._client_rows is not None:
            self._client_rows.extend(class_rows(part["counts"], part["sums"]))
        if self._packed is None:
            ClassStatistics.from_arrays(part)  # the first reply's shapes checked; later ones match them
            self._packed = {key: np.asarray(value, np.float64) for key, value in part.items()}
        else:
            _check_like(part, self._packed)
            for key, value in part.items():
                self._packed[key] += value  # float32 into the float64 sum: merge's arithmetic
        self._total = None
        self.senders += 1
        self.wire_bytes += record.count_bytes()

    @property
    def kept(self) -> "KeptStatistics":
        """The kept clients' statistics (`keep_parts`), each unpacked only when read."""
        return KeptStatistics(self.parts)

    def drop(self, nodes: list[int]) -> None:
        """Kept clients' statistics taken out of the sum."""
        total, kept = self.total, self.kept
        for node in nodes:
            total = without(total, kept[node])
            del self.parts[node]
            self.senders -= 1
        self.total = total

    def replace(self, changes: Mapping[int, ClassStatistics]) -> None:
        """Kept clients' statistics replaced in the sum (the screen's repairs)."""
        self.total = changed(self.total, self.kept, changes)
        for node, new in changes.items():
            self.parts[node] = new.to_arrays()

    def described(self, clients: dict[int, dict], norm: NormStats | None
                  ) -> dict[int, tuple[np.ndarray, float]]:
        """What each kept client's standardised rows total by the moments it described
        (`normalize.standardized_totals`); empty where the run has no moments."""
        if norm is None or self.parts is None:
            return {}
        return {node: standardized_totals(FeatureMoments(
            int(clients[node][p.NUM_EXAMPLES]), clients[node][p.MOMENTS]["sum"],
            clients[node][p.MOMENTS]["sum-sq"]), norm)
            for node in self.parts if p.MOMENTS in clients.get(node, {})}


class KeptStatistics(Mapping[int, ClassStatistics]):
    """Node -> its statistics, unpacked from the kept wire form when read: a full float64 Gram
    matrix is 13 MB at D = 1280, so all of them at once would be 1.3 GB for 100 clients."""

    def __init__(self, packed: dict[int, dict[str, np.ndarray]]) -> None:
        self._packed = packed

    def __getitem__(self, node: int) -> ClassStatistics:
        return ClassStatistics.from_arrays(self._packed[node])

    def __iter__(self) -> Iterator[int]:
        return iter(self._packed)

    def __len__(self) -> int:
        return len(self._packed)


def with_gram_estimate(part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A low-rank reply in the Gram's wire form, its matrix estimated (`gram_estimate`, in
    float64): from here it is summed, kept and checked as a Gram reply is."""
    if "scatter-factor" not in part:
        return part
    stats = ClassStatistics.from_arrays(part)
    gram = stats.gram_estimate()
    arrays = {key: value for key, value in part.items() if key != "scatter-factor"}
    arrays["gram-triu"] = gram[upper_mask(len(gram))]
    return arrays


def _check_like(part: dict[str, np.ndarray], total: dict[str, np.ndarray]) -> None:
    """A client's statistics must have the arrays and shapes of the first client's."""
    if set(part) != set(total):
        raise ValueError("some clients sent a Gram matrix and others did not" if
                         "gram-triu" in set(part) ^ set(total) else
                         f"statistics have arrays {sorted(part)}; expected {sorted(total)}")
    for key, value in part.items():
        if np.shape(value) != total[key].shape:
            raise ValueError(f"statistics {key!r} have shape {np.shape(value)}; the first "
                             f"client's have {total[key].shape}")


def statistics_chunk(request: dict | None, cache: CachedFeatures | None,
                     budget: int = STATISTICS_BUDGET) -> int | None:
    """How many nodes one set-up exchange asks for class statistics at a time: their replies
    are held until the exchange's last one arrives (by the SuperLink, by the simulation's state,
    by `exchange`), and a Gram matrix is D²/2 floats per node: 1.2 MB at D = 784, so 12 GB for
    10,000 nodes at once. None (all at once) when nothing big is asked for."""
    kind = str((request or {}).get(p.STATISTICS_KIND, "none"))
    if kind == "none" or cache is None:
        return None
    per_node = wire_bytes(kind, int(request[p.NUM_CLASSES]), cache.train.x.shape[1],
                          int(request.get(p.GRAM_RANK, 0)))
    return max(1, budget // per_node)


def _replies(grid: Grid, message_type: str, contents: dict[int, RecordDict],
             costs: SetupCosts | None, chunk: int | None):
    """Every (node, reply) of an exchange, chunk after chunk, in `contents`' order."""
    for replies in exchange_in_chunks(grid, message_type, contents, costs, chunk):
        yield from replies.items()


def statistics_request(kind: str, num_classes: int, gram_rank: int = 0) -> dict:
    """What the last set-up message asks each client to send for the heads' start."""
    if kind == "none":
        return {}
    rank = {p.GRAM_RANK: gram_rank} if kind == "low-rank" else {}
    return {p.STATISTICS_KIND: kind, p.NUM_CLASSES: num_classes, **rank}


def describe_clients(grid: Grid, nodes: list[int], check_ids: bool = True,
                     costs: SetupCosts | None = None, request: dict | None = None,
                     statistics: StatisticsSum | None = None,
                     cache: CachedFeatures | None = None) -> dict[int, dict]:
    """Every client's partition id and sample count (plus moments, if the norm needs them, and
    the class statistics into `statistics`, if `request` asks for them). With the server's
    `cache`, a node whose description is impossible (`setup_refusal`) is left out, warned of."""
    contents = {n: RecordDict({p.CONFIG: ConfigRecord(dict(request or {}))}) for n in nodes}
    chunk = statistics_chunk(request, cache)
    clients = {}
    for node, content in _replies(grid, p.DESCRIBE, contents, costs, chunk):
        reason = None if cache is None else setup_refusal(content, cache, describe=True)
        if reason:
            say(WARNING, "node %s left out of the federation: its %s reply %s", node, p.DESCRIBE,
                reason)
            continue
        if statistics is not None:
            statistics.add(content, node)
        info = dict(content[p.METRICS])
        info[p.FEATURE_SPACE] = str(content[p.CONFIG][p.FEATURE_SPACE])
        if p.MOMENTS in content:
            info[p.MOMENTS] = p.from_record(content[p.MOMENTS])
        clients[node] = info
    if check_ids:
        leave_out(clients, [])  # nobody left: one line, not an empty federation
        _check_partition_ids(clients)
    return clients


def setup_refusal(content: RecordDict, cache: CachedFeatures, describe: bool = False,
                  examples: int | None = None) -> str | None:
    """Why a set-up reply cannot be used (`validation`), or None: a `describe` reply's counts
    (no more samples than the dataset, unless the node reads its own data) and moments; the
    class statistics of either, against the node's described samples."""
    num_features, reason = cache.train.x.shape[1], None
    try:
        if describe:
            metrics = dict(content[p.METRICS])
            own = metrics.get(p.OWN_DATA) == 1
            reason = check_description(metrics, None if own else len(cache.train.y))
            examples = None if reason else int(metrics[p.NUM_EXAMPLES])
            if not reason and p.MOMENTS in content:
                reason = check_moments(p.from_record(content[p.MOMENTS]), num_features)
        if not reason and p.STATISTICS in content:
            reason = check_statistics(p.from_record(content[p.STATISTICS]), cache.num_classes,
                                      num_features, examples or 0)
    except (KeyError, ValueError, TypeError) as err:
        return f"is malformed ({type(err).__name__}: {err})"
    return f"is refused: {reason}" if reason else None


def check_feature_space(clients: dict[int, dict], expected: str,
                        differs: str = "have features from another encoder or label set than "
                                       "the server's cache",
                        hint: str = ": give every node the same dataset classes and encoder "
                                    "options") -> None:
    """Every node's features (or raw data and model, on the encoder path) must be the server's
    `expected` feature space, or averaging across them is meaningless: refuse, naming a node."""
    wrong = {n: c[p.FEATURE_SPACE] for n, c in clients.items() if c[p.FEATURE_SPACE] != expected}
    if wrong:
        node, found = next(iter(sorted(wrong.items())))
        raise FederationError(f"{len(wrong)} node(s) {differs} ({expected}); node {node} has "
                              f"{found}{hint}")


def _check_partition_ids(clients: dict[int, dict]) -> None:
    """One num-partitions N for all, distinct ids in 0..N-1. N may exceed the nodes present:
    the missing partitions' nodes can join later (`late_admitter`)."""
    counts = {int(c[p.NUM_PARTITIONS]) for c in clients.values()}
    ids = sorted(int(c[p.PARTITION_ID]) for c in clients.values())
    n = max(counts)
    if len(counts) != 1 or len(set(ids)) != len(ids) or not 0 <= ids[0] <= ids[-1] < n:
        raise FederationError(
            f"{len(clients)} clients report num-partitions {sorted(counts)} and partition ids "
            f"{ids[:5]}...; every node needs the same num-partitions and a distinct partition-id "
            f"in 0..num-partitions-1")
    if len(ids) < n:
        missing = sorted(set(range(n)) - set(ids))
        say(WARNING, "partitions %s of %s have no node yet; they join when their nodes connect",
            missing[:10], n)


def num_partitions(clients: dict[int, dict]) -> int:
    return int(next(iter(clients.values()))[p.NUM_PARTITIONS])


def by_partition(clients: dict[int, dict]) -> list[int]:
    """Node ids ordered by partition id: the order sampling draws from."""
    return sorted(clients, key=lambda node: int(clients[node][p.PARTITION_ID]))


def leave_out(clients: dict[int, dict], nodes: list[int]) -> None:
    """Drop `nodes` from the federation; refuse to go on without anyone."""
    for node in nodes:
        clients.pop(node, None)
    if not clients:
        raise FederationError("every node was left out of the federation: see the warnings above")


def global_stats(feature_norm: str, clients: dict[int, dict]) -> NormStats | None:
    """Merge the clients' moments into the global mean/std (None if the norm needs none)."""
    if not NEEDS_STATS[feature_norm]:
        return None
    parts = [FeatureMoments(int(c[p.NUM_EXAMPLES]), c[p.MOMENTS]["sum"], c[p.MOMENTS]["sum-sq"])
             for c in clients.values() if p.MOMENTS in c]
    return NormStats.from_moments(FeatureMoments.merge(parts))


def broadcast_stats(grid: Grid, stats: NormStats, nodes: list[int],
                    costs: SetupCosts | None = None, request: dict | None = None,
                    statistics: StatisticsSum | None = None, clients: dict[int, dict] | None = None,
                    cache: CachedFeatures | None = None) -> list[int]:
    """The global mean/std to every node; their replies carry the class statistics of the
    normalised features into `statistics` when `request` asks for them. Returns the nodes whose
    statistics are impossible (checked against `clients` and `cache` when given): not added."""
    record = p.to_record({"mean": stats.mean, "std": stats.std})
    config = ConfigRecord(dict(request or {}))
    contents = {n: RecordDict({p.NORM: record, p.CONFIG: config}) for n in nodes}
    refused = []
    for node, content in _replies(grid, p.SET_NORM, contents, costs, statistics_chunk(request, cache)):
        reason = None if cache is None or clients is None else setup_refusal(
            content, cache, examples=int(clients[node][p.NUM_EXAMPLES]))
        if reason:
            say(WARNING, "node %s left out of the federation: its %s reply %s", node, p.SET_NORM,
                reason)
            refused.append(node)
        elif statistics is not None:
            statistics.add(content, node)
    return refused


def late_admitter(cache: CachedFeatures, stats: NormStats | None,
                  clients: dict[int, dict]) -> Callable[[Grid, list[int]], list[int]]:
    """How a node that connects mid-run joins: `describe`, the feature-space check, the
    global statistics. Refused (one warning each): a failed reply, another feature space,
    another num-partitions, a partition id a live node already holds. A new node that takes
    the id of an offline one replaces it."""

    def admit(grid: Grid, new_nodes: list[int]) -> list[int]:
        try:
            described = describe_clients(grid, new_nodes, check_ids=False, cache=cache)
        except FederationError as err:
            say(WARNING, "late nodes %s not admitted: %s", new_nodes, err)
            return by_partition(clients)
        live = set(grid.get_node_ids())
        holders = {int(c[p.PARTITION_ID]): node for node, c in clients.items()}
        admitted = []
        for node in by_partition(described):
            info, pid = described[node], int(described[node][p.PARTITION_ID])
            reason = _refusal(info, pid, num_partitions(clients), cache, holders, live)
            if reason:
                say(WARNING, "late node %s not admitted: %s", node, reason)
                continue
            clients.pop(holders.get(pid, -1), None)  # an offline holder is replaced
            clients[node], holders[pid] = info, node
            admitted.append(node)
        if stats is not None and admitted:
            try:
                broadcast_stats(grid, stats, admitted)
            except FederationError as err:  # they would fail every train message: leave them out
                say(WARNING, "late nodes %s not admitted: %s", admitted, err)
                for node in admitted:
                    clients.pop(node)
        return by_partition(clients)

    return admit


def _refusal(info: dict, pid: int, n: int, cache: CachedFeatures, holders: dict[int, int],
             live: set[int]) -> str | None:
    if info[p.FEATURE_SPACE] != cache.feature_space():
        return f"features from another encoder or label set ({info[p.FEATURE_SPACE]})"
    if int(info[p.NUM_PARTITIONS]) != n or not 0 <= pid < n:
        return f"partition {pid} of {int(info[p.NUM_PARTITIONS])} does not fit the run's {n}"
    if holders.get(pid) in live:
        return f"partition-id {pid} is held by live node {holders[pid]}"
    return None
