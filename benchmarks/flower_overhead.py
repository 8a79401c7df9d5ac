"""What Flower's plumbing costs around our arithmetic, side by side in one run.

- `aggregation`: the server's own work per round at K = 100 classes, D = 1280 features and 100
  clients (the staged strategy's configure_train and aggregate_train on 100 synthetic replies:
  the reply screen, the weighted mean, SCAFFOLD's variates and corrections) against the bare
  weighted mean of the same, already decoded, float32 heads.
- `rounds`: the default config run in process (`federation.local_grid`), with `flwr run` on Ray
  (`ops.launch`) and on a local deployment of SuperLink + 3 SuperNodes (`ops.deploy`): seconds
  per round, for the set-up, the whole command and to 95% of the ceiling, read from each
  run's own results (`ops.timings`), and its accuracies (every runner must give the same).
  Beside each `flwr run` and deployment row, Flower's floor: `floor_app/` run the same way,
  the same exchanges and message shapes through the same grid and polling, with nothing
  computed on either side. What a round costs above it is ours.

Results go to benchmarks/results/flower_overhead.{json,md}:

    .venv/bin/python benchmarks/flower_overhead.py                  # both parts
    .venv/bin/python benchmarks/flower_overhead.py --only aggregation
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "results"


# --- aggregation ------------------------------------------------------------------------------


def _replies(messages, rng: np.random.Generator, global_arrays: dict,
             nodes: dict | None = None) -> list:
    """One train reply per message: the global head plus noise, 500 samples, 30 local steps;
    with `nodes` (node -> (RunConfig, Context): scaffold-variates = "clients"), each node's c_i
    as its ClientApp computes, keeps and uploads it (`scaffold_client`)."""
    from flwr.app import Message, MetricRecord, RecordDict

    from ovalp_flwr.federation import protocol as p
    from ovalp_flwr.federation.scaffold_client import drift_offset, reply_variate

    noise = [{key: rng.standard_normal(value.shape, dtype=np.float32) * 1e-3
              for key, value in global_arrays.items()} for _ in range(7)]
    shift = int(rng.integers(7))
    replies = []
    for i, message in enumerate(messages):
        local = {key: value + noise[(i + shift) % 7][key] * (1 + i % 3)
                 for key, value in global_arrays.items()}
        content = RecordDict({p.ARRAYS: p.to_record(local), p.METRICS: MetricRecord({
            p.NUM_EXAMPLES: 500, p.TRAIN_LOSS: 0.1, p.TRAIN_SECONDS: 0.01, p.LOCAL_STEPS: 30})})
        if nodes is not None:
            config, context = nodes[message.metadata.dst_node_id]
            offset = drift_offset(message, context)
            content[p.VARIATE] = reply_variate(config.rounds, config.learning_rate, context,
                                               message, local, 30, offset)
        replies.append(Message(content=content, reply_to=message))
    return replies


def bare_mean(heads: list[dict[str, np.ndarray]], weights: list[float]) -> dict[str, np.ndarray]:
    """The arithmetic alone, on decoded heads: sum_i x_i * w_i / sum w in float32, in place."""
    total = sum(weights)
    mean = {key: value * (weights[0] / total) for key, value in heads[0].items()}
    scratch = {key: np.empty_like(value) for key, value in mean.items()}
    for head, weight in zip(heads[1:], weights[1:]):
        for key, value in head.items():
            np.multiply(value, weight / total, out=scratch[key])
            mean[key] += scratch[key]
    return mean


def aggregation(classes: int, dim: int, clients: int, rounds: int, drift_correction: str,
                scaffold_variates: str = "server") -> dict:
    """Median milliseconds per round of the strategy's configure_train and aggregate_train (from
    round 3: SCAFFOLD's corrections start once clients have reported in stage 2), and of the
    bare weighted mean of the same replies, decoded beforehand. The clients' own work (with
    scaffold-variates = "clients", their c_i) is outside the timed calls, as it is on a node."""
    from flwr.app import ConfigRecord, Context, RecordDict
    from flwr.clientapp import ClientApp

    from ovalp_flwr.config import RunConfig
    from ovalp_flwr.federation import protocol as p
    from ovalp_flwr.federation.local_grid import InProcessGrid
    from ovalp_flwr.federation.rounds import make_strategy, train_reply_check

    config = RunConfig(drift_correction=drift_correction, stage1_rounds=1,
                       scaffold_variates=scaffold_variates)
    grid = InProcessGrid(ClientApp(), clients, run_config={})
    nodes = sorted(grid.get_node_ids())
    contexts = None if scaffold_variates == "server" else {
        node: (config, Context(run_id=1, node_id=node, node_config={}, state=RecordDict(),
                               run_config={})) for node in nodes}
    described = {node: {p.NUM_EXAMPLES: 500, p.PARTITION_ID: i, p.NUM_PARTITIONS: clients}
                 for i, node in enumerate(nodes)}
    strategy = make_strategy(config, node_order=nodes,
                             check_reply=train_reply_check(config, described, 30))
    rng = np.random.default_rng(0)
    global_arrays = {"weight": rng.standard_normal((classes, dim), dtype=np.float32) * 0.01,
                     "bias": np.zeros(classes, np.float32)}
    arrays = p.to_record(global_arrays)
    times: dict[str, list[float]] = {"configure_train": [], "aggregate_train": [],
                                     "bare_mean": [], "gemv": []}
    for server_round in range(1, rounds + 1):
        started = time.perf_counter()
        messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
        configured = time.perf_counter()
        replies = _replies(messages, rng, global_arrays, contexts)
        received = time.perf_counter()
        new_arrays, _ = strategy.aggregate_train(server_round, replies)
        aggregated = time.perf_counter()
        heads = [p.from_record(m.content[p.ARRAYS]) for m in replies]
        weights = [500.0] * len(heads)
        mean_started = time.perf_counter()
        mean = bare_mean(heads, weights)
        mean_done = time.perf_counter()
        stacked = np.stack([np.concatenate([h["weight"].ravel(), h["bias"]]) for h in heads])
        factors = np.full(len(heads), 1 / len(heads), np.float32)
        gemv_started = time.perf_counter()
        factors @ stacked
        gemv_done = time.perf_counter()
        assert all(np.array_equal(mean[key], new_arrays[key].numpy()) for key in mean), \
            "the strategy's mean is not the bare mean, bit for bit"
        arrays = new_arrays
        if server_round >= 3:
            times["configure_train"].append(configured - started)
            times["aggregate_train"].append(aggregated - received)
            times["bare_mean"].append(mean_done - mean_started)
            times["gemv"].append(gemv_done - gemv_started)
    ms = {key: 1e3 * statistics.median(values) for key, values in times.items()}
    ms["server"] = ms["configure_train"] + ms["aggregate_train"]
    return {"drift_correction": drift_correction, "scaffold_variates": scaffold_variates,
            "classes": classes, "dim": dim,
            "clients": clients, "rounds_timed": rounds - 2, "ms": ms,
            "aggregate_over_mean": ms["aggregate_train"] / ms["bare_mean"],
            "server_over_mean": ms["server"] / ms["bare_mean"]}


def aggregation_table(rows: list[dict]) -> list[str]:
    lines = ["| local step | configure_train | aggregate_train | server per round | bare mean "
             "| aggregate / mean | server / mean | (BLAS gemv on stacked heads) |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        ms = row["ms"]
        lines.append(f"| {_local_step(row)} "
                     f"| {ms['configure_train']:.1f} ms | {ms['aggregate_train']:.1f} ms "
                     f"| {ms['server']:.1f} ms | {ms['bare_mean']:.1f} ms "
                     f"| {row['aggregate_over_mean']:.2f}x | {row['server_over_mean']:.2f}x "
                     f"| {ms['gemv']:.1f} ms |")
    return lines


def _local_step(row: dict) -> str:
    if row["drift_correction"] != "scaffold":
        return "SGD"
    return f"SGD + SCAFFOLD, c_i kept by the {row.get('scaffold_variates', 'server')}"


# --- rounds: in process, flwr run, deployment -------------------------------------------------

PY = ".venv/bin/python"
IN_PROCESS = ("from ovalp_flwr.federation.local_grid import run_local; "
              "from ovalp_flwr.ops.preflight import parse_overrides; import sys; "
              "run_local(parse_overrides([sys.argv[2]]), int(sys.argv[1]))")
RUNNERS = {  # runner -> the command for (clients, run config)
    "in process": lambda n, rc: [PY, "-c", IN_PROCESS, str(n), rc],
    "flwr run (Ray)": lambda n, rc: [PY, "-m", "ovalp_flwr.ops.launch", "--num-supernodes",
                                     str(n), "--", "--run-config", rc],
    "deployment": lambda n, rc: [PY, "-m", "ovalp_flwr.ops.deploy", "-n", str(n), "--",
                                 "--run-config", rc],
}


ROOT = Path(__file__).resolve().parents[1]
NODE_LOGS = ROOT / ".flwr-deploy" / "deploy"  # ops.deploy's default --flwr-home: supernode-<i>.log
# on PYTHONPATH for the deployment run: Flower's log lines get timestamps (node_phases reads them)
TIMESTAMPS = Path(__file__).resolve().parent / "timestamps"


def node_phases(offsets: dict[Path, int]) -> dict:
    """Each SuperNode's train messages in the log lines written since `offsets` (file -> size
    before the run), phase by phase (`ops.timings.node_timeline`): medians and maxima over every
    message of every node, and how many replies Flower saw at its first 0.5 s step."""
    from ovalp_flwr.ops.timings import node_timeline

    messages = []
    for log, offset in offsets.items():
        with open(log, "rb") as handle:
            handle.seek(offset)
            messages += node_timeline(handle.read().decode(errors="replace"))
    phases = {phase: [m[phase] for m in messages if phase in m]
              for phase in ("pull", "reply_wait", "push", "idle")}
    return {"messages": len(messages),
            "first_step": sum(wait < 0.75 for wait in phases["reply_wait"]),
            **{f"{phase}_median": statistics.median(values) for phase, values in phases.items()
               if values},
            **{f"{phase}_max": max(values) for phase, values in phases.items() if values}}


def run_command(command: list[str], what: str, env: dict | None = None) -> None:
    """`command` from the project's root; SystemExit with its output's tail if it fails."""
    import subprocess

    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{what} failed ({done.returncode}):\n"
                         f"{done.stdout[-3000:]}{done.stderr[-3000:]}")


def timed_run(runner: str, clients: int, rounds: int, results: Path, target: float,
              variant: str = "") -> dict:
    """One run of the default config (with `variant`'s keys, e.g. "scaffold-variates='clients'")
    through `runner`; its timings (`ops.timings`), the command's wall seconds measured here, and
    its accuracies (to check that every runner got the same). A deployment also gives its
    SuperNodes' phases per message (`node_phases`)."""
    from ovalp_flwr.ops.timings import run_timings

    name = f"overhead-{runner.split()[0].lower()}-{clients}" + ("-variant" if variant else "")
    run_config = f"num-server-rounds={rounds} results-dir='{results}' run-name='{name}' {variant}"
    env = dict(os.environ)
    if runner == "deployment":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TIMESTAMPS),
                                                          env.get("PYTHONPATH")]))
        NODE_LOGS.mkdir(parents=True, exist_ok=True)
        offsets = {NODE_LOGS / f"supernode-{i}.log": 0 for i in range(clients)}
        for log in offsets:
            log.touch()
            offsets[log] = log.stat().st_size
    started = time.monotonic()
    run_command(RUNNERS[runner](clients, run_config), f"{runner} with {clients} clients", env)
    wall = time.monotonic() - started
    timings = run_timings(results / name, target)
    summary = json.loads((results / name / "summary.json").read_text())
    curve = [summary["initial_accuracy"], *(r["accuracy"] for r in summary["rounds"])]
    return {"runner": runner, "clients": clients, "variant": variant, "wall_seconds": wall,
            "accuracies": curve,
            **{key: timings[key] for key in ("median_round_seconds", "setup_seconds",
                                             "serverapp_seconds", "target_round",
                                             "seconds_to_target", "command_seconds")},
            **({"node_phases": node_phases(offsets)} if runner == "deployment" else {})}


