"""A real deployment on loopback: flower-superlink + 3 flower-supernode processes, with the
ServerApp and ClientApp runtimes as separate flower-superexec processes (docker/compose.yml)."""

import json
import re
import threading
import time
from pathlib import Path

import pytest

from ovalp_flwr import deploy
from ovalp_flwr.launch import descendants
from ovalp_flwr.personalize.store import read_model
from test_flwr_run import left_behind  # tests/ is on sys.path under pytest

pytestmark = pytest.mark.e2e


class AppProcesses(threading.Thread):
    """Which app executables ran under the server's runtime and under the nodes' runtimes."""

    def __init__(self, server_runtime_pid: int, node_runtime_pids: list[int]):
        super().__init__(daemon=True)
        self.roots = {"server": [server_runtime_pid], "nodes": node_runtime_pids}
        self.seen: dict[str, set[str]] = {"server": set(), "nodes": set()}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.3):
            for side, roots in self.roots.items():
                for pid in (kid for root in roots for kid in descendants(root)):
                    try:
                        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    except OSError:
                        continue
                    self.seen[side].update(Path(a.decode()).name for a in argv[:2] if a)


def test_three_supernodes_with_their_own_caches_complete_a_run_and_personalize(tmp_path, capfd, monkeypatch):
    flwr_home, results = tmp_path / "flwr-home", tmp_path / "results"
    run_config = (f"encoder='pixels' num-server-rounds=2 partition='iid' run-name='deploy' "
                  f"results-dir='{results}' feature-cache-dir='{tmp_path / 'server-cache'}' "
                  "personalize='ft lp-ft own-heads' pft-epochs=2 pft.lp-ft.lp-epochs=1")
    watchers = []
    run_app = deploy.run_app

    def watched_run_app(deployment, app, flwr_args, console=None):
        watchers.append(AppProcesses(deployment.server_runtime.pid,
                                     [node.runtime.pid for node in deployment.nodes]))
        watchers[0].start()
        try:
            return run_app(deployment, app, flwr_args, console)
        finally:
            watchers[0].done.set()

    monkeypatch.setattr(deploy, "run_app", watched_run_app)
    code = deploy.main(["-n", "3", "--node-dir", str(tmp_path / "node{i}"),
                        "--flwr-home", str(flwr_home), "--", "--run-config", run_config])
    out = capfd.readouterr().out
    assert code == 0, out[-3000:]
    # the launcher shows each SuperNode building its cache, read from the node's log file
    for i in range(3):
        assert any(line.startswith(f"supernode-{i}-clientapp: ") and "100%|" in line
                   for line in out.splitlines()), out[-3000:]
    assert out.splitlines()[-1].startswith("final accuracy ")
    # process isolation, as in compose: the runtimes, not SuperLink/SuperNodes, ran the apps
    assert "flwr-serverapp" in watchers[0].seen["server"], watchers[0].seen
    assert "flwr-clientapp" in watchers[0].seen["nodes"], watchers[0].seen
    for i in range(3):
        log = (flwr_home / "deploy" / f"supernode-{i}-clientapp.log").read_text(errors="replace")
        assert "Start `flwr-clientapp` process" in log
    summary = json.loads((results / "deploy" / "summary.json").read_text())
    assert summary["num_clients"] == 3 and [r["round"] for r in summary["rounds"]] == [1, 2]
    assert summary["partition"]["kind"] == "iid of node-local data"
    assert summary["final_accuracy"] > 0.5
    # the ridge start from the statistics of each node's own data, sent once each
    assert summary["head_init"]["clients_sent"] == 3 and summary["initial_accuracy"] > 0.85
    for i in range(3):  # each SuperNode built and kept its own cache and rows
        cache = tmp_path / f"node{i}" / "cache"
        assert (cache / "digits__pixels" / "manifest.json").exists()
        assert len(list((cache / ".rows").rglob("*.safetensors"))) == 1
    # the personalization phase ran on the real nodes; each keeps its models in its own dir
    phase = summary["personalization"]
    assert list(phase["methods"]) == ["global", "ft", "lp-ft", "own-heads"]
    assert all(len(result["clients"]) == 3 for result in phase["methods"].values())
    assert phase["methods"]["ft"]["summary"]["local"] >= 0.5
    for i in range(3):
        for method in ("ft", "lp-ft", "own-heads"):
            arrays, metadata = read_model(tmp_path / f"node{i}" / "models" / "deploy"
                                          / f"{method}.safetensors")
            assert (metadata["partition-id"], metadata["method"]) == (str(i), method)
            assert arrays["weight"].shape == (10, 64)
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
        deployment.nodes[2].stop()  # the host fails: SuperNode and ClientApp runtime
        runner.join(timeout=600)
    code, final_line = outcome["result"]
    assert code == 0 and final_line.startswith("0.")
    rounds = json.loads((results / "fault" / "summary.json").read_text())["rounds"]
    assert rounds[0]["clients_trained"] == 3
    assert [(r["clients_trained"], r["clients_failed"]) for r in rounds[1:]] == [(2, 1), (2, 1)]
    assert left_behind(flwr_home) == set()


