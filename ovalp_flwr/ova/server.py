"""The cached-feature path's ServerApp run (OvA-LP, or LP-softmax): set-up, the staged FedAvg
rounds on the heads, results. `server_app.py` chooses this path when `finetune = "none"`.

Order of a run:
1. build or load the feature cache (the server scores the global head on its test split, and
   makes its choices on the validation rows no client trains on: `data.holdout`);
2. `query.describe` to every client: partition ids, sample counts, feature moments;
3. `query.set_norm`: the global mean/std every client normalises with; its replies carry the
   clients' class statistics when the heads start from them (`head-init`);
4. the heads' start (`ovalp_flwr.core.head_init`), scored as round 0;
5. FedAvg rounds with the stage in each train message, centralised evaluation after each, and
   a checkpoint after each (`resume` goes on from the last one);
6. `results/<run-name>/summary.json` + `rounds.csv`, and one closing line.
Steps 5 and 6 are the shared run's (`runs.pipeline`); `FeaturePath` is this path's part.
Every reply is checked before it is used (`ovalp_flwr.federation.validation`): a node that
describes itself impossibly is left out, a train reply that is not what it claims is not averaged.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from logging import INFO
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord
from flwr.serverapp import Grid

from ovalp_flwr.config import RunConfig, check_num_clients
from ovalp_flwr.core.devices import resolve_device
from ovalp_flwr.core.head_init import HeadInit, make_head_init
from ovalp_flwr.core.head_init.chosen import ChosenInit, choose_head
from ovalp_flwr.core.head_init.ridge import lambda_path
from ovalp_flwr.core.model import initial_adapter, model_from_numpy
from ovalp_flwr.core.normalize import NEEDS_STATS, NormStats, normalize
from ovalp_flwr.data.partition import PartitionSummary
from ovalp_flwr.features.cache import CachedFeatures, load_or_build
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.evaluation import CentralEvaluator
from ovalp_flwr.federation.exchange import FederationError, SetupCosts, wait_for_nodes
from ovalp_flwr.federation.node import all_partitions, held_rows, node_data, resolve_path
from ovalp_flwr.runs.pipeline import Prepared, RunPath, run
from ovalp_flwr.federation.checkpoint import pack, unpack
from ovalp_flwr.federation.privacy import (applied_rounds, postprocessed, privacy_report,
                                           released_arrays, released_statistics,
                                           statistics_noise, statistics_noise_share,
                                           statistics_sensitivities, uncovered_fields)
from ovalp_flwr.federation.secure_sum import fewest_survivors, statistics_range
from ovalp_flwr.federation.setup import (StatisticsSum, broadcast_stats, check_feature_space,
                                         describe_clients, global_stats, late_admitter,
                                         leave_out, statistics_request)
from ovalp_flwr.federation.strategy import Staged
from ovalp_flwr.federation.summary import partition_summary
from ovalp_flwr.ops.console import say
from ovalp_flwr.ova.start_check import checked_start
from ovalp_flwr.personalize.scoring import FeatureScorer

AUTO_LAMBDA_FIRST = 0.2  # ridge-lambda "auto": only names the statistics until the path chooses


def run_ova(grid: Grid, config: RunConfig) -> Path:
    """One OvA-LP (or LP-softmax) run on cached features; returns its results folder."""
    return run(grid, FeaturePath(config))


class FeaturePath(RunPath):
    """The cached-feature path's own steps in the shared run (`runs.pipeline`)."""

    def prepare(self, grid: Grid, released: dict[str, np.ndarray]) -> Prepared:
        """The cache, the set-up exchanges, the start (chosen and checked on validation rows)."""
        config = self.config
        self.cache = cache = load_or_build(
            config.dataset, config.encoder, resolve_path(config.feature_cache_dir),
            data_dir=config.data_dir or None, device=config.device, **config.cache_options())
        nodes = wait_for_nodes(grid)
        check_num_clients(len(nodes), len(cache.train.y))  # nodes with own data check theirs
        choosing = "ridge-lambda" in config.choices or "head-init" in config.choices
        init = make_head_init(config.head_init, ridge_lambda=AUTO_LAMBDA_FIRST if choosing
                              else config.ridge_lambda, fed3r_lambda=config.fed3r_lambda,
                              fedcof_shrinkage=config.fedcof_shrinkage,
                              lda_shrinkage=config.lda_shrinkage, gram_rank=config.gram_rank)
        # the server's L-BFGS is preconditioned by the Gram matrix, whatever the start
        wanted = "gram" if config.server_steps else init.statistics
        released = unpack("statistics", released) if config.dp_statistics_epsilon > 0 else {}
        self.setup = setup = set_up(grid, nodes, config, cache,
                                    "none" if released else wanted,  # released once only
                                    keep_client_sums=init.keeps_client_sums)
        if released:  # a resumed private run: the statistics released before, not a new draw
            setup.statistics.total = released_statistics(released)
            say(INFO, "resume: the start's private statistics as released before (no new "
                "release)")
        elif config.dp_statistics_epsilon > 0 and setup.statistics.total is not None:
            # central DP adds the noise here; under SecAgg+ the clients added it (distributed DP)
            noisy = setup.statistics.total if setup.statistics.secure else \
                statistics_noise_share(setup.statistics.total, statistics_noise(config.privacy),
                                       config.dp_feature_clip)
            setup.statistics.total = postprocessed(noisy, statistics_noise(config.privacy),
                                                   config.dp_feature_clip)
            released = released_arrays(setup.statistics.total)
        self.validation = validation = validation_rows(config, cache, setup.norm)
        chosen, requested = {}, init
        if choosing:  # before the check (it scores starts at this penalty), and after it
            init, chosen = chosen_start(init, setup.statistics, validation)
        checked = checked_start(config.robustness, config.seed, config.feature_norm, init,
                                setup.statistics, setup.clients, setup.norm,
                                validation.features, validation.labels) \
            if config.robust_start != "none" else {}
        if choosing and (checked.get("left_out") or checked.get("screened_out")
                         or checked.get("screen_repaired")):
            # chosen again on the sums kept
            init, chosen = chosen_start(requested, setup.statistics, validation)
        initial, start = initial_head(config, init, setup.statistics, cache)
        start.update(checked)
        start.update(chosen)
        stats = setup.norm
        # only sent when there are statistics: Flower's ConfigRecord.count_bytes rejects ""
        digest_config = {p.NORM_DIGEST: stats.digest()} if stats else {}
        return Prepared(nodes, setup.clients, initial, setup.partition, setup.costs,
                        _feature_info(cache, stats), stats, start, digest_config,
                        pack("statistics", released) if released else {})

    def strategy_wiring(self, prepared: Prepared) -> dict:
        """Nodes that connect late are described, checked and briefed; the server's L-BFGS is
        preconditioned by the summed statistics."""
        return {"admit": late_admitter(self.cache, prepared.norm, prepared.clients),
                "statistics": self.setup.statistics.total}

    def evaluator(self, strategy: Staged, prepared: Prepared) -> CentralEvaluator:
        evaluator = FeatureEvaluator(self.cache, self.config, prepared.norm, self.validation)
        if getattr(strategy, "path", None) is not None:  # weight-decay "auto": its walk's scores
            strategy.score_validation = evaluator.validation_score
        return evaluator

    def trial_score(self, evaluator: CentralEvaluator):
        return evaluator.score  # L-BFGS: the point sent next, beside the held heads

    def summarize(self, summary: dict, strategy: Staged, evaluator: CentralEvaluator,
                  prepared: Prepared, head_init: dict) -> None:
        """The validation rows and the round they pick, the start, the weight-decay path, the
        privacy spent."""
        config, validation = self.config, self.validation
        if validation is not None or strategy.federated_validation:
            rows = len(validation.labels) if validation is not None else \
                strategy.validation_scores.get(config.num_server_rounds, {}).get("rows", 0)
            summary.update(validation_summary(config, rows, evaluator.validation_accuracy,
                                              summary))
        summary["head_init"] = head_init
        if getattr(strategy, "path", None) is not None:
            summary["weight_decay_path"] = strategy.path.summary()
        if config.dp_statistics_epsilon > 0 or config.dp_rounds_epsilon > 0:
            summary["privacy"] = privacy_report(
                config.privacy, config.rounds, config.data_releases,
                config.statistics_aggregation == "secagg+", len(prepared.clients),
                applied_rounds(strategy.rounds) if config.dp_rounds_epsilon > 0 else None)
            summary["privacy"]["run"]["uncovered_fields"] = uncovered_fields(summary)

    def scorer(self, evaluator: CentralEvaluator, prepared: Prepared) -> FeatureScorer:
        return FeatureScorer(evaluator.features, evaluator.labels, self.config.adapter_activation)

    def last_line(self, summary: dict, out: Path) -> str:
        config = self.config
        return (f"final accuracy {summary['final_accuracy']:.4f} after "
                f"{config.num_server_rounds} rounds ({config.head_init} start "
                f"{summary['initial_accuracy']:.4f}; {config.head}, "
                f"{'server L-BFGS' if config.server_steps else config.schedule}, "
                f"{config.partition}); results in {out}")


