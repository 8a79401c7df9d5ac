"""A preset (`conf/<name>.toml`) run over seeds x its axes, each run through Flower.

A preset names a shared run config and named choices along axes (method, partition,
participation, noise, ...); the sweep is their product times the seeds:

    [preset]
    num-supernodes = 100
    seeds = [0, 42, 777, 1337, 15254]
    [config]                       # run-config keys shared by every run
    dataset = "tinyimagenet-100"
    [axes.method]                  # axis -> choice name -> run-config overrides
    ova-lp = { head = "ova", schedule = "two-stage" }
    [axes.partition]
    iid = { partition = "iid" }    # the reference of R(t): pairs with every other partition

Every run lands in `results/<preset>/<choice>-<choice>-...-seed<seed>/`; a run whose summary
is already there is skipped, so an interrupted sweep resumes where it stopped, and two sweeps
of one preset (each on a core, `--only` splitting the work roughly) skip what the other has
finished. Runs go through
`flwr run` on a local simulation SuperLink (`--runner flwr`, the default) or, for tests and
quick looks, through the same ServerApp/ClientApp logic in process (`--runner local`).

    python -m ovalp_flwr.experiments.sweep conf/tinyimagenet-ablation.toml --seeds 0 42 --only method=ova-lp
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import sys
import time
import tomllib
from collections.abc import Sequence
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ovalp_flwr.config import NOT_PART_OF_THE_RESULT, ConfigError, RunConfig, validation_share
from ovalp_flwr.ops import launch
from ovalp_flwr.ops.console import quiet_flower
from ovalp_flwr.ops.processes import sigterm_unwinds
from ovalp_flwr.federation.results import read_summary
from ovalp_flwr.tracking.tracker import git_commit, local_store, sweep_parent

PAPER_SEEDS = (0, 42, 777, 1337, 15254)
REFERENCE_AXIS, REFERENCE_CHOICE = "partition", "iid"
PRESET_KEYS = {"description", "num-supernodes", "seeds", "target-accuracy", "ceiling-fraction"}
RUN_KEYS_SET_BY_SWEEP = {"seed", "run-name", "results-dir"}

# What a summary without these keys ran: the quantity-skew variants came with the first seven,
# and until then every run took the paper's local recipe; until `head-init` every run started
# from torch's random init; own-heads moved its rows freely until its `mu`; personalization's
# Global was the clients' cross-scoring until `pft-global` (the defaults have moved since).
BEFORE_THE_KEY: dict[str, Any] = {"local-optimizer": "adamw", "local-steps": 0,
                                  "aggregation-weights": "samples", "drift-correction": "none",
                                  "server-optimizer": "fedavg", "server-learning-rate": 0.1,
                                  "epoch-size": "own-data", "head-init": "random",
                                  "pft.own-heads.mu": 0.0, "within-domain": "iid",
                                  "pft-global": "clients", "validation-fraction": 0.0,
                                  # before it, an L-BFGS round reported its trial point
                                  "lbfgs-patience": 0}
LBFGS_KNOBS = ("lbfgs-memory", "lbfgs-patience", "lbfgs-path-rounds")  # count only under L-BFGS


class PresetError(ValueError):
    """A preset file that cannot be run; the message is one line naming file, key and value."""


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: its seed, its choice on every axis, and its full run config."""

    seed: int
    choices: tuple[tuple[str, str], ...]  # (axis, choice) in the preset's axis order
    run_config: dict[str, Any]

    @property
    def name(self) -> str:
        return "-".join([*(choice for _, choice in self.choices), f"seed{self.seed}"])

    def choice(self, axis: str) -> str:
        return dict(self.choices)[axis]

    @property
    def config(self) -> RunConfig:
        """The run config it makes, validated (the keys it does not set at their defaults)."""
        return RunConfig.from_mapping(self.run_config)

    def reference(self) -> tuple[tuple[str, str], ...] | None:
        """The choices of the IID run this run's R(t) divides by (None: it is that run)."""
        chosen = dict(self.choices)
        if chosen.get(REFERENCE_AXIS, REFERENCE_CHOICE) == REFERENCE_CHOICE:
            return None
        return tuple((a, REFERENCE_CHOICE if a == REFERENCE_AXIS else c) for a, c in self.choices)


