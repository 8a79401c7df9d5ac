"""A preset's finished runs as the numbers a report needs, paired for R(t) and decline.

Loading is apart from what is made of the runs (tables, plots) so each of those reads one
`RunResult` list and none reads `summary.json` itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ovalp_flwr.experiments.ceiling import CEILING_FILE, CeilingError, ceiling
from ovalp_flwr.experiments.sweep import Preset, RunSpec, config_mismatch
from ovalp_flwr.federation.metrics import (acc_at, bytes_through, cost_to_round, first_round_at,
                                           relative_curve, start_and_rounds)
from ovalp_flwr.federation.results import read_summary

METHOD_AXIS, NOISE_AXIS, CLEAN_CHOICE = "method", "noise", "none"

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
    validation: dict[str, Any] | None = None  # summary["validation"] and the round it picks

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


# ---------------------------------------------------------------- reading and pairing runs


def load_runs(preset: Preset, specs: Sequence[RunSpec], results_root: Path,
              ceilings: Path = CEILING_FILE) -> tuple[list[RunResult], list[tuple[str, str]]]:
    """The finished runs, paired for R(t) and decline, and (name, why) for every other one."""
    found, missing = [], []
    horizon = max(spec.config.num_server_rounds for spec in specs)
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
    config = spec.config
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
                     domains=summary.get("domain_accuracy", {}).get("final"),
                     validation=validation_of(summary))


def validation_of(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The validation rows' final accuracy, the round they pick and its test accuracy; None
    for a run that held no rows back."""
    if "validation" not in summary:
        return None
    return {"final": summary["validation"]["final_accuracy"],
            "best_round": summary["best_val_round"],
            "test_at_best": summary["accuracy_at_best_val_round"]}


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


def personalized_runs(preset: Preset, runs: Sequence[RunResult],
                      results_dir: Path) -> dict[Choices, list[dict[str, Any]]]:
    """The summaries of the runs that personalized, by cell (seeds pooled): the
    personalization section reads what `RunResult` does not keep."""
    cells: dict[Choices, list[dict[str, Any]]] = {}
    for run in runs:
        summary = read_summary(results_dir / run.spec.name)
        if "methods" in summary.get("personalization", {}):
            cells.setdefault(run.spec.choices, []).append(summary)
    return {cell: cells[cell] for cell in combos(preset) if cell in cells}


# ---------------------------------------------------------------- cells


def combos(preset: Preset) -> list[Choices]:
    """Every choice combination, in the preset's order: the rows of every table."""
    return [spec.choices for spec in preset.runs([0])]


def by_cell(runs: Sequence[RunResult]) -> dict[Choices, list[RunResult]]:
    """The runs of each choice combination (its seeds), the unit a cell averages over."""
    cells: dict[Choices, list[RunResult]] = {}
    for run in runs:
        cells.setdefault(run.spec.choices, []).append(run)
    return cells


def without(choices: Choices, axes: Sequence[str]) -> Choices:
    """The choices but those of `axes`: the key of a pivot block or a plot panel."""
    return tuple((a, c) for a, c in choices if a not in axes)

