"""A preset's results as one report: Markdown tables, CSVs and plots under `reports/<preset>/`.

Reads every run of the preset that is done (`results/<preset>/<run>/summary.json` with the
config the preset asks for); runs not there are listed in the report, not fatal, so a report
can be made while a sweep is still going. Numbers are mean ± std over the seeds found:

- R(t) = Acc_nonIID(t) / Acc_IID(t) x 100, each non-IID run against the IID run with the same
  other choices and seed (`RunSpec.reference()`), then averaged over seeds;
- Acc@95 and the costs summed over rounds 1..Acc@95 (`ovalp_flwr.experiments.metrics`);
- with `target-accuracy` in the preset, the round each run first reaches that accuracy; with
  `ceiling-fraction`, the round it reaches that share of its dataset's centralised ceiling
  (`benchmarks/centralised_ceiling.py`), the bytes moved to get there, and its accuracy at the
  start and after the first rounds;
- with a `noise` axis, the decline rate against the noise-free run of the same choices and seed.

    python -m ovalp_flwr.experiments.report conf/tinyimagenet-ablation.toml --seeds 0 42
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import shlex
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ovalp_flwr.core.durable import write_durably
from ovalp_flwr.experiments.ceiling import CEILING_FILE, CeilingError, ceiling
from ovalp_flwr.config import RunConfig
from ovalp_flwr.experiments.metrics import (acc_at, bytes_through, cost_to_round, first_round_at,
                                relative_curve, start_and_rounds)
from ovalp_flwr.federation.results import read_summary
from ovalp_flwr.experiments.sweep import (REFERENCE_AXIS, REFERENCE_CHOICE, Preset, PresetError, RunSpec,
                              config_mismatch, load_preset, select)

METHOD_AXIS, NOISE_AXIS, CLEAN_CHOICE = "method", "noise", "none"
NO_STD = "—"
PLOTS = ("curves.png", "relative.png", "r_final.png", "ceiling.png", "domains.png")

Choices = tuple[tuple[str, str], ...]


class ReportError(ValueError):
    """Nothing to report on; the message is one line naming the preset and where it looked."""


@dataclass(frozen=True)
class RunResult:
    """The numbers of one finished run that the report needs (accuracies are fractions)."""

    spec: RunSpec
    curve: list[float]  # after rounds 1..T (a run without rounds: its start, T times)
    final: float
    best: float
    acc95: int
    costs: dict[str, float]
    noise: dict[str, Any] | None  # summary["label_noise"]; None in summaries older than it
    start: float = float("nan")  # round 0: the heads' start
    bytes_through: tuple[float, ...] = ()  # bytes moved by the end of round t = 0..T
    target: float | None = None  # the bar of "round to target" for this run (a fraction)
    relative: list[float] | None = None  # R(t) in %, non-IID runs whose IID run was found
    decline: float | None = None  # %, noisy runs whose noise-free run was found
    domains: dict[str, float] | None = None  # final accuracy per domain (multi-domain data)

    def accuracy_at(self, round_: int) -> float:
        """Accuracy after `round_` (0: the start), the last one for rounds past the end."""
        return self.start if round_ == 0 else self.curve[min(round_, len(self.curve)) - 1]

    @property
    def round_to_target(self) -> int | None:
        return None if self.target is None else first_round_at([self.start, *self.curve],
                                                               self.target)

    @property
    def megabytes_to_target(self) -> float | None:
        t = self.round_to_target
        return None if t is None else self.bytes_through[t] / 1e6

    @property
    def r_final(self) -> float | None:
        return self.relative[-1] if self.relative else None

    @property
    def realised_noise(self) -> float | None:
        rate = (self.noise or {}).get("realised_rate")
        return None if rate is None else float(rate)


@dataclass(frozen=True)
class Stat:
    """Mean and sample std (ddof=1; None under two values) of the values a cell has."""

    values: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.values) if self.n >= 2 else None

    def text(self, fmt: Callable[[float], str], seeds: int | None = None) -> str:
        """`mean ± std`; `(n=k)` when fewer values than the cell has seeds (a pair missing)."""
        if self.mean is None:
            return ""
        mean = fmt(self.mean)
        decimals = len(mean.partition(".")[2])  # the std to the mean's precision
        std = NO_STD if self.std is None else f"{self.std:.{decimals}f}"
        short = f" (n={self.n})" if seeds is not None and self.n < seeds else ""
        return f"{mean} ± {std}{short}"


def stat(values: Sequence[float | None]) -> Stat:
    return Stat(tuple(float(v) for v in values if v is not None and not math.isnan(v)))


# ---------------------------------------------------------------- reading and pairing runs


def load_runs(preset: Preset, specs: Sequence[RunSpec], results_root: Path,
              ceilings: Path = CEILING_FILE) -> tuple[list[RunResult], list[tuple[str, str]]]:
    """The finished runs, paired for R(t) and decline, and (name, why) for every other one."""
    found, missing = [], []
    horizon = max(RunConfig.from_mapping(s.run_config).num_server_rounds for s in specs)
    for spec in specs:
        result = read_run(preset.results_dir(results_root) / spec.name, spec, horizon,
                          target_of(preset, spec, ceilings))
        if isinstance(result, str):
            missing.append((spec.name, result))
        else:
            found.append(result)
    return attach_decline(attach_relative(found)), missing


def target_of(preset: Preset, spec: RunSpec, ceilings: Path = CEILING_FILE) -> float | None:
    """The preset's fixed target accuracy, or its share of the run's dataset's ceiling."""
    if preset.ceiling_fraction is None:
        return preset.target_accuracy
    config = RunConfig.from_mapping(spec.run_config)
    try:
        return preset.ceiling_fraction * ceiling(config.dataset, config.encoder, ceilings)
    except CeilingError as err:
        raise ReportError(f"preset {preset.name}: {err}") from None


