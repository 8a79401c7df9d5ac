"""The ServerApp's run: set-up exchanges, the staged FedAvg rounds, results.

`server_app.py` only wires this to Flower. Order of a run:
1. build or load the feature cache (the server scores the global head on its test split);
2. `query.describe` to every client: partition ids, sample counts, feature moments;
3. `query.set_norm`: the global mean/std every client normalises with; its replies carry the
   clients' class statistics when the heads start from them (`head-init`);
4. the heads' start (`ovalp_flwr.core.head_init`), scored as round 0;
5. FedAvg rounds with the stage in each train message, centralised evaluation after each, and
   a checkpoint after each (`resume` goes on from the last one);
6. `results/<run-name>/summary.json` + `rounds.csv`, and one closing line.
Every reply is checked before it is used (`ovalp_flwr.federation.validation`): a node that describes
itself impossibly is left out, a train reply that is not what it claims is not averaged.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.supercore import log

from ovalp_flwr import __version__
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.features.cache import CachedFeatures, load_or_build
from ovalp_flwr.federation.node import all_partitions, resolve_path
from ovalp_flwr.config import RunConfig, check_num_clients
from ovalp_flwr.ops.console import say
from ovalp_flwr.core.devices import resolve_device
from ovalp_flwr.core.head_init import ClassStatistics, HeadInit, make_head_init
from ovalp_flwr.core.model import initial_adapter, model_from_numpy
from ovalp_flwr.core.normalize import NEEDS_STATS, FeatureMoments, NormStats, normalize
from ovalp_flwr.data.partition import PartitionSummary, summarize_partition, summarize_sizes
from ovalp_flwr.federation.results import default_run_name, write_run
from ovalp_flwr.federation.checkpoint import (FILE as CHECKPOINT_FILE, Checkpoint, check_resumable,
                                   comparable, pack, read_checkpoint, unpack, write_checkpoint)
from ovalp_flwr.ova.client import local_schedule
from ovalp_flwr.federation.strategy import (ControlVariates, ReplyCheck, Staged, StagedFedAdam, StagedFedAvg,
                                 message_bytes)
from ovalp_flwr.federation.validation import (check_description, check_moments, check_statistics,
                                   check_train_reply)


def run_server(grid: Grid, config: RunConfig) -> Path:
    """One OvA-LP (or LP-softmax) run; returns its results folder."""
    if config.finetune != "none":  # through the encoder, on raw data
        from ovalp_flwr.finetune.server import run_finetune

        return run_finetune(grid, config)
    started = time.time()
    run_name = config.run_name or default_run_name(config.to_dict())
    run_dir = resolve_path(config.results_dir) / run_name
    resumed = resumable(config, run_dir)
    cache = load_or_build(config.dataset, config.encoder, resolve_path(config.feature_cache_dir),
                          data_dir=config.data_dir or None, device=config.device,
                          **config.cache_options())
    nodes = wait_for_nodes(grid)
    check_num_clients(len(nodes), len(cache.train.y))  # nodes with own data check theirs
    init = make_head_init(config.head_init, config.ridge_lambda)
    setup = set_up(grid, nodes, config, cache, init.statistics)
    initial, start = initial_head(config, init, setup.statistics, cache)
    clients, stats = setup.clients, setup.norm

    # only sent when there are statistics: Flower's ConfigRecord.count_bytes rejects ""
    digest_config = {p.NORM_DIGEST: stats.digest()} if stats else {}
    steps = equal_share_steps(config, clients)
    strategy = make_strategy(
        config,
        node_order=by_partition(clients),
        admit=late_admitter(cache, stats, clients),
        extra_train_config={**digest_config, **({p.LOCAL_STEPS: steps} if steps else {})},
        check_reply=train_reply_check(config, clients, steps),
        left_out=set(nodes) - set(clients),
    )
    evaluator = CentralEvaluator(cache, config, stats)
    evaluator.round_info = lambda server_round: strategy.rounds.get(server_round, {})
    checkpoints = Checkpoints(run_dir, config, strategy, evaluator, clients, stats, start)
    where = checkpoints.restore(resumed) if resumed else {"initial_arrays": p.to_record(initial)}
    result = strategy.start(
        grid=grid,
        train_config=ConfigRecord(),
        evaluate_config=ConfigRecord(digest_config),
        num_rounds=config.num_server_rounds,
        timeout=config.round_timeout,
        evaluate_fn=evaluator,
        after_round=checkpoints,
        **where,  # the start, or where the checkpoint left off
    )
    summary = _summary(config, result, strategy, evaluator, setup.partition,
                       _feature_info(cache, stats))
    summary["label_noise"] = label_noise_summary(config, clients)
    summary["local_steps"] = config.local_steps or steps or None  # None: epochs of own data
    summary["setup"] = setup.costs.to_dict()
    summary["head_init"] = checkpoints.head_init
    if checkpoints.resumes:
        summary["resumes"] = checkpoints.resumes
    if config.personalization_methods:
        summary["personalization"] = personalize_after(grid, config, clients, result.arrays,
                                                       stats, run_name)
    summary["total_seconds"] = checkpoints.seconds_before + time.time() - started
    out = write_run(resolve_path(config.results_dir), run_name, summary, carry=(CHECKPOINT_FILE,))
    say(INFO, "final accuracy %.4f after %d rounds (%s start %.4f; %s, %s, %s); results in %s",
        summary["final_accuracy"], config.num_server_rounds, config.head_init,
        summary["initial_accuracy"], config.head, config.schedule, config.partition, out)
    return out


def resumable(config: RunConfig, run_dir: Path) -> Checkpoint | None:
    """The checkpoint a `resume` run goes on from (None: start at round 1). Checked before any
    data is read: the file verifies and is of this run's config."""
    if not config.resume:
        return None
    checkpoint = read_checkpoint(run_dir)
    if checkpoint is None:
        say(WARNING, "resume: %s has no checkpoint; the run starts at round 1", run_dir)
        return None
    check_resumable(checkpoint, comparable(config.to_dict()), config.num_server_rounds)
    say(INFO, "resume: going on from round %d of %s", checkpoint.round, run_dir)
    return checkpoint


