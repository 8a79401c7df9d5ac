"""report.md: a list of sections, each a function of what the report knows (`Context`)
that returns its Markdown, or "" where it has nothing to show for this preset.

A section is included by being in `SECTIONS` and decides for itself whether it applies (the
personalization section: when some run personalized), so no section edits another's text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from ovalp_flwr.experiments.report import personalization
from ovalp_flwr.experiments.report.cells import SPEED_TABLE, TARGET, VALIDATION_TABLE, metrics
from ovalp_flwr.experiments.report.runs import (METHOD_AXIS, NOISE_AXIS, Choices, RunResult,
                                                by_cell)
from ovalp_flwr.experiments.report.tables import (WORST_OF, coverage, domain_table, main_table,
                                                  noise_tables, pivots, worst_over_partitions)
from ovalp_flwr.experiments.sweep import REFERENCE_AXIS, REFERENCE_CHOICE, Preset


@dataclass(frozen=True)
class Context:
    """What the sections draw on: the preset, its runs and how the report was made."""

    preset: Preset
    runs: list[RunResult]
    missing: list[tuple[str, str]]  # (run name, why it does not count)
    seeds: Sequence[int]
    results_dir: Path
    command: str
    plots: Sequence[str]  # the figures made, linked under *Plots*
    personalized: dict[Choices, list[dict[str, Any]]] = field(default_factory=dict)

    @cached_property
    def cells(self) -> dict[Choices, list[RunResult]]:
        """The runs by cell, grouped once for every section."""
        return by_cell(self.runs)


Section = Callable[[Context], str]


def markdown(context: Context) -> str:
    """The sections that apply, in order, a blank line between them."""
    return "\n".join(text for section in SECTIONS if (text := section(context)))


# ---------------------------------------------------------------- sections


def heading(ctx: Context) -> str:
    return f"# {ctx.preset.name}\n\n{ctx.preset.description}\n"


def provenance(ctx: Context) -> str:
    """The command and folder it was made from, and how complete the runs are."""
    total = len(ctx.runs) + len(ctx.missing)
    return (f"Made by `{ctx.command}` from `{ctx.results_dir}`: {len(ctx.runs)} of {total} runs "
            f"found.\n\n{coverage(ctx.preset, ctx.cells, ctx.seeds)}\n")


def definitions(ctx: Context) -> str:
    """The definitions the tables below use: the target's only with one, decline with noise."""
    noise = NOISE_DEFINITION if NOISE_AXIS in ctx.preset.axes else ""
    return ("## Definitions\n\n" + DEFINITIONS + target_definition(ctx.preset, ctx.runs)
            + noise)


def speed(ctx: Context) -> str:
    if ctx.preset.ceiling_fraction is None:
        return ""
    return "## Speed to the ceiling\n\n" + main_table(ctx.preset, ctx.cells, SPEED_TABLE)


def all_cells(ctx: Context) -> str:
    return "## All cells\n\n" + main_table(ctx.preset, ctx.cells)


def validation(ctx: Context) -> str:
    """Where runs held validation rows back: their accuracy there, what a choice between the
    cells is made on, and the round it picks (the test split only scores)."""
    if not any(r.validation is not None for r in ctx.runs):
        return ""
    return ("## Validation rows\n\nWhat a choice between these cells is made on: the accuracy on "
            "the validation rows each run held back from its training split (`validation-fraction`)"
            ", beside the test accuracy that only scores it; the best round by validation "
            "accuracy and the test accuracy there.\n\n"
            + main_table(ctx.preset, ctx.cells, VALIDATION_TABLE))


def ablation(ctx: Context) -> str:
    """Method x partition pivots, for a preset with both axes."""
    preset, cells = ctx.preset, ctx.cells
    if METHOD_AXIS not in preset.axes or REFERENCE_AXIS not in preset.axes:
        return ""
    parts = []
    if set(preset.axes[REFERENCE_AXIS]) - {REFERENCE_CHOICE}:  # some R to show
        parts.append("## Ablation: R(final) (%)\n\n" + pivots(preset, cells, "r_final", False))
    parts.append("## Ablation: final accuracy (%)\n\n" + pivots(preset, cells, "final", True))
    if TARGET in metrics(preset):
        parts.append(f"## Ablation: {metrics(preset)[TARGET][0].lower()}\n\n"
                     + pivots(preset, cells, TARGET, True))
    if preset.ceiling_fraction is not None:
        parts.append("## Ablation: accuracy after round 1 (%)\n\n"
                     + pivots(preset, cells, "round_1", True))
    return "\n".join(parts)


def worst_partition(ctx: Context) -> str:
    """Whether a method holds on every partition, for a ceiling preset with both axes."""
    preset = ctx.preset
    if preset.ceiling_fraction is None or not {METHOD_AXIS, REFERENCE_AXIS} <= set(preset.axes):
        return ""
    return ("## Worst partition\n\nEach cell: the partition where the method does worst (mean "
            "over seeds), and which one it is; `k/N`: only k of the N partitions have runs yet."
            "\n\n" + "\n".join(f"### {metrics(preset)[name][0]}\n\n"
                                + worst_over_partitions(preset, ctx.cells, name)
                                for name in WORST_OF))


def label_noise(ctx: Context) -> str:
    if NOISE_AXIS not in ctx.preset.axes:
        return ""
    return "## Label noise\n\n" + noise_tables(ctx.preset, ctx.runs)


def per_domain(ctx: Context) -> str:
    if not any(r.domains for r in ctx.runs):
        return ""
    return "## Per domain: final accuracy (%)\n\n" + domain_table(ctx.preset, ctx.cells)


def personalization_section(ctx: Context) -> str:
    """After federation, for presets whose runs personalized."""
    return personalization.markdown(ctx.personalized) if ctx.personalized else ""


def plot_links(ctx: Context) -> str:
    return "## Plots\n\n" + "".join(f"![{p}]({p})\n" for p in ctx.plots)


def file_list(ctx: Context) -> str:
    return ("## Files\n\n- `runs.csv`: one row per run\n- `table.csv`: the table *All cells* "
            "with mean and std in separate columns\n")


def missing_runs(ctx: Context) -> str:
    """The runs not counted and why, so a report made mid-sweep says what it lacks."""
    if not ctx.missing:
        return ""
    return (f"## Missing runs ({len(ctx.missing)})\n\n"
            + "".join(f"- `{name}`: {why}\n" for name, why in ctx.missing))


SECTIONS: tuple[Section, ...] = (heading, provenance, definitions, speed, all_cells, validation,
                                 ablation, worst_partition, label_noise, per_domain,
                                 personalization_section, plot_links, file_list, missing_runs)


# ---------------------------------------------------------------- definitions


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
- **Ceiling** = the test accuracy of a logistic regression fitted on all training features in
  one place, L2 and the kind (multinomial or one-vs-rest) chosen on a held-out tenth
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
    """The target's definition: a fixed accuracy, or a share of each dataset's ceiling (named
    with its value, so the report says which bar it used)."""
    if preset.ceiling_fraction is not None:
        bars = {}
        for run in runs:
            config = run.spec.config
            bars[f"{config.dataset} / {config.encoder}"] = run.target / preset.ceiling_fraction
        ceilings = ", ".join(f"{case} {100 * value:.2f}%" for case, value in bars.items())
        return CEILING_DEFINITION.format(share=f"{100 * preset.ceiling_fraction:g}",
                                         ceilings=ceilings)
    target = preset.target_accuracy
    return "" if target is None else TARGET_DEFINITION.format(target=f"{100 * target:g}")
