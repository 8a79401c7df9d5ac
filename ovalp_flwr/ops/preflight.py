"""The launchers' checks before any Flower or Ray process starts.

`flwr run` rejects a misspelt run-config key with a bare `[code: 15] Invalid run
configuration.` (the cause is in the SuperLink's log), and a bad value or a missing data file
only surfaces once the simulation is up (~30 s). Here the run config is assembled exactly as
Flower will assemble it (the app's `[tool.flwr.app.config]` defaults, then `--run-config`,
parsed by Flower's own parser), validated as the ServerApp will validate it, and the data it
needs is looked for: one line naming the cause, in about a second. Given the number of
SuperNodes (the simulation's, a sweep's), the rules that depend on how many clients there are
are checked too (`check_clients`): a robust rule a round's clients cannot hold, more clients than
training rows; else they would stop the run only once its rounds began.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from click import ClickException
from flwr.common.config import flatten_dict, get_project_config, parse_config_args

from ovalp_flwr.config import ConfigError, RunConfig, check_num_clients
from ovalp_flwr.data.options import flower_partitioner, partition_args
from ovalp_flwr.tracking.tracker import needs_mlflow
from ovalp_flwr.data.registry import missing_data

RUN_CONFIG_FLAGS = ("--run-config", "-c")


class PreflightError(ValueError):
    """A run that cannot start; the message is one self-contained line."""


def run_config_overrides(flwr_args: Sequence[str]) -> list[str]:
    """The values of every `--run-config`/`-c` in `flwr run`'s arguments, in order."""
    values, args = [], list(flwr_args)
    for i, arg in enumerate(args):
        if arg in RUN_CONFIG_FLAGS:
            if i + 1 >= len(args):
                raise PreflightError(f"{arg} needs a value, e.g. {arg} \"head='softmax'\"")
            values.append(args[i + 1])
        elif arg.startswith("--run-config="):
            values.append(arg.split("=", 1)[1])
    return values


def app_defaults(app: Path) -> dict[str, Any]:
    """The app's `[tool.flwr.app.config]`, flattened as Flower flattens it."""
    try:
        project = get_project_config(app)
    except (FileNotFoundError, ValueError) as err:
        raise PreflightError(f"app {app}: {str(err).splitlines()[0]}") from None
    return flatten_dict(project["tool"]["flwr"]["app"].get("config", {}))


THIS_APP = {"serverapp": "server_app:app", "clientapp": "client_app:app"}  # pyproject.toml's


def is_this_app(app: Path) -> bool:
    """Whether `app` is this project's Flower app (its components), whose config `check_run`
    knows; an app folder without a readable pyproject.toml counts as this one, so that
    `check_run` says what is wrong with it."""
    try:
        project = get_project_config(app)
    except (FileNotFoundError, ValueError):
        return True
    return project["tool"]["flwr"]["app"].get("components") == THIS_APP


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """Flower's own parsing of `--run-config` (TOML values, or one .toml file)."""
    try:
        return parse_config_args(overrides or None)
    except ClickException as err:
        raise PreflightError(f"--run-config: {err.message}") from None
    except (OSError, ValueError) as err:
        raise PreflightError(f"--run-config: {err}") from None


def fused_run_config(app: Path, flwr_args: Sequence[str]) -> dict[str, Any]:
    """The run config the ServerApp will get; an unknown key names the closest known one."""
    defaults = app_defaults(app)
    overrides = parse_overrides(run_config_overrides(flwr_args))
    for key, value in overrides.items():
        if key not in defaults:
            close = difflib.get_close_matches(key, list(defaults), n=1)
            hint = f"did you mean {close[0]!r}?" if close else "see [tool.flwr.app.config] in pyproject.toml"
            raise PreflightError(f"run config: unknown key {key!r} (={value!r}); {hint}")
    return {**defaults, **overrides}


