"""The floor ServerApp: the project's exchanges (wait for the nodes, the set-up queries, then one
train message per node per round carrying heads of the same shapes) through the same grid and
polling as `server_app.py`, with nothing computed between them. Its round seconds are what
Flower's runtime costs a round of the embedded default when our work costs nothing."""

from __future__ import annotations

import json
import time
from logging import INFO
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log

from ovalp_flwr.core.durable import replace_durably
from ovalp_flwr.federation.exchange import exchange, wait_for_nodes
from ovalp_flwr.federation.polling import prompt_replies
from ovalp_flwr.federation.protocol import to_record

app = ServerApp()


def heads(config: dict, server_round: int, node: int, copies: int) -> ArrayRecord:
    """`copies` heads of the run's shapes (weight K x D, bias K), new every round: the first the
    same for every node (the global head), the others the node's own (SCAFFOLD's correction),
    as in the project's train messages: Flower moves new objects, and shares none but the first."""
    shape = (int(config["classes"]), int(config["dim"]))
    arrays = {}
    for copy in range(copies):
        suffix, value = ("", server_round) if copy == 0 else (f"-{copy}", node + server_round)
        arrays[f"weight{suffix}"] = np.full(shape, value, np.float32)
        arrays[f"bias{suffix}"] = np.full(shape[0], value, np.float32)
    return to_record(arrays)


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = dict(context.run_config)
    grid = prompt_replies(grid)
    started = time.time()
    nodes = wait_for_nodes(grid)
    for _ in range(int(config["setup-exchanges"])):
        exchange(grid, "query", {node: RecordDict({"config": ConfigRecord({"ask": 1})})
                                 for node in nodes})
    setup_done = time.time()
    log(INFO, "round  0/%s  set-up done", config["num-server-rounds"])
    round_seconds = []
    last = time.monotonic()
    for server_round in range(1, int(config["num-server-rounds"]) + 1):
        exchange(grid, "train", {node: RecordDict({  # every node replies, or it raises
            "arrays": heads(config, server_round, node, int(config["heads-down"])),
            "config": ConfigRecord({"round": server_round})}) for node in nodes})
        now = time.monotonic()
        round_seconds.append(now - last)
        last = now
        log(INFO, "round %2d/%s  %.2f s", server_round, config["num-server-rounds"],
            round_seconds[-1])
    run_dir = Path(config["results-dir"]) / str(config["run-name"])
    run_dir.mkdir(parents=True, exist_ok=True)
    replace_durably(run_dir / "floor.json", json.dumps(
        {"nodes": len(nodes), "started_unix": started, "setup_done_unix": setup_done,
         "setup_seconds": setup_done - started, "round_seconds": round_seconds}).encode())
    log(INFO, "final accuracy none (the floor app trains nothing); results in %s", run_dir)