FLOOR_APP = Path(__file__).resolve().parent / "floor_app"


def floor_run(runner: str, clients: int, rounds: int, results: Path) -> dict:
    """The floor app (`floor_app/`: the default run's set-up exchanges and train messages,
    same shapes, same grid and polling, nothing computed) through `runner`: Flower's seconds
    per round (median over rounds 2.., as for the project's runs) and from the command to the
    end of its set-up exchanges, when the project's run scores its start (round 0)."""
    name = f"floor-{runner.split()[0].lower()}-{clients}"
    command = RUNNERS[runner](clients, f"num-server-rounds={rounds} results-dir='{results}' "
                                       f"run-name='{name}'")
    dashes = command.index("--")
    command[dashes:dashes] = ["--app", str(FLOOR_APP)]
    started = time.time()
    run_command(command, f"the floor app on {runner} with {clients} clients")
    floor = json.loads((results / name / "floor.json").read_text())
    return {"median_round_seconds": statistics.median(floor["round_seconds"][1:]),
            "setup_done_seconds": floor["setup_done_unix"] - started,
            "wall_seconds": time.time() - started}


def warm_node_caches(clients: int, results: Path) -> None:
    """A deployed node keeps its own feature cache (`ops.deploy`): one untimed round of the
    deployment first, unless every node's is there, so that the timed run's set-up is Flower's
    and ours, not an encoder's pass over the data."""
    if all((NODE_LOGS.parent / "nodes" / str(i) / "cache").is_dir() for i in range(clients)):
        return
    command = RUNNERS["deployment"](clients, f"num-server-rounds=1 results-dir='{results}' "
                                             "run-name='warm-node-caches'")
    run_command(command, "the untimed deployment that builds the nodes' caches")