def check_data(config: RunConfig, app: Path) -> int | None:
    """The feature cache must be sound, or else the dataset files it is built from must exist.
    Returns the cache's number of training rows where it was read (None where it is not built).

    Relative paths are the app's (Flower runs the apps in the app's folder).
    """
    # late: the feature cache imports torch (~1.5 s): a bad run config is reported before it
    from ovalp_flwr.features.cache import CacheError, cache_path, load_features

    cache_dir = Path(config.feature_cache_dir)
    cache_dir = cache_dir if cache_dir.is_absolute() else app / cache_dir
    if cache_path(cache_dir, config.dataset, config.encoder, **config.cache_options()).exists():
        try:  # the ServerApp's own check (manifest, sizes, hashes): under a second
            cache = load_features(config.dataset, config.encoder, cache_dir,
                                  **config.cache_options())
        except CacheError as err:
            raise PreflightError(str(err)) from None
        return len(cache.train.y)
    problem = missing_data(config.dataset, config.data_dir or None, cwd=app)
    if problem:
        raise PreflightError(problem)
    return None


def check_clients(config: RunConfig, num_supernodes: int, train_rows: int | None = None) -> None:
    """What the number of clients decides, known before any process starts: a robust rule
    must hold on a round's clients (`fraction-train` of the SuperNodes, as the strategy samples
    them), and every client needs a chance of a row (`train_rows`, where known). The ServerApp
    checks the same once it knows its nodes: in deployment that is the only check."""
    check_robust_rule(config, num_supernodes)
    try:
        if train_rows is not None and config.finetune == "none":
            check_num_clients(num_supernodes, train_rows)
    except ConfigError as err:
        raise PreflightError(str(err)) from None


def check_robust_rule(config: RunConfig, num_supernodes: int) -> None:
    """The robust rule on a round's clients; needs no data (so no torch: refused in a second)."""
    from ovalp_flwr.federation.aggregators import aggregator  # late: a rule imports Flower's
    from ovalp_flwr.federation.costs import sample_size  # late: records, only where run

    if config.robust_aggregation == "none":
        return
    per_round = sample_size(num_supernodes, config.fraction_train)
    reason = aggregator(config.robust_aggregation, config.robust_fraction).too_few(per_round)
    if reason is not None:
        raise PreflightError(f"{reason} ({num_supernodes} SuperNodes x fraction-train="
                             f"{config.fraction_train}: {per_round} clients a round)")


def check_run(app: Path, flwr_args: Sequence[str], num_supernodes: int | None = None
              ) -> RunConfig:
    """Everything that can be known before starting Flower; PreflightError if it is wrong.
    `num_supernodes`: the clients there will be, where the launcher decides it (simulation)."""
    try:
        config = RunConfig.from_mapping(fused_run_config(app, flwr_args))
        if config.tracking == "mlflow":
            needs_mlflow()  # before any Flower process starts, as every other config error
    except ConfigError as err:
        raise PreflightError(str(err)) from None
    check_flower_partitioner(config, num_supernodes)
    if num_supernodes is not None:
        check_robust_rule(config, num_supernodes)  # before the data: it imports torch
    train_rows = check_data(config, app)
    if num_supernodes is not None:
        check_clients(config, num_supernodes, train_rows)
    return config


def check_flower_partitioner(config: RunConfig, num_supernodes: int | None) -> None:
    """A Flower Datasets partitioner (`partition = "flwr:<Name>"`) that exists and takes
    `partition-args`: made once here, as the ServerApp makes it, without the data."""
    named = [flower_partitioner(kind) for kind in (config.partition, config.within_domain)]
    if not any(named):
        return
    # late: Flower Datasets (~3 s, it imports seaborn); only a flwr: partition needs it
    from ovalp_flwr.data.partitioners import flower_partitioner as make

    try:
        for name in filter(None, named):
            make(name, partition_args(config.partition_args), num_supernodes or 2, config.seed)
    except ConfigError as err:
        raise PreflightError(str(err)) from None
