"""benchmarks/floor_app: the overhead benchmark's floor, the default run's exchanges with nothing
computed, here on the in-process grid (the benchmark runs it on Ray and on a deployment)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from flwr.app import Context, RecordDict

from ovalp_flwr.federation.local_grid import InProcessGrid
from ovalp_flwr.ops.preflight import app_defaults

FLOOR_APP = Path(__file__).resolve().parents[1] / "benchmarks" / "floor_app"
sys.path.insert(0, str(FLOOR_APP))
import floor_client  # noqa: E402
import floor_server  # noqa: E402


def test_the_floor_app_sends_the_default_runs_messages_and_times_its_rounds(tmp_path, monkeypatch):
    config = {**app_defaults(FLOOR_APP), "num-server-rounds": 3, "results-dir": str(tmp_path)}
    grid = InProcessGrid(floor_client.app, 3, run_config=config)
    sent = []
    push = grid.push_messages

    def recorded(messages):
        messages = list(messages)
        sent.extend(m for m in messages if m.metadata.message_type == "train")
        return push(messages)

    monkeypatch.setattr(grid, "push_messages", recorded)
    floor_server.main(grid, Context(run_id=0, node_id=0, node_config={}, state=RecordDict(),
                                    run_config=config))
    floor = json.loads((tmp_path / "floor" / "floor.json").read_text())
    assert floor["nodes"] == 3 and len(floor["round_seconds"]) == 3
    assert floor["setup_done_unix"] >= floor["started_unix"]
    assert len(sent) == 9
    for message in sent:  # the default's train message: the global head and SCAFFOLD's correction
        arrays = message.content["arrays"]
        assert {key: arrays[key].shape for key in arrays} == {
            "weight": (10, 1280), "bias": (10,), "weight-1": (10, 1280), "bias-1": (10,)}
    by_round = {}
    for message in sent:  # the head shared, the correction each node's own
        by_round.setdefault(message.content["config"]["round"], []).append(message)
    for messages in by_round.values():
        heads = [m.content["arrays"]["weight"].numpy() for m in messages]
        own = [m.content["arrays"]["weight-1"].numpy() for m in messages]
        assert all(np.array_equal(heads[0], head) for head in heads)
        assert len({value.tobytes() for value in own}) == len(own)