class Checkpoints:
    """Writes the run's checkpoint after every `checkpoint-every` rounds (and the last), and
    turns one back into the state the rounds go on from (`ovalp_flwr.federation.checkpoint`)."""

    def __init__(self, run_dir: Path, config: RunConfig, strategy: Staged,
                 evaluator: CentralEvaluator, clients: dict[int, dict], stats: NormStats | None,
                 head_init: dict) -> None:
        self.run_dir, self.config, self.strategy, self.evaluator = run_dir, config, strategy, evaluator
        self.clients, self.norm_digest = clients, stats.digest() if stats else None
        self.head_init = head_init  # what summary.json says of the start (the first process's)
        self.resumes: list[dict] = []  # {round, at} of each resume, the earliest first
        self.seconds_before = 0.0  # the run's seconds in the processes before this one
        self.started = time.time()
        self._partition: dict[int, int] = {}  # every node seen -> its partition id

    def partition_of(self, node: int) -> int:
        return self._partition[node]

    def __call__(self, server_round: int, arrays: ArrayRecord, result: Result) -> None:
        every, last = self.config.checkpoint_every, self.config.num_server_rounds
        if not every or (server_round % every and server_round != last):
            return
        self._partition.update({n: int(c[p.PARTITION_ID]) for n, c in self.clients.items()})
        strategy_arrays, strategy_state = self.strategy.state(self.partition_of)
        state = {"config": comparable(self.config.to_dict()), "norm_digest": self.norm_digest,
                 "strategy": strategy_state, "evaluator": self.evaluator.state(),
                 "result": _history(result), "head_init": self.head_init,
                 "resumes": self.resumes,
                 "seconds": self.seconds_before + time.time() - self.started}
        write_checkpoint(self.run_dir, Checkpoint(server_round, {
            **pack("global", p.from_record(arrays)), **strategy_arrays}, state))

    def restore(self, checkpoint: Checkpoint) -> dict:
        """The strategy and evaluator as they were after the checkpoint's round; returns how
        `Staged.start` goes on. The features must be normalised as they were, and the global
        head must score what it scored then."""
        state, k = checkpoint.state, checkpoint.round
        if state["norm_digest"] != self.norm_digest:
            raise FederationError(
                f"resume: the federation's feature statistics ({self.norm_digest}) are not the "
                f"checkpoint's ({state['norm_digest']}): other nodes or data than at round {k}")
        holders = {int(c[p.PARTITION_ID]): n for n, c in self.clients.items()}
        # a partition without a node now keeps its entries under a stand-in (negative) id
        self.strategy.restore(checkpoint.arrays, state["strategy"],
                              lambda partition: holders.get(partition, -1 - partition))
        self.evaluator.restore(state["evaluator"])
        self.head_init, self.seconds_before = state["head_init"], state["seconds"]
        self.resumes = [*state["resumes"], {"round": k, "at": time.strftime("%Y-%m-%dT%H:%M:%S")}]
        arrays = p.to_record(unpack("global", checkpoint.arrays))
        result = _result(state["result"], arrays)
        self.evaluator.recheck(k, arrays, float(result.evaluate_metrics_serverapp[k][p.ACCURACY]))
        return {"initial_arrays": arrays, "resume": result, "first_round": k + 1}


