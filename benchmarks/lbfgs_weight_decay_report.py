"""`weight-decay = "auto"` under the server's L-BFGS against fixed values: the report of
`conf/lbfgs-weight-decay.toml`'s runs (each dataset's tuned value, the path on validation rows,
and the grid's two ends, 0.1 and 1e-4), read from `results/lbfgs-weight-decay/`.

Per dataset: the start, each method's validation and test accuracy after the last round, and
for `auto` the values it walked (their validation accuracy), the one it chose and the rounds
its walk took. Writes `reports/lbfgs-weight-decay/{report.md,table.csv}`:

    python -m ovalp_flwr.experiments.sweep conf/lbfgs-weight-decay.toml --seeds 0 --runner local
    python benchmarks/lbfgs_weight_decay_report.py
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ovalp_flwr.core.durable import replace_durably
from ovalp_flwr.experiments.sweep import is_done, load_preset
from ovalp_flwr.federation.results import read_summary

ROOT = Path(__file__).resolve().parent.parent
PRESET = ROOT / "conf" / "lbfgs-weight-decay.toml"
OUT = ROOT / "reports" / "lbfgs-weight-decay"
METHODS = ("tuned", "auto", "strong", "weak")
TITLES = {"tuned": "tuned (fixed)", "auto": "auto", "strong": "0.1 (fixed)",
          "weak": "1e-4 (fixed)"}


def rows(results: Path, seeds: list[int]) -> list[dict[str, Any]]:
    """One row per finished run: its choices and numbers (a run today's code would not make
    again is an error, not a row)."""
    preset = load_preset(PRESET)
    found = []
    for spec in preset.runs(seeds):
        run_dir = preset.results_dir(results) / spec.name
        if not is_done(preset, spec, results):
            raise SystemExit(f"error: {spec.name} is not done under {run_dir.parent}; run `python "
                             f"-m ovalp_flwr.experiments.sweep {PRESET.relative_to(ROOT)} --seeds "
                             f"{' '.join(map(str, seeds))} --runner local` first")
        summary = read_summary(run_dir)
        path = summary.get("weight_decay_path")
        found.append({
            "dataset": spec.choices[0][1], "method": spec.choices[1][1], "seed": spec.seed,
            "weight_decay": path["chosen"] if path else summary["config"]["weight-decay"],
            "start": summary["initial_accuracy"], "final": summary["final_accuracy"],
            "val_final": summary["validation"]["final_accuracy"],
            "walk": (" → ".join(f"{v:g}: {100 * a:.2f}" for v, a in
                                zip(path["grid"], path["val_accuracy"])) if path else ""),
            "walk_rounds": (max(r["round"] for r in summary["rounds"]
                                if r.get("server_step") == "path") if path else 0),
        })
    return found


def mean_std(values: list[float]) -> str:
    return f"{100 * np.mean(values):.2f} ± {100 * np.std(values):.2f}"


def means(by: dict, datasets: list[str], seeds: list[int]) -> list[str]:
    """Per dataset and method, test accuracy after round 30 over the seeds, and auto's gap to
    the tuned value's."""
    lines = ["## Mean over seeds", "", "Test accuracy (%) after round 30, mean ± std over "
             "the seeds; *auto − tuned*: the mean of the per-seed differences (points).", "",
             "| dataset | " + " | ".join(TITLES[m] for m in METHODS) + " | auto − tuned |",
             "|---|" + "---:|" * (len(METHODS) + 1)]
    for dataset in datasets:
        finals = {m: [by[(dataset, m, seed)]["final"] for seed in seeds] for m in METHODS}
        gap = np.mean(np.subtract(finals["auto"], finals["tuned"])) * 100
        lines.append(f"| {dataset} | " + " | ".join(mean_std(finals[m]) for m in METHODS)
                     + f" | {gap:+.2f} |")
    return lines + ["", "## Every run", ""]


def markdown(found: list[dict[str, Any]], command: str) -> str:
    by = {(r["dataset"], r["method"], r["seed"]): r for r in found}
    datasets = list(dict.fromkeys(r["dataset"] for r in found))
    seeds = sorted({r["seed"] for r in found})
    lines = ["# `weight-decay = \"auto\"` under the server's L-BFGS", "",
             f"Made by `{command}` from `results/lbfgs-weight-decay/` (seeds "
             f"{', '.join(map(str, seeds))}; 100 clients, IID, ridge start, 30 rounds, 10% of "
             "the training split held back as validation rows in every run). Accuracy (%) "
             "after round 30 on the validation rows / the test split; *walk*: each value's "
             "held heads on the validation rows, in the order walked (2 rounds each); the run "
             "then goes on at the best.", "", *means(by, datasets, seeds),
             "| dataset | seed | start | " + " | ".join(TITLES[m] for m in METHODS)
             + " | auto chose | its walk (λ: validation %) | walk rounds |",
             "|---|---:|---:|" + "---:|" * len(METHODS) + "---:|---|---:|"]
    for dataset in datasets:
        for seed in seeds:
            cells = {m: by[(dataset, m, seed)] for m in METHODS}
            auto = cells["auto"]
            lines.append(
                f"| {dataset} | {seed} | {100 * auto['start']:.2f} | "
                + " | ".join(f"{100 * c['val_final']:.2f} / {100 * c['final']:.2f}"
                             + (f" (λ {c['weight_decay']:g})" if m == "tuned" else "")
                             for m, c in cells.items())
                + f" | {auto['weight_decay']:g} | {auto['walk']} | {auto['walk_rounds']} |")
    return "\n".join(lines) + "\n"


def table_csv(found: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(found[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(found)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results-dir", type=Path, default=ROOT / "results")
    parser.add_argument("--seeds", nargs="*", type=int, default=[0])
    args = parser.parse_args(argv)
    found = rows(args.results_dir, args.seeds)
    command = " ".join(["python benchmarks/lbfgs_weight_decay_report.py", *(argv or sys.argv[1:])])
    OUT.mkdir(parents=True, exist_ok=True)
    replace_durably(OUT / "report.md", markdown(found, command).encode())
    replace_durably(OUT / "table.csv", table_csv(found).encode())
    print(markdown(found, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
