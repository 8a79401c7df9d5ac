"""The launcher `make run` uses: real `flwr run`s on Ray virtual SuperNodes (e2e: `make run`'s own
path, then scenarios on the shared Ray federation of tests/e2e.py), and the app folder Flower
packs (SIGTERM to a test session or a CLI: tests/test_processes.py)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ovalp_flwr.ops import launch
from ovalp_flwr.features.cache import load_or_build
from ovalp_flwr.federation.local_grid import run_local
from ovalp_flwr.federation.results import read_summary
from ovalp_flwr.ops.ports import free_ports
from ovalp_flwr.ops.processes import alive, signal_all
from e2e import left_behind, processes_of  # tests/ is on sys.path under pytest


# what a run prints by default (README, "What a run prints"): a line per round and at most
# this many more: the log's path, set-up facts, the summary and the result line
LINES_BESIDES_ROUNDS = 12


def run_config_arg(options: dict) -> str:
    return " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in options.items())


@pytest.mark.e2e(seconds=65)
def test_flwr_run_two_rounds_on_ray_and_leaves_no_process(tmp_path, capfd, monkeypatch):
    """`make run`'s path, so on processes of its own: the launcher starts its SuperLink, the
    simulation its Ray, and all of it is gone after the run. Partition 1 sends NaN in every
    train reply (`OVALP_CHAOS`, here and in process): the server rejects them on Ray as in
    process. (Resuming through `flwr run`: on real SuperNodes, tests/test_deploy.py; the
    checkpoint itself, tests/test_checkpoint.py.)"""
    monkeypatch.setenv("OVALP_CHAOS", "nan@1")
    cache_dir, results_dir = tmp_path / "cache", tmp_path / "results"
    load_or_build("digits", "pixels", cache_dir, progress=False)
    run_config = (f"encoder='pixels' feature-cache-dir='{cache_dir}' results-dir='{results_dir}' "
                  "num-server-rounds=2 run-name='e2e' partition='shard'")
    flwr_home = tmp_path / "flwr-home"
    code = launch.simulate(launch.PROJECT, num_supernodes=4, flwr_home=flwr_home,
                           flwr_args=["--run-config", run_config], num_gpus=0.0)
    output = capfd.readouterr().out.splitlines()
    assert code == 0, "\n".join(output)
    assert len(output) <= 2 + LINES_BESIDES_ROUNDS, "\n".join(output)
    assert [line.split("  ")[0] for line in output if line.startswith("round ")] == \
        ["round 0/2", "round 1/2", "round 2/2"]
    assert output[-1].startswith("final accuracy ") and "INFO" not in "".join(output)
    logged = (flwr_home / "logs").glob("run-*.log")
    assert "Aggregated MetricRecord" in next(logged).read_text()  # Flower's lines: in the log
    summary = json.loads((results_dir / "e2e" / "summary.json").read_text())
    assert [r["round"] for r in summary["rounds"]] == [1, 2]
    assert [(r["clients_trained"], r["clients_rejected"]) for r in summary["rounds"]] == [(3, 1)] * 2
    assert "non-finite" in summary["rounds"][0]["rejections"][0]["reason"]
    assert summary["num_clients"] == 4
    assert [r["stage"] for r in summary["rounds"]] == [1, 2]
    assert summary["final_accuracy"] > 0.8  # 10 classes: chance is 0.1
    assert summary["head_init"] == {**summary["head_init"], "name": "ridge", "clients_sent": 4}
    assert summary["initial_accuracy"] > 0.85  # the ridge start, before any round
    # the in-process runner gives the same run, bit for bit, start included
    local = read_summary(run_local({"encoder": "pixels", "feature-cache-dir": str(cache_dir),
                                    "results-dir": str(results_dir), "num-server-rounds": 2,
                                    "run-name": "local", "partition": "shard"}, 4))
    assert [local["initial_accuracy"], *(r["accuracy"] for r in local["rounds"])] == \
        [summary["initial_accuracy"], *(r["accuracy"] for r in summary["rounds"])]
    assert [r["train_loss"] for r in local["rounds"]] == [r["train_loss"] for r in summary["rounds"]]
    assert left_behind(flwr_home) == set(), "the run left Flower/Ray processes behind"
    assert (flwr_home / "config.toml").exists()


def test_a_ray_address_that_is_not_host_port_is_refused_with_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        launch.main(["--ray-address", "head-node", "--num-supernodes", "2"])
    assert exit_.value.code == 2
    assert "--ray-address='head-node' is not allowed; use the Ray head's host:port" in \
        capsys.readouterr().err
    assert launch.flower_env(Path("/tmp/x"), "10.0.0.5:6379")["RAY_ADDRESS"] == "10.0.0.5:6379"


# --- runs on the shared Ray federation (tests/e2e.py): two raylets, one simulation SuperLink ----


@pytest.mark.xdist_group("ray")
@pytest.mark.e2e(seconds=230)
def test_flwr_run_on_two_raylets_personalizes_with_every_method_as_in_process(
        ray_federation, tmp_path, capfd):
    """A run joins the Ray cluster its SuperLink was pointed at (two raylets, the stand-in of
    two machines; `--ray-address`): each raylet hosts a ClientApp actor of this run. Its
    rounds, and the personalization after them with every method (per-client and summary
    metrics), are the in-process runner's for the same seed."""
    from ovalp_flwr.ops.ray_cluster import actor_placement, alive_nodes
    from ovalp_flwr.personalize import METHODS

    address = ray_federation.cluster.address
    assert len(alive_nodes(address)) == 2
    cache_dir, results_dir = tmp_path / "cache", tmp_path / "results"
    load_or_build("digits", "pixels", cache_dir, progress=False)
    options = {"encoder": "pixels", "feature-cache-dir": str(cache_dir),
               "results-dir": str(results_dir), "num-server-rounds": 2, "adapter-dim": 16,
               "head-init": "random", "partition": "bernoulli-dirichlet", "dirichlet-p": 1.0,
               "dirichlet-alpha": 0.1, "personalize": " ".join(METHODS), "pft-epochs": 3,
               "personalize-curve": "1", "pft.lp-ft.lp-epochs": 1}
    before = actor_placement(address)
    code = launch.simulate_on(launch.PROJECT, 4, ["--run-config", run_config_arg(
        {**options, "run-name": "pft"})], ray_federation.flwr_home, num_gpus=0.0)
    output = capfd.readouterr().out.splitlines()
    assert code == 0, "\n".join(output)
    after = actor_placement(address)
    this_run = {node: after[node] - before.get(node, 0) for node in after}
    assert len(this_run) == 2 and all(count >= 1 for count in this_run.values()), this_run
    said = [line.split()[1] for line in output if line.startswith("personalize ")]
    assert said == ["global", *METHODS], "\n".join(output)
    on_ray = read_summary(results_dir / "pft")
    local = read_summary(run_local({**options, "run-name": "local"}, 4))
    assert [local["initial_accuracy"], *(r["accuracy"] for r in local["rounds"])] == \
        [on_ray["initial_accuracy"], *(r["accuracy"] for r in on_ray["rounds"])]
    assert [r["train_loss"] for r in local["rounds"]] == [r["train_loss"] for r in on_ray["rounds"]]
    flwr, mine = on_ray["personalization"], local["personalization"]
    assert list(flwr["methods"]) == ["global", *METHODS]
    for method, result in flwr["methods"].items():
        assert len(result["clients"]) == 4
        assert result["summary"] == mine["methods"][method]["summary"], method
        assert [{k: v for k, v in row.items() if k != "seconds"} for row in result["clients"]] \
            == [{k: v for k, v in row.items() if k != "seconds"}
                for row in mine["methods"][method]["clients"]]
    assert ray_federation.left_behind() == set(), "the run left Flower processes behind"