@dataclass(frozen=True)
class Preset:
    name: str
    path: Path
    description: str
    num_supernodes: int
    seeds: tuple[int, ...]
    config: dict[str, Any]
    axes: dict[str, dict[str, dict[str, Any]]]
    target_accuracy: float | None = None  # reports add "rounds to this accuracy" (a fraction)
    # reports add "rounds to this share of the dataset's centralised ceiling" (ovalp_flwr.experiments.ceiling)
    ceiling_fraction: float | None = None

    def runs(self, seeds: Sequence[int] | None = None) -> list[RunSpec]:
        """Every run, seed-major (all of seed 0 first, so an early stop leaves whole seeds)."""
        specs = []
        for seed in seeds or self.seeds:
            for combo in itertools.product(*(list(c.items()) for c in self.axes.values())):
                overrides: dict[str, Any] = {}
                for _, values in combo:
                    overrides.update(values)
                choices = tuple(zip(self.axes, (name for name, _ in combo)))
                specs.append(RunSpec(seed, choices, {**self.config, **overrides, "seed": seed}))
        return specs

    def results_dir(self, root: Path) -> Path:
        return root / self.name

    def restricted_to(self, specs: Sequence[RunSpec]) -> "Preset":
        """The preset with only the axis choices these runs use (a report of an `--only` subset)."""
        used = {axis: {spec.choice(axis) for spec in specs} for axis in self.axes}
        axes = {axis: {name: values for name, values in choices.items() if name in used[axis]}
                for axis, choices in self.axes.items()}
        return dataclasses.replace(self, axes=axes)


def load_preset(path: Path) -> Preset:
    """Parse and check a preset: every run's config must validate before anything runs."""
    try:
        raw = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise PresetError(f"preset {path}: cannot read it ({err})") from None
    head = raw.get("preset", {})
    unknown = set(head) - PRESET_KEYS
    if unknown:
        raise PresetError(f"preset {path}: [preset] key {sorted(unknown)[0]!r} is not allowed; "
                          f"known keys: {', '.join(sorted(PRESET_KEYS))}")
    seeds = tuple(head.get("seeds", PAPER_SEEDS))
    num_supernodes = head.get("num-supernodes", 100)
    if not isinstance(num_supernodes, int) or num_supernodes < 1:
        raise PresetError(f"preset {path}: num-supernodes={num_supernodes!r} is not allowed; "
                          "use an integer >= 1")
    target, share = (_fraction(path, head, key) for key in ("target-accuracy", "ceiling-fraction"))
    if target is not None and share is not None:
        raise PresetError(f"preset {path}: target-accuracy and ceiling-fraction are both set; "
                          "keep one (a fixed bar, or a share of each dataset's ceiling)")
    axes = raw.get("axes", {})
    if not axes or not all(isinstance(c, dict) and c for c in axes.values()):
        raise PresetError(f"preset {path}: needs [axes.<name>] tables with at least one choice")
    # late: Flower (~0.4 s); the report imports this module and, for one run, reads no preset.
    # flatten_dict: dotted keys (pft.<method>.<knob>), as Flower flattens them
    from flwr.common.config import flatten_dict

    preset = Preset(Path(path).stem, Path(path), head.get("description", ""), num_supernodes,
                    seeds, flatten_dict(raw.get("config", {})),
                    {a: {n: flatten_dict(c) if isinstance(c, dict) else c
                         for n, c in choices.items()} for a, choices in axes.items()},
                    target, share)
    for spec in preset.runs(seeds[:1]):
        _check(preset, spec)
    return preset


def _fraction(path: Path, head: dict[str, Any], key: str) -> float | None:
    """An optional [preset] fraction in (0, 1]."""
    value = head.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not 0 < value <= 1):
        raise PresetError(f"preset {path}: {key}={value!r} is not allowed; "
                          "use a fraction in (0, 1], e.g. 0.6")
    return None if value is None else float(value)


def _check(preset: Preset, spec: RunSpec) -> None:
    clash = RUN_KEYS_SET_BY_SWEEP & spec.run_config.keys() - {"seed"}
    if clash or "seed" in preset.config:
        key = sorted(clash)[0] if clash else "seed"
        raise PresetError(f"preset {preset.path}: {key} is set by the sweep; remove it")
    try:
        RunConfig.from_mapping(spec.run_config)
    except ConfigError as err:
        raise PresetError(f"preset {preset.path}, run {spec.name}: {err}") from None


