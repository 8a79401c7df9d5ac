"""One run folder read on its own: its summary in a few lines and its accuracy curve as a
PNG (with R(t) beside it when the folder's siblings hold its IID twin), so a run can be
looked at without a preset report. `write_run` draws the PNG into every run folder;
`python -m ovalp_flwr.experiments.report results/<run>` prints the lines and redraws it.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from ovalp_flwr.config import NOT_PART_OF_THE_RESULT
from ovalp_flwr.federation.metrics import ACC_AT_FRACTION, first_round_at, relative_curve, start_and_rounds

PLOT_FILE = "accuracy.png"
# what a partition is made of: a twin differs from its run in these keys (and where it lives)
PARTITION_KEYS = ("partition", "classes-per-client", "dirichlet-p", "dirichlet-alpha", "zipf-s")
NOT_COMPARED = NOT_PART_OF_THE_RESULT | set(PARTITION_KEYS)


def iid_twin(results_dir: Path, summary: dict[str, Any]) -> dict[str, Any] | None:
    """The summary of the IID run with this run's config but its partition, in results_dir;
    None for an IID run or when there is none."""
    config = summary["config"]
    if config.get("partition") == "iid" or not results_dir.is_dir():
        return None
    wanted = {k: v for k, v in config.items() if k not in NOT_COMPARED}
    for path in sorted(results_dir.glob("*/summary.json")):
        try:
            other = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        ran = other.get("config", {})
        if ran.get("partition") == "iid" and \
                {k: v for k, v in ran.items() if k not in NOT_COMPARED} == wanted:
            return other
    return None


def plot_run(summary: dict[str, Any], twin: dict[str, Any] | None = None) -> bytes:
    """Accuracy per round (round 0 = the start), and R(t) when the IID twin is given."""
    import matplotlib  # late: ~1 s with pyplot; only plots need it, not the launcher

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # late: likewise, and after the Agg backend is set

    curve = start_and_rounds(summary)
    config = summary["config"]
    if twin is not None and len(start_and_rounds(twin)) != len(curve):
        twin = None
    panels = 2 if twin is not None else 1
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 2.8), dpi=80, squeeze=False)
    ax = axes[0][0]
    ax.plot(range(len(curve)), curve, marker=".", color="tab:blue", label=config["partition"])
    if twin is not None:
        iid = start_and_rounds(twin)
        ax.plot(range(len(iid)), iid, color="tab:gray", linestyle="--", label="iid")
        ax.legend(fontsize=7, frameon=False)
        relative = relative_curve(curve, iid)
        axes[0][1].plot(range(len(relative)), relative, color="tab:green")
        axes[0][1].set(title="R(t) = non-IID / IID (%)", xlabel="round")
    ax.set(title=f"{config['dataset']}: {config['head']}, {config.get('head-init', 'random')} start",
           xlabel="round", ylabel="test accuracy")
    for each in axes[0]:
        each.grid(alpha=0.3)
        each.title.set_fontsize(9)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def summary_lines(summary: dict[str, Any], twin: dict[str, Any] | None = None) -> str:
    """A finished run in a few lines: start, best and final accuracy with their rounds, R at
    the end against its IID twin if there is one, and what the rounds cost."""
    rounds = summary["rounds"]
    curve = start_and_rounds(summary)
    best = max(range(min(1, len(rounds)), len(curve)), key=curve.__getitem__)  # as summary.json
    at_bar = first_round_at(curve, ACC_AT_FRACTION * summary["final_accuracy"])
    start = summary.get("head_init", {}).get("name", "random")
    # the round picked on test is a figure of the curve; the one picked on validation rows is
    # the model a user could have chosen
    rows = [(f"start ({start})", 0), ("best on test", best)]
    if "best_val_round" in summary:
        rows.append(("best on val.", summary["best_val_round"]))
    rows.append(("final", len(rounds)))
    width = max(len(label) for label, _ in rows)
    lines = [f"  {label:<{width}}  round {index:>3}  accuracy {curve[index]:.4f}"
             for label, index in rows]
    lines[-1] += f"  ({ACC_AT_FRACTION:.0%} of it from round {at_bar})"
    if twin is not None and len(start_and_rounds(twin)) == len(curve):
        lines[-1] += f", R = {relative_curve(curve, start_and_rounds(twin))[-1]:.1f}%"
    per_domain = summary.get("domain_accuracy", {}).get("final")
    if per_domain:  # worst first: where the global model serves its clients least
        ranked = sorted(per_domain.items(), key=lambda item: item[1])
        lines.append("  per domain (final): " + ", ".join(f"{d} {a:.4f}" for d, a in ranked))
    sent = sum(r.get("bytes_sent_per_client", 0.0) for r in rounds) / 1e6
    received = sum(r.get("bytes_received_per_client", 0.0) for r in rounds) / 1e6
    seconds = summary.get("total_seconds", 0.0)
    lines.append(f"  {summary.get('num_clients', '?')} clients, {seconds:.0f} s; per client over "
                 f"{len(rounds)} rounds: {sent:.2f} MB down, {received:.2f} MB up")
    return "\n".join(lines)