@pytest.mark.xdist_group("ray")
@pytest.mark.e2e(seconds=115)
def test_flwr_run_trains_flora_on_ray_as_the_in_process_runner_does(ray_federation, tmp_path,
                                                                     capfd):
    """FLoRA keeps each node's merged update in its context state: on Ray's virtual nodes the
    run is the in-process one, bit for bit (a tiny random encoder, raw digits)."""
    results_dir = tmp_path / "results"
    settings = {"finetune": "flora", "encoder": "tiny-cnn", "head-init": "random",
                "drift-correction": "none", "limit-per-class": 12, "num-server-rounds": 3,
                "local-epochs": 1, "batch-size": 8, "partition": "shard",
                "classes-per-client": 3, "fraction-train": 0.5}
    run_config = run_config_arg(settings) + f" results-dir='{results_dir}' run-name='ray'"
    code = launch.simulate_on(launch.PROJECT, 4, ["--run-config", run_config],
                              ray_federation.flwr_home, num_gpus=0.0)
    output = capfd.readouterr().out
    assert code == 0, output[-3000:]
    ray = read_summary(results_dir / "ray")
    local = read_summary(run_local({**settings, "results-dir": str(results_dir),
                                    "run-name": "local"}, 4))
    assert ray["finetune"]["method"] == "flora"
    assert [(r["accuracy"], r["train_loss"], r["bytes_sent_per_client"]) for r in ray["rounds"]] == \
        [(r["accuracy"], r["train_loss"], r["bytes_sent_per_client"]) for r in local["rounds"]]
    assert ray["rounds"][1]["bytes_sent_per_client"] > ray["rounds"][0]["bytes_sent_per_client"]
    assert ray_federation.left_behind() == set(), "the run left Flower processes behind"