def read_run(run_dir: Path, spec: RunSpec, horizon: int = 0,
             target: float | None = None) -> RunResult | str:
    """A run's numbers, or why it does not count (absent, unreadable, run with another config:
    the same test as `sweep.is_done`, so a stale folder is never averaged in). A run with
    fewer rounds than `horizon` (FedNCM, Fed3R: none) keeps its last model to the horizon."""
    if not (run_dir / "summary.json").exists():
        return "not run"
    try:
        summary = read_summary(run_dir)
    except ValueError as err:
        return f"unreadable ({err})"
    mismatch = config_mismatch(spec, summary["config"])
    if mismatch:
        return mismatch
    start, *curve = start_and_rounds(summary, max(horizon, 1))
    acc95 = acc_at(curve)
    assert acc95 is not None  # a non-empty curve always reaches 95% of its last value
    return RunResult(spec, curve, float(summary["final_accuracy"]), max(curve), acc95,
                     cost_to_round(summary, acc95), summary.get("label_noise"), start,
                     tuple(bytes_through(summary, horizon)), target,
                     domains=summary.get("domain_accuracy", {}).get("final"))


def attach_relative(runs: list[RunResult]) -> list[RunResult]:
    """R(t) for each non-IID run whose IID run (same other choices, same seed) is there."""
    by_key = {(r.spec.choices, r.spec.seed): r for r in runs}
    paired = []
    for run in runs:
        reference = run.spec.reference()
        iid = by_key.get((reference, run.spec.seed)) if reference else None
        if iid is not None and len(iid.curve) == len(run.curve):
            run = replace(run, relative=relative_curve(run.curve, iid.curve))
        paired.append(run)
    return paired


def clean_key(choices: Choices) -> Choices | None:
    """The choices of the noise-free run a noisy run's decline is measured against."""
    chosen = dict(choices)
    if chosen.get(NOISE_AXIS, CLEAN_CHOICE) == CLEAN_CHOICE:
        return None
    return tuple((a, CLEAN_CHOICE if a == NOISE_AXIS else c) for a, c in choices)


def attach_decline(runs: list[RunResult]) -> list[RunResult]:
    """Decline = (Acc_clean - Acc_noisy) / Acc_clean x 100, final accuracies, same seed."""
    by_key = {(r.spec.choices, r.spec.seed): r for r in runs}
    paired = []
    for run in runs:
        key = clean_key(run.spec.choices)
        clean = by_key.get((key, run.spec.seed)) if key else None
        if clean is not None and clean.final > 0:
            run = replace(run, decline=100.0 * (clean.final - run.final) / clean.final)
        paired.append(run)
    return paired


# ---------------------------------------------------------------- cells and formatting


def combos(preset: Preset) -> list[Choices]:
    """Every choice combination, in the preset's order."""
    return [spec.choices for spec in preset.runs([0])]


def by_cell(runs: Sequence[RunResult]) -> dict[Choices, list[RunResult]]:
    cells: dict[Choices, list[RunResult]] = {}
    for run in runs:
        cells.setdefault(run.spec.choices, []).append(run)
    return cells


def without(choices: Choices, axes: Sequence[str]) -> Choices:
    return tuple((a, c) for a, c in choices if a not in axes)


def label(choices: Choices) -> str:
    return ", ".join(c for _, c in choices) or "all runs"


def title(choices: Choices) -> str:
    """A panel's title names its axes: `method = ova-lp, noise = sym-0.3`."""
    return ", ".join(f"{a} = {c}" for a, c in choices)


def pct(x: float) -> str:
    return f"{x:.2f}"


def num(x: float) -> str:
    """Costs span 1e-3 s to 1e4 s and kB to GB: about three significant digits, no exponent."""
    size = abs(x)
    return f"{x:.0f}" if size >= 100 else f"{x:.1f}" if size >= 10 else (
        f"{x:.2f}" if size >= 1 else f"{x:.3f}")


def rnd(x: float) -> str:
    return f"{x:.1f}"


Metric = tuple[str, Callable[[RunResult], float | None], Callable[[float], str]]
TARGET = "rounds_to_target"
NEVER = "never"

# metric name -> (column title, value of a run, format); the main table and table.csv
METRICS: dict[str, Metric] = {
    "final": ("Final acc. (%)", lambda r: 100 * r.final, pct),
    "best": ("Best acc. (%)", lambda r: 100 * r.best, pct),
    "r_final": ("R(final) (%)", lambda r: r.r_final, pct),
    "acc_at_95": ("Acc@95 (round)", lambda r: r.acc95, rnd),
    "client_seconds": ("Client s to Acc@95", lambda r: r.costs["client_seconds"], num),
    "server_seconds": ("Server s to Acc@95", lambda r: r.costs["server_seconds"], num),
    "megabytes": ("MB to Acc@95", lambda r: r.costs["bytes"] / 1e6, num),
}


TARGET_BYTES = "megabytes_to_target"
SPEED_ROUNDS = (0, 1, 2, 3, 5)  # accuracy at these rounds: how fast a method starts


def target_title(preset: Preset) -> str:
    if preset.ceiling_fraction is not None:
        return f"{100 * preset.ceiling_fraction:g}% of ceiling"
    return f"{100 * preset.target_accuracy:g}%"


def speed_metrics() -> dict[str, Metric]:
    """Accuracy at the start and after the first rounds."""
    def at(t: int) -> Callable[[RunResult], float]:
        return lambda r: 100 * r.accuracy_at(t)

    return {f"round_{t}": ("Start (%)" if t == 0 else f"Round {t} (%)", at(t), pct)
            for t in SPEED_ROUNDS}


def metrics(preset: Preset) -> dict[str, Metric]:
    """METRICS, and the round to the preset's target when it names one (a fixed accuracy, or a
    share of the ceiling, with the bytes to it and the first rounds' accuracy)."""
    if preset.target_accuracy is None and preset.ceiling_fraction is None:
        return METRICS
    target = {TARGET: (f"Round to {target_title(preset)}", lambda r: r.round_to_target, rnd)}
    if preset.ceiling_fraction is None:
        return {**METRICS, **target}
    return {**METRICS, **target,
            TARGET_BYTES: (f"MB to {target_title(preset)}", lambda r: r.megabytes_to_target, num),
            **speed_metrics()}


