"""One pass of the simulation runtime's message loop: Flower's (one `get_message_ins` per node,
each scanning every stored message) against `federation.simulation_queue` (one scan).

Flower's own in-memory state, nodes registered as its simulation registers them, and a 10%
round's train messages in it (one per sampled node):

    flock /tmp/ovalp-bench.lock .venv/bin/python benchmarks/simulation_queue.py

writes `benchmarks/results/simulation_queue.{json,md}`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))  # run as a script: the project's modules
sys.path.insert(0, str(PROJECT / "tests"))  # the test's Flower state, as the runtime builds it

from flwr import __version__ as FLWR_VERSION  # noqa: E402

from ovalp_flwr.core.durable import replace_durably  # noqa: E402
from ovalp_flwr.federation.simulation_queue import undelivered  # noqa: E402
from test_simulation_queue import push, simulation_state  # noqa: E402

OUT = PROJECT / "benchmarks" / "results"


def one_pass(num_nodes: int, ours: bool) -> tuple[float, int]:
    """Seconds of one pass with num_nodes / 10 messages waiting; how many it handed out."""
    state, grid, nodes = simulation_state(num_nodes)
    push(grid, nodes[::10])
    started = time.perf_counter()
    if ours:
        found = undelivered(state, set(nodes))
    else:
        found = [m for n in nodes for m in state.get_message_ins(node_id=n, limit=1)]
    return time.perf_counter() - started, len(found)


def main() -> None:
    rows = []
    for num_nodes in (1000, 10000):
        for ours in (False, True):
            seconds, handed = one_pass(num_nodes, ours)
            rows.append({"nodes": num_nodes, "messages": num_nodes // 10,
                         "loop": "simulation_queue (one scan)" if ours else f"Flower {FLWR_VERSION} (per node)",
                         "seconds": round(seconds, 4), "handed_out": handed})
            print(json.dumps(rows[-1]), flush=True)
    OUT.mkdir(exist_ok=True)
    command = "flock /tmp/ovalp-bench.lock .venv/bin/python benchmarks/simulation_queue.py"
    replace_durably(OUT / "simulation_queue.json",
                    json.dumps({"command": command, "flwr": FLWR_VERSION, "runs": rows}, indent=1).encode())
    lines = ["# One pass of the simulation's message loop (a 10% round waiting)", "",
             f"Command: `{command}` (flwr {FLWR_VERSION})", "", "| nodes | messages | loop | seconds per pass |",
             "|---|---|---|---|"]
    lines += [f"| {r['nodes']:,} | {r['messages']:,} | {r['loop']} | {r['seconds']} |" for r in rows]
    replace_durably(OUT / "simulation_queue.md", ("\n".join(lines) + "\n").encode())
    print("\n".join(lines))


if __name__ == "__main__":
    main()
