"""The stand-in Ray cluster's commands and queries (its runs on two raylets: tests/e2e.py and
tests/test_launch.py, e2e)."""

import subprocess
import sys

import pytest

from ovalp_flwr.ops import ray_cluster
from ovalp_flwr.ops.ray_cluster import START_ATTEMPTS, NodeExited, local_cluster, node_command


def flags(command: list[str]) -> dict[str, str]:
    return {arg: command[i + 1] for i, arg in enumerate(command[:-1]) if arg.startswith("--")}


def test_head_and_raylet_commands_block_and_take_ports_of_their_own(tmp_path):
    head = node_command(tmp_path, 1, 6379)
    raylet = node_command(tmp_path, 2, None)
    assert head[1:3] == ["start", "--block"] and raylet[1:3] == ["start", "--block"]
    assert "--head" in head and "--head" not in raylet
    assert flags(head)["--port"] == "6379" and flags(head)["--temp-dir"] == str(tmp_path)
    assert flags(raylet)["--num-cpus"] == "2"
    ports = [flags(c)[k] for c in (head, raylet) for k in flags(c)
             if k.endswith("-port") and "worker" not in k]
    assert len(ports) == len(set(ports)) == 9 + 6  # two raylets on one machine must not collide
    # workers on random ports: Ray's default range (10002-19999) is reserved whole, and a
    # picked port inside it makes `ray start` exit
    for command in (head, raylet):
        assert flags(command)["--min-worker-port"] == flags(command)["--max-worker-port"] == "0"


def fake_node(behaviour: str) -> list[str]:
    """A stand-in for `ray start --block`: one that fails at once ("exits"), one that says it
    started and stays up ("starts"), or one that stays up and never says so ("hangs")."""
    code = {"exits": "print('Failed to bind: port taken'); raise SystemExit(1)",
            "starts": f"import time; print({ray_cluster.STARTED.decode()!r}, flush=True); time.sleep(60)",
            "hangs": "import time; print('starting', flush=True); time.sleep(60)"}[behaviour]
    return [sys.executable, "-c", code]


def test_a_node_that_exits_at_start_up_is_retried_on_new_ports(monkeypatch):
    """A port taken between its pick and `ray start` (another run on the machine) costs one
    more try, not the run; the retry's start is read from its own part of the node's log."""
    tries = iter(["exits", "starts"])
    monkeypatch.setattr(ray_cluster, "node_command", lambda *args: fake_node(next(tries)))
    with local_cluster(nodes=1) as cluster:
        log = (cluster.temp_dir / "node-0.log").read_text()
        assert log.index("port taken") < log.index("Ray runtime started.")  # try 1 failed, try 2 up
    assert not cluster.temp_dir.exists()


def test_a_node_is_up_only_once_it_says_it_started(monkeypatch):
    """A node still starting is not counted as up: the cluster waits for Ray's own line, and a
    node that never prints it times out with the log to read named."""
    monkeypatch.setattr(ray_cluster, "node_command", lambda *args: fake_node("hangs"))
    with pytest.raises(RuntimeError, match=r"ray start \(node 0\) did not say it started in 2 s; "
                                           r"see .*node-0\.log"):
        with local_cluster(nodes=1, timeout=2.0):
            pass


@pytest.mark.slow
def test_a_node_that_keeps_exiting_fails_with_its_log_in_the_error(monkeypatch):
    tries = []
    monkeypatch.setattr(ray_cluster, "node_command",
                        lambda *args: tries.append(args) or fake_node("exits"))
    with pytest.raises(NodeExited, match="(?s)node 0. exited with 1; the end of .*port taken"):
        with local_cluster(nodes=1):
            pass
    assert len(tries) == START_ATTEMPTS


def test_a_cluster_of_no_nodes_is_refused():
    with pytest.raises(ValueError, match="nodes=0, cpus_per_node=1 are not allowed"):
        with local_cluster(0):
            pass


def test_a_query_finds_its_answer_among_the_lines_ray_prints_after_it(monkeypatch):
    """Under the full suite's load a raylet's log line followed the answer on stdout, and the
    query took that line for its answer."""
    raylet_line = ("[2026-11-28 00:29:07,451 I 25897 25897] (raylet) worker_pool.cc:742: Job "
                   "05000000 already started in worker pool.")
    scripts = []

    def run(command, **_kwargs):
        scripts.append(command[-1])
        return subprocess.CompletedProcess(command, 0, stderr="",
                                           stdout=f'{ray_cluster.ANSWER}["n1", "n2"]\n{raylet_line}\n')

    monkeypatch.setattr(ray_cluster.subprocess, "run", run)
    assert ray_cluster.alive_nodes("127.0.0.1:6379") == ["n1", "n2"]
    assert "ray.init(address='127.0.0.1:6379'" in scripts[0] and "answer(" in scripts[0]
    monkeypatch.setattr(ray_cluster.subprocess, "run", lambda command, **_: subprocess.CompletedProcess(
        command, 0, stdout=raylet_line + "\n", stderr="connection refused"))
    with pytest.raises(RuntimeError, match="(?s)ray query on 127.0.0.1:6379 failed.*refused"):
        ray_cluster.alive_nodes("127.0.0.1:6379")
