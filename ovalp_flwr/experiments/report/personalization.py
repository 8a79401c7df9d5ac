"""The personalization section of a preset's report (runs with `personalize`): the study's
Table-2-style table (mean ± std over seeds), the distortion-vs-Global plot and the PFT-epoch
curves, and `personalization.csv`.

It reads the runs' summaries, not `RunResult`s: what personalization measured (per method,
per PFT epoch) is only there. The document includes it when some run personalized.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ovalp_flwr.experiments.report.cells import label, stat
from ovalp_flwr.experiments.report.plots import png, pyplot
from ovalp_flwr.experiments.report.runs import Choices
from ovalp_flwr.personalize.metrics import METRIC_NAMES

Runs = dict[Choices, list[dict[str, Any]]]  # cell (axis choices) -> the seeds' summaries
COLUMNS = ("local", "global", "c_std", "worst", "average", "distortion")
PLOTS = ("distortion_vs_global.png", "pft_epochs.png")


def methods_of(runs: Runs) -> list[str]:
    """The methods in run order, the global model first."""
    names: dict[str, None] = {}
    for summaries in runs.values():
        for summary in summaries:
            names.update(dict.fromkeys(summary["personalization"]["methods"]))
    return list(names)


def values(summaries: list[dict], method: str, column: str) -> list[float]:
    """One value per seed, in percent (Δ as it is: an L2 distance in feature units)."""
    scale = 1.0 if column == "distortion" else 100.0
    return [s["personalization"]["methods"][method]["summary"][column] * scale
            for s in summaries if method in s["personalization"]["methods"]]


def cell_text(xs: Sequence[float], decimals: int) -> str:
    """`mean ± std` over the seeds (the report's `Stat`)."""
    return stat(xs).text(lambda x: f"{x:.{decimals}f}")


def table(runs: Runs) -> str:
    """Rows: each cell's methods; columns: the study's metrics (%) and Δ."""
    header = ["federation", "method", "seeds", *(METRIC_NAMES[c] + ("" if c == "distortion"
                                                                   else " (%)") for c in COLUMNS)]
    lines = [header, ["---", "---", "---:", *("---:" for _ in COLUMNS)]]
    for cell, summaries in runs.items():
        for method in methods_of({cell: summaries}):
            lines.append([label(cell), method, str(len(values(summaries, method, "local"))),
                          *(cell_text(values(summaries, method, c), 2 if c == "distortion" else 1)
                            for c in COLUMNS)])
    return "\n".join("| " + " | ".join(line) + " |" for line in lines) + "\n"


def table_csv(runs: Runs) -> str:
    """`personalization.csv`: the table unrounded, mean and std apart (a federation's commas
    become semicolons so it stays one field)."""
    rows = ["federation,method,seeds," + ",".join(f"{c}_mean,{c}_std" for c in COLUMNS)]
    for cell, summaries in runs.items():
        for method in methods_of({cell: summaries}):
            stats = [stat(values(summaries, method, c)) for c in COLUMNS]
            rows.append(",".join([label(cell).replace(",", ";"), method,
                                  str(len(values(summaries, method, "local"))),
                                  *(f"{x.mean:.6g},{'' if x.std is None else f'{x.std:.6g}'}"
                                    for x in stats)]))
    return "\n".join(rows) + "\n"


def versus_global(runs: Runs) -> str:
    """Each method against the global model it started from, in points: what it buys in Local
    and what it costs in Global (mean over seeds of the per-seed differences)."""
    lines = ["| federation | method | Local gain (points) | Global change (points) | "
             "Average change (points) |", "|---|---|---:|---:|---:|"]
    for cell, summaries in runs.items():
        for method in methods_of({cell: summaries})[1:]:
            diffs = {c: [100 * (s["personalization"]["methods"][method]["summary"][c]
                                - s["personalization"]["methods"]["global"]["summary"][c])
                         for s in summaries if method in s["personalization"]["methods"]]
                     for c in ("local", "global", "average")}
            lines.append(f"| {label(cell)} | {method} | "
                         + " | ".join(cell_text(diffs[c], 1) for c in ("local", "global", "average"))
                         + " |")
    return "\n".join(lines) + "\n"


def paired(runs: Runs, method: str, baseline: str) -> str:
    """`method` − `baseline` per seed (same federation, same seed), on Global, Average and
    Local: the study's question of LP-FT against FT."""
    lines = [f"| federation | seeds | Global (points) | Average (points) | Local (points) |",
             "|---|---:|---:|---:|---:|"]
    for cell, summaries in runs.items():
        both = [s["personalization"]["methods"] for s in summaries
                if {method, baseline} <= s["personalization"]["methods"].keys()]
        if not both:
            continue
        diffs = {c: [100 * (m[method]["summary"][c] - m[baseline]["summary"][c]) for m in both]
                 for c in ("global", "average", "local")}
        lines.append(f"| {label(cell)} | {len(both)} | "
                     + " | ".join(cell_text(diffs[c], 1) for c in ("global", "average", "local"))
                     + " |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def distortion_plot(runs: Runs) -> bytes:
    """Global accuracy against feature distortion, one point per method (mean ± std over
    seeds), one panel per federation: the study's Figure, where less distortion keeps more."""
    plt = pyplot()
    methods = methods_of(runs)
    cmap = plt.get_cmap("tab10")
    fig, axes = _panels(plt, len(runs))
    for ax, (cell, summaries) in zip(axes, runs.items()):
        for i, method in enumerate(methods):
            xs, ys = values(summaries, method, "distortion"), values(summaries, method, "global")
            if not xs:
                continue
            x, y = stat(xs), stat(ys)
            ax.errorbar(x.mean, y.mean, xerr=x.std or 0, yerr=y.std or 0, fmt="o", color=cmap(i % 10),
                        label=method, capsize=3, markersize=7)
        ax.set_title(label(cell))
        ax.set_xlabel("feature distortion Δ (mean L2, global vs personalized)")
    return _finish(plt, fig, axes, "Global accuracy (%)",
                   "Global accuracy vs feature distortion after personalization")


def epochs_plot(runs: Runs) -> bytes:
    """Local (solid, every epoch) and Global (dashed, at the curve epochs and the last) against
    the PFT epoch, from the global model's values at epoch 0: the study's overfitting curve."""
    plt = pyplot()
    methods = [m for m in methods_of(runs)[1:]
               if all(len(s["personalization"]["methods"][m]["curve"]["local"]) > 1
                      for ss in runs.values() for s in ss if m in s["personalization"]["methods"])]
    cmap = plt.get_cmap("tab10")
    fig, axes = _panels(plt, len(runs))
    for ax, (cell, summaries) in zip(axes, runs.items()):
        for method in methods:
            color = cmap((methods_of(runs).index(method)) % 10)
            local = _mean_curve([[s["personalization"]["methods"]["global"]["summary"]["local"],
                                  *s["personalization"]["methods"][method]["curve"]["local"]]
                                 for s in summaries])
            ax.plot(range(len(local)), local, color=color, label=method)
            epochs, global_ = _global_curve(summaries, method)
            ax.plot(epochs, global_, "--o", color=color, markersize=3)
        ax.set_title(label(cell))
        ax.set_xlabel("PFT epoch")
    return _finish(plt, fig, axes, "accuracy (%): Local solid, Global dashed",
                   "Local and Global accuracy during personalization (mean over seeds)")


def _panels(plt: Any, n: int) -> tuple[Any, list[Any]]:
    """One panel per cell (federation, partition), three to a row, sharing y."""
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols + 1.6, 4.0 * rows + 0.4),
                             sharey=True, squeeze=False, layout="constrained")
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat)[:n]


