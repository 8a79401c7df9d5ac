"""Accuracy on the embedded default (digits -> EfficientNet-Lite0, 100 clients, 20 rounds).

Runs methods x partitions x feature normalisations x seeds through the real ServerApp
logic and ClientApp handlers in one process (`ovalp_flwr.federation.local_grid`: same records,
strategy and client code as `flwr run`, delivered by direct calls instead of Ray), and
writes `benchmarks/results/embedded_default.{json,md,png}`:

    .venv/bin/python benchmarks/embedded_default.py            # full grid (~6 min, 2 idle cores)
    .venv/bin/python benchmarks/embedded_default.py --seeds 0 --norms standardize
    .venv/bin/python benchmarks/embedded_default.py --local-epochs 30 --name local_epochs_30
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ovalp_flwr.config import RECIPE  # the paper's local recipe, as when the results were made
from ovalp_flwr.ops.console import quiet_flower
from ovalp_flwr.federation.local_grid import run_local
from ovalp_flwr.federation.results import read_summary

OUT = Path(__file__).resolve().parent / "results"
METHODS = {  # name -> run-config overrides (the paper's ablation row)
    "LP-softmax": {"head": "softmax"},
    "OvA single-stage": {"head": "ova", "schedule": "single-stage"},
    "OvA-LP": {"head": "ova", "schedule": "two-stage"},
}
PARTITIONS = {"IID": {"partition": "iid"}, "shard-1": {"partition": "shard", "classes-per-client": 1}}


def run_one(method: str, partition: str, norm: str, seed: int, rounds: int, clients: int,
            epochs: int, scratch: Path) -> dict:
    overrides = {**RECIPE, **METHODS[method], **PARTITIONS[partition], "feature-norm": norm, "seed": seed,
                 "num-server-rounds": rounds, "local-epochs": epochs, "results-dir": str(scratch),
                 "run-name": f"{method}-{partition}-{norm}-e{epochs}-{seed}".replace(" ", "_")}
    summary = read_summary(run_local(overrides, clients))
    curve = [r["accuracy"] for r in summary["rounds"]]
    return {"method": method, "partition": partition, "feature_norm": norm, "seed": seed,
            "final_accuracy": summary["final_accuracy"], "best_accuracy": max(curve), "curve": curve}


def table(rows: list[dict], norms: list[str]) -> str:
    """Markdown: final accuracy mean±std per method/norm, IID vs shard-1 and their ratio R."""
    lines = ["| feature-norm | method | IID | shard-1 | R = shard-1 / IID |", "|---|---|---|---|---|"]
    for norm in norms:
        for method in METHODS:
            acc = {p: np.array([r["final_accuracy"] for r in rows
                                if (r["method"], r["partition"], r["feature_norm"]) == (method, p, norm)])
                   for p in PARTITIONS}
            if not all(len(a) for a in acc.values()):
                continue
            ratio = acc["shard-1"].mean() / acc["IID"].mean()
            lines.append(f"| {norm} | {method} | {_fmt(acc['IID'])} | {_fmt(acc['shard-1'])} | "
                         f"{100 * ratio:.1f}% |")
    return "\n".join(lines)


def plot(rows: list[dict], norms: list[str], path: Path) -> None:
    """Accuracy per round, one panel per normalisation: IID solid, shard-1 dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(norms), figsize=(4.2 * len(norms), 3.6), sharey=True,
                             squeeze=False)
    colors = dict(zip(METHODS, ("tab:red", "tab:blue", "tab:green")))
    for ax, norm in zip(axes[0], norms):
        for method in METHODS:
            for partition, style in (("IID", "-"), ("shard-1", "--")):
                curves = [r["curve"] for r in rows
                          if (r["method"], r["partition"], r["feature_norm"]) == (method, partition, norm)]
                if curves:
                    mean = 100 * np.mean(curves, axis=0)
                    ax.plot(np.arange(1, len(mean) + 1), mean, style, color=colors[method],
                            label=f"{method}, {partition}")
        ax.set_title(f"feature-norm = {norm}")
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("test accuracy (%)")
    axes[0][0].set_ylim(0, 100)
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(values: np.ndarray) -> str:
    return f"{100 * values.mean():.1f} ± {100 * values.std():.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 42, 777])
    parser.add_argument("--norms", nargs="+", default=["none", "l2", "standardize", "center-l2"])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--local-epochs", type=int, default=3)
    parser.add_argument("--name", default="embedded_default", help="output file stem")
    parser.add_argument("--plot-only", action="store_true",
                        help="redraw the PNG from an existing <name>.json, run nothing")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/ovalp-bench"))
    args = parser.parse_args()
    quiet_flower()
    if args.plot_only:
        saved = json.loads((OUT / f"{args.name}.json").read_text())["runs"]
        norms = list(dict.fromkeys(r["feature_norm"] for r in saved))
        plot(saved, norms, OUT / f"{args.name}.png")
        return

    grid = [(m, p, n, s) for n in args.norms for m in METHODS for p in PARTITIONS for s in args.seeds]
    started, rows = time.time(), []
    for method, partition, norm, seed in tqdm(grid, desc="runs"):
        rows.append(run_one(method, partition, norm, seed, args.rounds, args.clients,
                            args.local_epochs, args.scratch))
    OUT.mkdir(exist_ok=True)
    setup = {"dataset": "digits", "encoder": "efficientnet-lite0", "clients": args.clients,
             "rounds": args.rounds, "local_epochs": args.local_epochs, "seeds": args.seeds,
             "seconds": round(time.time() - started, 1)}
    (OUT / f"{args.name}.json").write_text(json.dumps({"setup": setup, "runs": rows}, indent=1))
    md = (f"# Embedded default: final accuracy after {args.rounds} rounds (%, mean ± std over "
          f"seeds {args.seeds})\n\n{args.clients} clients, digits through EfficientNet-Lite0, "
          f"AdamW lr 0.01, batch 50, {args.local_epochs} local epochs.\nCommand: `"
          f"{shlex.join(['.venv/bin/python', 'benchmarks/embedded_default.py', *sys.argv[1:]])}`\n\n{table(rows, args.norms)}\n")
    (OUT / f"{args.name}.md").write_text(md + f"\n![accuracy per round]({args.name}.png)\n")
    plot(rows, args.norms, OUT / f"{args.name}.png")
    print(md)


if __name__ == "__main__":
    main()