@dataclass
class SetUp:
    """What the set-up exchanges established before round 1."""

    clients: dict[int, dict]  # node -> what its describe reply said
    partition: PartitionSummary
    norm: NormStats | None  # the global mean/std every client normalises with
    statistics: StatisticsSum  # the clients' class statistics, summed, if the start needs them
    costs: SetupCosts


def set_up(grid: Grid, nodes: list[int], config: RunConfig, cache: CachedFeatures,
           statistics_kind: str, keep_client_sums: bool = False) -> SetUp:
    """describe, then set_norm; the start's statistics ride on the last of them (set_norm, or
    describe when the normalisation needs no global statistics), or come under SecAgg+ after
    them (`statistics-aggregation = "secagg+"`). `keep_client_sums`: each client's class sums
    kept besides their sum (FedCOF's start reads them)."""
    costs = SetupCosts()
    summed = StatisticsSum(keep_parts=config.robust_start != "none",
                           keep_client_sums=keep_client_sums)
    request = statistics_request(statistics_kind, cache.num_classes, config.gram_rank)
    secure = config.statistics_aggregation == "secagg+" and bool(request)
    on_describe = not NEEDS_STATS[config.feature_norm] and not secure
    clients = describe_clients(grid, nodes, costs=costs, request=request if on_describe else {},
                               statistics=summed, cache=cache)
    check_feature_space(clients, cache.feature_space())
    partition = partition_summary(config.partitioning, clients,
                                  lambda n: all_partitions(node_data(config), n),
                                  cache.train.y, cache.train.domain, cache.domain_names)
    say(INFO, "partition %s", partition)
    norm = global_stats(config.feature_norm, clients)
    if norm is not None:
        refused = broadcast_stats(grid, norm, list(clients), costs=costs,
                                  request={} if secure else request, statistics=summed,
                                  clients=clients, cache=cache)
        leave_out(clients, refused)
    if secure:
        summed.add_secure(grid, clients, {**request, **_noise_shares(config, clients),
                                          p.NORM_DIGEST: norm.digest() if norm else ""},
                          cache.train.x.shape[1], costs, _statistics_range(config, clients),
                          _fewest_back(config, clients))
    return SetUp(clients, partition, norm, summed, costs)


