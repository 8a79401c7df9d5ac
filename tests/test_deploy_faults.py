"""Faults on a real deployment (SuperLink, SuperNodes and runtimes as processes on loopback): a
SuperNode that hangs, a ServerApp that is killed, a SuperLink that restarts (README,
"Reliability")."""

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from ovalp_flwr import deploy
from ovalp_flwr.checkpoint import FILE as CHECKPOINT, read_checkpoint
from ovalp_flwr.launch import descendants
from ovalp_flwr.local_grid import run_local
from ovalp_flwr.results import read_summary
from test_deploy import wait_for  # tests/ is on sys.path under pytest
from test_flwr_run import left_behind

pytestmark = pytest.mark.e2e


def signal_node(node: deploy.Node, signum: int) -> None:
    """`signum` to a SuperNode, its ClientApp runtime and every process they started."""
    for process in node.processes():
        for pid in [process.pid, *descendants(process.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)


def start_run(deployment: deploy.Deployment, run_config: str, outcome: dict) -> threading.Thread:
    runner = threading.Thread(target=lambda: outcome.update(
        result=deploy.run_app(deployment, deploy.PROJECT, ["--run-config", run_config])))
    runner.start()
    return runner


def test_a_frozen_supernode_times_out_and_a_poisoning_one_is_rejected(tmp_path):
    """Node 2 is frozen by SIGSTOP: alive and connected, never answering (a stuck driver, a
    laptop asleep); with round-timeout=25 its round ends without it after 25 s, not Flower's
    3600, and once thawed it trains again. Node 3 runs with `chaos='nan'`: every train reply
    it sends has a NaN, and every one is rejected. (Frozen for 30 s: the SuperLink calls a
    node offline 36-60 s after its last heartbeat, and then its rounds fail at once instead.)
    The assertions allow for a busy machine, where a round can time out a slow node too."""
    flwr_home, results = tmp_path / "flwr-home", tmp_path / "results"
    run_config = (f"encoder='pixels' num-server-rounds=5 partition='iid' run-name='faults' "
                  f"round-timeout=25.0 results-dir='{results}' "
                  f"feature-cache-dir='{tmp_path / 'cache'}'")
    outcome: dict = {}
    with deploy.local_deployment(3, flwr_home, num_partitions=4) as deployment:
        deploy.start_supernode(deployment, 3, 4, None, extra_config="chaos='nan'")
        runner = start_run(deployment, run_config, outcome)
        node = deployment.nodes[2]
        wait_for(flwr_home / "deploy" / "supernode-2.log",
                 r"Receiving: train message.*?Receiving: train message")  # round 2's
        signal_node(node, signal.SIGSTOP)
        time.sleep(30)
        signal_node(node, signal.SIGCONT)
        runner.join(timeout=600)
    code, final_line = outcome["result"]
    assert code == 0 and final_line.startswith("0."), final_line
    summary = read_summary(results / "faults")
    rounds = summary["rounds"]
    # the poisoning node: each of its replies that came in time was rejected, none averaged
    assert all(r["clients_rejected"] <= 1 for r in rounds)
    assert sum(r["clients_rejected"] for r in rounds) >= 4
    assert all("non-finite" in x["reason"] for r in rounds for x in r["rejections"])
    # the frozen node: round 2 ended without it after the timeout, not after 3600 s ...
    assert rounds[1]["clients_timed_out"] >= 1 and rounds[1]["clients_trained"] <= 2
    assert max(r["round_seconds"] for r in rounds) < 25 + 15
    # ... and once thawed it trained again
    assert max(r["clients_trained"] for r in rounds[2:]) == 3
    assert summary["final_accuracy"] > 0.8  # no NaN reached the global head
    assert left_behind(flwr_home) == set()


def checkpoint_round(run_dir: Path) -> int:
    try:
        checkpoint = read_checkpoint(run_dir)
    except Exception:  # noqa: BLE001 - mid-replace on a slow disk: look again
        return 0
    return checkpoint.round if checkpoint else 0


def wait_for_round(run_dir: Path, server_round: int, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while checkpoint_round(run_dir) < server_round:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no checkpoint of round {server_round} in {run_dir}")
        time.sleep(0.3)


def serverapp_pids(deployment: deploy.Deployment) -> list[int]:
    found = []
    for pid in descendants(deployment.server_runtime.pid):
        with contextlib.suppress(OSError):
            if b"flwr-serverapp" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found


def test_a_run_survives_its_serverapp_killed_and_its_superlink_restarted(tmp_path):
    """Killed after its round-1 checkpoint, resumed; the SuperLink restarted (same
    `--database`) after round 3, resumed again: the same rounds as the run uninterrupted."""
    flwr_home, results = tmp_path / "flwr-home", tmp_path / "results"
    options = {"encoder": "pixels", "num-server-rounds": 4, "partition": "shard",
               "feature-cache-dir": str(tmp_path / "cache"), "results-dir": str(results)}
    run_config = " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                          for k, v in {**options, "run-name": "survivor"}.items())
    run_dir = results / "survivor"
    outcomes: list[dict] = [{}, {}, {}]
    with deploy.local_deployment(3, flwr_home) as deployment:
        first = start_run(deployment, run_config, outcomes[0])
        wait_for_round(run_dir, 1)
        for pid in serverapp_pids(deployment):
            os.kill(pid, signal.SIGKILL)
        # at once, as a supervisor would: the SuperLink notices the dead run only after its
        # heartbeats stop (minutes), and the new run does not wait for that
        second = start_run(deployment, run_config + " resume=true", outcomes[1])
        wait_for_round(run_dir, 3)
        deploy.restart_superlink(deployment)
        third = start_run(deployment, run_config + " resume=true", outcomes[2])
        third.join(timeout=600)
        first.join(timeout=60)
        second.join(timeout=60)
    code, final_line = outcomes[2]["result"]
    assert code == 0 and final_line.startswith("0."), final_line
    resumed = read_summary(run_dir)
    assert [r["round"] for r in resumed["resumes"]][:1] == [1]
    assert resumed["resumes"][-1]["round"] >= 3
    whole = read_summary(run_local({**options, "run-name": "whole"}, 3))
    assert [(r["accuracy"], r["train_loss"]) for r in resumed["rounds"]] == \
        [(r["accuracy"], r["train_loss"]) for r in whole["rounds"]]
    assert json.loads((run_dir / "summary.json").read_text())["final_accuracy"] == \
        whole["final_accuracy"]
    assert (run_dir / CHECKPOINT).exists()
    assert left_behind(flwr_home) == set()
