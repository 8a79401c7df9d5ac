"""The compose demo in a docker engine, end to end (`pytest -m docker`; `.ci/run` runs it after
the suite): the images (official or stand-ins), `compose up` with 3 SuperNodes, `flwr run .
docker` with the accuracy of the same run in process, a SuperNode container stopped
mid-run and started again, `compose down -v` leaving nothing, and the TLS overlay with node
authentication. Skipped, with the reason, where no docker engine answers. The first tests need
no engine."""

import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ovalp_flwr.federation.local_grid import run_local
from ovalp_flwr.federation.results import read_summary
from ovalp_flwr.ops import compose, images

ROUNDS = 3  # each run's; the README's measured run is the default (20)
FAULT_ROUNDS = 6


def test_compose_v2_is_used_where_installed_else_v1_else_one_clear_error(monkeypatch):
    for v2, v1, expected in ((0, "/usr/bin/docker-compose", ["docker", "compose"]),
                             (1, "/usr/bin/docker-compose", ["docker-compose"])):
        monkeypatch.setattr(compose.subprocess, "run",
                            lambda *a, code=v2, **k: subprocess.CompletedProcess(a, code))
        monkeypatch.setattr(compose.shutil, "which", lambda name, path=v1: path)
        assert compose.compose_command() == expected
    monkeypatch.setattr(compose.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="neither `docker compose` nor `docker-compose`"):
        compose.compose_command()


