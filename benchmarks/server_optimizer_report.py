"""The server-optimizer report: how close `server-optimizer = "lbfgs"` gets to the centralised
optimum, round by round, on every dataset and partition of `conf/server-optimizer.toml`.

Reads the preset's runs (`results/server-optimizer/`), the centralised ceilings
(`benchmarks/results/centralised_ceiling.json`) and the regularised optima F* with each dataset's
λ (`benchmarks/results/regularised_optimum.json`), and, for the shipped default and Fed3R, the
committed closed-form-starts runs (`reports/closed-form-starts/runs.csv`, seeds 0, 42, 777).
Writes `reports/server-optimizer/report.md`, `table.csv` and `gap.png`:

    .venv/bin/python benchmarks/server_optimizer_report.py

F - F* at round t is the objective of the heads the server holds after round t (L-BFGS's last
accepted point: `held_objective` in summary.json, from the clients' own sums), the model a
round reports, not the trial point sent next.
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ovalp_flwr.core.durable import replace_durably  # noqa: E402
from ovalp_flwr.experiments.ceiling import read_ceilings  # noqa: E402
from ovalp_flwr.experiments.sweep import is_done, load_preset  # noqa: E402
from ovalp_flwr.federation.results import read_summary  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from regularised_optimum import read_optima  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "conf" / "server-optimizer.toml"
OUT = ROOT / "reports" / "server-optimizer"
BASELINES = ROOT / "reports" / "closed-form-starts" / "runs.csv"
ROUNDS = (1, 3, 5, 10)
FORMATS = {"gap": "{:.1e}", "to": "{:.1f}", "MB": "{:.1f}", "shortened": "{:.1f}",
           "heads": "{:.1f}"}
BARS = (0.99, 0.995)


def run_row(summary: dict[str, Any], ceiling: float, optimum: float) -> dict:
    """What the tables need of one run."""
    rounds = summary["rounds"]
    accuracy = [summary["initial_accuracy"], *(r["accuracy"] for r in rounds)]
    gap = [r["held_objective"] - optimum for r in rounds]  # after round t, of the heads held
    clients = summary["num_clients"]
    setup = (summary["setup"]["bytes_sent"] + summary["setup"]["bytes_received"]) / clients
    spent = np.cumsum([setup] + [r["bytes_sent_per_client"] + r["bytes_received_per_client"]
                                 for r in rounds])
    row = {"start": 100 * accuracy[0], "final": 100 * accuracy[-1],
           **{f"round {t}": 100 * accuracy[t] for t in ROUNDS if t < len(accuracy)},
           **{f"gap {t}": gap[t - 1] for t in (*ROUNDS, len(rounds)) if t <= len(gap)},
           "gap final": gap[-1], "gaps": gap,
           "shortened": sum(r["server_step"] == "shortened" for r in rounds),
           "heads shortened": sum(r.get("steps_shortened", 0) for r in rounds)}
    for bar in BARS:
        reached = next((t for t, a in enumerate(accuracy) if a >= bar * ceiling), None)
        row[f"to {bar:g}"] = reached
        row[f"MB to {bar:g}"] = None if reached is None else spent[reached] / 1e6
    return row


def baselines(path: Path = BASELINES) -> dict[tuple[str, str, str], list[dict]]:
    """(dataset, method, partition) -> the committed closed-form-starts runs of seeds 0, 42, 777."""
    if not path.exists():
        return {}
    out = defaultdict(list)
    with path.open() as handle:
        for row in csv.DictReader(handle):
            if row["method"] in ("ridge", "fed3r") and int(row["seed"]) in (0, 42, 777):
                out[row["dataset"], row["method"], row["partition"]].append(row)
    return out


def cell(values: list[float | None], fmt: str = "{:.2f}") -> str:
    """mean ± std over the seeds that have a value; "never" if none has."""
    present = [v for v in values if v is not None]
    if not present:
        return "never"
    mean = statistics.fmean(present)
    std = statistics.stdev(present) if len(present) > 1 else 0.0
    short = f" (n={len(present)})" if len(present) < len(values) else ""
    return f"{fmt.format(mean)} ± {fmt.format(std)}{short}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results-dir", type=Path, default=ROOT / "results")
    args = parser.parse_args(argv)
    preset = load_preset(PRESET)
    ceilings, optima, base = read_ceilings(), read_optima(), baselines()
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    curves: dict[str, list[list[float]]] = defaultdict(list)
    for spec in preset.runs():
        if spec.choice("method") != "lbfgs":
            continue
        run_dir = preset.results_dir(args.results_dir) / spec.name
        if not is_done(preset, spec, args.results_dir):  # missing, or made by older behaviour
            continue
        summary = read_summary(run_dir)
        config = summary["config"]
        case = f"{config['dataset']}:{config['encoder']}"
        lam = config["weight-decay"]
        optimum = optima[f"{case}|ova|{lam:g}"]["objective"]
        if any("held_objective" not in r for r in summary["rounds"]):
            raise SystemExit(f"error: {run_dir} has no held_objective per round (older code made "
                             f"it); rerun `python -m ovalp_flwr.experiments.sweep "
                             f"{PRESET.relative_to(ROOT)} --runner local`")
        row = run_row(summary, ceilings[case]["ceiling"], optimum)
        cells[spec.choice("dataset"), spec.choice("partition")].append(row)
        curves[spec.choice("dataset")].append(row["gaps"])
    OUT.mkdir(parents=True, exist_ok=True)
    write(cells, curves, ceilings, optima, base, preset)
    return 0


def write(cells, curves, ceilings, optima, base, preset) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    header = ["dataset", "partition", "seeds", "start", *(f"round {t}" for t in ROUNDS), "final",
              *(f"to {b:g}" for b in BARS), *(f"MB to {b:g}" for b in BARS),
              *(f"gap {t}" for t in (5, 10)), "gap final", "shortened",
              "heads shortened"]
    table = io.StringIO()
    writer = csv.writer(table)
    writer.writerow(header)
    lines = ["| dataset | partition | Start | Round 1 | Round 3 | Round 5 | Round 10 | Round 20 | "
             "rounds to 99% | rounds to 99.5% | MB/client to 99.5% | F−F* after 5 | "
             "F−F* after 10 | F−F* after 20 | seeds |", "|---|---|" + "---:|" * 13]
    for (dataset, partition), rows in cells.items():
        get = lambda key: [r.get(key) for r in rows]  # noqa: E731
        writer.writerow([dataset, partition, len(rows),
                         *(cell(get(k), FORMATS.get(k.split(" ")[0], "{:.2f}")) for k in header[3:])])
        lines.append("| " + " | ".join([
            dataset, partition, cell(get("start")), *(cell(get(f"round {t}")) for t in ROUNDS),
            cell(get("final")), cell(get("to 0.99"), "{:.1f}"), cell(get("to 0.995"), "{:.1f}"),
            cell(get("MB to 0.995"), "{:.1f}"), cell(get("gap 5"), "{:.1e}"),
            cell(get("gap 10"), "{:.1e}"), cell(get("gap final"), "{:.1e}"), str(len(rows))]) + " |")
    replace_durably(OUT / "table.csv", table.getvalue())
    replace_durably(OUT / "report.md", document(lines, cells, ceilings, optima, base, preset))
    plot_gaps(curves)


def baseline_lines(base, datasets) -> list[str]:
    lines = ["| dataset | method | partition | Start | Round 1 | Round 3 | Round 5 | Round 50 |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for (dataset, method, partition), rows in sorted(base.items()):
        if dataset not in datasets:
            continue
        get = lambda key: [float(r[key]) if r[key] else None for r in rows]  # noqa: E731
        lines.append(f"| {dataset} | {'default' if method == 'ridge' else method} | {partition} | "
                     + " | ".join(cell(get(k)) for k in ("round_0_pct", "round_1_pct",
                                                        "round_3_pct", "round_5_pct", "final_pct"))
                     + " |")
    return lines


def document(lines, cells, ceilings, optima, base, preset) -> str:
    datasets = sorted({d for d, _ in cells})
    bars = ", ".join(f"{case.split(':')[0]} {100 * c['ceiling']:.2f}%" for case, c in ceilings.items()
                     if case.split(":")[0] in datasets)
    targets = ", ".join(f"{o['case'].split(':')[0]} F* = {o['objective']:.6f} (λ = {o['lambda']:g}, "
                        f"{100 * o['test_accuracy']:.2f}%)" for o in optima.values()
                        if o["head"] == "ova" and o["case"].split(":")[0] in datasets)
    return "\n".join([
        "# server-optimizer", "",
        f"{preset.description}. Made by `python benchmarks/server_optimizer_report.py` from the "
        "runs of `python -m ovalp_flwr.experiments.sweep conf/server-optimizer.toml --runner local` "
        "(100 clients, OvA heads, ridge start, 20 rounds).",
        "", "## Definitions", "",
        f"- **Ceiling**: the centralised ceiling (`benchmarks/results/centralised_ceiling.md`): {bars}.",
        "- **Rounds to 99% / 99.5%**: the first round whose test accuracy reaches that share of "
        "the ceiling (0: the start is there); **MB/client** to it: bytes each client moved both "
        "ways by then, the set-up's statistics (with the Gram matrix) included.",
        "- **F − F\\***: the objective the rounds minimise (mean OvA loss + λ/2 ‖W‖², λ the "
        "ceiling's one-vs-rest λ) at the heads the server holds after round t, minus its "
        f"centralised optimum from SciPy (`benchmarks/results/regularised_optimum.md`): {targets}.",
        "- Cells are mean ± std over seeds 0, 42, 777.", "",
        "## The server's L-BFGS", "", *lines, "",
        "![F − F* per round](gap.png)", "",
        "## The shipped default and Fed3R on the same data (committed closed-form-starts runs)",
        "", "The default is the ridge start, then SGD + SCAFFOLD with weight decay 0.01, 50 "
        "rounds; Fed3R is its own head alone (`head-init = \"fed3r\"`: absolute λ 0.01, no bias; "
        "`reports/closed-form-starts/`), so every round repeats its start.", "",
        *baseline_lines(base, datasets), ""])


def plot_gaps(curves: dict[str, list[list[float]]]) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for dataset, runs in sorted(curves.items()):
        width = min(len(r) for r in runs)
        gaps = np.array([r[:width] for r in runs])
        ax.semilogy(range(1, width + 1), np.median(np.maximum(gaps, 1e-9), axis=0), marker="o",
                    markersize=3, label=f"{dataset} ({len(runs)} runs)")
    ax.axhline(1e-3, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("round")
    ax.set_ylabel("F − F* (median over partitions and seeds)")
    ax.set_title("server-optimizer = lbfgs: distance to the centralised optimum")
    ax.legend()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    replace_durably(OUT / "gap.png", buffer.getvalue())


if __name__ == "__main__":
    sys.exit(main())
