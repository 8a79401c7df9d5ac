"""Scale: 1,000 and 10,000 clients, 10% sampled per round, in process and under `flwr run`.

Each run is a child process whose whole tree (the launcher's SuperLink, the simulation, Ray's
raylet and workers included) is sampled every half second for its memory: the sum of every
process's PSS (proportional set size: a page shared by k processes counts 1/k in each), so
shared libraries are not counted once per Ray worker. Set-up is the wall time from the child's
start to the log line of round 1; rounds are the summary's own `round_seconds`.

    flock /tmp/ovalp-bench.lock .venv/bin/python benchmarks/flower_scale.py --clients 1000 10000

writes `benchmarks/results/flower_scale.{json,md}` (`--name` for another name). Runs on MNIST
through the `pixels` encoder at 28 px (60,000 training rows, 784-d: every one of 10,000
clients holds data; the cache builds in ~15 s; `python -m ovalp_flwr.features.cache build
--dataset mnist --encoder pixels --image-size 28`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))  # run as a script: the project's modules

from ovalp_flwr.core.durable import replace_durably  # noqa: E402
from ovalp_flwr.ops.processes import descendants  # noqa: E402
from ovalp_flwr.ops.ray_cluster import actor_placement, alive_nodes, local_cluster  # noqa: E402

OUT = PROJECT / "benchmarks" / "results"
ROUND_ONE = ("[ROUND 1/", "round 1/")  # Flower's loop line; the launcher's console line
BASE = {"dataset": "mnist", "encoder": "pixels", "image-size": 28}


def run_config(args: argparse.Namespace, results_dir: Path, name: str) -> dict:
    return {**BASE, "fraction-train": args.fraction, "num-server-rounds": args.rounds,
            "seed": args.seed, "results-dir": str(results_dir), "run-name": name}


def to_flwr(config: dict) -> str:
    """The `--run-config` string of a dict: strings quoted, numbers bare."""
    return " ".join(f"{k}='{v}'" if isinstance(v, str) else f"{k}={v}" for k, v in config.items())


def command(runner: str, clients: int, config: dict, flwr_home: Path,
            ray_address: str | None) -> list[str]:
    if runner == "in-process":
        code = ("import json, sys; from ovalp_flwr.federation.local_grid import run_local; "
                f"run_local(json.loads(sys.argv[1]), {clients})")
        return [sys.executable, "-c", code, json.dumps(config)]
    extra = ["--ray-address", ray_address] if ray_address else []
    return [sys.executable, "-m", "ovalp_flwr.ops.launch", "--num-supernodes", str(clients),
            "--num-gpus", "0", "--flwr-home", str(flwr_home), "--verbose", *extra, "--",
            "--run-config", to_flwr(config)]


def pss_kib(pid: int) -> int:
    """A process's PSS in KiB (0 if it is gone or unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