def _history(result: Result) -> dict:
    """The metrics of every round so far, JSON-able."""
    return {name: {str(r): dict(metrics) for r, metrics in getattr(result, name).items()}
            for name in HISTORIES}


def _result(history: dict, arrays: ArrayRecord) -> Result:
    """A `Result` back from `_history`, ending at `arrays`."""
    result = Result(arrays=arrays)
    for name in HISTORIES:
        getattr(result, name).update({int(r): MetricRecord(m) for r, m in history[name].items()})
    return result


HISTORIES = ("train_metrics_clientapp", "evaluate_metrics_clientapp", "evaluate_metrics_serverapp")


def personalize_after(grid: Grid, config: RunConfig, clients: dict[int, dict],
                      arrays: ArrayRecord, stats: NormStats | None, run_name: str) -> dict:
    """The personalization phase; if a client fails it, the federated run's results are
    still written, with the error in place of the phase's."""
    from ovalp_flwr.personalize.phase import personalization_phase

    try:
        return personalization_phase(grid, config, clients, arrays,
                                     stats.digest() if stats else "", run_name)
    except FederationError as err:
        say(WARNING, "personalization stopped: %s", err)
        return {"error": str(err)}


@dataclass
class SetUp:
    """What the set-up exchanges established before round 1."""

    clients: dict[int, dict]  # node -> what its describe reply said
    partition: PartitionSummary
    norm: NormStats | None  # the global mean/std every client normalises with
    statistics: StatisticsSum  # the clients' class statistics, summed, if the start needs them
    costs: SetupCosts


def set_up(grid: Grid, nodes: list[int], config: RunConfig, cache: CachedFeatures,
           statistics_kind: str) -> SetUp:
    """describe, then set_norm; the start's statistics ride on the last of them (set_norm, or
    describe when the normalisation needs no global statistics), or come under SecAgg+ after
    them (`statistics-aggregation = "secagg+"`)."""
    costs, summed = SetupCosts(), StatisticsSum()
    request = statistics_request(statistics_kind, cache.num_classes)
    secure = config.statistics_aggregation == "secagg+" and bool(request)
    on_describe = not NEEDS_STATS[config.feature_norm] and not secure
    clients = describe_clients(grid, nodes, costs=costs, request=request if on_describe else {},
                               statistics=summed, cache=cache)
    check_feature_space(clients, cache)
    partition = partition_summary(config, clients, cache)
    say(INFO, "partition %s", partition)
    norm = global_stats(config, clients)
    if norm is not None:
        refused = broadcast_stats(grid, norm, list(clients), costs=costs,
                                  request={} if secure else request, statistics=summed,
                                  clients=clients, cache=cache)
        leave_out(clients, refused)
    if secure:
        summed.add_secure(grid, clients, {**request, p.NORM_DIGEST: norm.digest() if norm else ""},
                          cache.train.x.shape[1], costs)
    return SetUp(clients, partition, norm, summed, costs)


