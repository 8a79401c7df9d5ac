"""The report's tables: Markdown for report.md, CSV for runs.csv and table.csv.

Each table is a function of the preset and its runs (grouped by cell), so the document
decides which tables it shows and these decide only how one looks.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Sequence
from typing import Any

from ovalp_flwr.experiments.report.cells import (NEVER, SPEED_ROUNDS, TARGET, TARGET_BYTES,
                                                 VALIDATION_METRICS, cell_stat, cell_text, label, metrics, pct,
                                                 stat, title)
from ovalp_flwr.experiments.report.runs import (CLEAN_CHOICE, METHOD_AXIS, NOISE_AXIS, Choices,
                                                RunResult, by_cell, combos, without)
from ovalp_flwr.experiments.sweep import REFERENCE_AXIS, REFERENCE_CHOICE, Preset


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
    every = {**VALIDATION_METRICS, **metrics(preset)}
    columns = {n: every[n] for n in (names or [n for n in metrics(preset)
                                               if not n.startswith("round_")])}
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
    if CLEAN_CHOICE not in preset.axes[NOISE_AXIS]:
        return (f"The noise axis has no `{CLEAN_CHOICE}` choice, so there is nothing to measure "
                "a decline against.\n")
    return (f"Decline rate (%) of final accuracy against `{NOISE_AXIS} = {CLEAN_CHOICE}`:\n\n"
            f"{_decline_table(preset, runs)}\nLabel noise asked for and realised (share of "
            f"training labels changed, from `summary.json` `label_noise.realised_rate`):\n\n"
            f"{_realised_table(preset, runs)}")


def _decline_table(preset: Preset, runs: Sequence[RunResult]) -> str:
    """Rows: the other axes' combinations; columns: each noisy choice's decline."""
    noisy = [n for n in preset.axes[NOISE_AXIS] if n != CLEAN_CHOICE]
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
    return md_table([*others, *(f"{n} decline (%)" for n in noisy)], rows, len(others))


def _realised_table(preset: Preset, runs: Sequence[RunResult]) -> str:
    """Per noise choice, the rate asked for against the share of labels the runs changed."""
    rows = []
    for choice in preset.axes[NOISE_AXIS]:
        members = [r for r in runs if dict(r.spec.choices)[NOISE_AXIS] == choice]
        overrides = preset.axes[NOISE_AXIS][choice]
        asked = 100 * float(overrides.get("noise-rate", 0.0))
        realised = stat([None if r.realised_noise is None else 100 * r.realised_noise
                         for r in members])
        rows.append([choice, str(overrides.get("label-noise", "none")), pct(asked),
                     realised.text(pct, len(members)), str(len(members))])
    return md_table(["noise", "kind", "asked rate (%)", "realised rate (%)", "runs"], rows, 2)


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
    """CSV text, an absent value (None) as an empty field so spreadsheets read it as blank."""
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
    """The table *All cells* with mean and std in separate columns, unrounded, to compute on."""
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
