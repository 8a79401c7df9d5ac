"""Attack x defence, one table per setting, from the robustness report's `table.csv`.

`python -m ovalp_flwr.experiments.report conf/robustness.toml` writes every cell of the grid;
this pivots it so a defence reads down a column: each cell is the final accuracy (%) and its
difference from the clean run with FedAvg's mean (points). Cells whose run is missing say so.
Writes `reports/robustness/pivot.md`:

    .venv/bin/python benchmarks/robustness_table.py
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from ovalp_flwr.core.durable import replace_durably
from ovalp_flwr.experiments.sweep import load_preset

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "conf" / "robustness.toml"
REPORT = ROOT / "reports" / "robustness"


def final_accuracy(table: Path) -> dict[tuple[str, str, str], float]:
    """(setting, attack, defence) -> final accuracy (%), for the cells with a run."""
    with table.open() as handle:
        return {(row["setting"], row["attack"], row["defence"]): float(row["final_mean"])
                for row in csv.DictReader(handle) if row["final_mean"]}


def pivot(finals: dict[tuple[str, str, str], float], setting: str, attacks: list[str],
          defences: list[str]) -> list[str]:
    clean = finals.get((setting, "clean", "mean"))
    lines = [f"### {setting}", "", "| attack | " + " | ".join(defences) + " |",
             "|---|" + "---:|" * len(defences)]
    for attack in attacks:
        cells = []
        for defence in defences:
            value = finals.get((setting, attack, defence))
            if value is None:
                cells.append("not run")
            elif clean is None:
                cells.append(f"{value:.2f}")
            else:
                cells.append(f"{value:.2f} ({value - clean:+.2f})")
        lines.append(f"| {attack} | " + " | ".join(cells) + " |")
    return lines + [""]


def main() -> int:
    preset = load_preset(PRESET)
    axes = {axis: list(choices) for axis, choices in preset.axes.items()}
    finals = final_accuracy(REPORT / "table.csv")
    found = sum(1 for _ in finals)
    lines = ["# Attack x defence", "",
             "Made by `python benchmarks/robustness_table.py` from `reports/robustness/table.csv` "
             f"({found} of {len(preset.runs())} runs). Final accuracy (%) after the preset's "
             "rounds, seed 0, 10% of 100 clients attacking; in brackets, points against the clean "
             "run with FedAvg's mean.", ""]
    for setting in axes["setting"]:
        lines += pivot(finals, setting, axes["attack"], axes["defence"])
    replace_durably(REPORT / "pivot.md", "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
