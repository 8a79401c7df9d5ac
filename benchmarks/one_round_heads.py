"""The one-round heads' table of docs/closed-form-starts.md, from a sweep's run folders: each
head alone (round 0, the start), after 1 and after the last of OvA-LP's rounds from it, and the
bytes one client sends for it; mean ± std over seeds.

    python benchmarks/one_round_heads.py results/one-round-heads-digits
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np


def cells(results: Path) -> dict[tuple[str, str], list[dict]]:
    """(method, partition) -> the summaries of its seeds (run names `<method>-<partition>-seed<s>`)."""
    found: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for path in sorted(results.glob("*/summary.json")):
        method, partition = path.parent.name.rsplit("-seed", 1)[0].split("-", 1)
        found[(method, partition)].append(json.loads(path.read_text()))
    return found


def mean_std(values: list[float]) -> str:
    return f"{100 * np.mean(values):.2f} ± {100 * np.std(values, ddof=1):.2f}" if len(values) > 1 \
        else f"{100 * values[0]:.2f}"


def table(results: Path) -> str:
    lines = ["| head | partition | round 0 (the head) (%) | round 1 (%) | last round (%) | "
             "kB a client sends for it | seeds |", "|---|---|---:|---:|---:|---:|---:|"]
    for (method, partition), runs in cells(results).items():
        start = [r["initial_accuracy"] for r in runs]
        first = [r["rounds"][0]["accuracy"] for r in runs]
        last = [r["final_accuracy"] for r in runs]
        sent = np.mean([r["head_init"]["statistics_bytes_per_client"] for r in runs]) / 1e3
        lines.append(f"| {method} | {partition} | {mean_std(start)} | {mean_std(first)} | "
                     f"{mean_std(last)} | {sent:,.1f} | {len(runs)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1] if len(sys.argv) > 1 else "results/one-round-heads-digits")))