class SetupCosts:
    """Bytes and seconds of the set-up exchanges (describe, set_norm), as the rounds record
    theirs: totals over all clients, so a report can add them to the rounds' bytes."""

    def __init__(self) -> None:
        self.bytes_sent = self.bytes_received = self.seconds = 0.0
        self.messages = 0

    def add(self, sent: list[RecordDict], received: list[RecordDict], seconds: float) -> None:
        self.bytes_sent += sum(message_bytes(c) for c in sent)
        self.bytes_received += sum(message_bytes(c) for c in received)
        self.messages += len(sent)
        self.seconds += seconds

    def to_dict(self) -> dict:
        return {"bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
                "messages": self.messages, "seconds": self.seconds}


class StatisticsSum:
    """The federation's class statistics, added up reply by reply: no client's copy is kept
    (a Gram matrix is D² floats per client); or summed under SecAgg+ (`add_secure`)."""

    def __init__(self) -> None:
        self.total: ClassStatistics | None = None
        self.senders = 0
        self.wire_bytes = 0.0
        self.secure = False

    def add_secure(self, grid: Grid, clients: dict[int, dict], request: dict, num_features: int,
                   costs: SetupCosts) -> None:
        """Flower's SecAgg+ (`secure_sum`): only the sum and the sample counts are seen."""
        from ovalp_flwr.federation.secure_sum import secure_statistics

        sizes = {node: int(c[p.NUM_EXAMPLES]) for node, c in clients.items()}
        counted = CountingGrid(grid)
        started = time.perf_counter()
        total = secure_statistics(counted, list(clients), request, sizes, num_features)
        costs.add(counted.sent, counted.received, time.perf_counter() - started)
        if total is None:
            said = f"; node {counted.errors[0][0]} said: {counted.errors[0][1]}" if counted.errors \
                else ""
            raise FederationError(f"statistics-aggregation='secagg+': SecAgg+ did not complete "
                                  f"({len(counted.errors)} client error(s)){said}")
        self.total = total
        self.senders, self.secure = sum(1 for n in sizes.values() if n), True
        self.wire_bytes = sum(message_bytes(c) for c in counted.received) / max(len(clients), 1)

    def add(self, content: RecordDict) -> None:
        if p.STATISTICS not in content:
            return
        record = content[p.STATISTICS]
        part = ClassStatistics.from_arrays(p.from_record(record))
        self.total = part if self.total is None else ClassStatistics.merge([self.total, part])
        self.senders += 1
        self.wire_bytes += record.count_bytes()


class CountingGrid:
    """A grid that remembers what went through `send_and_receive` (SecAgg+'s exchanges)."""

    def __init__(self, grid: Grid) -> None:
        self.grid, self.sent, self.received = grid, [], []
        self.errors: list[tuple[int, str]] = []  # (node, reason) of failed replies

    def __getattr__(self, name: str):
        return getattr(self.grid, name)

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        self.sent += [m.content for m in messages]
        self.received += [m.content for m in replies if not m.has_error()]
        self.errors += [(m.metadata.src_node_id, m.error.reason) for m in replies if m.has_error()]
        return replies


def statistics_request(kind: str, num_classes: int) -> dict:
    """What the last set-up message asks each client to send for the heads' start."""
    return {} if kind == "none" else {p.STATISTICS_KIND: kind, p.NUM_CLASSES: num_classes}