SPEED_TABLE = ("round_0", "round_1", "round_2", "round_3", "round_5", "final", "r_final", TARGET,
               TARGET_BYTES)


def cell_stat(runs: Sequence[RunResult], metric: Metric) -> Stat:
    return stat([metric[1](r) for r in runs])


def cell_text(runs: Sequence[RunResult], name: str, metric: Metric) -> str:
    """The cell as shown; "never" where no run reached the target accuracy."""
    values = cell_stat(runs, metric)
    if name in (TARGET, TARGET_BYTES) and runs and values.n == 0:
        return NEVER
    return values.text(metric[2], len(runs))


# ---------------------------------------------------------------- Markdown


def md_table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric_from: int) -> str:
    """A GitHub Markdown table; columns from `numeric_from` on are right-aligned."""
    align = ["---" if i < numeric_from else "---:" for i in range(len(headers))]
    lines = [headers, align, *rows]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines) + "\n"


def main_table(preset: Preset, cells: dict[Choices, list[RunResult]],
               names: Sequence[str] | None = None) -> str:
    """One row per choice combination; the columns `names` of `metrics(preset)` (default: the
    table *All cells*: every metric but the speed columns)."""
    every = metrics(preset)
    columns = {n: every[n] for n in (names or [n for n in every if not n.startswith("round_")])}
    headers = [*preset.axes, *(head for head, _, _ in columns.values()), "Seeds"]
    rows = []
    for choices in combos(preset):
        runs = cells.get(choices, [])
        row = [c for _, c in choices]
        for name, metric in columns.items():
            is_reference = name == "r_final" and dict(choices).get(REFERENCE_AXIS) in (
                REFERENCE_CHOICE, None)
            row.append("" if is_reference else cell_text(runs, name, metric))
        rows.append([*row, str(len(runs))])
    return md_table(headers, rows, len(preset.axes))


def pivots(preset: Preset, cells: dict[Choices, list[RunResult]], metric: str,
           include_iid: bool) -> str:
    """Rows = methods, columns = partitions; one pivot per combination of any other axes."""
    partitions = [p for p in preset.axes[REFERENCE_AXIS] if include_iid or p != REFERENCE_CHOICE]
    others = [a for a in preset.axes if a not in (METHOD_AXIS, REFERENCE_AXIS)]
    column = metrics(preset)[metric]
    blocks = []
    for rest in dict.fromkeys(without(c, (METHOD_AXIS, REFERENCE_AXIS)) for c in combos(preset)):
        rows = []
        for method in preset.axes[METHOD_AXIS]:
            row = [method]
            for partition in partitions:
                choices = {**dict(rest), METHOD_AXIS: method, REFERENCE_AXIS: partition}
                runs = cells.get(tuple((a, choices[a]) for a in preset.axes), [])
                row.append(cell_text(runs, metric, column))
            rows.append(row)
        heading = f"{title(rest)}\n\n" if others else ""
        blocks.append(heading + md_table(["method", *partitions], rows, 1))
    return "\n".join(blocks)


WORST_OF = {"round_3": min, "final": min, "r_final": min, TARGET: max}  # what "worst" means


def worst_over_partitions(preset: Preset, cells: dict[Choices, list[RunResult]],
                          metric: str) -> str:
    """Rows = methods, columns = the other axes' combinations (datasets); each cell is the
    worst partition's mean over seeds, named, so one line says whether a method holds on every
    partition. A round to the target counts as never where any seed of a partition never got
    there; `k/N` marks a cell with runs for only k of its N partitions."""
    worst, column = WORST_OF[metric], metrics(preset)[metric]
    partitions = [p for p in preset.axes[REFERENCE_AXIS]
                  if metric != "r_final" or p != REFERENCE_CHOICE]
    rests = list(dict.fromkeys(without(c, (METHOD_AXIS, REFERENCE_AXIS)) for c in combos(preset)))
    rows = []
    for method in preset.axes[METHOD_AXIS]:
        row = [method]
        for rest in rests:
            found: list[tuple[float, str]] = []
            for partition in partitions:
                choices = {**dict(rest), METHOD_AXIS: method, REFERENCE_AXIS: partition}
                runs = cells.get(tuple((a, choices[a]) for a in preset.axes), [])
                values = cell_stat(runs, column)
                never = metric == TARGET and runs and values.n < len(runs)
                if runs and (values.mean is not None or never):
                    found.append((math.inf if never else values.mean, partition))
            value, partition = worst(found) if found else (None, "")
            if len(found) > 1 and len({v for v, _ in found}) == 1:
                partition = "every one"  # a tie names no partition
            text = "" if value is None else NEVER if value == math.inf else column[2](value)
            share = "" if len(found) == len(partitions) else f", {len(found)}/{len(partitions)}"
            row.append(f"{text} ({partition}{share})" if found else "")
        rows.append(row)
    return md_table(["method", *(label(rest) for rest in rests)], rows, 1)