def rounds_part(rounds: int, results: Path, target: float,
                sizes: list[tuple[str, int, str]]) -> list:
    """Each (runner, clients, variant) timed; the floor app beside each runner and size once;
    each row against the in-process run of its size and variant (the first such row)."""
    rows = [timed_run(runner, clients, rounds, results, target, variant)
            for runner, clients, variant in sizes]
    floors: dict[tuple[str, int], dict] = {}
    for row in rows:
        where = (row["runner"], row["clients"])
        if row["runner"] != "in process":
            row["floor"] = floors.get(where) or floors.setdefault(
                where, floor_run(row["runner"], row["clients"], rounds, results))
    for row in rows:
        first = next(r for r in rows if r["clients"] == row["clients"])
        baseline = next((r for r in rows if r["runner"] == "in process" and
                         (r["clients"], r["variant"]) == (row["clients"], row["variant"])), first)
        row["same_accuracies_as_in_process"] = row["accuracies"] == first["accuracies"]
        row["in_process_round_seconds"] = baseline["median_round_seconds"]
        row["round_over_in_process"] = (row["median_round_seconds"]
                                        / baseline["median_round_seconds"])
    return rows


def rounds_table(rows: list[dict], target: float) -> list[str]:
    lines = ["| runner | clients | run config | per round (median) | x in process "
             "| Flower's floor per round "
             "(x in process) | ours above the floor | set-up | whole command "
             f"| to {100 * target:.2f}% (round) | the floor's set-up done | same accuracies |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        to_target = ("-" if r["seconds_to_target"] is None else
                     f"{r['seconds_to_target']:.1f} s ({r['target_round']})")
        floor, floor_setup, above = "-", "-", "-"
        if "floor" in r:
            per_round = r["floor"]["median_round_seconds"]
            floor = f"{per_round:.2f} s ({per_round / r['in_process_round_seconds']:.1f}x)"
            above = f"{r['median_round_seconds'] - per_round:+.2f} s"
            floor_setup = f"{r['floor']['setup_done_seconds']:.1f} s"
        lines.append(f"| {r['runner']} | {r['clients']} | {_variant(r)} "
                     f"| {r['median_round_seconds']:.2f} s "
                     f"| {r['round_over_in_process']:.1f}x | {floor} | {above} "
                     f"| {r['setup_seconds']:.1f} s | {r['wall_seconds']:.1f} s | {to_target} "
                     f"| {floor_setup} | {'yes' if r['same_accuracies_as_in_process'] else 'NO'} |")
    return lines