def _fewest_back(config: RunConfig, clients: dict[int, dict]) -> int | None:
    """The fewest clients holding data the secure sum may be built from (`secagg-dropouts`);
    None: every one of them."""
    if config.secagg_dropouts <= 0:
        return None
    holders = sum(1 for c in clients.values() if int(c[p.NUM_EXAMPLES]) > 0)
    return fewest_survivors(holders, config.secagg_dropouts)


def _noise_shares(config: RunConfig, clients: dict[int, dict]) -> dict:
    """Distributed DP: every client holding data adds its share of the noise before masking,
    sized for the fewest that may come back, so that any sum accepted carries one release's
    noise (more when fewer drop out)."""
    if config.dp_statistics_epsilon <= 0:
        return {}
    holders = sum(1 for c in clients.values() if int(c[p.NUM_EXAMPLES]) > 0)
    return {p.NOISE_SHARES: _fewest_back(config, clients) or holders}


def _statistics_range(config: RunConfig, clients: dict[int, dict]) -> float:
    """SecAgg+'s clipping range for this run's per-sample statistics (`statistics_range`)."""
    row_norm = (1.0 if config.feature_norm in ("l2", "center-l2") else None)
    if config.dp_statistics_epsilon > 0:
        row_norm = min(row_norm or math.inf, config.dp_feature_clip)
        shares = _noise_shares(config, clients)[p.NOISE_SHARES]
        share_std = (statistics_noise(config.privacy) * 2 * max(statistics_sensitivities(
            config.dp_feature_clip)) / math.sqrt(max(shares, 1)))
        return statistics_range(row_norm, share_std)
    return statistics_range(row_norm)