def test_a_supernode_that_joins_late_trains_from_the_next_round(tmp_path, capfd):
    """Real processes, Flower's default subprocess isolation (the other tests use process)."""
    flwr_home, results = tmp_path / "flwr-home", tmp_path / "results"
    run_config = (f"encoder='pixels' num-server-rounds=4 partition='iid' run-name='late' "
                  f"results-dir='{results}' feature-cache-dir='{tmp_path / 'cache'}'")
    outcome = {}
    with deploy.local_deployment(2, flwr_home, isolation="subprocess",
                                 num_partitions=3) as deployment:
        runner = threading.Thread(target=lambda: outcome.update(
            result=deploy.run_app(deployment, deploy.PROJECT, ["--run-config", run_config])))
        runner.start()
        wait_for(flwr_home / "deploy" / "supernode-0.log", r"Receiving: train message")
        deploy.start_supernode(deployment, 2, 3, None)  # partition 2 had no node until now
        runner.join(timeout=600)
    out = capfd.readouterr().out
    code, final_line = outcome["result"]
    assert code == 0 and final_line.startswith("0."), out[-3000:]
    assert "1 node(s) connected late, 1 admitted; 3 in the federation" in out
    summary = json.loads((results / "late" / "summary.json").read_text())
    assert summary["head_init"]["clients_sent"] == 2  # the heads started before it came
    rounds = summary["rounds"]
    trained = [r["clients_trained"] for r in rounds]
    joined = trained.index(3)  # the first round after it connected; from then on, every round
    assert trained[0] == 2 and 1 <= joined <= 2 and trained[joined:] == [3] * (4 - joined), trained
    assert all(r["clients_failed"] == 0 for r in rounds)
    assert left_behind(flwr_home) == set()


def test_flora_fine_tunes_an_encoder_on_real_supernodes(tmp_path, capfd):
    """The encoder path on real processes: every message a fresh ClientApp process, so FLoRA's
    merged update lives only in the node's context state, which the SuperNode keeps."""
    flwr_home, results = tmp_path / "flwr-home", tmp_path / "results"
    run_config = (f"finetune='flora' encoder='tiny-cnn' head-init='random' "
                  f"drift-correction='none' limit-per-class=12 num-server-rounds=3 local-epochs=1 "
                  f"batch-size=8 partition='iid' fraction-train=0.67 run-name='flora' "
                  f"results-dir='{results}'")
    code = deploy.main(["-n", "3", "--flwr-home", str(flwr_home), "--", "--run-config",
                        run_config])
    out = capfd.readouterr().out
    assert code == 0, out[-3000:]
    summary = json.loads((results / "flora" / "summary.json").read_text())
    assert summary["finetune"]["method"] == "flora"
    rounds = summary["rounds"]
    assert [r["clients_trained"] for r in rounds] == [2, 2, 2]
    assert all(not r["clients_failed"] and not r["clients_rejected"] for r in rounds)
    assert rounds[1]["bytes_sent_per_client"] > rounds[0]["bytes_sent_per_client"]
    assert left_behind(flwr_home) == set(), "the deployment left processes behind"