def check_clients(preset: Preset, specs: Sequence[RunSpec]) -> None:
    """Each run's rules that depend on the number of clients, against the preset's SuperNodes,
    before the first run starts (`preflight.check_clients`): a sweep stops at once, not each
    run at its first round."""
    from ovalp_flwr.ops.preflight import PreflightError, check_clients as check  # late: Flower

    for spec in specs:
        try:
            check(spec.config, preset.num_supernodes)
        except PreflightError as err:
            raise PresetError(f"preset {preset.path}, run {spec.name}: {err}") from None


def select(specs: list[RunSpec], only: Sequence[str]) -> list[RunSpec]:
    """Keep runs matching every `axis=choice[,choice]` (or `seed=0,42`) filter."""
    kept = specs
    for rule in only:
        axis, _, wanted = rule.partition("=")
        values = set(wanted.split(","))
        if axis == "seed":
            kept = [s for s in kept if str(s.seed) in values]
        elif specs and axis in dict(specs[0].choices):
            kept = [s for s in kept if s.choice(axis) in values]
        else:
            axes = ", ".join(["seed", *dict(specs[0].choices)]) if specs else "seed"
            raise PresetError(f"--only {rule!r} is not allowed; use <axis>=<choice> with axis "
                              f"one of: {axes}")
    return kept