@pytest.mark.xdist_group("ray")
@pytest.mark.e2e(seconds=15)
def test_flwr_run_with_a_bad_config_fails_with_one_line(ray_federation, capfd):
    """A config the ServerApp refuses (`simulate_on` skips the launcher's own check): its one
    line last, exit 2, no traceback, the run's processes gone, and Flower's record of the run
    failed with that line, not completed (a `SystemExit` in the simulation's ServerApp thread
    was recorded completed). A refusal during the rounds takes the same path
    (`federation.errors.refuse`): on real SuperNodes, tests/test_deploy.py."""
    flwr_home = ray_federation.flwr_home
    code = launch.simulate_on(launch.PROJECT, 2, ["--run-config", "head='mlp'"], flwr_home,
                              num_gpus=0.0)
    output = capfd.readouterr().out
    said = "run config: head='mlp' is not allowed; choose one of: ova, softmax"
    assert code == 2
    assert output.splitlines()[-1] == f"error: {said}"
    assert "Traceback" not in output
    runs = json.loads(launch.flwr_cli(flwr_home, "ls", launch.CONNECTION, "--format", "json"))
    assert [run["status"] for run in runs["runs"] if said in run["status-details"]] == \
        ["finished:failed"]
    assert ray_federation.left_behind() == set()


@pytest.mark.xdist_group("ray")
@pytest.mark.e2e(seconds=5)
def test_a_run_flower_refuses_shows_the_cause_from_the_superlinks_log(ray_federation, capfd):
    """Past the launcher's own checks, Flower's refusal `[code: 15] Invalid run configuration.`
    comes with its cause, read from what the SuperLink logged since the run was submitted."""
    flwr_home = ray_federation.flwr_home
    code = launch.simulate_on(launch.PROJECT, 2, ["--run-config", "heads='ova'"], flwr_home,
                              num_gpus=0.0)
    output = capfd.readouterr().out
    assert code != 0
    assert ("error: Could not start run: Key 'heads' is not present in the main dictionary "
            f"(from {flwr_home / 'superlink.log'})") in output
    assert ray_federation.left_behind() == set()


# --- the folder `flwr run` packs ---------------------------------------------------------------


@pytest.mark.slow
def test_flwr_run_packs_the_same_app_from_the_packable_folder(tmp_path):
    """The launchers hand `flwr run` a folder of only what it packs (no .venv to list file by
    file): the FAB, hash included, is the one Flower builds from the project folder itself."""
    from flwr.cli.build import build_fab_from_disk

    with launch.packable_app(launch.PROJECT, tmp_path) as folder:
        assert (folder / "ovalp_flwr" / "ops" / "launch.py").is_file() and not (folder / ".venv").exists()
        pyproject = folder / "pyproject.toml"  # a copy: Flower may rewrite a legacy one
        assert pyproject.stat().st_ino != (launch.PROJECT / "pyproject.toml").stat().st_ino
        assert build_fab_from_disk(folder) == build_fab_from_disk(launch.PROJECT)
    assert list(tmp_path.iterdir()) == []  # gone once the run is


def test_preflight_checks_this_projects_config_and_leaves_another_apps_to_flower(capsys):
    floor_app = launch.PROJECT / "benchmarks" / "floor_app"
    assert not launch.preflight(launch.PROJECT, ["--run-config", "classes=10"])
    assert "classes" in capsys.readouterr().err
    assert launch.preflight(floor_app, ["--run-config", "classes=10"])
    assert capsys.readouterr().err == ""


# --- the bare Flower path: `flwr run .` with the venv active, no launcher of ours --------------