def initial_head(config: RunConfig, init: HeadInit, summed: StatisticsSum,
                 cache: CachedFeatures) -> tuple[dict[str, np.ndarray], dict]:
    """The heads the first round starts from, and what `summary.json` says of them."""
    started = time.perf_counter()
    if init.statistics != "none" and summed.total is None:
        raise FederationError(f"head-init={config.head_init!r}: no client sent statistics "
                              "(every client is empty)")
    num_features = cache.train.x.shape[1]
    weight, bias = init.build(summed.total, config.adapter_dim or num_features, cache.num_classes,
                              config.seed, config.head)
    adapter = initial_adapter(num_features, config.adapter_dim, config.seed) \
        if config.adapter_dim else {}
    seconds = time.perf_counter() - started
    info = {"name": init.name, "statistics": init.statistics, "clients_sent": summed.senders,
            "aggregation": "secagg+" if summed.secure else "plain",
            "statistics_bytes_per_client": summed.wire_bytes if summed.secure
            else summed.wire_bytes / summed.senders if summed.senders else 0.0,
            "server_seconds": seconds}
    if init.statistics != "none":
        say(INFO, "head-init %s: statistics from %d clients (%.0f kB each), built in %.2f s",
            init.name, summed.senders, info["statistics_bytes_per_client"] / 1e3, seconds)
    return {**adapter, "weight": weight, "bias": bias}, info


# per-round counts of what went wrong, as the round's line names them
ROUND_FAULTS = (("clients_failed", "client(s) failed"), ("clients_timed_out", "timed out"),
                ("clients_rejected", "reply(ies) rejected"))


class CentralEvaluator:
    """Scores the global head on the server's test features; remembers when and how long."""

    def __init__(self, cache: CachedFeatures, config: RunConfig, stats: NormStats | None) -> None:
        self.device = resolve_device(config.device)
        features = normalize(config.feature_norm, cache.test.x, stats)
        self.features = torch.from_numpy(features).to(self.device)
        self.labels = torch.from_numpy(cache.test.y.astype(np.int64)).to(self.device)
        # with several domains, accuracy on each domain's test rows too (the union is `accuracy`)
        self.domain_names = cache.domain_names if len(cache.domain_names) > 1 else ()
        self.domains = torch.from_numpy(cache.test.domain).to(self.device)
        self.domain_accuracy: dict[int, dict[str, float]] = {}
        self.seconds: dict[int, float] = {}  # round -> seconds of its evaluation
        self.round_seconds: dict[int, float] = {}  # round -> seconds from the last one's end
        self.done_at: dict[int, float] = {}  # round -> when its evaluation ended
        self.config = config
        self.round_info: Callable[[int], dict] = lambda _round: {}  # the strategy's record

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        start = time.perf_counter()
        right = self._right(arrays)
        acc = float(right.float().mean())
        if self.domain_names:
            self.domain_accuracy[server_round] = self._per_domain(right)
        ended = self.done_at[server_round] = time.perf_counter()
        self.seconds[server_round] = ended - start
        if server_round:
            self.round_seconds[server_round] = ended - self.done_at.get(server_round - 1, ended)
        self._say_round(server_round, acc)
        return MetricRecord({p.ACCURACY: acc})

    def _right(self, arrays: ArrayRecord) -> torch.Tensor:
        """Which test rows the model predicts right: one forward pass for the union and every
        domain."""
        head = model_from_numpy(p.from_record(arrays), self.device, self.config.adapter_activation)
        with torch.inference_mode():
            return head(self.features).argmax(dim=1) == self.labels

    def state(self) -> dict:
        """What a checkpoint keeps of the rounds scored so far."""
        return {"domain_accuracy": self.domain_accuracy, "seconds": self.seconds,
                "round_seconds": self.round_seconds}

    def restore(self, state: dict) -> None:
        """Back to `state`; the next round's seconds count from now."""
        for name in ("domain_accuracy", "seconds", "round_seconds"):
            setattr(self, name, {int(r): value for r, value in state[name].items()})
        last = max(self.seconds)
        self.done_at[last] = time.perf_counter()

    def recheck(self, server_round: int, arrays: ArrayRecord, recorded: float) -> None:
        """A resumed head must score on this test set what it scored at `server_round`: else
        the server's data or normalisation changed, and the rounds would not go on the same."""
        scored = float(self._right(arrays).float().mean())
        if abs(scored - recorded) * len(self.labels) > 0.5:
            raise FederationError(f"resume: the checkpoint's head scores {scored:.4f} here but "
                                  f"{recorded:.4f} at round {server_round}: the server's test "
                                  "features are not the ones the run was scored on")

    def _per_domain(self, right: torch.Tensor) -> dict[str, float]:
        """Accuracy on each domain's test rows, from the rows predicted right (NaN-free: a
        domain without test rows is left out)."""
        return {name: float(right[self.domains == d].float().mean())
                for d, name in enumerate(self.domain_names) if bool((self.domains == d).any())}

    def _say_round(self, server_round: int, acc: float) -> None:
        """The run's one line per round for its user: stage, accuracy, the round's seconds,
        and failed clients if any."""
        width = len(str(self.config.num_server_rounds))
        where = f"round {server_round:>{width}}/{self.config.num_server_rounds}"
        if server_round == 0:
            say(INFO, "%s  %-8s accuracy %.4f", where, "start", acc)
            return
        info = self.round_info(server_round)
        faults = ", ".join(f"{info[key]} {what}" for key, what in ROUND_FAULTS if info.get(key))
        say(INFO, "%s  stage %d  accuracy %.4f  %5.1f s%s", where,
            self.config.stage_for_round(server_round), acc, self.round_seconds[server_round],
            f"  ({faults})" if faults else "")


