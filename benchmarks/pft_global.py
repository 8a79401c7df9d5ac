"""`pft-global = "server"` against `"clients"` on conf/personalization-label-shift.toml: the
Global figures the two give, and the phase's seconds against its fine-tuning's.

Each run is the preset's run through the product's own ServerApp and ClientApp in one process
(`federation.local_grid`, as `sweep --runner local`), with `pft-global = "server"`: its
`summary.json` gives the server's Global and the phase's timing. The grid keeps every
personalized model the clients uploaded; the clients' cross-scoring (`pft-global = "clients"`,
`evaluate.personalized`) then scores those very models, so both Globals judge the same models
(fine-tuning is seeded by run seed and partition: a clients-mode run trains them bit for bit,
tests/test_phase.py). The federation and fine-tuning are not run twice.

"Within noise": per method, the difference (server − clients) against (a) a paired bootstrap
over clients (resampling the 20 clients with replacement, both Globals of a client together:
the 95% interval of the difference) and (b) the seed-to-seed standard deviation of Global when
more than one seed ran.

    python benchmarks/pft_global.py                  # every seed of the preset
    python benchmarks/pft_global.py --seeds 0        # fewer, on a 2-core machine
    python benchmarks/pft_global.py --report         # the .json/.md from the runs kept

Runs are kept in results/pft-global/<run>.json (delete one to redo it); the tables go to
benchmarks/results/pft_global.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the apps (client_app, server_app) live at the project root

PRESET = ROOT / "conf" / "personalization-label-shift.toml"
RUNS = ROOT / "results" / "pft-global"
OUT = ROOT / "benchmarks" / "results" / "pft_global"
BOOTSTRAP = 2000


def recording_grid(num_nodes: int, run_config: dict[str, Any], seed: int):
    """An in-process grid that keeps, per method, every client's PERSONALIZE reply models and
    the request (the global model, the normalisation digest)."""
    from client_app import app as flower_client_app
    from ovalp_flwr.federation import protocol as p
    from ovalp_flwr.federation.local_grid import InProcessGrid

    class RecordingGrid(InProcessGrid):
        def __init__(self) -> None:
            super().__init__(flower_client_app, num_nodes, run_config, seed=seed)
            self.sent: Counter = Counter()
            self.request: dict[str, Any] = {}
            self.models: dict[str, dict[int, dict]] = {}  # method -> node -> reply arrays

        def send_and_receive(self, messages, *, timeout=None):
            messages = list(messages)
            replies = list(super().send_and_receive(messages, timeout=timeout))
            for message, reply in zip(messages, replies):
                self.sent[message.metadata.message_type] += 1
                if message.metadata.message_type == p.PERSONALIZE and not reply.has_error():
                    method = str(message.content[p.CONFIG][p.METHOD])
                    self.request = {"arrays": message.content[p.ARRAYS],
                                    "digest": message.content[p.CONFIG].get(p.NORM_DIGEST, "")}
                    self.models.setdefault(method, {})[message.metadata.dst_node_id] = \
                        dict(reply.content.array_records.items())
            return replies

    return RecordingGrid()


def clients_scores(grid, config, summary: dict) -> tuple[dict[str, dict], float]:
    """The clients' cross-scoring of the models the server-mode run kept, per method: Global
    (and the curve's) as `pft-global = "clients"` computes it; and its seconds."""
    from ovalp_flwr.federation import protocol as p
    from ovalp_flwr.federation.exchange import SetupCosts
    from ovalp_flwr.federation.setup import by_partition
    from ovalp_flwr.personalize.metrics import mean_global, per_client
    from ovalp_flwr.personalize.phase import GLOBAL, _models, _score  # the phase's own steps

    partitions = {node: int(ctx.node_config["partition-id"]) for node, ctx in grid.contexts.items()}
    nodes = by_partition({n: {p.PARTITION_ID: i} for n, i in partitions.items()})
    common = {p.NORM_DIGEST: grid.request["digest"]} if grid.request["digest"] else {}
    started, costs = time.perf_counter(), SetupCosts()
    out: dict[str, dict] = {}
    reference = _score(grid, nodes, grid.request["arrays"], common,
                       {GLOBAL: grid.request["arrays"]}, partitions, costs,
                       model_of=lambda _partition, _suffix: GLOBAL)
    out[GLOBAL] = {"clients": [r["global"] for r in per_client(reference[""])]}
    for method in config.personalization_methods:
        replies = {n: _Reply(records) for n, records in grid.models[method].items()}
        scores = _score(grid, nodes, grid.request["arrays"], common,
                        _models(replies, nodes, partitions), partitions, costs)
        rows = per_client(scores[""])
        out[method] = {"clients": [r["global"] for r in rows],
                       "local": [r["local"] for r in rows],
                       "curve": {s[1:]: mean_global(per_client(c)) for s, c in scores.items() if s}}
    return out, time.perf_counter() - started


class _Reply(dict):
    """A PERSONALIZE reply's array records, as `phase._models` reads a reply."""

    @property
    def array_records(self) -> dict:
        return self


def places(preset_name: str) -> tuple[Path, Path]:
    """Where a preset's kept runs and its tables go (the default preset: RUNS and OUT)."""
    if preset_name == PRESET.stem:
        return RUNS, OUT
    return RUNS.with_name(f"pft-global-{preset_name}"), OUT.with_name(f"pft_global_{preset_name}")


def run(spec, preset, runs_dir: Path) -> dict:
    """One server-mode run of the preset, then the clients' scoring of its models."""
    from ovalp_flwr.config import RunConfig
    from ovalp_flwr.federation.local_grid import app_config
    from ovalp_flwr.federation.results import read_summary
    from server_app import run_server

    run_config = {**app_config(), **spec.run_config, "pft-global": "server",
                  "run-name": spec.name, "results-dir": str(runs_dir / "runs")}
    config = RunConfig.from_mapping(run_config)
    grid = recording_grid(preset.num_supernodes, run_config, spec.seed)
    started = time.perf_counter()
    summary = read_summary(run_server(grid, config))
    run_seconds = time.perf_counter() - started
    phase = summary["personalization"]
    clients, clients_seconds = clients_scores(grid, config, summary)
    methods = {}
    for method, result in phase["methods"].items():
        rows = result["clients"]
        methods[method] = {
            "server": {"global": result["summary"]["global"],
                       "clients": [r["global"] for r in rows],
                       "local": [r["local"] for r in rows],
                       "curve": result.get("curve", {}).get("global", {})},
            "clients": {"global": float(np.mean([g for g in clients[method]["clients"]
                                                 if g is not None])),
                        **clients[method]},
        }
    return {"run": spec.name, "seed": spec.seed, "axis": "-".join(c for _, c in spec.choices),
            "final_accuracy": summary["final_accuracy"], "timing": phase["timing"],
            "phase_costs": phase["costs"], "messages": dict(grid.sent),
            "run_seconds": run_seconds, "clients_scoring_seconds": clients_seconds,
            "methods": methods}


def bootstrap_difference(server: list, clients: list, seed: int = 0) -> tuple[float, float]:
    """The 95% interval of mean(server − clients) over clients resampled with replacement."""
    pairs = np.array([(s, c) for s, c in zip(server, clients) if s is not None and c is not None])
    diff = pairs[:, 0] - pairs[:, 1]
    draws = np.random.default_rng(seed).integers(0, len(diff), (BOOTSTRAP, len(diff)))
    means = diff[draws].mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def table(runs: list[dict]) -> list[dict]:
    """Per federation axis and method: both Globals (mean over seeds), their difference, the
    bootstrap interval (pooled over the seeds' clients) and the seeds' spread."""
    rows = []
    for axis in dict.fromkeys(r["axis"] for r in runs):
        mine = [r for r in runs if r["axis"] == axis]
        for method in mine[0]["methods"]:
            server = [r["methods"][method]["server"]["global"] for r in mine]
            clients = [r["methods"][method]["clients"]["global"] for r in mine]
            low, high = bootstrap_difference(
                [g for r in mine for g in r["methods"][method]["server"]["clients"]],
                [g for r in mine for g in r["methods"][method]["clients"]["clients"]])
            spread = float(np.std(clients, ddof=1)) if len(mine) > 1 else None
            diff = float(np.mean(server) - np.mean(clients))
            rows.append({"federation": axis, "method": method, "seeds": [r["seed"] for r in mine],
                         "global_server": float(np.mean(server)),
                         "global_clients": float(np.mean(clients)), "difference": diff,
                         "bootstrap_95": [low, high], "seed_std_clients": spread,
                         "seed_std_server": float(np.std(server, ddof=1)) if len(mine) > 1
                         else None,
                         "within_bootstrap": low <= 0 <= high,
                         "within_seed_std": None if spread is None else abs(diff) <= spread})
    return rows


def timing_rows(runs: list[dict]) -> list[dict]:
    return [{"run": r["run"], **{k: r["timing"][k] for k in
                                ("phase", "fine_tuning_sum", "fine_tuning_max", "exchange",
                                 "scoring", "phase_over_fine_tuning")},
             "clients_scoring_seconds": r["clients_scoring_seconds"],
             "phase_messages": r["phase_costs"]["messages"],
             "phase_bytes": r["phase_costs"]["bytes_sent"] + r["phase_costs"]["bytes_received"],
             "score_messages": r["messages"].get("evaluate.personalized", 0)}
            for r in runs]


def markdown(rows: list[dict], timings: list[dict], runs: list[dict], seeds: list[int],
             preset: Path, preset_seeds: tuple[int, ...]) -> str:
    pct = lambda x: f"{100 * x:.1f}"  # noqa: E731
    lines = [
        "# pft-global: server against clients",
        "",
        f"`python benchmarks/pft_global.py --seeds {' '.join(map(str, seeds))}` on "
        f"{platform.machine()} ({os.cpu_count()} cores, shared), {len(runs)} run(s) of "
        f"`{preset.relative_to(ROOT) if preset.is_relative_to(ROOT) else preset}`"
        + (" (CIFAR-10 / Lite0, 20 clients, Dirichlet α = 0.1, 8 methods)"
           if preset == PRESET else "") + ", in process, seeds "
        f"{', '.join(map(str, seeds))}" + ("" if set(preset_seeds) <= set(seeds) else
                                          f" only of the preset's {', '.join(map(str, preset_seeds))} "
                                          "(`--seeds`: all of them did not fit ~40 min of 2 "
                                          "shared cores)") + ".",
        "Checked on a smaller preset: the clients' Globals computed this way equal a "
        "`pft-global = \"clients\"` run's, bit for bit.",
        "Each run: `pft-global = \"server\"`; then the clients' cross-scoring of the same "
        "uploaded models (`pft-global = \"clients\"`'s Global), so both judge the same models.",
        "",
        "## Global (%), server against clients",
        "",
        "Server: a client's model on the server's whole test split. Clients: its mean "
        "accuracy on the other clients' own test splits (each drawn with that client's "
        "training classes' proportions). "
        "Bootstrap: the 95% interval of the difference, clients resampled with replacement "
        f"({BOOTSTRAP} draws, pooled over seeds)"
        + ("; seed std: of the clients' Global over the seeds." if len(seeds) > 1 else
           "; one seed, so no seed-to-seed spread of our own."),
        "",
        "| federation | method | Global server | Global clients | difference | bootstrap 95% | "
        "seed std | within noise |",
        "|---|---|---:|---:|---:|---|---:|---|",
    ]
    for r in rows:
        low, high = r["bootstrap_95"]
        std = "" if r["seed_std_clients"] is None else pct(r["seed_std_clients"])
        verdict = "yes" if r["within_bootstrap"] else "no"
        if r["within_seed_std"] is not None:
            verdict += f" (seed std: {'yes' if r['within_seed_std'] else 'no'})"
        lines.append(f"| {r['federation']} | {r['method']} | {pct(r['global_server'])} | "
                     f"{pct(r['global_clients'])} | {100 * r['difference']:+.1f} | "
                     f"[{100 * low:+.1f}, {100 * high:+.1f}] | {std} | {verdict} |")
    lines += [
        "",
        "## The phase's seconds (server mode) against its fine-tuning",
        "",
        "Fine-tuning: the clients' train seconds summed over clients and methods (in process "
        "they run one after another) and the sum over methods of the slowest client (what "
        "parallel nodes would wait for). Exchange: the PERSONALIZE exchanges (fine-tuning "
        "included); scoring: the server's. Clients scoring: what `clients` adds on the same "
        "models (its `evaluate.personalized` exchanges).",
        "",
        "| run | phase s | fine-tuning s (sum) | slowest-client s | exchange s | server scoring s "
        "| phase / fine-tuning | messages | MB moved | clients scoring s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in timings:
        lines.append(f"| {t['run']} | {t['phase']:.1f} | {t['fine_tuning_sum']:.1f} | "
                     f"{t['fine_tuning_max']:.1f} | {t['exchange']:.1f} | {t['scoring']:.1f} | "
                     f"{t['phase_over_fine_tuning']:.2f} | {t['phase_messages']} | "
                     f"{t['phase_bytes'] / 1e6:.0f} | {t['clients_scoring_seconds']:.1f} |")
    return "\n".join(lines) + "\n"


def write(runs: list[dict], seeds: list[int], preset: Path, preset_seeds: tuple[int, ...],
          out: Path) -> None:
    from ovalp_flwr.core.durable import replace_durably

    rows, timings = table(runs), timing_rows(runs)
    out.parent.mkdir(parents=True, exist_ok=True)
    replace_durably(out.with_suffix(".json"), json.dumps(
        {"preset": str(preset), "seeds": seeds, "global": rows, "timing": timings,
         "runs": runs}, indent=1))
    replace_durably(out.with_suffix(".md"), markdown(rows, timings, runs, seeds, preset,
                                                            preset_seeds))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", help="default: the preset's")
    parser.add_argument("--only", nargs="*", default=[], help="sweep's axis=choice filters")
    parser.add_argument("--report", action="store_true", help="only the tables, from kept runs")
    parser.add_argument("--preset", type=Path, default=PRESET, help="another preset (a smoke "
                        "test); its runs and tables go beside the default's, named after it")
    args = parser.parse_args(argv)
    from ovalp_flwr.core.durable import replace_durably
    from ovalp_flwr.experiments.sweep import load_preset, select

    preset = load_preset(args.preset)
    runs_dir, out = places(preset.name)
    seeds = args.seeds or list(preset.seeds)
    specs = select(preset.runs(seeds), args.only)
    runs_dir.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        kept = runs_dir / f"{spec.name}.json"
        if kept.exists() or args.report:
            continue
        print(f"run {spec.name} ...", flush=True)
        result = run(spec, preset, runs_dir)
        replace_durably(kept, json.dumps(result))
        print(f"run {spec.name}: phase {result['timing']['phase']:.0f} s, fine-tuning "
              f"{result['timing']['fine_tuning_sum']:.0f} s", flush=True)
    runs = [json.loads((runs_dir / f"{s.name}.json").read_text()) for s in specs
            if (runs_dir / f"{s.name}.json").exists()]
    if runs:
        write(runs, sorted({r["seed"] for r in runs}), preset.path, preset.seeds, out)
        print(f"wrote {out}.json and .md from {len(runs)} run(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
