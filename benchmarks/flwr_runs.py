"""Real `flwr run`s (Ray, virtual SuperNodes) of OvA-LP and LP-softmax on one feature cache.

Each run goes through the same launcher as `make run`; the table is read back from the
runs' own `summary.json` files and written to `benchmarks/results/<name>.{md,json}`:

    .venv/bin/python benchmarks/flwr_runs.py --dataset tinyimagenet-100 --name tinyimagenet_flwr
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ovalp_flwr.ops import launch
from ovalp_flwr.federation.results import read_summary

OUT = Path(__file__).resolve().parent / "results"
METHODS = {"OvA-LP": "head='ova' schedule='two-stage'", "LP-softmax": "head='softmax'"}
PARTITIONS = {"IID": "partition='iid'", "shard-1": "partition='shard' classes-per-client=1"}
# the paper's local recipe, as when the committed results were made (config.RECIPE)
RECIPE = "local-optimizer='adamw' learning-rate=0.01 drift-correction='none'"


def run(args: argparse.Namespace, method: str, partition: str, results_dir: Path) -> dict:
    name = f"{args.name}-{method}-{partition}".replace(" ", "_")
    run_config = (f"dataset='{args.dataset}' encoder='{args.encoder}' {RECIPE} {METHODS[method]} "
                  f"{PARTITIONS[partition]} num-server-rounds={args.rounds} seed={args.seed} "
                  f"results-dir='{results_dir}' run-name='{name}'")
    started = time.time()
    code = launch.simulate(launch.PROJECT, args.clients, ["--run-config", run_config],
                           launch.PROJECT / ".flwr")
    if code != 0:
        raise SystemExit(f"flwr run for {method} / {partition} failed with exit {code}")
    summary = read_summary(results_dir / name)
    return {"method": method, "partition": partition, "final_accuracy": summary["final_accuracy"],
            "best_accuracy": summary["best_accuracy"], "wall_seconds": round(time.time() - started, 1),
            "server_seconds": round(summary["total_seconds"], 1),
            "curve": [r["accuracy"] for r in summary["rounds"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="tinyimagenet-100")
    parser.add_argument("--encoder", default="efficientnet-lite0")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="tinyimagenet_flwr")
    parser.add_argument("--results-dir", type=Path, default=launch.PROJECT / "results")
    args = parser.parse_args()

    rows = [run(args, m, p, args.results_dir.resolve()) for m in METHODS for p in PARTITIONS]
    OUT.mkdir(exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps({"setup": vars(args) | {
        "results_dir": str(args.results_dir)}, "runs": rows}, indent=1))
    iid = {r["method"]: r["final_accuracy"] for r in rows if r["partition"] == "IID"}
    lines = [f"# `flwr run` on {args.dataset} / {args.encoder}: {args.clients} SuperNodes, "
             f"{args.rounds} rounds, seed {args.seed}", "",
             f"Command: `.venv/bin/python benchmarks/flwr_runs.py --dataset {args.dataset} "
             f"--encoder {args.encoder} --name {args.name}`", "",
             "| method | partition | final accuracy | best | R = acc / IID acc | wall s |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        ratio = 100 * r["final_accuracy"] / iid[r["method"]]
        lines.append(f"| {r['method']} | {r['partition']} | {100 * r['final_accuracy']:.1f}% | "
                     f"{100 * r['best_accuracy']:.1f}% | {ratio:.1f}% | {r['wall_seconds']} |")
    (OUT / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