def equal_share_steps(config: RunConfig, clients: dict[int, dict]) -> int:
    """Local steps for every client under epoch-size "equal-share" or "own-data-equal-steps":
    `local-epochs` passes over an equal share of the federation's data (its samples at the
    start over num-partitions), in batches. Clients of unequal size then take the same number
    of steps, as SCAFFOLD's analysis assumes (under "own-data-equal-steps" in bigger batches
    where a client holds more than a share: `client.local_schedule`); on equal-size
    partitions nothing changes. 0 when the run's steps come from elsewhere (`local-steps`, or
    epochs of each client's own data)."""
    if config.epoch_size == "own-data" or config.local_steps:
        return 0
    share = sum(int(c[p.NUM_EXAMPLES]) for c in clients.values()) / num_partitions(clients)
    steps = config.local_epochs * max(1, math.ceil(share / config.batch_size))
    say(INFO, "epoch-size %s: every client takes %s local steps per round", config.epoch_size,
        steps)
    return steps


def train_reply_check(config: RunConfig, clients: dict[int, dict], steps: int) -> ReplyCheck:
    """What a train reply must be (`validation.check_train_reply`): the global model's arrays,
    finite; the sample count its node described (`clients`, late nodes included); the steps
    the run's local schedule takes on them."""
    round_config = {p.LOCAL_STEPS: steps} if steps else {}

    def check(node: int, arrays: dict[str, np.ndarray], metrics: dict,
              global_arrays: dict[str, np.ndarray]) -> str | None:
        if node not in clients:
            return "the node is not in the federation"
        examples = int(clients[node][p.NUM_EXAMPLES])
        planned = local_schedule(config, round_config, examples).num_steps(examples)
        return check_train_reply(arrays, metrics, global_arrays, examples, planned)

    return check


def make_strategy(config: RunConfig, strategy_class: Callable[..., Staged] | None = None,
                  **wiring) -> Staged:
    """The run's strategy: FedAvg or FedAdam, with its staging and quantity-skew options (or
    `strategy_class` with those options: FLoRA's)."""
    options = dict(
        stage_for_round=config.stage_for_round,
        seed=config.seed,
        fraction_train=config.fraction_train,
        fraction_evaluate=config.fraction_evaluate,
        aggregation_weights=config.aggregation_weights,
        exclude_after=config.exclude_after_rejections,
        control_variates=(ControlVariates(config.learning_rate)
                          if config.drift_correction == "scaffold" else None),
        **wiring,
    )
    if strategy_class is not None:
        return strategy_class(**options)
    if config.server_optimizer == "fedadam":
        return StagedFedAdam(eta=config.server_learning_rate, eta_l=config.learning_rate, **options)
    return StagedFedAvg(**options)