def noise_tables(preset: Preset, runs: Sequence[RunResult]) -> str:
    """Decline per noise choice (rows: the other axes' combinations), and the realised rates."""
    noisy = [n for n in preset.axes[NOISE_AXIS] if n != CLEAN_CHOICE]
    if CLEAN_CHOICE not in preset.axes[NOISE_AXIS]:
        return (f"The noise axis has no `{CLEAN_CHOICE}` choice, so there is nothing to measure "
                "a decline against.\n")
    groups: dict[Choices, dict[str, list[RunResult]]] = {}
    for choices in combos(preset):
        groups.setdefault(without(choices, (NOISE_AXIS,)), {})[dict(choices)[NOISE_AXIS]] = []
    for run in runs:
        choices = run.spec.choices
        groups[without(choices, (NOISE_AXIS,))][dict(choices)[NOISE_AXIS]].append(run)
    others = [a for a in preset.axes if a != NOISE_AXIS]
    rows = [[*(c for _, c in rest), *(stat([r.decline for r in cell[n]]).text(pct, len(cell[n]))
                                      for n in noisy)]
            for rest, cell in groups.items()]
    decline = md_table([*others, *(f"{n} decline (%)" for n in noisy)], rows, len(others))
    realised_rows = []
    for choice in preset.axes[NOISE_AXIS]:
        members = [r for r in runs if dict(r.spec.choices)[NOISE_AXIS] == choice]
        overrides = preset.axes[NOISE_AXIS][choice]
        asked = 100 * float(overrides.get("noise-rate", 0.0))
        realised = stat([None if r.realised_noise is None else 100 * r.realised_noise
                         for r in members])
        realised_rows.append([choice, str(overrides.get("label-noise", "none")), pct(asked),
                              realised.text(pct, len(members)), str(len(members))])
    realised = md_table(["noise", "kind", "asked rate (%)", "realised rate (%)", "runs"],
                        realised_rows, 2)
    return (f"Decline rate (%) of final accuracy against `{NOISE_AXIS} = {CLEAN_CHOICE}`:\n\n"
            f"{decline}\nLabel noise asked for and realised (share of training labels "
            f"changed, from `summary.json` `label_noise.realised_rate`):\n\n{realised}")


def coverage(preset: Preset, cells: dict[Choices, list[RunResult]], seeds: Sequence[int]) -> str:
    """How many seeds each cell has, counted: `8 cells with 2 seeds, 2 with 1`."""
    counts: dict[int, int] = {}
    for choices in combos(preset):
        n = len(cells.get(choices, []))
        counts[n] = counts.get(n, 0) + 1
    parts = [f"{cells_n} cell(s) with {n} seed(s)" for n, cells_n in sorted(counts.items(),
                                                                               reverse=True)]
    return (f"Seeds asked: {', '.join(map(str, seeds))}. Seeds found per cell: "
            f"{'; '.join(parts)} (column *Seeds* below).")


DEFINITIONS = """\
- **R(t)** = Acc_nonIID(t) / Acc_IID(t) x 100, round by round: each non-IID run is paired with
  the IID run of the same method (and every other choice) and the same seed; R(final) is R at
  the last round. The ratio is taken per seed, then averaged over seeds.
- **Acc@95** = the first round whose test accuracy reaches 95% of that run's *final* accuracy.
- **Costs to Acc@95** are summed over rounds 1..Acc@95: client seconds = mean training time per
  trained client in a round, summed over rounds; server seconds = aggregation + evaluation;
  MB = 10^6 bytes moved both ways (server -> sampled clients, trained clients -> server), the
  set-up exchanges (describe, set_norm, and the statistics a start needs) included where the
  run recorded them.
- Cells are mean ± std over seeds (std with ddof=1; "—" with one seed); `(n=k)` marks a cell
  where only k runs have a value (R: the others lack their paired run; round to a target: the
  others never reach it, and "never" means no run does).
"""

TARGET_DEFINITION = """\
- **Round to {target}%** = the first round whose test accuracy reaches {target}%, the same bar
  for every method and partition (the preset's `target-accuracy`); round 0 is the start.
"""

CEILING_DEFINITION = """\
- **Ceiling** = the better test accuracy of a multinomial and a one-vs-rest logistic regression
  fitted on all training features in one place, L2 tuned on a held-out tenth
  (`benchmarks/results/centralised_ceiling.md`): {ceilings}.
- **Round to {share}% of ceiling** = the first round whose test accuracy reaches {share}% of the
  run's dataset's ceiling, the same bar for every method and partition; round 0 is the start
  (a start from statistics can be there before any training round). **MB to** it = bytes moved
  both ways by then, set-up included (for a start from statistics, the statistics).
- **Start**, **Round t** = test accuracy of the heads' start and after round t. FedNCM and Fed3R
  run no rounds: their accuracy is their start's at every round.
"""

NOISE_DEFINITION = """\
- **Decline rate** = (Acc_clean - Acc_noisy) / Acc_clean x 100, final accuracies, against the
  `noise = none` run of the same other choices and seed.
"""


def target_definition(preset: Preset, runs: Sequence[RunResult]) -> str:
    if preset.ceiling_fraction is not None:
        bars = {}
        for run in runs:
            config = RunConfig.from_mapping(run.spec.run_config)
            bars[f"{config.dataset} / {config.encoder}"] = run.target / preset.ceiling_fraction
        ceilings = ", ".join(f"{case} {100 * value:.2f}%" for case, value in bars.items())
        return CEILING_DEFINITION.format(share=f"{100 * preset.ceiling_fraction:g}",
                                         ceilings=ceilings)
    target = preset.target_accuracy
    return "" if target is None else TARGET_DEFINITION.format(target=f"{100 * target:g}")