def _finish(plt: Any, fig: Any, axes: list[Any], ylabel: str, heading: str) -> bytes:
    """Grids, the y label, one legend right of the panels, the title; the PNG."""
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_subplotspec().is_first_col():
            ax.set_ylabel(ylabel)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, title="method", loc="outside right center", frameon=False)
    fig.suptitle(heading)
    return png(plt, fig)


def _mean_curve(curves: list[list[float]]) -> list[float]:
    """The seeds' mean in percent, over the epochs every seed has."""
    length = min(len(c) for c in curves)
    return [100 * sum(c[e] for c in curves) / len(curves) for e in range(length)]


def _global_curve(summaries: list[dict], method: str) -> tuple[list[int], list[float]]:
    """Epoch 0 (the global model), the snapshot epochs, and the last epoch (the table's)."""
    points: dict[int, list[float]] = {}
    for s in summaries:
        result = s["personalization"]["methods"][method]
        last = s["config"]["pft-epochs"]
        found = {0: s["personalization"]["methods"]["global"]["summary"]["global"],
                 **{int(e): g for e, g in result["curve"]["global"].items()},
                 last: result["summary"]["global"]}
        for epoch, value in found.items():
            points.setdefault(epoch, []).append(value)
    epochs = sorted(points)
    return epochs, [100 * sum(points[e]) / len(points[e]) for e in epochs]


def markdown(runs: Runs) -> str:
    """The report's section: what personalization is, its tables, and its plots' links."""
    return ("## Personalization\n\n" + DEFINITIONS + "\n### Table (mean ± std over seeds)\n\n"
            + table(runs) + "\n### Against the global model\n\n" + versus_global(runs)
            + _subsection("LP-FT against FT (paired by seed)", paired(runs, "lp-ft", "ft"))
            + "\n" + "".join(f"![{p}]({p})\n" for p in PLOTS))


def files(runs: Runs) -> dict[str, bytes | str]:
    """The files the section links or names: its two plots and `personalization.csv`."""
    return {PLOTS[0]: distortion_plot(runs), PLOTS[1]: epochs_plot(runs),
            "personalization.csv": table_csv(runs)}


def _subsection(heading: str, body: str) -> str:
    """A `###` block, left out when it has nothing to say (no run has both methods)."""
    return f"\n### {heading}\n\n{body}" if body else ""


DEFINITIONS = """After the last federated round every client fine-tunes the final global model on
its own training rows (`pft-epochs` epochs), once; `global` is the federated model itself.
Each client holds a test split drawn from the test set with its own training classes'
proportions, from its own domain(s) on multi-domain data (its corruption, camera, digit style
or concept). Local: a client's model on its own split, averaged over clients. Global: a
client's model on the other clients' splits (mean over them), averaged over clients. C-Std
and Worst: the standard deviation and the minimum of the Local accuracies. Average: the
mean of Local and Global. Δ: mean L2 distance between the personalized and the global
model's features (the adapter's output) over all clients' test rows; 0 where the features
do not move (LP, own-heads, the global model).
"""
