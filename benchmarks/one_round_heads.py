"""The one-round heads' tables of docs/closed-form-starts.md, from a preset's run folders: each
head alone (round 0, the start), after round 1 and after the last of OvA-LP's rounds from it
where the preset has rounds, and the bytes one client sends for it; mean ± std over the seeds
found (runs not yet made are left out, and counted).

    python benchmarks/one_round_heads.py conf/one-round-heads-digits.toml
    python benchmarks/one_round_heads.py conf/one-round-heads.toml
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from ovalp_flwr.experiments.sweep import load_preset

ROOT = Path(__file__).resolve().parents[1]


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


def table(preset_path: Path, results_root: Path = ROOT / "results") -> str:
    axes, found = cells(preset_path, results_root)
    rounds = any(summary["rounds"] for runs in found.values() for summary in runs)
    scores = ["round 0 (the head) (%)", *(["round 1 (%)", "last round (%)"] if rounds else [])]
    lines = ["| " + " | ".join([*axes, *scores, "kB a client sends for it", "seeds"]) + " |",
             "|" + "---|" * len(axes) + "---:|" * (len(scores) + 2)]
    for choices, runs in found.items():
        values = [[r["initial_accuracy"] for r in runs]]
        if rounds:
            values += [[r["rounds"][0]["accuracy"] for r in runs], [r["final_accuracy"] for r in runs]]
        sent = np.mean([r["head_init"]["statistics_bytes_per_client"] for r in runs]) / 1e3
        lines.append("| " + " | ".join([*choices, *map(mean_std, values), f"{sent:,.1f}",
                                        str(len(runs))]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1] if len(sys.argv) > 1 else "conf/one-round-heads-digits.toml")))