def run_config_arg(run_config: dict[str, Any]) -> str:
    """`flwr run --run-config` syntax: strings single-quoted, numbers and bools as TOML."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            if "'" in v:
                raise PresetError(f"run-config value {v!r} is not allowed; it contains a quote")
            return f"'{v}'"
        return repr(v)

    return " ".join(f"{k}={value(v)}" for k, v in run_config.items())


def run_one(preset: Preset, spec: RunSpec, results_root: Path, runner: str) -> Path:
    """Run one spec into results/<preset>/<name>; returns its folder."""
    out_dir = preset.results_dir(results_root)
    run_config = {**spec.run_config, "run-name": spec.name, "results-dir": str(out_dir)}
    if runner == "local":
        from ovalp_flwr.federation.local_grid import run_local  # late: apps and torch, ~2 s

        return run_local(run_config, preset.num_supernodes)

    with contextlib.redirect_stdout(io.StringIO()) as shown:  # the sweep's line per run says it
        code = launch.simulate(launch.PROJECT, preset.num_supernodes,
                               ["--run-config", run_config_arg(run_config)],
                               launch.PROJECT / ".flwr")
    if code != 0:  # the launcher's last line says why (the run's own line, or Flower's record)
        said = (shown.getvalue().strip().splitlines() or [f"exit {code}"])[-1]
        raise RuntimeError(said.removeprefix("error: "))
    return out_dir / spec.name


def config_mismatch(spec: RunSpec, ran: dict[str, Any]) -> str | None:
    """Why a finished run's config is not this spec's, or None if it is.

    The whole resolved config is compared, defaults included, so a run made before a default
    changed is not reused. A key the summary lacks was added after the run: the run had the
    behaviour from before the key existed (`BEFORE_THE_KEY`, else the key's default). Where
    the run's files live and which device ran it do not change what it computed, nor do the
    knobs of a personalization method the run did not use (`pft.<method>.<knob>`).
    """
    config = RunConfig.from_mapping(spec.run_config)
    wanted, used = config.to_dict(), set(config.personalization_methods)
    before = {**RunConfig().to_dict(), **BEFORE_THE_KEY}
    ran = {**ran, "validation-fraction": _held_back(ran, before)}  # what "auto" resolved to
    wanted["validation-fraction"] = config.validation_share
    for key, value in wanted.items():
        if key in NOT_PART_OF_THE_RESULT or _unused_knob(key, used) \
                or (key in LBFGS_KNOBS and not config.server_steps):
            continue
        if ran.get(key, before[key]) != value:
            return f"ran with {key}={ran.get(key, '(absent)')!r}, preset asks {value!r}"
    return None


def _held_back(ran: dict[str, Any], before: dict[str, Any]) -> float:
    """The share of training rows a finished run held back: a run made before the key held
    none; "auto" is compared by what it resolved to, so a run that chose nothing is reused."""
    return validation_share({key: ran.get(key, default) for key, default in before.items()})


def _unused_knob(key: str, methods: set[str]) -> bool:
    """`pft.<method>.<knob>` of a method not among `methods`; `pft-global` without any."""
    if key == "pft-global":
        return not methods
    return key.startswith("pft.") and key.split(".")[1] not in methods


def is_done(preset: Preset, spec: RunSpec, results_root: Path) -> bool:
    """A readable summary of this run, with the config it was asked to run."""
    try:
        summary = read_summary(preset.results_dir(results_root) / spec.name)
    except ValueError:
        return False
    return config_mismatch(spec, summary["config"]) is None


def sweep(preset: Preset, specs: list[RunSpec], results_root: Path, runner: str
          ) -> dict[str, str]:
    """Run what is missing, in order; returns the runs that failed (others go on), each with
    its one line on why."""
    from tqdm.auto import tqdm  # late: ~40 ms (asyncio); the report imports this module too

    failed: dict[str, str] = {}
    todo = [s for s in specs if not is_done(preset, s, results_root)]
    print(f"{preset.name}: {len(specs)} runs, {len(specs) - len(todo)} already done, "
          f"{len(todo)} to run ({runner})", flush=True)
    for spec in tqdm(todo, desc=preset.name, unit="run", file=sys.stdout):
        if is_done(preset, spec, results_root):  # another sweep of the preset ran it meanwhile
            tqdm.write(f"{spec.name}: done meanwhile, skipped")
            continue
        started = time.time()
        try:
            path = run_one(preset, spec, results_root, runner)
            final = read_summary(path)["final_accuracy"]
            tqdm.write(f"{spec.name}: final accuracy {final:.4f} ({time.time() - started:.0f} s)")
        except Exception as err:  # noqa: BLE001 - one failed run must not stop a long sweep
            failed[spec.name] = str(err).strip().splitlines()[0] if str(err).strip() else \
                type(err).__name__
            tqdm.write(f"{spec.name}: FAILED ({failed[spec.name]})")
    return failed


def tracked(preset: Preset, specs: list[RunSpec], uri: str) -> list[RunSpec]:
    """The runs, each logged to MLflow (`uri`) as a child of the preset's parent run, in the
    preset's experiment, tagged with the preset and its axis choices. None of these keys is
    part of the result (`is_done` still reuses a finished run)."""
    parent = sweep_parent(uri, preset.name, {"ovalp.git-commit": git_commit()}) or ""
    return [dataclasses.replace(spec, run_config={
        **spec.run_config, "tracking": "mlflow", "tracking-uri": uri,
        "tracking-experiment": preset.name, "tracking-parent": parent,
        "tracking-tags": " ".join([f"ovalp.preset={preset.name}",
                                   *(f"{axis}={choice}" for axis, choice in spec.choices)])})
        for spec in specs]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ovalp_flwr.experiments.sweep",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("preset", type=Path, help="conf/<name>.toml")
    parser.add_argument("--seeds", type=int, nargs="+", help="default: the preset's")
    parser.add_argument("--only", action="append", default=[],
                        help="axis=choice[,choice] (repeatable), e.g. method=ova-lp seed=0")
    parser.add_argument("--runner", choices=("flwr", "local"), default="flwr",
                        help="flwr: each run through `flwr run` on a local simulation "
                             "SuperLink; local: the same apps in this process, no Ray "
                             "(default: %(default)s)")
    parser.add_argument("--results-dir", type=Path, default=Path("results"),
                        help="where results/<preset>/ is (default: %(default)s)")
    parser.add_argument("--list", action="store_true", help="print the runs and their state")
    parser.add_argument("--tracking", choices=("none", "mlflow"), default=None,
                        help="log every run to MLflow as a child of the preset's parent run "
                             "(default: the preset's `tracking`, else none; docs/tracking.md)")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow's tracking URI (default: the preset's, else "
                             "<results-dir>/mlflow.db)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show the in-process runner's Flower log (--runner local)")
    args = parser.parse_args(argv)
    if not args.verbose:
        quiet_flower()
    try:
        preset = load_preset(args.preset)
        specs = select(preset.runs(args.seeds), args.only)
        check_clients(preset, specs)
    except PresetError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    root = args.results_dir.resolve()
    if args.list:
        for spec in specs:
            print(f"{'done' if is_done(preset, spec, root) else 'todo'}  {spec.name}")
        return 0
    tracking = args.tracking or preset.config.get("tracking", "none")
    if tracking == "mlflow":
        specs = tracked(preset, specs, args.tracking_uri or preset.config.get("tracking-uri")
                        or local_store(root))
    with sigterm_unwinds():  # the running simulation's processes are stopped too
        failed = sweep(preset, specs, root, args.runner)
    for name, why in failed.items():  # the last lines: each failed run's own reason
        print(f"error: run {name} failed: {why}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
