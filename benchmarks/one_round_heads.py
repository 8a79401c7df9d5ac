"""The one-round heads of docs/closed-form-starts.md, from the presets' run folders: each head
alone (round 0, the start), after round 1 and after the last of OvA-LP's rounds from it where
the preset has rounds, and the bytes one client sends for it; mean ± std over the seeds found
(runs not yet made are left out, and counted); rounds 1, 5 and the last where there are. `--front`: the front over both presets, one
row per (dataset, head): its bytes, its accuracy on our partitions and on FedCOF's protocol,
its share of the dataset's centralised ceiling, whether it is the most accurate head at its
budget, and the median wall time of its run (set-up and head, 100 clients in one process); the README's table of the best head at each budget; and the plot of it
(benchmarks/results/one_round_heads_front.png).

    python benchmarks/one_round_heads.py conf/one-round-heads-digits.toml
    python benchmarks/one_round_heads.py conf/one-round-heads.toml
    python benchmarks/one_round_heads.py conf/one-round-heads-rounds.toml
    python benchmarks/one_round_heads.py --front
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ovalp_flwr.experiments.ceiling import ceiling
from ovalp_flwr.experiments.report.plots import png, pyplot
from ovalp_flwr.experiments.sweep import load_preset

ROOT = Path(__file__).resolve().parents[1]
PRESETS = (ROOT / "conf" / "one-round-heads-digits.toml", ROOT / "conf" / "one-round-heads.toml")
FRONT_PLOT = ROOT / "benchmarks" / "results" / "one_round_heads_front.png"
THEIR_PROTOCOL = "fedcof-dirichlet"  # FedCOF's: 100 clients, Dirichlet α = 0.1; the rest are ours
DATASETS = ("digits", "cifar10", "mnist", "ag-news", "tinyimagenet-100")
HEADS = {"fedncm": "FedNCM", "fedcof": "FedCOF", "low-rank-10": "ours, low-rank r = 10",
         "low-rank-50": "ours, low-rank r = 50", "fed3r": "Fed3R", "lda": "GH-OFL LDA",
         "ridge": "ours, ridge (λ 0.2)", "ridge-auto": "ours, ridge (λ on validation)",
         "auto": "ours, auto (ridge or LDA on validation)"}
OURS = ("low-rank-10", "low-rank-50", "ridge", "ridge-auto", "auto")


def cells(preset_path: Path, results_root: Path) -> tuple[list[str], dict[tuple, list[dict]]]:
    """The preset's axes, and (its choices but the seed) -> the summaries found of its seeds."""
    preset = load_preset(preset_path)
    found: dict[tuple, list[dict]] = defaultdict(list)
    for spec in preset.runs():
        path = preset.results_dir(results_root) / spec.name / "summary.json"
        if path.exists():
            found[tuple(choice for _, choice in spec.choices)].append(json.loads(path.read_text()))
    return list(preset.axes), found


def mean_std(values: list[float]) -> str:
    return f"{100 * np.mean(values):.2f} ± {100 * np.std(values, ddof=1):.2f}" if len(values) > 1 \
        else f"{100 * values[0]:.2f}"


def accuracy_at(summary: dict, round_number: int) -> float:
    return summary["initial_accuracy"] if round_number == 0 else \
        summary["rounds"][round_number - 1]["accuracy"]


def table(preset_path: Path, results_root: Path = ROOT / "results") -> str:
    axes, found = cells(preset_path, results_root)
    last = max((len(summary["rounds"]) for runs in found.values() for summary in runs), default=0)
    shown = [r for r in (1, 5) if r < last] + ([last] if last else [])
    scores = ["round 0 (the head) (%)", *(f"round {r} (%)" for r in shown)]
    lines = ["| " + " | ".join([*axes, *scores, "kB a client sends for it", "seeds"]) + " |",
             "|" + "---|" * len(axes) + "---:|" * (len(scores) + 2)]
    for choices, runs in found.items():
        values = [[accuracy_at(r, n) for r in runs] for n in (0, *shown)]
        sent = np.mean([r["head_init"]["statistics_bytes_per_client"] for r in runs]) / 1e3
        lines.append("| " + " | ".join([*choices, *map(mean_std, values), f"{sent:,.1f}",
                                        str(len(runs))]) + " |")
    return "\n".join(lines)