def _summary(config: RunConfig, result: Result, strategy: Staged,
             evaluator: CentralEvaluator, partition: PartitionSummary, features: dict) -> dict:
    """What `summary.json` holds (README, "Results")."""
    accuracies = {r: float(m[p.ACCURACY]) for r, m in result.evaluate_metrics_serverapp.items()}
    local = {r: float(m[p.ACCURACY]) for r, m in result.evaluate_metrics_clientapp.items()}
    last = config.num_server_rounds  # 0: the start is the result
    rounds = [
        {"round": r, "accuracy": accuracies[r], "local_accuracy": local.get(r),
         **strategy.rounds.get(r, {}), "server_eval_seconds": evaluator.seconds[r],
         "round_seconds": evaluator.round_seconds[r],
         **({"domain_accuracy": evaluator.domain_accuracy[r]} if evaluator.domain_names else {})}
        for r in range(1, last + 1)
    ]
    domains = {"domain_accuracy": {"initial": evaluator.domain_accuracy[0],
                                   "final": evaluator.domain_accuracy[last]}} \
        if evaluator.domain_names else {}
    return {**domains,
        "final_accuracy": accuracies[last],
        "best_accuracy": max(accuracies[r] for r in range(min(1, last), last + 1)),
        "initial_accuracy": accuracies[0],
        "num_clients": partition.num_clients,
        "config": config.to_dict(),
        "partition": partition.to_dict(),
        "features": features,
        "rounds": rounds,
        "versions": _versions(),
    }


class FederationError(RuntimeError):
    """The clients cannot run this configuration (a set-up exchange failed)."""


def wait_for_nodes(grid: Grid, timeout: float = 120.0, settle: float = 1.0) -> list[int]:
    """All connected nodes, once their number has stopped changing for `settle` seconds
    (SuperNodes connect one by one). A grid whose nodes are all there from the start
    (`static_nodes`, the in-process one) is answered at once."""
    if getattr(grid, "static_nodes", False):
        return sorted(grid.get_node_ids())
    deadline = time.monotonic() + timeout
    previous: list[int] = []
    while time.monotonic() < deadline:
        nodes = sorted(grid.get_node_ids())
        if nodes and nodes == previous:
            return nodes
        previous = nodes
        time.sleep(settle)
    raise FederationError(f"no SuperNode connected within {timeout:.0f} s")


def exchange(grid: Grid, message_type: str, contents: dict[int, RecordDict],
             costs: SetupCosts | None = None) -> dict[int, RecordDict]:
    """Send one message to each node and return the replies; any client error stops the run."""
    started = time.perf_counter()
    messages = [Message(content=c, message_type=message_type, dst_node_id=n) for n, c in contents.items()]
    replies = list(grid.send_and_receive(messages))
    if costs is not None:
        costs.add(list(contents.values()), [m.content for m in replies if not m.has_error()],
                  time.perf_counter() - started)
    failed = [m for m in replies if m.has_error()]
    if failed:
        raise FederationError(f"{message_type}: {p.describe_failures(failed)}")
    if len(replies) != len(messages):
        raise FederationError(f"{message_type}: {len(replies)} of {len(messages)} clients replied")
    return {m.metadata.src_node_id: m.content for m in replies}


def describe_clients(grid: Grid, nodes: list[int], check_ids: bool = True,
                     costs: SetupCosts | None = None, request: dict | None = None,
                     statistics: StatisticsSum | None = None,
                     cache: CachedFeatures | None = None) -> dict[int, dict]:
    """Every client's partition id and sample count (plus moments, if the norm needs them, and
    the class statistics into `statistics`, if `request` asks for them). With the server's
    `cache`, a node whose description is impossible (`setup_refusal`) is left out, warned of."""
    replies = exchange(grid, p.DESCRIBE,
                       {n: RecordDict({p.CONFIG: ConfigRecord(dict(request or {}))}) for n in nodes},
                       costs)
    clients = {}
    for node, content in replies.items():
        reason = None if cache is None else setup_refusal(content, cache, describe=True)
        if reason:
            say(WARNING, "node %s left out of the federation: its %s reply %s", node, p.DESCRIBE,
                reason)
            continue
        if statistics is not None:
            statistics.add(content)
        info = dict(content[p.METRICS])
        info[p.FEATURE_SPACE] = str(content[p.CONFIG][p.FEATURE_SPACE])
        if p.MOMENTS in content:
            info[p.MOMENTS] = p.from_record(content[p.MOMENTS])
        clients[node] = info
    if check_ids:
        leave_out(clients, [])  # nobody left: one line, not an empty federation
        _check_partition_ids(clients)
    return clients