def initial_head(config: RunConfig, init: HeadInit, summed: StatisticsSum,
                 cache: CachedFeatures) -> tuple[dict[str, np.ndarray], dict]:
    """The heads the first round starts from, and what `summary.json` says of them."""
    started = time.perf_counter()
    if init.statistics != "none" and summed.total is None:
        raise FederationError(f"head-init={config.head_init!r}: no client sent statistics "
                              "(every client is empty)")
    num_features = cache.train.x.shape[1]
    weight, bias = init.build(summed.total if init.statistics != "none" else None,
                              config.adapter_dim or num_features, cache.num_classes, config.seed,
                              config.head, config.first_weight_decay if config.server_steps else 0.0)
    adapter = initial_adapter(num_features, config.adapter_dim, config.seed) \
        if config.adapter_dim else {}
    seconds = time.perf_counter() - started
    info = {"name": init.name, "statistics": init.statistics, "clients_sent": summed.senders,
            "aggregation": "secagg+" if summed.secure else "plain",
            "statistics_bytes_per_client": summed.wire_bytes if summed.secure
            else summed.wire_bytes / summed.senders if summed.senders else 0.0,
            "server_seconds": seconds}
    if summed.secure:
        info["secagg_dropped"] = summed.dropped
    if summed.noise_shares:  # distributed DP: the sum holds senders / shares releases' variance
        info["noise_releases"] = summed.senders / summed.noise_shares
    if init.statistics != "none":
        say(INFO, "head-init %s: statistics from %d clients (%.0f kB each), built in %.2f s",
            init.name, summed.senders, info["statistics_bytes_per_client"] / 1e3, seconds)
    return {**adapter, "weight": weight, "bias": bias}, info


@dataclass(frozen=True)
class ValidationRows:
    """The server's validation rows, normalised as the clients' features (clean labels)."""

    features: np.ndarray  # float32 [n, D]
    labels: np.ndarray  # int64 [n]


def validation_rows(config: RunConfig, cache: CachedFeatures,
                    norm: NormStats | None) -> ValidationRows | None:
    """The training rows no client holds (`validation-fraction`), or None where the run holds
    none back. The server has the training split in its cache, as it has for the partition
    summary; nodes with their own data hold back their share of theirs."""
    held = held_rows(cache, node_data(config).spec)
    if not len(held):
        return None
    return ValidationRows(normalize(config.feature_norm, cache.train.x[held], norm),
                          cache.train.y[held].astype(np.int64))


