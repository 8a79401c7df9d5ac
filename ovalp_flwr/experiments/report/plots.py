"""The report's figures: accuracy curves, R(t), R(final) bars, share of the ceiling, domains.

Each plot is a function of the preset and its runs that returns PNG bytes, so the writer
decides where they go. matplotlib is imported only when a figure is drawn (`pyplot`): it
takes about a second, which a report of tables, a test or `--help` need not pay.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ovalp_flwr.experiments.report.cells import label, stat, title
from ovalp_flwr.experiments.report.runs import (METHOD_AXIS, Choices, RunResult, by_cell, combos,
                                                without)
from ovalp_flwr.experiments.sweep import REFERENCE_AXIS, REFERENCE_CHOICE, Preset

PLOTS = ("curves.png", "relative.png", "r_final.png", "ceiling.png", "domains.png")


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display); imported here, not at the top,
    to keep it out of start-up."""
    import matplotlib  # late: matplotlib takes ~1 s to import; only plots need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # late: after the Agg backend is set

    return plt


def png(plt: Any, fig: Any) -> bytes:
    """The figure as PNG bytes, closed so a report of many figures does not hold them all."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


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


def mean_std(curves: Sequence[Sequence[float]]) -> tuple[Any, Any]:
    """Round-wise mean and std (ddof=1; zeros with one curve) over the rounds all curves have."""
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
    """One colour per name, the same in every panel of a figure."""
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


def curves_plot(preset: Preset, runs: Sequence[RunResult]) -> bytes:
    """Accuracy vs round: IID and each non-IID partition per panel (per method), or one line
    per combination when the preset has no partition axis."""
    plt = pyplot()
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
    return png(plt, fig)


def relative_plot(preset: Preset, runs: Sequence[RunResult]) -> bytes:
    """R(t) per non-IID partition, one panel per method (or other-axes combination). The
    y-range follows the mean curves: early rounds' ratios of two small accuracies swing wide."""
    plt = pyplot()
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
    return png(plt, fig)


def r_final_plot(preset: Preset, runs: Sequence[RunResult]) -> bytes:
    """Grouped bars: x = non-IID partition, one bar per method; one panel per combination of
    the other axes (a dataset each, say), so a bar group stays readable. Values are written
    above the error bars while a panel holds few enough bars to read them."""
    plt = pyplot()
    partitions = [p for p in preset.axes[REFERENCE_AXIS] if p != REFERENCE_CHOICE]
    groups = {k: v for k, v in panels(preset, runs).items() if any(r.relative for r in v)}
    by_panel: dict[Choices, dict[Choices, list[RunResult]]] = {}
    for key, members in groups.items():
        by_panel.setdefault(without(key, (METHOD_AXIS,)), {})[key] = members
    colors = _colors(plt, list(dict.fromkeys(_bar_name(key) for key in groups)))
    fig, axes = _grid(plt, len(by_panel),
                      f"{preset.name}: R(final) per partition (mean ± std over seeds; IID = 100%)")
    top = 100.0
    for ax, (rest, bars) in zip(axes, by_panel.items()):
        top = max(top, _r_final_bars(ax, bars, partitions, colors))
        ax.axhline(100.0, color="grey", linestyle="--", linewidth=1)
        ax.set_xticks(range(len(partitions)), partitions, fontsize=8)
        ax.set_title(title(rest))
        ax.grid(axis="y", alpha=0.3)
    for ax in axes:
        ax.set_ylim(0, top * 1.12)
    axes[0].set_ylabel("R(final) (%)")
    _bar_legend(fig, axes, METHOD_AXIS if METHOD_AXIS in preset.axes
                else " / ".join(a for a in preset.axes if a != REFERENCE_AXIS))
    return png(plt, fig)


def _r_final_bars(ax: Any, bars: dict[Choices, list[RunResult]], partitions: Sequence[str],
                  colors: dict[str, Any]) -> float:
    """One panel's bars, a group per partition; returns the highest error bar's top, so every
    panel gets the same y-range."""
    width, written = 0.8 / len(bars), len(bars) * len(partitions) <= 24
    top = 0.0
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
    return top


def _bar_legend(fig: Any, axes: list[Any], legend_title: str) -> None:
    """One legend entry per bar colour, from whichever panel has it (no panel has them all)."""
    unique: dict[str, Any] = {}
    for ax in axes:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            unique.setdefault(name, handle)
    fig.legend(unique.values(), unique.keys(), title=legend_title, loc="outside right center",
               frameon=False)


def _bar_name(choices: Choices) -> str:
    """A bar's legend name: its method, or all its choices when the preset has no method axis."""
    method = dict(choices).get(METHOD_AXIS)
    return method if method is not None else label(choices)


CEILING_TICKS = (0, 1, 2, 3, 5, 10, 20, 50, 100, 200, 500)


def ceiling_plot(preset: Preset, runs: Sequence[RunResult]) -> bytes:
    """Accuracy as a share of the dataset's ceiling from round 0 on: one row of panels per
    combination of the axes besides method and partition (the datasets), one panel per
    partition, one line per method; rounds on a scale linear to 5 and logarithmic after, so
    the first rounds, where the starts differ, are as wide as the rest."""
    plt = pyplot()
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
                    _ceiling_line(ax, preset, members, color=colors[method], label=method)
            _ceiling_axes(plt, ax, preset, label((*rest, (REFERENCE_AXIS, partition))))
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
    return png(plt, fig)


def _ceiling_line(ax: Any, preset: Preset, members: Sequence[RunResult], **style: Any) -> None:
    """A cell's mean accuracy from round 0 as % of its dataset's ceiling (the target over the
    preset's share of it)."""
    mean, _ = mean_std([[100 * a / (r.target / preset.ceiling_fraction)
                         for a in (r.start, *r.curve)] for r in members])
    ax.plot(range(len(mean)), mean, linewidth=1.4, **style)


def _ceiling_axes(plt: Any, ax: Any, preset: Preset, panel_title: str) -> None:
    """The target's dashed line and a round axis linear to 5, logarithmic after, with plain
    numbers for ticks up to the longest line."""
    ax.axhline(100 * preset.ceiling_fraction, color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("symlog", linthresh=5, linscale=1.5)
    horizon = max((len(line.get_xdata()) - 1 for line in ax.get_lines()), default=1)
    ax.set_xticks([t for t in CEILING_TICKS if t <= horizon])
    ax.xaxis.set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
    ax.set_title(panel_title, fontsize=9)
    ax.grid(alpha=0.3)


def domains_plot(preset: Preset, runs: Sequence[RunResult]) -> bytes:
    """Grouped bars: x = domain, one bar per cell (method, partition, ...): the global model's
    final accuracy on each domain's test rows, mean ± std over seeds; the dotted line per cell
    is its accuracy on the union. Where a domain's bar falls short, that domain's clients are
    served worst."""
    plt = pyplot()
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
    return png(plt, fig)