def _variant(row: dict) -> str:
    return f"`{row['variant']}`" if row.get("variant") else "the default"


def phases_table(rows: list[dict]) -> list[str]:
    """The deployment's SuperNode phases per train message (`node_phases`)."""
    lines: list[str] = []
    names = {"pull": "pull the message's objects from the SuperLink",
             "reply_wait": "wait for the ClientApp's reply (Flower looks every 0.5 s)",
             "push": "push the reply to the SuperLink",
             "idle": "after the push: pull nothing, sleep 3 s, pull the next message"}
    for row in rows:
        phases = row.get("node_phases")
        if not phases:
            continue
        lines += [f"{row['clients']} nodes, {_variant(row)}:", "",
                  "| phase (Flower's code) | median | max |", "|---|---|---|"]
        for phase, name in names.items():
            if f"{phase}_median" in phases:
                lines.append(f"| {name} | {phases[phase + '_median']:.2f} s "
                             f"| {phases[phase + '_max']:.2f} s |")
        lines += ["", f"{phases['first_step']} of {phases['messages']} replies were there at "
                  "Flower's first 0.5 s look.", ""]
    return lines


# --- the report -------------------------------------------------------------------------------


def machine() -> str:
    from flwr import __version__ as flwr_version  # late: the report's line only

    return (f"{platform.machine()}, {os.cpu_count()} CPU cores, Python "
            f"{platform.python_version()}, flwr {flwr_version}")


