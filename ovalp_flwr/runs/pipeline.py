"""One run, both paths: what every run does, in this order, with hooks for what a path does its
own way (`RunPath`: the cached features, `ova.server.FeaturePath`; the encoder,
`finetune.server.EncoderPath`).

resume check → the path's set-up (data or model, the nodes, describe, the start) → the round
loop from the run config (`rounds.make_strategy`) → the server's evaluator → checkpoints after
rounds (and resuming from one) → `Staged.start` → summary.json (the shared part, then the
path's) → personalization → the results folder, written atomically with the checkpoint carried.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from logging import INFO, WARNING
from pathlib import Path
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from ovalp_flwr.config import RunConfig
from ovalp_flwr.core.normalize import NormStats
from ovalp_flwr.data.partition import PartitionSummary
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.checkpoint import FILE as CHECKPOINT_FILE
from ovalp_flwr.federation.checkpoint import Checkpoint
from ovalp_flwr.federation.checkpoint import part_files, unpack
from ovalp_flwr.federation.evaluation import CentralEvaluator
from ovalp_flwr.federation.exchange import SetupCosts
from ovalp_flwr.federation.node import resolve_path
from ovalp_flwr.federation.results import RESULT_FILES, default_run_name, write_run
from ovalp_flwr.federation.resume import Checkpoints, resumable
from ovalp_flwr.federation.rounds import equal_share_steps, make_strategy, train_reply_check
from ovalp_flwr.federation.setup import by_partition
from ovalp_flwr.federation.strategy import Staged
from ovalp_flwr.federation.summary import finish_run, round_row, run_summary, versions
from ovalp_flwr.ops.console import say
from ovalp_flwr.personalize.phase import personalize_after
from ovalp_flwr.personalize.scoring import ServerScorer
from ovalp_flwr.tracking.tracker import (Tracker, flat_metrics, git_commit, make_tracker,
                                         personalization_metrics, run_params)


@dataclass
class Prepared:
    """What a path's set-up gives the rounds."""

    nodes: list[int]  # every node connected at the start
    clients: dict[int, dict]  # node -> its describe reply: the nodes the set-up kept
    initial: dict[str, np.ndarray]  # what round 1 starts from
    partition: PartitionSummary
    costs: SetupCosts
    features: dict  # summary.json's "features"
    norm: NormStats | None = None  # the normalisation every client uses (a resume checks it)
    head_init: dict = field(default_factory=dict)  # summary.json's "head_init"
    message_config: dict = field(default_factory=dict)  # in every train and evaluate message
    released: dict[str, np.ndarray] = field(default_factory=dict)  # kept by every checkpoint


class RunPath(ABC):
    """What a path does its own way; the rest is `run`'s."""

    checkpoints = True  # whether a round's state is all a resume needs (FLoRA's is not)

    def __init__(self, config: RunConfig) -> None:
        self.config = config

    @abstractmethod
    def prepare(self, grid: Grid, released: dict[str, np.ndarray]) -> Prepared:
        """The data or model, the nodes, the set-up exchanges and the start. `released`: what
        the run released before a resume (`Prepared.released`, as its checkpoint kept it),
        to be reused rather than drawn again; empty on a fresh run."""

    def strategy_wiring(self, prepared: Prepared) -> dict[str, Any]:
        """What else `make_strategy` needs on this path (late nodes, statistics, FLoRA's class)."""
        return {}

    @abstractmethod
    def evaluator(self, strategy: Staged, prepared: Prepared) -> CentralEvaluator:
        """The server's evaluation after every round."""

    def trial_score(self, evaluator: CentralEvaluator):
        """How the server scores the point it sends next where that is not the model it holds
        (the server's L-BFGS); None: it always is."""
        return None

    def summarize(self, summary: dict, strategy: Staged, evaluator: CentralEvaluator,
                  prepared: Prepared, head_init: dict) -> None:
        """The path's own part of summary.json (`head_init`: the start, as the checkpoints
        have it)."""

    @abstractmethod
    def scorer(self, evaluator: CentralEvaluator, prepared: Prepared) -> ServerScorer:
        """How the server scores the personalized models (pft-global = "server")."""

    @abstractmethod
    def last_line(self, summary: dict, out: Path) -> str:
        """The run's last log line."""


def run(grid: Grid, path: RunPath) -> Path:
    """One run on `grid` along `path`; returns its results folder."""
    config, started = path.config, time.time()
    settings = config.to_dict()
    run_name = config.run_name or default_run_name(settings)
    run_dir = resolve_path(config.results_dir) / run_name
    resumed = resumable(config.reliability, settings, run_dir)
    tracker = make_tracker(config.tracker, config.dataset, resolve_path(config.results_dir),
                           run_name, resumed is not None)
    try:
        return _run(grid, path, tracker, run_name, run_dir, resumed, started)
    except BaseException:
        tracker.finish({}, [], failed=True)  # the MLflow run ends FAILED (a resume goes on)
        raise