def markdown(preset: Preset, runs: list[RunResult], missing: list[tuple[str, str]],
             seeds: Sequence[int], results_dir: Path, command: str, plots: Sequence[str]) -> str:
    cells = by_cell(runs)
    total = len(runs) + len(missing)
    parts = [f"# {preset.name}\n\n{preset.description}\n",
             f"Made by `{command}` from `{results_dir}`: {len(runs)} of {total} runs found.\n\n"
             f"{coverage(preset, cells, seeds)}\n",
             "## Definitions\n\n" + DEFINITIONS + target_definition(preset, runs)
             + (NOISE_DEFINITION if NOISE_AXIS in preset.axes else "")]
    if preset.ceiling_fraction is not None:
        parts.append("## Speed to the ceiling\n\n" + main_table(preset, cells, SPEED_TABLE))
    parts.append("## All cells\n\n" + main_table(preset, cells))
    if METHOD_AXIS in preset.axes and REFERENCE_AXIS in preset.axes:
        if set(preset.axes[REFERENCE_AXIS]) - {REFERENCE_CHOICE}:  # some R to show
            parts.append("## Ablation: R(final) (%)\n\n" + pivots(preset, cells, "r_final", False))
        parts.append("## Ablation: final accuracy (%)\n\n" + pivots(preset, cells, "final", True))
        if TARGET in metrics(preset):
            parts.append(f"## Ablation: {metrics(preset)[TARGET][0].lower()}\n\n"
                         + pivots(preset, cells, TARGET, True))
        if preset.ceiling_fraction is not None:
            parts.append("## Ablation: accuracy after round 1 (%)\n\n"
                         + pivots(preset, cells, "round_1", True))
    if preset.ceiling_fraction is not None and {METHOD_AXIS, REFERENCE_AXIS} <= set(preset.axes):
        parts.append("## Worst partition\n\nEach cell: the partition where the method does "
                     "worst (mean over seeds), and which one it is; `k/N`: only k of the N "
                     "partitions have runs yet.\n\n" + "\n".join(
                         f"### {metrics(preset)[name][0]}\n\n"
                         + worst_over_partitions(preset, cells, name) for name in WORST_OF))
    if NOISE_AXIS in preset.axes:
        parts.append("## Label noise\n\n" + noise_tables(preset, runs))
    if any(r.domains for r in runs):
        parts.append("## Per domain: final accuracy (%)\n\n" + domain_table(preset, cells))
    parts.append("## Plots\n\n" + "".join(f"![{p}]({p})\n" for p in plots))
    parts.append("## Files\n\n- `runs.csv`: one row per run\n- `table.csv`: the table "
                 "*All cells* with mean and std in separate columns\n")
    if missing:
        parts.append(f"## Missing runs ({len(missing)})\n\n"
                     + "".join(f"- `{name}`: {why}\n" for name, why in missing))
    return "\n".join(parts)


def domain_table(preset: Preset, cells: dict[Choices, list[RunResult]]) -> str:
    """One row per domain, one column per cell: the global model's final accuracy on that
    domain's test rows, mean ± std over seeds; then each run's worst domain, and the gap
    between its best and worst domain."""
    present = [c for c in combos(preset) if any(r.domains for r in cells.get(c, []))]
    names = list(dict.fromkeys(d for c in present for r in cells[c] if r.domains for d in r.domains))

    def row(head: str, value: Callable[[dict[str, float]], float]) -> list[str]:
        return [head, *(stat([100 * value(r.domains) for r in cells[c] if r.domains]).text(
            pct, len(cells[c])) for c in present)]

    rows = [row(name, lambda d, name=name: d.get(name, math.nan)) for name in names]
    rows.append(row("worst domain", lambda d: min(d.values())))
    rows.append(row("best - worst", lambda d: max(d.values()) - min(d.values())))
    return (f"The global model's accuracy on each domain's test rows after the last round; "
            f"the union of the domains' test splits is *final accuracy* above.\n\n"
            + md_table(["domain", *(label(c) for c in present)], rows, 1))


# ---------------------------------------------------------------- CSV


def to_csv(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(headers)
    writer.writerows(["" if v is None else v for v in row] for row in rows)
    return buffer.getvalue()


def runs_csv(preset: Preset, runs: Sequence[RunResult]) -> str:
    """Percent for accuracies, R and rates; the extra noise columns only with a noise axis."""
    noise = NOISE_AXIS in preset.axes
    target = TARGET in metrics(preset)
    ceiling_columns = preset.ceiling_fraction is not None
    headers = ["preset", "run", "seed", *preset.axes, "final_pct", "best_pct", "r_final_pct",
               "acc_at_95", "client_seconds", "server_seconds", "megabytes",
               *(["decline_pct", "realised_noise_pct"] if noise else []),
               *([TARGET] if target else []),
               *(["target_pct", TARGET_BYTES, *(f"round_{t}_pct" for t in SPEED_ROUNDS)]
                 if ceiling_columns else [])]
    rows = []
    for r in runs:
        realised = None if r.realised_noise is None else 100 * r.realised_noise
        rows.append([preset.name, r.spec.name, r.spec.seed, *(c for _, c in r.spec.choices),
                     100 * r.final, 100 * r.best, r.r_final, r.acc95, r.costs["client_seconds"],
                     r.costs["server_seconds"], r.costs["bytes"] / 1e6,
                     *([r.decline, realised] if noise else []),
                     *([r.round_to_target] if target else []),
                     *([100 * r.target, r.megabytes_to_target,
                        *(100 * r.accuracy_at(t) for t in SPEED_ROUNDS)] if ceiling_columns
                       else [])])
    return to_csv(headers, rows)


def table_csv(preset: Preset, runs: Sequence[RunResult]) -> str:
    cells = by_cell(runs)
    columns = metrics(preset)
    headers = [*preset.axes, *(f"{m}_{s}" for m in columns for s in ("mean", "std")), "seeds"]
    rows = []
    for choices in combos(preset):
        members = cells.get(choices, [])
        values: list[Any] = []
        for metric in columns.values():
            s = cell_stat(members, metric)
            values += [s.mean, s.std]
        rows.append([*(c for _, c in choices), *values, len(members)])
    return to_csv(headers, rows)


# ---------------------------------------------------------------- plots


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def mean_std(curves: Sequence[Sequence[float]]) -> tuple[Any, Any]:
    """Round-wise mean and std (ddof=1; zeros with one curve) over the rounds all curves have."""
    import numpy as np

    length = min(len(c) for c in curves)
    stack = np.array([list(c)[:length] for c in curves], dtype=float)
    std = stack.std(axis=0, ddof=1) if len(stack) >= 2 else np.zeros(length)
    return stack.mean(axis=0), std


def panels(preset: Preset, runs: Sequence[RunResult]) -> dict[Choices, list[RunResult]]:
    """One panel per combination of the axes other than partition, in preset order."""
    out: dict[Choices, list[RunResult]] = {}
    for choices in combos(preset):
        out.setdefault(without(choices, (REFERENCE_AXIS,)), [])
    for run in runs:
        out[without(run.spec.choices, (REFERENCE_AXIS,))].append(run)
    return {k: v for k, v in out.items() if v}


def _grid(plt: Any, n: int, heading: str) -> tuple[Any, list[Any]]:
    """Panels three to a row, sharing y so methods compare at a glance."""
    cols = 2 if n == 4 else min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows + 0.4), sharey=True,
                             squeeze=False, layout="constrained")
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    fig.suptitle(heading)
    return fig, flat[:n]