def test_the_demo_command_says_why_without_an_engine(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(compose, "docker_available", lambda: "no docker engine answers: x")
    assert compose.main(["--flwr-home", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "cannot run the compose demo: no docker engine answers: x"


def test_the_tls_demo_stacks_the_overlay_and_mounts_its_certificates(tmp_path):
    demo = compose.Demo(tls=True, certs=tmp_path, command=["docker-compose"])
    assert [f.name for f in demo.files] == ["compose.yml", "compose.tls.yml"]
    overlay = (compose.DOCKER / "compose.tls.yml").read_text()
    assert f"${{{compose.CERTS_ENV}:-../.flwr-deploy/certs}}:/certs:ro" in overlay
    assert compose.DEFAULT_CERTS == compose.PROJECT / ".flwr-deploy" / "certs"


def run_config(name: str, rounds: int, extra: str = "") -> str:
    return f"num-server-rounds={rounds} run-name='{name}' {extra}".strip()


def accuracies(summary: dict) -> list[float]:
    return [summary["initial_accuracy"], *(r["accuracy"] for r in summary["rounds"])]


def left_over(project: str = "docker") -> dict[str, list[str]]:
    """Containers, networks and volumes compose made for `project` that still exist."""
    label = f"label=com.docker.compose.project={project}"
    found = {}
    for kind, command in (("containers", ["docker", "ps", "-aq"]),
                          ("networks", ["docker", "network", "ls", "-q"]),
                          ("volumes", ["docker", "volume", "ls", "-q"])):
        out = subprocess.run([*command, "--filter", label], capture_output=True, text=True).stdout
        found[kind] = out.split()
    return found


def container_log(demo: compose.Demo, service: str) -> str:
    return subprocess.run(["docker", "logs", demo.container(service)], capture_output=True,
                          text=True).stderr


def wait_for_trains(demo: compose.Demo, service: str, count: int, timeout: float = 300) -> None:
    """Until `service`'s SuperNode has received its `count`-th train message."""
    deadline = time.monotonic() + timeout
    while container_log(demo, service).count("Receiving: train message") < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{service} got no train message #{count} in {timeout:.0f} s")
        time.sleep(1)


def run_on(flwr_home: Path, demo: compose.Demo, name: str, capfd) -> dict:
    """A `ROUNDS`-round run named `name` on the demo; its summary."""
    code, final_line = compose.run(flwr_home, ["--run-config", run_config(name, ROUNDS)])
    assert code == 0 and final_line and final_line.startswith("0."), capfd.readouterr().out
    return demo.summary(name)


@pytest.fixture(scope="module")
def built():
    if (why := images.docker_available()) is not None:
        pytest.skip(why)
    started = time.monotonic()
    seconds = images.build_all(say=lambda text: None)
    print(f"images: {time.monotonic() - started:.0f} s {json.dumps(seconds)}")
    return seconds


@pytest.mark.docker
def test_the_demo_runs_as_in_process_survives_a_stopped_node_and_leaves_nothing(
        built, tmp_path, capfd):
    demo, flwr_home = compose.Demo(), tmp_path / "flwr-home"
    try:
        demo.up(flwr_home)
        in_docker = run_on(flwr_home, demo, "docker", capfd)

        # a SuperNode container stopped in round 2 and started in round 3 or 4
        outcome: dict = {}
        fault = run_config("fault", FAULT_ROUNDS, "round-timeout=60.0")
        runner = threading.Thread(target=lambda: outcome.update(
            result=compose.run(flwr_home, ["--run-config", fault])))
        runner.start()
        trains_before = container_log(demo, "supernode-1").count("Receiving: train message")
        wait_for_trains(demo, "supernode-1", trains_before + 2)  # round 2's
        demo.compose("stop", "supernode-1")
        wait_for_trains(demo, "supernode-0", trains_before + 3)  # round 3: without it
        demo.compose("start", "supernode-1")
        runner.join(timeout=900)
        out = capfd.readouterr().out
        code, final_line = outcome["result"]
        assert code == 0 and final_line and final_line.startswith("0."), out[-3000:]
        rounds = demo.summary("fault")["rounds"]
    finally:
        demo.down()
    assert left_over() == {"containers": [], "networks": [], "volumes": []}

    # the same run in process: the same numbers (native deployments give the in-process
    # runner's numbers too: tests/test_deploy.py)
    in_process = read_summary(run_local({"num-server-rounds": ROUNDS, "run-name": "docker",
                                         "results-dir": str(tmp_path / "in-process")}, 3))
    assert accuracies(in_docker) == accuracies(in_process)
    assert in_docker["final_accuracy"] == in_process["final_accuracy"] > 0.8

    # the stopped node's replies counted as missing, the others finished the run ...
    assert (rounds[0]["clients_trained"], rounds[0]["clients_failed"]) == (3, 0)
    missing = [r["clients_failed"] + r["clients_timed_out"] for r in rounds]
    assert missing[1] >= 1 and rounds[1]["clients_trained"] == 2, rounds
    # ... and once started again it rejoined: admitted, and trained in the last rounds
    assert re.search(r"node\(s\) connected late, 1 admitted", out), out[-3000:]
    assert rounds[-1]["clients_trained"] == 3, rounds


@pytest.mark.docker
def test_the_tls_overlay_with_node_authentication_runs_the_same_numbers(built, tmp_path, capfd):
    """In one command (`python -m ovalp_flwr.ops.compose --tls`): up, the run, its results
    copied out of the serverapp container, down."""
    results = tmp_path / "results"
    code = compose.main(["--tls", "--certs", str(tmp_path / "certs"), "--flwr-home",
                         str(tmp_path / "flwr-home"), "--results", str(results), "--",
                         "--run-config", run_config("tls", ROUNDS)])
    assert code == 0, capfd.readouterr().out[-3000:]
    assert left_over() == {"containers": [], "networks": [], "volumes": []}
    secure = read_summary(results / "tls")
    # the in-process runner's numbers, as the insecure demo's above
    in_process = read_summary(run_local({"num-server-rounds": ROUNDS, "run-name": "tls",
                                         "results-dir": str(tmp_path / "in-process")}, 3))
    assert secure["num_clients"] == 3 and secure["final_accuracy"] > 0.8
    assert accuracies(secure) == accuracies(in_process)
