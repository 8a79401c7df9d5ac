"""A run's log in MLflow, kept off the round loop.

The ServerApp's run (`runs.pipeline`) starts a tracker, hands it every round's metrics as the
round ends and its files at the end. An `MlflowTracker` does the talking on one thread of its
own, in order, so a slow or absent tracking server never stops or slows the federation: the
first call that fails is one warning line, and the run goes on without tracking (its results
folder is written as always). At the end the run waits at most `DRAIN_SECONDS` for what is
still queued. A resumed run (`resume = true`) continues the MLflow run of its results folder.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from logging import WARNING
from pathlib import Path
from typing import Any

from ovalp_flwr.ops.console import say
from ovalp_flwr.options import ConfigError
from ovalp_flwr.tracking.options import LOCAL_STORE, TrackingOptions

DRAIN_SECONDS = 60.0  # at the end: how long the run waits for its last logs
FAILED_DRAIN_SECONDS = 5.0  # ... when it failed or was stopped: not long
# MLflow's HTTP client retries 7 times with backoff by default (minutes on a dead server)
# (and prints a line to stdout for every run it ends: the run says where to look, once)
HTTP_SETTINGS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "1"}
RUN_DIR_TAG = "ovalp.run-dir"  # how a resumed run finds its MLflow run
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own: the UI nests the run under it
PRESET_TAG = "ovalp.preset"
PARAM_LENGTH = 6000  # MLflow's limit on a param's value
BATCH = 100  # MLflow's limit on params per log_batch


class Tracker:
    """No tracking: what a run calls, doing nothing."""

    run_id: str | None = None

    def start(self, params: Mapping[str, Any], tags: Mapping[str, str]) -> None:
        """The run's params and tags (a resumed run: its MLflow run found again)."""

    def log_step(self, step: int, metrics: Mapping[str, float]) -> None:
        """One round's metrics (step 0: the start), unless that step is logged already."""

    def finish(self, steps: Mapping[int, Mapping[str, float]], files: Iterable[Path],
               final: Mapping[str, float] | None = None, failed: bool = False) -> str | None:
        """Every step not logged yet, `final` (the personalization's) at the last step, the
        files, the run's end; a line saying where to look, or None."""
        return None


def local_store(results_dir: Path) -> str:
    """The default tracking URI: a SQLite file in the results folder."""
    return f"sqlite:///{results_dir.resolve() / LOCAL_STORE}"


def make_tracker(options: TrackingOptions, experiment: str, results_dir: Path, run_name: str,
                 resume: bool) -> Tracker:
    """The run's tracker (`experiment`: the default, when the options name none)."""
    if options.tracking == "none":
        return Tracker()
    needs_mlflow()
    return MlflowTracker(options.tracking_uri or local_store(results_dir),
                         options.tracking_experiment or experiment, run_name,
                         results_dir / run_name, options.tracking_parent, resume)


def needs_mlflow() -> None:
    """One config error where MLflow is not installed, before any round."""
    if importlib.util.find_spec("mlflow") is None:
        raise ConfigError("tracking", "mlflow", "MLflow is not installed where the ServerApp "
                          "runs; pip install '.[tracking]' (make install has it)")


def client(uri: str):
    """MLflow's client for `uri`, its HTTP retries short (a dead server fails in seconds)."""
    for name, value in HTTP_SETTINGS.items():
        os.environ.setdefault(name, value)
    from mlflow.tracking import MlflowClient  # late: ~2 s, only where a run is tracked

    return MlflowClient(tracking_uri=uri)


def experiment_id(mlflow_client, name: str, uri: str) -> str:
    """The experiment `name`, made if new (a local store keeps its files beside it)."""
    found = mlflow_client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    local = uri.startswith("sqlite:///")
    location = Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts" if local else None
    return mlflow_client.create_experiment(
        name, artifact_location=location.as_uri() if location else None)


