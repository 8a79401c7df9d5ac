"""What a table cell holds: mean ± std over seeds, the metric columns and their formats.

Shared by the Markdown and CSV tables, the plots and the personalization section, so a
number is computed and rounded the same way wherever it appears.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ovalp_flwr.experiments.report.runs import Choices, RunResult
from ovalp_flwr.experiments.sweep import Preset

NO_STD = "—"


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
    """The statistic of the values there are: a missing pair (None) or NaN is skipped."""
    return Stat(tuple(float(v) for v in values if v is not None and not math.isnan(v)))


# ---------------------------------------------------------------- names and formats


def label(choices: Choices) -> str:
    """A row's or legend entry's name: its choices, comma-separated."""
    return ", ".join(c for _, c in choices) or "all runs"


def title(choices: Choices) -> str:
    """A panel's title names its axes: `method = ova-lp, noise = sym-0.3`."""
    return ", ".join(f"{a} = {c}" for a, c in choices)


def pct(x: float) -> str:
    """Accuracies, R and rates in percent, to two decimals."""
    return f"{x:.2f}"


def num(x: float) -> str:
    """Costs span 1e-3 s to 1e4 s and kB to GB: about three significant digits, no exponent."""
    size = abs(x)
    return f"{x:.0f}" if size >= 100 else f"{x:.1f}" if size >= 10 else (
        f"{x:.2f}" if size >= 1 else f"{x:.3f}")


def rnd(x: float) -> str:
    """Rounds: a mean over seeds falls between them, so one decimal."""
    return f"{x:.1f}"


# ---------------------------------------------------------------- metric columns

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


def validated(key: str, scale: float = 1.0) -> Callable[[RunResult], float | None]:
    """A run's `validation[key]` times `scale`; None for a run that held no rows back."""
    return lambda r: None if r.validation is None else scale * r.validation[key]


# what the validation rows say, for runs that held some back: what choices are made on
VALIDATION_METRICS: dict[str, Metric] = {
    "val_final": ("Final val. acc. (%)", validated("final", 100), pct),
    "final": METRICS["final"],
    "best_val_round": ("Best round on val.", validated("best_round"), rnd),
    "test_at_best_val": ("Test acc. there (%)", validated("test_at_best", 100), pct),
}
VALIDATION_TABLE = tuple(VALIDATION_METRICS)


TARGET_BYTES = "megabytes_to_target"
SPEED_ROUNDS = (0, 1, 2, 3, 5)  # accuracy at these rounds: how fast a method starts


def target_title(preset: Preset) -> str:
    """The target's name in column titles: a fixed accuracy or a share of the ceiling."""
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
    """The metric over a cell's runs (its seeds)."""
    return stat([metric[1](r) for r in runs])


def cell_text(runs: Sequence[RunResult], name: str, metric: Metric) -> str:
    """The cell as shown; "never" where no run reached the target accuracy."""
    values = cell_stat(runs, metric)
    if name in (TARGET, TARGET_BYTES) and runs and values.n == 0:
        return NEVER
    return values.text(metric[2], len(runs))