class TreeMemory(threading.Thread):
    """Samples the PSS of `pid` and all its descendants until stopped; keeps the peak."""

    def __init__(self, pid: int, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.every, self.peak_kib, self.peak_processes = pid, every, 0, 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            tree = [self.pid, *descendants(self.pid)]
            total = sum(pss_kib(p) for p in tree)
            if total > self.peak_kib:
                self.peak_kib, self.peak_processes = total, len(tree)
            self._halt.wait(self.every)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def measure(runner: str, clients: int, args: argparse.Namespace, work: Path) -> dict:
    """One run: its wall time, set-up, rounds, peak memory and checkpoint, from its files."""
    name = f"{runner}-{clients}"
    config = run_config(args, work / "results", name)
    cmd = command(runner, clients, config, work / f"flwr-{name}", args.ray_address)
    log_path = work / f"{name}.log"
    started = time.monotonic()
    setup = None
    with open(log_path, "w") as log:
        child = subprocess.Popen(cmd, cwd=PROJECT, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True)
        memory = TreeMemory(child.pid)
        memory.start()
        assert child.stdout is not None
        for line in child.stdout:
            log.write(line)
            if setup is None and any(mark in line for mark in ROUND_ONE):
                setup = time.monotonic() - started
        code = child.wait()
        memory.stop()
    wall = time.monotonic() - started
    run_dir = work / "results" / name
    if code != 0 or not (run_dir / "summary.json").is_file():
        tail = log_path.read_text().splitlines()[-30:]
        raise SystemExit(f"{runner} with {clients} clients failed (exit {code}):\n" + "\n".join(tail))
    summary = json.loads((run_dir / "summary.json").read_text())
    rounds = [r["round_seconds"] for r in summary["rounds"]]
    return {"runner": runner, "clients": clients, "sampled_per_round": summary["rounds"][0]["clients_sampled"],
            "rounds": len(rounds), "setup_seconds": round(setup or float("nan"), 1),
            "setup_exchange_seconds": round(summary["setup"]["seconds"], 1),
            "round_seconds_mean": round(sum(rounds) / len(rounds), 2),
            "round_seconds": [round(s, 2) for s in rounds], "wall_seconds": round(wall, 1),
            "peak_pss_mib": round(memory.peak_kib / 1024), "processes_at_peak": memory.peak_processes,
            **checkpoint_sizes(run_dir, len(rounds)),
            "summary_kib": round((run_dir / "summary.json").stat().st_size / 1024),
            "final_accuracy": summary["final_accuracy"],
            "command": " ".join(cmd[:3] + ["..."]) if runner == "in-process" else " ".join(cmd)}


def checkpoint_sizes(run_dir: Path, last_round: int) -> dict:
    """The checkpoint on disk (main file and SCAFFOLD's variate parts) and what the last round
    wrote of it (the main file and its own part)."""
    files = [run_dir / "checkpoint.safetensors", *run_dir.glob("checkpoint-variates-*.safetensors")]
    last = [run_dir / "checkpoint.safetensors",
            run_dir / f"checkpoint-variates-{last_round}.safetensors"]
    mib = lambda paths: round(sum(f.stat().st_size for f in paths if f.exists()) / 2**20, 1)  # noqa: E731
    return {"checkpoint_mib": mib(files), "checkpoint_last_round_written_mib": mib(last)}


def write(rows: list[dict], args: argparse.Namespace) -> None:
    """The JSON and the table, each written atomically."""
    OUT.mkdir(exist_ok=True)
    invocation = "flock /tmp/ovalp-bench.lock .venv/bin/python benchmarks/flower_scale.py " + \
        " ".join(sys.argv[1:])
    replace_durably(OUT / f"{args.name}.json", json.dumps(
        {"command": invocation, "config": {**BASE, "fraction-train": args.fraction,
                                           "num-server-rounds": args.rounds, "seed": args.seed},
         "machine": f"{os.cpu_count()} cores", "flwr": flwr_version(), "runs": rows},
        indent=1).encode())
    lines = [f"# Scale: {args.rounds} rounds, {int(args.fraction * 100)}% of the clients sampled "
             f"per round (MNIST, pixels 28 px, 784-d; {os.cpu_count()} cores)", "",
             f"Command: `{invocation}` (flwr {flwr_version()})", "",
             "| runner | clients | sampled/round | set-up s | set-up exchanges s | s/round (mean) "
             "| s/round | whole run s | peak PSS MiB | checkpoint MiB (last round wrote) | final acc |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        runner = r["runner"] + (f" (Ray cluster, {r['ray_nodes']} raylets)" if "ray_nodes" in r else "")
        lines.append(f"| {runner} | {r['clients']:,} | {r['sampled_per_round']} | "
                     f"{r['setup_seconds']} | {r['setup_exchange_seconds']} | "
                     f"{r['round_seconds_mean']} | {' '.join(map(str, r['round_seconds']))} | "
                     f"{r['wall_seconds']} | {r['peak_pss_mib']:,} | {r['checkpoint_mib']} "
                     f"({r['checkpoint_last_round_written_mib']}) | "
                     f"{100 * r['final_accuracy']:.2f}% |")
    placed = [r for r in rows if "actors_per_ray_node" in r]
    if placed:
        lines += ["", "Where the ClientApp actors ran (Ray node id: actors), per run:", ""]
        lines += [f"- {r['runner']}, {r['clients']:,} clients: " + ", ".join(
            f"`{node[:12]}`: {count}" for node, count in r["actors_per_ray_node"].items())
            for r in placed]
    replace_durably(OUT / f"{args.name}.md", ("\n".join(lines) + "\n").encode())
    print("\n".join(lines))


def flwr_version() -> str:
    from flwr import __version__  # late: the report's line only

    return __version__


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--runners", nargs="+", default=["in-process", "flwr-run"],
                        choices=["in-process", "flwr-run"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ray-address", default=None,
                        help="flwr-run on an existing Ray cluster (the launcher's --ray-address)")
    parser.add_argument("--stand-in-cluster", type=int, default=0, metavar="RAYLETS",
                        help="flwr-run on a Ray cluster of this many raylets (1 CPU each) started "
                             "here with `ray start` (ops/ray_cluster.py); records where the "
                             "ClientApp actors ran")
    parser.add_argument("--name", default="flower_scale")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the runs' logs and results here (default: a temp folder)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="flower-scale-") as tmp, contextlib.ExitStack() as stack:
        work = args.keep.resolve() if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        cluster = (stack.enter_context(local_cluster(args.stand_in_cluster))
                   if args.stand_in_cluster else None)
        if cluster is not None:
            args.ray_address = cluster.address
        for clients in args.clients:
            for runner in args.runners:
                before = actor_placement(cluster.address) if cluster and runner != "in-process" else {}
                rows.append(measure(runner, clients, args, work))
                if cluster is not None and runner != "in-process":
                    after = actor_placement(cluster.address)
                    rows[-1]["ray_nodes"] = len(alive_nodes(cluster.address))
                    rows[-1]["actors_per_ray_node"] = {node: count - before.get(node, 0)
                                                       for node, count in after.items()}
                print(json.dumps(rows[-1]), flush=True)
                write(rows, args)


if __name__ == "__main__":
    main()