def check_feature_space(clients: dict[int, dict], cache: CachedFeatures) -> None:
    """Every node's features must be in the server's feature space (same encoder identity and
    label set), or averaging heads across them is meaningless: refuse, naming a node."""
    expected = cache.feature_space()
    wrong = {n: c[p.FEATURE_SPACE] for n, c in clients.items() if c[p.FEATURE_SPACE] != expected}
    if wrong:
        node, found = next(iter(sorted(wrong.items())))
        raise FederationError(
            f"{len(wrong)} node(s) have features from another encoder or label set than the "
            f"server's cache ({expected}); node {node} has {found}: give every node the same "
            "dataset classes and encoder options")


def partition_summary(config: RunConfig, clients: dict[int, dict],
                      cache: CachedFeatures) -> PartitionSummary:
    """Sizes and classes per client from the shared cache; for nodes with their own data the
    server knows only the sample counts they report (as FedAvg does), so classes stay empty."""
    by_id = [clients[node] for node in by_partition(clients)]
    kind = f"domain ({config.within_domain} within)" if config.partition == "domain" \
        else config.partition
    if not any(int(c[p.OWN_DATA]) for c in by_id):
        parts = all_partitions(config, num_partitions(clients))
        return summarize_partition(kind, [parts[int(c[p.PARTITION_ID])] for c in by_id],
                                   cache.train.y, cache.train.domain, cache.domain_names)
    return summarize_sizes(f"{kind} of node-local data", [int(c[p.NUM_EXAMPLES]) for c in by_id])


def label_noise_summary(config: RunConfig, clients: dict[int, dict]) -> dict:
    """What was asked for and what the clients' labels realise (counts from `describe`)."""
    examples = sum(int(c[p.NUM_EXAMPLES]) for c in clients.values())
    noisy = sum(int(c[p.NOISY_EXAMPLES]) for c in clients.values())
    return {"kind": config.label_noise, "rate": config.noise_rate,
            "realised_rate": noisy / examples if examples else 0.0}


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


def global_stats(config: RunConfig, clients: dict[int, dict]) -> NormStats | None:
    """Merge the clients' moments into the global mean/std (None if the norm needs none)."""
    if not NEEDS_STATS[config.feature_norm]:
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
    replies = exchange(grid, p.SET_NORM,
                       {n: RecordDict({p.NORM: record, p.CONFIG: config}) for n in nodes}, costs)
    refused = []
    for node, content in replies.items():
        reason = None if cache is None or clients is None else setup_refusal(
            content, cache, examples=int(clients[node][p.NUM_EXAMPLES]))
        if reason:
            say(WARNING, "node %s left out of the federation: its %s reply %s", node, p.SET_NORM,
                reason)
            refused.append(node)
        elif statistics is not None:
            statistics.add(content)
    return refused


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


def leave_out(clients: dict[int, dict], nodes: list[int]) -> None:
    """Drop `nodes` from the federation; refuse to go on without anyone."""
    for node in nodes:
        clients.pop(node, None)
    if not clients:
        raise FederationError("every node was left out of the federation: see the warnings above")


def _feature_info(cache: CachedFeatures, stats: NormStats | None) -> dict:
    return {
        "train_shape": list(cache.train.x.shape),
        "test_shape": list(cache.test.x.shape),
        "num_classes": cache.num_classes,
        "norm_digest": stats.digest() if stats else None,
        "cache_manifest": {k: v for k, v in cache.manifest.items() if k != "splits"},
    }


def _versions() -> dict:
    import flwr

    return {"ovalp_flwr": __version__, "flwr": flwr.__version__, "torch": torch.__version__}