def _band(ax: Any, curves: Sequence[Sequence[float]], scale: float,
          **style: Any) -> tuple[Any, Any]:
    """Mean line with a ± std band; returns (mean, std) for the y-limits."""
    mean, std = mean_std(curves)
    mean, std = mean * scale, std * scale
    rounds = range(1, len(mean) + 1)
    ax.plot(rounds, mean, marker="o" if len(mean) <= 12 else None, markersize=3, **style)
    ax.fill_between(rounds, mean - std, mean + std, alpha=0.2, color=style.get("color"),
                    linewidth=0)
    return mean, std


def _finish(fig: Any, axes: list[Any], ylabel: str, low: float, high: float,
            legend_title: str) -> None:
    """Shared y-limits, axis labels, one legend right of the panels (never over a curve)."""
    pad = max(2.0, 0.08 * (high - low))
    for ax in axes:
        ax.set_ylim(max(0.0, low - pad), high + pad)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    for ax in axes:
        if ax.get_subplotspec().is_first_col():
            ax.set_ylabel(ylabel)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, title=legend_title, loc="outside right center", frameon=False)


def _colors(plt: Any, names: Sequence[str]) -> dict[str, Any]:
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


def curves_plot(preset: Preset, runs: Sequence[RunResult]) -> bytes:
    """Accuracy vs round: IID and each non-IID partition per panel (per method), or one line
    per combination when the preset has no partition axis."""
    plt = _pyplot()
    if REFERENCE_AXIS in preset.axes:
        colors = _colors(plt, list(preset.axes[REFERENCE_AXIS]))
        legend = REFERENCE_AXIS
        lines = {k: {p: [r for r in v if r.spec.choice(REFERENCE_AXIS) == p] for p in colors}
                 for k, v in panels(preset, runs).items()}
    else:
        cells = by_cell(runs)
        colors = _colors(plt, [label(c) for c in combos(preset) if c in cells])
        legend = " / ".join(preset.axes)
        lines = {(): {label(c): cells[c] for c in combos(preset) if c in cells}}
    fig, axes = _grid(plt, len(lines), f"{preset.name}: test accuracy per round "
                                       "(mean ± std over seeds)")
    low, high = 100.0, 0.0
    for ax, (key, members) in zip(axes, lines.items()):
        for name, group in members.items():
            if group:
                mean, std = _band(ax, [r.curve for r in group], 100.0, color=colors[name],
                                  label=name)
                low = min(low, float((mean - std).min()))
                high = max(high, float((mean + std).max()))
        ax.set_title(title(key))
    _finish(fig, axes, "test accuracy (%)", low, min(high, 100.0), legend)
    return _png(plt, fig)


def relative_plot(preset: Preset, runs: Sequence[RunResult]) -> bytes:
    """R(t) per non-IID partition, one panel per method (or other-axes combination). The
    y-range follows the mean curves: early rounds' ratios of two small accuracies swing wide."""
    plt = _pyplot()
    groups = {k: [r for r in v if r.relative] for k, v in panels(preset, runs).items()}
    groups = {k: v for k, v in groups.items() if v}
    partitions = [p for p in preset.axes[REFERENCE_AXIS] if p != REFERENCE_CHOICE]
    colors = _colors(plt, list(preset.axes[REFERENCE_AXIS]))
    fig, axes = _grid(plt, len(groups), f"{preset.name}: R(t) = non-IID / IID accuracy "
                                        "(mean ± std over seeds)")
    low, high = 100.0, 100.0
    for ax, (key, members) in zip(axes, groups.items()):
        ax.axhline(100.0, color="grey", linestyle="--", linewidth=1, label="IID (100%)")
        for partition in partitions:
            group = [r.relative for r in members
                     if r.relative and r.spec.choice(REFERENCE_AXIS) == partition]
            if group:
                mean, _ = _band(ax, group, 1.0, color=colors[partition], label=partition)
                low, high = min(low, float(mean.min())), max(high, float(mean.max()))
        ax.set_title(title(key))
    _finish(fig, axes, "R(t) (%)", low, high, REFERENCE_AXIS)
    return _png(plt, fig)


def r_final_plot(preset: Preset, runs: Sequence[RunResult]) -> bytes:
    """Grouped bars: x = non-IID partition, one bar per method; one panel per combination of
    the other axes (a dataset each, say), so a bar group stays readable. Values are written
    above the error bars while a panel holds few enough bars to read them."""
    plt = _pyplot()
    partitions = [p for p in preset.axes[REFERENCE_AXIS] if p != REFERENCE_CHOICE]
    groups = {k: v for k, v in panels(preset, runs).items() if any(r.relative for r in v)}
    by_panel: dict[Choices, dict[Choices, list[RunResult]]] = {}
    for key, members in groups.items():
        by_panel.setdefault(without(key, (METHOD_AXIS,)), {})[key] = members
    bar_names = list(dict.fromkeys(_bar_name(key) for key in groups))
    colors = _colors(plt, bar_names)
    fig, axes = _grid(plt, len(by_panel),
                      f"{preset.name}: R(final) per partition (mean ± std over seeds; IID = 100%)")
    top = 100.0
    for ax, (rest, bars) in zip(axes, by_panel.items()):
        width, written = 0.8 / len(bars), len(bars) * len(partitions) <= 24
        for i, (key, members) in enumerate(bars.items()):
            for j, partition in enumerate(partitions):
                s = stat([r.r_final for r in members if r.spec.choice(REFERENCE_AXIS) == partition])
                if s.mean is None:
                    continue
                x, err = j + (i - (len(bars) - 1) / 2) * width, s.std or 0.0
                ax.bar(x, s.mean, width, yerr=err if s.std is not None else None, capsize=2,
                       color=colors[_bar_name(key)], label=_bar_name(key))
                if written:
                    ax.text(x, s.mean + err + 1.5, f"{s.mean:.0f}", ha="center", va="bottom",
                            fontsize=7)
                top = max(top, s.mean + err)
        ax.axhline(100.0, color="grey", linestyle="--", linewidth=1)
        ax.set_xticks(range(len(partitions)), partitions, fontsize=8)
        ax.set_title(title(rest))
        ax.grid(axis="y", alpha=0.3)
    for ax in axes:
        ax.set_ylim(0, top * 1.12)
    axes[0].set_ylabel("R(final) (%)")
    unique: dict[str, Any] = {}
    for ax in axes:  # one entry per bar colour, from whichever panel has it
        for handle, name in zip(*ax.get_legend_handles_labels()):
            unique.setdefault(name, handle)
    fig.legend(unique.values(), unique.keys(), title=METHOD_AXIS if METHOD_AXIS in preset.axes
               else " / ".join(a for a in preset.axes if a != REFERENCE_AXIS),
               loc="outside right center", frameon=False)
    return _png(plt, fig)


