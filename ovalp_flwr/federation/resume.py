"""A run's checkpoints on the server: written after every `checkpoint-every` rounds, and turned
back into the rounds' state by a `resume` run (the file format: `federation.checkpoint`)."""

from __future__ import annotations

import time
from logging import INFO, WARNING
from pathlib import Path

import numpy as np

from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp.strategy import Result

from ovalp_flwr.core.normalize import NormStats
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.checkpoint import (Checkpoint, CheckpointWriter, check_resumable,
                                              comparable, pack, read_checkpoint, unpack)
from ovalp_flwr.federation.evaluation import CentralEvaluator
from ovalp_flwr.federation.exchange import FederationError
from ovalp_flwr.federation.options import ReliabilityOptions
from ovalp_flwr.federation.strategy import Staged
from ovalp_flwr.ops.console import say


def resumable(reliability: ReliabilityOptions, settings: dict, run_dir: Path
              ) -> Checkpoint | None:
    """The checkpoint a `resume` run goes on from (None: start at round 1). Checked before any
    data is read: the file verifies and is of this run's config (`settings`: its keys and
    values, as summary.json has them)."""
    if not reliability.resume:
        return None
    checkpoint = read_checkpoint(run_dir)
    if checkpoint is None:
        say(WARNING, "resume: %s has no checkpoint; the run starts at round 1", run_dir)
        return None
    check_resumable(checkpoint, comparable(settings), settings["num-server-rounds"])
    say(INFO, "resume: going on from round %d of %s", checkpoint.round, run_dir)
    return checkpoint


class Checkpoints:
    """Writes the run's checkpoint after every `checkpoint-every` rounds (and the last), and
    turns one back into the state the rounds go on from (`ovalp_flwr.federation.checkpoint`)."""

    def __init__(self, run_dir: Path, settings: dict, every: int, strategy: Staged,
                 evaluator: CentralEvaluator, clients: dict[int, dict], stats: NormStats | None,
                 head_init: dict, released: dict[str, np.ndarray] | None = None) -> None:
        """settings: the run's config as summary.json has it; every: `checkpoint-every`;
        released: what the set-up released under DP (`Prepared.released`), kept in every
        checkpoint so that a resume reuses it."""
        self.released = released or {}
        self.run_dir, self.strategy, self.evaluator = run_dir, strategy, evaluator
        self.settings, self.every = settings, every
        self.clients, self.norm_digest = clients, stats.digest() if stats else None
        self.head_init = head_init  # what summary.json says of the start (the first process's)
        self.resumes: list[dict] = []  # {round, at} of each resume, the earliest first
        self.seconds_before = 0.0  # the run's seconds in the processes before this one
        self.started = time.time()
        self._partition: dict[int, int] = {}  # every node seen -> its partition id
        self.writer = CheckpointWriter(run_dir)  # SCAFFOLD's variates: only the changed ones

    def partition_of(self, node: int) -> int:
        return self._partition[node]

    def __call__(self, server_round: int, arrays: ArrayRecord, result: Result) -> None:
        every, last = self.every, self.settings["num-server-rounds"]
        if not every or (server_round % every and server_round != last):
            return
        self._partition.update({n: int(c[p.PARTITION_ID]) for n, c in self.clients.items()})
        strategy_arrays, strategy_state = self.strategy.state(self.partition_of)
        state = {"config": comparable(self.settings), "norm_digest": self.norm_digest,
                 "strategy": strategy_state, "evaluator": self.evaluator.state(),
                 "result": _history(result), "head_init": self.head_init,
                 "resumes": self.resumes,
                 "seconds": self.seconds_before + time.time() - self.started}
        self.writer.write(Checkpoint(server_round, {
            **pack("global", p.from_record(arrays)), **strategy_arrays,
            **pack("released", self.released)}, state))

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
        self.writer.resume_from(checkpoint)
        self.head_init, self.seconds_before = state["head_init"], state["seconds"]
        self.resumes = [*state["resumes"], {"round": k, "at": time.strftime("%Y-%m-%dT%H:%M:%S")}]
        arrays = p.to_record(unpack("global", checkpoint.arrays))
        result = _result(state["result"], arrays)
        self.evaluator.recheck(k, self.strategy.held(arrays),  # the heads round k scored
                               float(result.evaluate_metrics_serverapp[k][p.ACCURACY]))
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
