"""A real deployment on loopback: flower-superlink + 3 flower-supernode processes."""

import json
import re
import threading
import time

import pytest

from ovalp_flwr import deploy
from ovalp_flwr.launch import stop_group
from test_flwr_run import left_behind  # tests/ is on sys.path under pytest

pytestmark = pytest.mark.e2e


def test_three_supernodes_with_their_own_caches_complete_a_run(tmp_path, capfd):
    flwr_home, results = tmp_path / "flwr-home", tmp_path / "results"
    run_config = (f"encoder='pixels' num-server-rounds=2 partition='iid' run-name='deploy' "
                  f"results-dir='{results}' feature-cache-dir='{tmp_path / 'server-cache'}'")
    code = deploy.main(["-n", "3", "--node-dir", str(tmp_path / "node{i}"),
                        "--flwr-home", str(flwr_home), "--", "--run-config", run_config])
    out = capfd.readouterr().out
    assert code == 0, out[-3000:]
    summary = json.loads((results / "deploy" / "summary.json").read_text())
    assert summary["num_clients"] == 3 and [r["round"] for r in summary["rounds"]] == [1, 2]
    assert summary["partition"]["kind"] == "iid of node-local data"
    assert summary["final_accuracy"] > 0.5
    for i in range(3):  # each SuperNode built and kept its own cache and rows
        cache = tmp_path / f"node{i}" / "cache"
        assert (cache / "digits__pixels" / "manifest.json").exists()
        assert len(list((cache / ".rows").rglob("*.safetensors"))) == 1
    assert left_behind(flwr_home) == set(), "the deployment left processes behind"


def wait_for(path, pattern: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and re.search(pattern, path.read_text(errors="replace"), re.DOTALL):
            return
        time.sleep(0.5)
    raise TimeoutError(f"{pattern!r} did not appear in {path} within {timeout:.0f} s")


def test_a_supernode_killed_mid_run_leaves_the_others_to_finish(tmp_path):
    flwr_home, results = tmp_path / "flwr-home", tmp_path / "results"
    run_config = (f"encoder='pixels' num-server-rounds=3 partition='iid' run-name='fault' "
                  f"results-dir='{results}' feature-cache-dir='{tmp_path / 'cache'}'")
    outcome = {}
    with deploy.local_deployment(3, flwr_home) as deployment:
        runner = threading.Thread(target=lambda: outcome.update(
            result=deploy.run_app(deployment, deploy.PROJECT, ["--run-config", run_config])))
        runner.start()
        # node 2 dies as its second train message (round 2) arrives. (Killed right after
        # sending a reply, that reply is lost too: the SuperLink answers for a node that
        # went offline with an error, so a round can only count on nodes still online.)
        wait_for(flwr_home / "deploy" / "supernode-2.log",
                 r"Receiving: train message.*?Receiving: train message")
        stop_group(deployment.supernodes[2])
        runner.join(timeout=600)
    code, final_line = outcome["result"]
    assert code == 0 and final_line.startswith("0.")
    rounds = json.loads((results / "fault" / "summary.json").read_text())["rounds"]
    assert rounds[0]["clients_trained"] == 3
    assert [(r["clients_trained"], r["clients_failed"]) for r in rounds[1:]] == [(2, 1), (2, 1)]
    assert left_behind(flwr_home) == set()