def validation_summary(config: RunConfig, rows: int, scored: dict[int, float],
                       summary: dict) -> dict:
    """What summary.json says of the validation rows (`rows` of them, kept by the server or
    by the clients) and the round they pick: the best round by validation accuracy (the
    earliest of equals; among the rounds `best_accuracy` ranges over, and scored: a round whose
    federated validation no client answered has no score), and that round's test accuracy."""
    last = config.num_server_rounds
    best = max((r for r in range(min(1, last), last + 1) if r in scored),
               key=lambda r: (scored[r], -r))
    test = [summary["initial_accuracy"], *(r["accuracy"] for r in summary["rounds"])]
    return {"validation": {"fraction": config.validation_share, "rows": rows,
                           "kept_by": config.validation_rows,
                           "initial_accuracy": scored.get(0), "final_accuracy": scored.get(last)},
            "best_val_round": best, "accuracy_at_best_val_round": test[best]}


def chosen_start(init: HeadInit, summed: StatisticsSum, validation: ValidationRows | None
                 ) -> tuple[HeadInit, dict]:
    """`ridge-lambda = "auto"`: the ridge start (or low-rank's) at the penalty of the grid whose
    start scores best on the validation rows; `head-init = "auto"`: the ridge or LDA head that
    does (`choose_head`). What `summary.json` says of the choice with it."""
    assert validation is not None, "config validation: a start chosen needs validation rows"
    if summed.total is None:
        raise FederationError(f"head-init={init.name!r}: no client sent statistics to choose "
                              "the start from (every client is empty)")
    started = time.perf_counter()
    if isinstance(init, ChosenInit):
        chosen, info = choose_head(summed.total, validation.features, validation.labels)
        say(INFO, "head-init auto: %s (validation accuracy %.4f; %d candidates in %.1f s)",
            chosen.name, info["chosen_val_accuracy"], len(info["lambda_path"]["grid"])
            + len(info["lda_path"]["grid"]), time.perf_counter() - started)
        return chosen, info
    path = lambda_path(summed.total, validation.features, validation.labels)
    say(INFO, "ridge-lambda auto: %.3g (validation accuracy %.4f; %d penalties in %.1f s)",
        path.chosen, max(path.accuracy), len(path.grid), time.perf_counter() - started)
    return init.at(path.chosen), {"ridge_lambda": path.chosen, "lambda_path": {
        "grid": list(path.grid), "val_accuracy": list(path.accuracy)}}


def _feature_info(cache: CachedFeatures, stats: NormStats | None) -> dict:
    return {
        "train_shape": list(cache.train.x.shape),
        "test_shape": list(cache.test.x.shape),  # scores: its size, reported, no choice
        "num_classes": cache.num_classes,
        "norm_digest": stats.digest() if stats else None,
        "cache_manifest": {k: v for k, v in cache.manifest.items() if k != "splits"},
    }


class FeatureEvaluator(CentralEvaluator):
    """Scores the global head on the server's cached test features, normalised as the clients',
    and on the validation rows where the run holds some back."""

    def __init__(self, cache: CachedFeatures, config: RunConfig, stats: NormStats | None,
                 validation: ValidationRows | None = None) -> None:
        self.device = resolve_device(config.device)
        features = normalize(config.feature_norm, cache.test.x, stats)  # scores
        self.features = torch.from_numpy(features).to(self.device)
        self.validation = None if validation is None else (
            torch.from_numpy(validation.features).to(self.device),
            torch.from_numpy(validation.labels).to(self.device))
        self.activation = config.adapter_activation
        super().__init__(config.num_server_rounds, config.stage_for_round,
                         torch.from_numpy(cache.test.y.astype(np.int64)).to(self.device),  # scores
                         torch.from_numpy(cache.test.domain).to(self.device),  # scores
                         cache.domain_names)

    def _head(self, arrays: ArrayRecord) -> torch.nn.Module:
        return model_from_numpy(p.from_record(arrays), self.device, self.activation)

    def _right(self, arrays: ArrayRecord) -> torch.Tensor:
        with torch.inference_mode():
            return self._head(arrays)(self.features).argmax(dim=1) == self.labels

    def _right_on_validation(self, arrays: ArrayRecord) -> torch.Tensor | None:
        if self.validation is None:
            return None
        features, labels = self.validation
        with torch.inference_mode():
            return self._head(arrays)(features).argmax(dim=1) == labels