def _run(grid: Grid, path: RunPath, tracker: Tracker, run_name: str, run_dir: Path,
         resumed: Checkpoint | None, started: float) -> Path:
    config, settings = path.config, path.config.to_dict()
    prepared = path.prepare(grid, unpack("released", resumed.arrays) if resumed else {})
    tracker.start(run_params(settings, prepared.partition.to_dict(), versions()),
                  {**config.tracker.tags(), "ovalp.run-name": run_name,
                   "ovalp.git-commit": git_commit()})
    clients = prepared.clients
    steps = equal_share_steps(config, clients)
    strategy = make_strategy(
        config,
        node_order=by_partition(clients),
        extra_train_config={**prepared.message_config, **({p.LOCAL_STEPS: steps} if steps else {})},
        check_reply=train_reply_check(config, clients, steps),
        left_out=set(prepared.nodes) - set(clients),
        sizes={node: int(c[p.NUM_EXAMPLES]) for node, c in clients.items()},
        **path.strategy_wiring(prepared),
    )
    evaluator = path.evaluator(strategy, prepared)
    evaluator.round_info = lambda server_round: strategy.rounds.get(server_round, {})
    evaluator.federated_validation = \
        lambda server_round: strategy.validation_scores.get(server_round, {}).get("accuracy")
    checkpoints = Checkpoints(run_dir, settings, config.checkpoint_every, strategy, evaluator,
                              clients, prepared.norm, prepared.head_init, prepared.released)
    if config.checkpoint_every and not path.checkpoints:
        say(WARNING, "finetune %s: no checkpoints (a round's state is not all a resume needs; "
            "checkpoint-every=%d has no effect here)", config.finetune, config.checkpoint_every)
    where = checkpoints.restore(resumed) if resumed else \
        {"initial_arrays": p.to_record(prepared.initial)}
    result = strategy.start(
        grid=grid,
        train_config=ConfigRecord(),
        evaluate_config=ConfigRecord(prepared.message_config),
        num_rounds=config.num_server_rounds,
        timeout=config.round_timeout,
        evaluate_fn=evaluator,
        after_round=tracked(tracker, strategy, evaluator,
                            checkpoints if path.checkpoints else None),
        trial_score=path.trial_score(evaluator),
        **where,  # the start, or where the checkpoint left off
    )
    summary = run_summary(settings, result, strategy, evaluator, prepared.partition,
                          prepared.features)
    finish_run(summary, config.data, config.local_steps, clients, steps, prepared.costs)
    path.summarize(summary, strategy, evaluator, prepared, checkpoints.head_init)
    if checkpoints.resumes:
        summary["resumes"] = checkpoints.resumes
    if config.personalization_methods:
        summary["personalization"] = personalize_after(
            grid, config.personalization, clients, result.arrays, prepared.norm, run_name,
            path.scorer(evaluator, prepared))
    summary["total_seconds"] = checkpoints.seconds_before + time.time() - started
    out = write_run(resolve_path(config.results_dir), run_name, summary,
                    carry=(CHECKPOINT_FILE, *part_files(run_dir)))
    say(INFO, "%s", path.last_line(summary, out))
    rows = [round_row(0, result, strategy, evaluator), *summary["rounds"]]
    tracked_at = tracker.finish({row["round"]: flat_metrics(row) for row in rows},
                                [out / name for name in RESULT_FILES],
                                final=personalization_metrics(summary.get("personalization", {})))
    if tracked_at:
        say(INFO, "%s", tracked_at)
    return out


def tracked(tracker: Tracker, strategy: Staged, evaluator: CentralEvaluator,
            checkpoints: Callable[[int, ArrayRecord, Result], None] | None
            ) -> Callable[[int, ArrayRecord, Result], None]:
    """What runs after each round: the checkpoint first (a crash after it resumes from this
    round, and the resumed run does not log it twice), then the round's metrics for the
    tracker (the start's with round 1's), which logs them off the loop."""
    def after_round(server_round: int, arrays: ArrayRecord, result: Result) -> None:
        if checkpoints is not None:
            checkpoints(server_round, arrays, result)
        if 0 in result.evaluate_metrics_serverapp:
            tracker.log_step(0, flat_metrics(round_row(0, result, strategy, evaluator)))
        tracker.log_step(server_round,
                         flat_metrics(round_row(server_round, result, strategy, evaluator)))
    return after_round