def wide_table(preset_path: Path, rounds: tuple[int, ...] = (0,),
               results_root: Path = ROOT / "results") -> str:
    """One row per (dataset, method), one column per partition: the head (round 0) as mean ±
    std over the seeds, or with more rounds their means joined by arrows (round 0 → 1 → …)."""
    axes, found = cells(preset_path, results_root)
    where = axes.index("partition")
    partitions = list(dict.fromkeys(choices[where] for choices in found))
    rows: dict[tuple, dict[str, list[dict]]] = defaultdict(dict)
    for choices, runs in found.items():
        rows[choices[:where] + choices[where + 1:]][choices[where]] = runs
    names = [a for a in axes if a != "partition"]
    what = "the head (%)" if rounds == (0,) else " → ".join(f"r{r}" for r in rounds) + " (%)"
    lines = [f"| {' | '.join(names)} | " + " | ".join(f"{p}: {what}" for p in partitions)
             + " | kB a client | seeds |", "|" + "---|" * len(names)
             + "---:|" * (len(partitions) + 2)]
    for key, by_partition in rows.items():
        runs = [r for runs in by_partition.values() for r in runs]
        columns = []
        for partition in partitions:
            here = by_partition.get(partition, [])
            scores = [[accuracy_at(r, n) for r in here] for n in rounds]
            columns.append("–" if not here else mean_std(scores[0]) if rounds == (0,)
                          else " → ".join(f"{100 * np.mean(s):.2f}" for s in scores))
        sent = runs[0]["head_init"]["statistics_bytes_per_client"] / 1e3
        seeds = min(len(v) for v in by_partition.values())
        lines.append(f"| {' | '.join(key)} | " + " | ".join(columns) + f" | {sent:,.1f} | {seeds} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ the front


@dataclass
class Head:
    """One head on one dataset: its round-0 accuracies on our partitions and on FedCOF's."""

    dataset: str
    method: str
    kilobytes: float = 0.0
    seconds: list[float] = field(default_factory=list)  # the whole run's (set-up and head)
    server_seconds: list[float] = field(default_factory=list)  # the server's, for the head
    ours: list[float] = field(default_factory=list)
    theirs: list[float] = field(default_factory=list)
    seeds: set[int] = field(default_factory=set)


def heads(presets=PRESETS, results_root: Path = ROOT / "results") -> list[Head]:
    """Every (dataset, head) with runs, in DATASETS' and HEADS' order."""
    found: dict[tuple[str, str], Head] = {}
    for preset_path in presets:
        preset = load_preset(preset_path)
        for spec in preset.runs():
            path = preset.results_dir(results_root) / spec.name / "summary.json"
            if not path.exists():
                continue
            summary = json.loads(path.read_text())
            dataset, method = spec.run_config["dataset"], spec.choice("method")
            head = found.setdefault((dataset, method), Head(dataset, method))
            head.kilobytes = summary["head_init"]["statistics_bytes_per_client"] / 1e3
            head.seconds.append(summary["total_seconds"])
            head.server_seconds.append(summary["head_init"]["server_seconds"])
            scores = head.theirs if spec.choice("partition") == THEIR_PROTOCOL else head.ours
            scores.append(summary["initial_accuracy"])
            head.seeds.add(spec.seed)
    return sorted(found.values(), key=lambda h: (DATASETS.index(h.dataset), list(HEADS).index(h.method)))


def on_front(head: Head, rivals: list[Head]) -> bool:
    """No head of its dataset that sends at most its bytes is more accurate on our partitions."""
    return not any(r.kilobytes <= head.kilobytes * 1.001 and np.mean(r.ours) > np.mean(head.ours)
                   for r in rivals if r.dataset == head.dataset)


def encoder_of(dataset: str) -> str:
    return "minilm" if dataset == "ag-news" else "efficientnet-lite0"


def front_table(found: list[Head]) -> str:
    lines = ["| dataset | head | kB a client | our partitions (%): mean, worst | FedCOF's "
             "protocol (%) | of the ceiling | best at its bytes | server (s) | run (s) | seeds |",
             "|---|---|---:|---:|---:|---:|:---:|---:|---:|---:|"]
    for head in found:
        top = ceiling(head.dataset, encoder_of(head.dataset))
        theirs = mean_std(head.theirs) if head.theirs else "–"
        lines.append(f"| {head.dataset} | {HEADS[head.method]} | {head.kilobytes:,.1f} | "
                     f"{100 * np.mean(head.ours):.2f}, {100 * min(head.ours):.2f} | {theirs} | "
                     f"{np.mean(head.ours) / top:.1%} | {'✓' if on_front(head, found) else ''} | "
                     f"{np.median(head.server_seconds):.2f} | {np.median(head.seconds):.0f} | "
                     f"{len(head.seeds)} |")
    return "\n".join(lines)


TIERS = {"class means": ("fedncm", "fedcof"), "+ 10 directions": ("low-rank-10",),
         "+ 50 directions": ("low-rank-50",),
         "the Gram": ("fed3r", "lda", "ridge", "ridge-auto", "auto")}
SHORT = {"fedncm": "FedNCM", "fedcof": "FedCOF", "fed3r": "Fed3R", "lda": "GH-OFL LDA",
         "low-rank-10": "ours", "low-rank-50": "ours", "ridge": "ours (ridge)",
         "ridge-auto": "ours (ridge, λ on validation)", "auto": "ours (auto)"}


def budget_table(found: list[Head]) -> str:
    """The README's: per dataset and budget, the most accurate head on our partitions (mean
    over partitions and seeds), and the best of the others' where it is ours."""
    lines = ["| dataset | " + " | ".join(TIERS) + " |", "|---|" + "---|" * len(TIERS)]
    for dataset in DATASETS:
        mine = {h.method: h for h in found if h.dataset == dataset}
        if not mine:
            continue
        row = []
        for methods in TIERS.values():
            here = [mine[m] for m in methods if m in mine]
            if not here:
                row.append("–")
                continue
            best = max(here, key=lambda h: np.mean(h.ours))
            cell = f"{SHORT[best.method]} {100 * np.mean(best.ours):.2f}"
            theirs = [h for h in here if h.method not in OURS]
            if best.method in OURS:
                cell = f"**{cell}**"
                if theirs:
                    rival = max(theirs, key=lambda h: np.mean(h.ours))
                    cell += f" ({SHORT[rival.method]} {100 * np.mean(rival.ours):.2f})"
            row.append(cell)
        lines.append(f"| {dataset} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def front_plot(found: list[Head]) -> bytes:
    """Accuracy on our partitions against bytes a client sends, a panel a dataset: ours joined
    by a line, FedCOF's protocol hollow, the centralised ceiling dashed."""
    plt = pyplot()
    datasets = [d for d in DATASETS if any(h.dataset == d for h in found)]
    fig, axes = plt.subplots(1, len(datasets), figsize=(3.6 * len(datasets), 3.4), squeeze=False)
    colours = dict(zip(HEADS, plt.get_cmap("tab10").colors))
    for ax, dataset in zip(axes[0], datasets):
        mine = [h for h in found if h.dataset == dataset]
        for head in mine:
            ax.scatter(head.kilobytes, 100 * np.mean(head.ours), color=colours[head.method],
                       label=HEADS[head.method], zorder=3)
            if head.theirs:
                ax.scatter(head.kilobytes, 100 * np.mean(head.theirs), facecolors="none",
                           edgecolors=colours[head.method], zorder=3)
        ours = sorted((h for h in mine if h.method in ("low-rank-10", "low-rank-50", "auto")),
                      key=lambda h: h.kilobytes)
        ax.plot([h.kilobytes for h in ours], [100 * np.mean(h.ours) for h in ours], color="0.4",
                lw=1, zorder=2)
        ax.axhline(100 * ceiling(dataset, encoder_of(dataset)), color="0.6", ls="--", lw=1)
        ax.set_xscale("log")
        ax.set_title(dataset)
        ax.set_xlabel("kB a client sends for the head")
    axes[0][0].set_ylabel("accuracy of the head alone (%)")
    handles, names = axes[0][-1].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=4, frameon=False,
               bbox_to_anchor=(0.5, -0.12))
    return png(plt, fig)


if __name__ == "__main__":
    if sys.argv[1:] == ["--front"]:
        found = heads()
        FRONT_PLOT.write_bytes(front_plot(found))
        print(front_table(found), budget_table(found), sep="\n\n")
    elif sys.argv[1:2] == ["--wide"]:
        rounds = tuple(int(r) for r in sys.argv[3:]) or (0,)
        print(wide_table(Path(sys.argv[2]), rounds))
    else:
        print(table(Path(sys.argv[1] if len(sys.argv) > 1 else "conf/one-round-heads-digits.toml")))
