"""Experiment tracking's knobs (run config): whether and where a run is logged. Torch-, Flower-
and MLflow-free: the config reads them on every node, and only the ServerApp logs."""

from __future__ import annotations

from dataclasses import dataclass

from ovalp_flwr.options import ConfigError, Options, key, one_of

TRACKERS = ("none", "mlflow")
LOCAL_STORE = "mlflow.db"  # the default store: a SQLite file in `results-dir`


@dataclass(frozen=True)
class TrackingOptions(Options):
    """Where a run's config, rounds and files are logged besides its results folder."""

    TITLE = "Experiment tracking"
    INTRO = ("Every run and sweep in MLflow, to filter, overlay and compare "
             "([Tracking](tracking.md)); the results folder is written as without it.")

    tracking: str = key(
        "none", "`mlflow`: log the run (its config, every round's metrics, personalization, "
        "the results folder's files) to MLflow from the ServerApp; needs `pip install "
        "'.[tracking]'` where the ServerApp runs (`make install` has it).", TRACKERS)
    tracking_uri: str = key(
        "", f'MLflow\'s tracking URI (`""`: a SQLite store in `results-dir`, `{LOCAL_STORE}`); '
        "a tracking server's URL where you have one (`http://127.0.0.1:5000`).")
    tracking_experiment: str = key(
        "", 'The MLflow experiment (`""`: the dataset; a sweep sets its preset\'s name).')
    tracking_parent: str = key(
        "", "The MLflow run this run is a child of (a sweep sets its preset's parent run).")
    tracking_tags: str = key(
        "", "More tags, `name=value` separated by spaces (a sweep sets the preset and its "
        "axis choices).")

    def tags(self) -> dict[str, str]:
        """`tracking-tags` as a dict."""
        pairs = [item.partition("=") for item in self.tracking_tags.split()]
        return {name: value for name, _, value in pairs}

    def check(self) -> None:
        one_of("tracking", self.tracking, TRACKERS)
        for item in self.tracking_tags.split():
            name, sign, _ = item.partition("=")
            if not name or not sign:
                raise ConfigError("tracking-tags", self.tracking_tags,
                                  "use name=value pairs separated by spaces")