@functools.cache
def git_commit() -> str:
    """The code's commit: `OVALP_GIT_COMMIT` (set by the launchers, for an installed app), else
    the repository this package is in ("-dirty" where its tracked files were edited), else
    "unknown"."""
    if os.environ.get("OVALP_GIT_COMMIT"):
        return os.environ["OVALP_GIT_COMMIT"]
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True,
                              text=True, timeout=5, check=True).stdout.strip()
    try:  # "-dirty": tracked files differ from the commit
        return git("rev-parse", "HEAD") + ("-dirty" if git("status", "--porcelain",
                                                           "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def flat_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """A round's numbers as MLflow metrics: every number of its row, and its per-domain
    accuracies as `domain_accuracy/<domain>`."""
    metrics = {}
    for name, value in row.items():
        if isinstance(value, Mapping):
            metrics.update({f"{name}/{inner}": float(v) for inner, v in value.items()
                            if _number(v)})
        elif _number(value) and name != "round":
            metrics[name] = float(value)
    return metrics


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class MlflowTracker(Tracker):
    """A run in MLflow, written by one thread of its own (`_work`) in the order asked."""

    def __init__(self, uri: str, experiment: str, run_name: str, run_dir: Path,
                 parent: str = "", resume: bool = False) -> None:
        self.uri, self.experiment, self.run_name = uri, experiment, run_name
        self.run_dir, self.parent, self.resume = run_dir, parent, resume
        self.logged: set[int] = set()  # steps in MLflow (a resumed run: its earlier ones too)
        self.experiment_id: str | None = None
        self.failed = threading.Event()
        self._client = None
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._worker = threading.Thread(target=self._work, name="mlflow-tracking", daemon=True)
        self._worker.start()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            if self.failed.is_set():
                continue
            try:
                job()
            except Exception as err:  # noqa: BLE001 - tracking must never stop a run
                self._fail(f"failed ({type(err).__name__}: {str(err).splitlines()[0][:200]})")

    def _fail(self, what: str) -> None:
        if not self.failed.is_set():
            self.failed.set()
            say(WARNING, "tracking: MLflow at %s %s; the run goes on without it (its results "
                "folder is complete)", self.uri, what)

    def start(self, params: Mapping[str, Any], tags: Mapping[str, str]) -> None:
        self._jobs.put(lambda: self._start(params, tags))

    def _start(self, params: Mapping[str, Any], tags: Mapping[str, str]) -> None:
        self._client = mlflow = client(self.uri)
        self.experiment_id = experiment = experiment_id(mlflow, self.experiment, self.uri)
        if self.resume and (earlier := self._earlier_run(experiment)) is not None:
            self.run_id = earlier.info.run_id
            mlflow.update_run(self.run_id, status="RUNNING")
            self.logged = {m.step for m in mlflow.get_metric_history(self.run_id, "accuracy")}
            return
        own = {**tags, RUN_DIR_TAG: str(self.run_dir.resolve()),
               **({PARENT_TAG: self.parent} if self.parent else {})}
        self.run_id = mlflow.create_run(experiment, run_name=self.run_name, tags=own).info.run_id
        from mlflow.entities import Param  # late: with the client

        entries = [Param(name, str(value)[:PARAM_LENGTH]) for name, value in params.items()]
        for first in range(0, len(entries), BATCH):
            mlflow.log_batch(self.run_id, params=entries[first:first + BATCH])

    def _earlier_run(self, experiment: str):
        """The MLflow run this results folder's earlier process logged to, if any."""
        runs = self._client.search_runs(
            [experiment], filter_string=f"tags.`{RUN_DIR_TAG}` = '{self.run_dir.resolve()}'",
            order_by=["attributes.start_time DESC"], max_results=1)
        return runs[0] if runs else None

    def log_step(self, step: int, metrics: Mapping[str, float]) -> None:
        self._jobs.put(lambda: self._log_step(step, dict(metrics)))

    def _log_step(self, step: int, metrics: dict[str, float], again: bool = False) -> None:
        if (step in self.logged and not again) or not metrics:
            return
        from mlflow.entities import Metric  # late: with the client

        stamp = int(time.time() * 1000)
        self._client.log_batch(self.run_id, metrics=[
            Metric(name, value, stamp, step) for name, value in metrics.items()])
        self.logged.add(step)

    def finish(self, steps: Mapping[int, Mapping[str, float]], files: Iterable[Path],
               final: Mapping[str, float] | None = None, failed: bool = False) -> str | None:
        for step, metrics in sorted(steps.items()):
            self.log_step(step, metrics)
        if final:
            last = max(steps, default=0)
            self._jobs.put(lambda: self._log_step(last, dict(final), again=True))
        files = [path for path in files if path.is_file()]
        self._jobs.put(lambda: self._end(files, failed))
        self._jobs.put(None)
        wait = FAILED_DRAIN_SECONDS if failed else DRAIN_SECONDS
        self._worker.join(wait)
        if self._worker.is_alive():
            self._fail(f"did not take the run's last logs within {wait:.0f} s")
        if self.failed.is_set():
            return None
        where = (f"mlflow ui --backend-store-uri {self.uri}" if self.uri.startswith("sqlite:")
                 else f"{self.uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/"
                      f"{self.run_id}")
        return f"tracking: MLflow run {self.run_id} in experiment {self.experiment!r} ({where})"

    def _end(self, files: list[Path], failed: bool) -> None:
        if self.run_id is None:  # it failed before it started: nothing to end
            return
        for path in files:
            self._client.log_artifact(self.run_id, str(path))
        self._client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


def sweep_parent(uri: str, preset: str, tags: Mapping[str, str]) -> str | None:
    """The parent run of a preset's sweep in its experiment (one per preset: a later sweep of
    a subset, `--seeds` or `--only`, lands in the same one); None, with one warning, where
    MLflow cannot be reached (the runs are then logged without a parent)."""
    needs_mlflow()
    try:
        mlflow = client(uri)
        experiment = experiment_id(mlflow, preset, uri)
        found = mlflow.search_runs([experiment], filter_string=f"tags.`{PRESET_TAG}` = "
                                   f"'{preset}' and tags.`ovalp.sweep` = 'parent'",
                                   order_by=["attributes.start_time ASC"], max_results=1)
        if found:
            return found[0].info.run_id
        made = mlflow.create_run(experiment, run_name=preset,
                                 tags={**tags, PRESET_TAG: preset, "ovalp.sweep": "parent"})
        mlflow.set_terminated(made.info.run_id, "FINISHED")
        return made.info.run_id
    except Exception as err:  # noqa: BLE001 - tracking must never stop a sweep
        say(WARNING, "tracking: MLflow at %s failed (%s: %s); the sweep's runs are logged "
            "without a parent", uri, type(err).__name__, str(err).splitlines()[0][:200])
        return None


def run_params(settings: Mapping[str, Any], partition: Mapping[str, Any],
               versions: Mapping[str, str]) -> dict[str, Any]:
    """What a run logs as params: every key of its resolved config, the partition's scalars
    (`partition.<name>`; its lists are in summary.json) and the versions it ran on."""
    scalars = {f"partition.{name}": value for name, value in partition.items()
               if not isinstance(value, (list, dict, tuple))}
    return {**settings, **scalars, **{f"version.{name}": v for name, v in versions.items()}}


def personalization_metrics(personalization: Mapping[str, Any]) -> dict[str, float]:
    """Each personalization method's summary (Local, Global, C-Std, Worst, Average,
    distortion) as `pft/<method>/<metric>`."""
    return {f"pft/{method}/{name}": float(value)
            for method, result in personalization.get("methods", {}).items()
            for name, value in result.get("summary", {}).items() if _number(value)}