def bare_flwr(flwr_home: Path, ports: list[int]):
    """`flwr <args>` as a user runs it with `.venv` active (its bin/ on PATH, Flower's runtime
    dependency installation off as `.venv/bin/activate` sets it), on a Flower home of its own
    and Flower's local SuperLink on free ports (Flower's own variables: 39091/39093 stay free)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "FLWR_HOME": str(flwr_home), "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(ports[0]),
           "FLWR_LOCAL_CONTROL_API_PORT": str(ports[1])}

    def flwr(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(["flwr", *args], cwd=launch.PROJECT, env=env, capture_output=True,
                              text=True, timeout=timeout)

    return flwr


# Flower's CLI gives the local SuperLink it starts a fixed 15 s (`LOCAL_SUPERLINK_STARTUP_TIMEOUT`,
# flwr/cli/local_superlink.py), then kills it: in the suite's first minutes, beside a Ray
# cluster and two deployments starting on 2 cores, it once took longer (a user's `flwr run .`
# on a loaded machine would see the same; its second try finds the machine quieter)
LOCAL_SUPERLINK_SLOW = "Failed to start local SuperLink within"


def flwr_run(flwr, *args: str) -> subprocess.CompletedProcess:
    """`flwr run ...`, once more if Flower gave up on starting its local SuperLink in 15 s."""
    done = flwr(*args)
    if done.returncode != 0 and LOCAL_SUPERLINK_SLOW in done.stdout + done.stderr:
        done = flwr(*args)
    return done


def run_of(flwr, run_id: int) -> dict:
    listed = flwr("ls", "--run-id", str(run_id), "--format", "json", timeout=60)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    return json.loads(listed.stdout)["runs"][0]


def wait_for_simulation(flwr_home: Path, running: bool, timeout: float) -> None:
    """Until a run's `flwr-simulation` process of `flwr_home` is there (or gone): read from
    /proc, where each `flwr ls` to ask would be a fresh Python importing Flower (3-4 CPU-s)."""
    deadline = time.monotonic() + timeout
    while bool(simulations_of(flwr_home)) != running:
        assert time.monotonic() < deadline, f"no flwr-simulation {'started' if running else 'ended'}"
        time.sleep(0.5)


def simulations_of(flwr_home: Path) -> set[int]:
    found = set()
    for pid in processes_of(flwr_home):
        try:
            if b"flwr-simulation" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.add(pid)
        except OSError:  # it ended meanwhile
            pass
    return found


def stop_all(flwr_home: Path, grace: float = 20.0) -> None:
    """Every process of `flwr_home` (the detached local SuperLink, what it started), by PID:
    SIGTERM, then SIGKILL what is left after `grace`, until none is left (a Ray worker may
    start while the first ones stop)."""
    for _ in range(5):
        pids = sorted(processes_of(flwr_home))
        if not pids:
            return
        signal_all(pids, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.5)
        signal_all([pid for pid in pids if alive(pid)], signal.SIGKILL)


@pytest.mark.e2e(seconds=110)
def test_bare_flwr_run_streams_a_run_and_list_log_stop_work_on_another(tmp_path, cache_dir):
    """A Flower user's path (README): `flwr run . --stream` on Flower's own local SuperLink
    (started by the CLI, detached) runs to its result line, its results where the run config
    says (on clients a Flower Datasets partitioner made), `flwr ls` lists it completed and
    `flwr log` shows its log; a run started without `--stream` is listed running and stopped
    with `flwr stop`. The local SuperLink and all it started are stopped by PID at the end."""
    flwr_home = tmp_path / "flwr-home"
    flwr = bare_flwr(flwr_home, free_ports(2))
    results = tmp_path / "results"
    common = f"encoder='pixels' feature-cache-dir='{cache_dir}' results-dir='{results}'"
    federation = ["--federation-config", "num-supernodes=4 client-resources-num-cpus=1"]
    try:
        streamed = flwr_run(flwr, "run", ".", "--stream", *federation, "--run-config",
                            f"{common} num-server-rounds=2 run-name='streamed' partition="
                            "'flwr:DirichletPartitioner' partition-args='alpha=0.5'")
        assert streamed.returncode == 0, streamed.stdout[-3000:] + streamed.stderr[-3000:]
        assert "final accuracy" in streamed.stdout
        summary = read_summary(results / "streamed")  # a Flower Datasets partitioner's run
        assert summary["num_clients"] == 4 and len(summary["rounds"]) == 2
        assert summary["partition"]["kind"] == "flwr:DirichletPartitioner"
        done = int(streamed.stdout.split("Successfully started run ")[1].split()[0])
        assert run_of(flwr, done)["status"] == "finished:completed"
        shown = flwr("log", str(done), "--show")
        assert shown.returncode == 0 and re.search(r"round +2/2", shown.stdout), shown.stdout[-2000:]

        started = flwr("run", ".", *federation, "--run-config",
                       f"{common} num-server-rounds=1000 run-name='stopped'")
        assert started.returncode == 0, started.stdout + started.stderr
        run_id = int(started.stdout.split("Successfully started run ")[1].split()[0])
        wait_for_simulation(flwr_home, running=True, timeout=120)
        deadline = time.monotonic() + 60
        while (status := run_of(flwr, run_id)["status"]) != "running":
            assert status in ("pending", "starting") and time.monotonic() < deadline, status
            time.sleep(2)
        stopped = flwr("stop", str(run_id))
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        wait_for_simulation(flwr_home, running=False, timeout=60)
        deadline = time.monotonic() + 30
        while (status := run_of(flwr, run_id)["status"]) != "finished:stopped":
            assert time.monotonic() < deadline, status
            time.sleep(2)
        assert not (results / "stopped" / "summary.json").exists()
    finally:
        stop_all(flwr_home)
    assert left_behind(flwr_home) == set(), "the local SuperLink outlived its stop"