def write(name: str, payload: dict, lines: list[str]) -> None:
    """benchmarks/results/<name>.{json,md}, each written whole under a temp name, then renamed."""
    OUT.mkdir(exist_ok=True)
    for suffix, text in ((".json", json.dumps(payload, indent=1)), (".md", "\n".join(lines) + "\n")):
        path = OUT / f"{name}{suffix}"
        temp = path.with_suffix(suffix + ".tmp")
        temp.write_text(text)
        temp.replace(path)


def render(payload: dict, args: argparse.Namespace) -> list[str]:
    """The report's markdown from its JSON payload (either part may be absent)."""
    lines = ["# Flower's plumbing around our arithmetic", "",
             "Command: `.venv/bin/python benchmarks/flower_overhead.py`; machine: "
             f"{payload['machine']}.", ""]
    if "aggregation" in payload:
        first = payload["aggregation"][0]
        lines += [f"## Server work per round: K = {first['classes']}, D = {first['dim']}, "
                  f"{first['clients']} clients", "",
                  f"Medians over rounds 3-{first['rounds_timed'] + 2} (from round 3 SCAFFOLD "
                  "sends corrections). The bare mean is the arithmetic any bit-identical FedAvg "
                  "does (in place, float32, on arrays decoded beforehand); the strategy's mean "
                  "is checked equal to it, bit for bit, every round. With c_i kept by the clients "
                  "(`scaffold-variates = \"clients\"`), each node's work on its c_i is outside "
                  "the timed calls, as it is on a node; the server sums the c_i it receives.", "",
                  *aggregation_table(payload["aggregation"]), ""]
    if "rounds" in payload:
        rows = payload["rounds"]
        lines += [f"## Rounds: the default config, {len(rows[0]['accuracies']) - 1} rounds, "
                  "each runner", "",
                  "Per round: the ServerApp's `round_seconds`, median over rounds 2.. "
                  "(`python -m ovalp_flwr.ops.timings`); set-up: the ServerApp's, to the "
                  "start's score; whole command: from the command to its exit, measured "
                  "around it; to the target: from the command to the first score at or above "
                  "it, as the launcher saw the line. In-process runs print no stream, so "
                  "they have no such time. Flower's floor: `benchmarks/floor_app` through the "
                  "same runner (the same set-up exchanges, then train messages of the same "
                  "shapes, on the same grid and polling, with nothing computed on either side); "
                  "its set-up done: from its command to the end of its set-up exchanges, where "
                  "the project's run scores its start. The deployment's nodes have built their "
                  "feature caches before it is timed (`warm_node_caches`). x in process: "
                  "against the in-process run of the same size and run config; same "
                  "accuracies: every score equal to the first run of that size's.", "",
                  *rounds_table(rows, args.target), "",
                  "### The deployment's SuperNodes, train message by train message", "",
                  "From the nodes' logs (Flower's timestamps on: `benchmarks/timestamps/`, "
                  "`ops.timings.node_timeline`), over every train message of the 3 nodes.", "",
                  *phases_table(rows), ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("aggregation", "rounds"), default=None,
                        help="measure one part; the other is kept from the last results")
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--dim", type=int, default=1280)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--run-rounds", type=int, default=20, help="rounds of each timed run")
    parser.add_argument("--target", type=float, default=0.9025,
                        help="accuracy to time the runs to: 95%% of the digits ceiling (95.00%%, "
                             "benchmarks/results/centralised_ceiling.md)")
    parser.add_argument("--results-dir", type=Path, default=Path("/tmp/ovalp-overhead"))
    args = parser.parse_args()
    last = OUT / "flower_overhead.json"
    payload: dict = json.loads(last.read_text()) if args.only and last.is_file() else {}
    payload["machine"] = machine()
    if args.only in (None, "aggregation"):
        payload["aggregation"] = [
            aggregation(args.classes, args.dim, args.clients, args.rounds, drift, variates)
            for drift, variates in (("none", "server"), ("scaffold", "server"),
                                    ("scaffold", "clients"))]
    if args.only in (None, "rounds"):
        clients_keep = "scaffold-variates='clients'"
        sizes = [("in process", 3, ""), ("flwr run (Ray)", 3, ""), ("deployment", 3, ""),
                 ("in process", 3, clients_keep), ("deployment", 3, clients_keep),
                 ("in process", 100, ""),
                 ("flwr run (Ray)", 100, ""), ("in process", 100, clients_keep),
                 ("flwr run (Ray)", 100, clients_keep)]
        warm_node_caches(3, args.results_dir.resolve())
        payload["rounds"] = rounds_part(args.run_rounds, args.results_dir.resolve(), args.target,
                                        sizes)
    lines = render(payload, args)
    write("flower_overhead", payload, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