def _bar_name(choices: Choices) -> str:
    """A bar's legend name: its method, or all its choices when the preset has no method axis."""
    method = dict(choices).get(METHOD_AXIS)
    return method if method is not None else label(choices)


def _png(plt: Any, fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


CEILING_TICKS = (0, 1, 2, 3, 5, 10, 20, 50, 100, 200, 500)


def ceiling_plot(preset: Preset, runs: Sequence[RunResult]) -> bytes:
    """Accuracy as a share of the dataset's ceiling from round 0 on: one row of panels per
    combination of the axes besides method and partition (the datasets), one panel per
    partition, one line per method; rounds on a scale linear to 5 and logarithmic after, so
    the first rounds, where the starts differ, are as wide as the rest."""
    plt = _pyplot()
    partitions = list(preset.axes.get(REFERENCE_AXIS, {"all": {}}))
    rows = list(dict.fromkeys(without(c, (METHOD_AXIS, REFERENCE_AXIS)) for c in combos(preset)))
    methods = list(preset.axes.get(METHOD_AXIS, {"all": {}}))
    colors = _colors(plt, methods)
    fig, axes = plt.subplots(len(rows), len(partitions), squeeze=False, sharey=True,
                             figsize=(3.3 * len(partitions), 2.7 * len(rows) + 0.6),
                             layout="constrained")
    fig.suptitle(f"{preset.name}: test accuracy as % of the centralised ceiling "
                 f"(mean over seeds; dashed: {100 * preset.ceiling_fraction:g}%)")
    cells = by_cell(runs)
    for i, rest in enumerate(rows):
        for j, partition in enumerate(partitions):
            ax = axes[i][j]
            for method in methods:
                chosen = {**dict(rest), METHOD_AXIS: method, REFERENCE_AXIS: partition}
                members = cells.get(tuple((a, chosen[a]) for a in preset.axes), [])
                if members:
                    mean, _ = mean_std([[100 * a / (r.target / preset.ceiling_fraction)
                                         for a in (r.start, *r.curve)] for r in members])
                    ax.plot(range(len(mean)), mean, color=colors[method], label=method,
                            linewidth=1.4)
            ax.axhline(100 * preset.ceiling_fraction, color="grey", linestyle="--", linewidth=1)
            ax.set_xscale("symlog", linthresh=5, linscale=1.5)
            horizon = max((len(line.get_xdata()) - 1 for line in ax.get_lines()), default=1)
            ax.set_xticks([t for t in CEILING_TICKS if t <= horizon])
            ax.xaxis.set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
            ax.set_title(label((*rest, (REFERENCE_AXIS, partition))), fontsize=9)
            ax.grid(alpha=0.3)
            if i == len(rows) - 1:
                ax.set_xlabel("round")
            if j == 0:
                ax.set_ylabel("% of ceiling")
    low = min((line.get_ydata().min() for ax in axes.flat for line in ax.get_lines()
               if len(line.get_ydata()) > 2), default=0.0)
    for ax in axes.flat:
        ax.set_ylim(max(0.0, min(low, 80.0) - 2), 103)
    drawn = {}  # every method drawn in any panel, in the preset's order
    for ax in axes.flat:
        drawn.update(zip(*reversed(ax.get_legend_handles_labels())))
    fig.legend([drawn[m] for m in methods if m in drawn], [m for m in methods if m in drawn],
               title=METHOD_AXIS, loc="outside right center", frameon=False)
    return _png(plt, fig)


def plots(preset: Preset, runs: Sequence[RunResult]) -> dict[str, bytes]:
    """curves.png always; the R(t) plots only where some run has its IID pair; ceiling.png
    when the preset measures runs against the centralised ceiling."""
    out = {"curves.png": curves_plot(preset, runs)}
    if REFERENCE_AXIS in preset.axes and any(r.relative for r in runs):
        out["relative.png"] = relative_plot(preset, runs)
        out["r_final.png"] = r_final_plot(preset, runs)
    if preset.ceiling_fraction is not None:
        out["ceiling.png"] = ceiling_plot(preset, runs)
    if any(r.domains for r in runs):
        out["domains.png"] = domains_plot(preset, runs)
    return out


def domains_plot(preset: Preset, runs: Sequence[RunResult]) -> bytes:
    """Grouped bars: x = domain, one bar per cell (method, partition, ...): the global model's
    final accuracy on each domain's test rows, mean ± std over seeds; the dotted line per cell
    is its accuracy on the union. Where a domain's bar falls short, that domain's clients are
    served worst."""
    import numpy as np

    plt = _pyplot()
    cells = {c: [r for r in members if r.domains] for c, members in by_cell(runs).items()}
    cells = {c: cells[c] for c in combos(preset) if cells.get(c)}
    names = list(dict.fromkeys(d for members in cells.values() for r in members for d in r.domains))
    colors = _colors(plt, [label(c) for c in cells])
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(names) * len(cells) ** 0.5 + 3), 4.2),
                           layout="constrained")
    width = 0.8 / len(cells)
    for i, (choices, members) in enumerate(cells.items()):
        values = [stat([100 * r.domains.get(d, math.nan) for r in members]) for d in names]
        x = np.arange(len(names)) + (i - (len(cells) - 1) / 2) * width
        ax.bar(x, [v.mean if v.mean is not None else 0.0 for v in values], width,
               yerr=[v.std or 0.0 for v in values], capsize=1.5, color=colors[label(choices)],
               label=label(choices))
        ax.axhline(100 * stat([r.final for r in members]).mean, color=colors[label(choices)],
                   linestyle=":", linewidth=1)
    ax.set_xticks(range(len(names)), names, rotation=30 if len(names) > 5 else 0, ha="right"
                  if len(names) > 5 else "center", fontsize=8)
    ax.set_ylabel("final accuracy (%)")
    ax.set_title(f"{preset.name}: accuracy per domain (mean ± std over seeds; dotted: all "
                 "domains)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.legend(loc="outside right center", frameon=False, fontsize=8)
    return _png(plt, fig)


# ---------------------------------------------------------------- writing


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write beside the destination, then rename: a reader sees the old file or the new one."""
    staging = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write_durably(staging, data)
    os.replace(staging, path)


def write_report(preset: Preset, specs: Sequence[RunSpec], results_root: Path, out_root: Path,
                 command: str, ceilings: Path = CEILING_FILE) -> Path:
    """Everything under out_root/<preset>/; returns report.md. ReportError if no run is done."""
    runs, missing = load_runs(preset, specs, results_root, ceilings)
    results_dir = preset.results_dir(results_root)
    if not runs:
        raise ReportError(f"preset {preset.name}: none of its {len(specs)} runs is done under "
                          f"{results_dir}; run `python -m ovalp_flwr.experiments.sweep {preset.path}` first")
    out_dir = out_root / preset.name
    out_dir.mkdir(parents=True, exist_ok=True)
    images = plots(preset, runs)
    for stale in set(PLOTS) - images.keys():  # a plot this report cannot make must not linger
        (out_dir / stale).unlink(missing_ok=True)
    for name, data in images.items():
        write_atomic(out_dir / name, data)
    personalization = personalized_runs(preset, runs, results_dir)
    if personalization:
        from ovalp_flwr.experiments import pft_report

        section, pft_images, pft_csv = pft_report.section(personalization)
        for name, data in pft_images.items():
            write_atomic(out_dir / name, data)
        write_atomic(out_dir / "personalization.csv", pft_csv)
    write_atomic(out_dir / "runs.csv", runs_csv(preset, runs))
    write_atomic(out_dir / "table.csv", table_csv(preset, runs))
    seeds = list(dict.fromkeys(s.seed for s in specs))
    text = markdown(preset, runs, missing, seeds, results_dir, command, list(images))
    if personalization:
        text = text.replace("\n## Plots\n", f"\n{section}\n## Plots\n", 1)
    write_atomic(out_dir / "report.md", text)
    return out_dir / "report.md"


def personalized_runs(preset: Preset, runs: Sequence[RunResult],
                      results_dir: Path) -> dict[Choices, list[dict]]:
    """The summaries of the runs that personalized, by cell (seeds pooled)."""
    cells: dict[Choices, list[dict]] = {}
    for run in runs:
        summary = read_summary(results_dir / run.spec.name)
        if "methods" in summary.get("personalization", {}):
            cells.setdefault(run.spec.choices, []).append(summary)
    return {cell: cells[cell] for cell in combos(preset) if cell in cells}


def report_run(run_dir: Path) -> int:
    """One run folder: its summary lines, and its accuracy plot redrawn (with R(t) when its IID
    twin is among its siblings)."""
    from ovalp_flwr.experiments.single_run import PLOT_FILE, iid_twin, plot_run, summary_lines

    try:
        summary = read_summary(run_dir)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    twin = iid_twin(run_dir.resolve().parent, summary)
    config = summary["config"]
    print(f"{run_dir}: {config['dataset']} ({config['encoder']}), {config['head']} "
          f"{config['schedule']}, partition {config['partition']}, seed {config['seed']}"
          f"{'; R(t) against its IID twin' if twin else ''}")
    print(summary_lines(summary, twin))
    write_durably(run_dir / PLOT_FILE, plot_run(summary, twin))
    print(run_dir / PLOT_FILE)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m ovalp_flwr.experiments.report",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("preset", type=Path,
                        help="conf/<name>.toml, or one run's folder (results/<run>) to summarise")
    parser.add_argument("--results-dir", type=Path, default=Path("results"),
                        help="where results/<preset>/ is (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("reports"),
                        help="the report goes to <out>/<preset>/ (default: %(default)s)")
    parser.add_argument("--ceilings", type=Path, default=CEILING_FILE,
                        help="the centralised ceilings a preset with ceiling-fraction is measured "
                             "against (benchmarks/centralised_ceiling.py writes them)")
    parser.add_argument("--seeds", type=int, nargs="+", help="default: the preset's")
    parser.add_argument("--only", action="append", default=[],
                        help="axis=choice[,choice] (repeatable): report the subset a sweep ran "
                             "with the same --only; the other choices are left out, not missing")
    args = parser.parse_args(args_list)
    if args.preset.is_dir():
        return report_run(args.preset)
    command = shlex.join(["python", "-m", "ovalp_flwr.experiments.report", *args_list])
    try:
        preset = load_preset(args.preset)
        specs = select(preset.runs(args.seeds), args.only)
        if not specs:
            raise ReportError(f"--only {' '.join(args.only)} leaves no run of {preset.name}")
        path = write_report(preset.restricted_to(specs), specs, args.results_dir, args.out, command,
                            args.ceilings)
    except (PresetError, ReportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
