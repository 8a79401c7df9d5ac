"""Real deployments on loopback: flower-superlink + flower-supernode processes, with the
ServerApp and ClientApp runtimes as separate flower-superexec processes (docker/compose.yml);
faults on them (a SuperNode that hangs or dies, a ServerApp killed, a SuperLink restarted:
README, "Reliability"); TLS + SuperNode authentication (`deploy --tls`)."""

import contextlib
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from ovalp_flwr.ops import certs, deploy, launch
from ovalp_flwr.federation.checkpoint import FILE as CHECKPOINT, read_checkpoint
from ovalp_flwr.ops.processes import descendants
from ovalp_flwr.federation.local_grid import run_local
from ovalp_flwr.personalize.store import read_model
from ovalp_flwr.federation.results import read_summary
from ovalp_flwr.tracking.tracker import local_store
from e2e import left_behind  # tests/ is on sys.path under pytest
from test_tracking import logged_as_its_results


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


def wait_for_exit(process, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    return process.poll()


# --- runs on the shared secure deployment (tests/e2e.py): TLS, node auth, nodes' own data ------


@pytest.mark.xdist_group("deployment")
@pytest.mark.e2e(seconds=190)
def test_a_secure_deployment_of_nodes_with_their_own_data_runs_secagg_and_personalizes(
        secure_deployment, capfd):
    """The compose deployment on loopback (`deploy --tls --node-dir`): TLS + SuperNode
    authentication (a node whose key was never registered is refused), process isolation (the
    runtimes, not SuperLink/SuperNodes, run the apps), SuperNodes that each build and keep
    their own cache, the statistics under SecAgg+ (its key shares and masks survive a fresh
    ClientApp process per message: the mod's state lives in the node's context), a round, then
    the personalization phase on the nodes, each keeping its models in its own folder. Two
    nodes: every property here is one of each node, or of a sum over more than one. The first
    run of the `pixels` features on these nodes (so each builds its cache, shown below)."""
    deployment, flwr_home = secure_deployment.deployment, secure_deployment.flwr_home
    logs = flwr_home / "deploy"
    results = secure_deployment.root / "results"
    run_config = (f"encoder='pixels' num-server-rounds=1 partition='iid' run-name='deploy' "
                  f"results-dir='{results}' feature-cache-dir='{secure_deployment.root / 'server-cache'}' "
                  "statistics-aggregation='secagg+' personalize='ft' pft-epochs=2 "
                  "tracking='mlflow'")  # the ServerApp logs, as in simulation (results/mlflow.db)
    # before the run: a SuperNode whose key pair was never registered; the SuperLink refuses it
    private, _ = certs.make_node_keys(deployment.certs, "intruder")
    intruder = deploy.start_supernode(deployment, 2, 3, None, private_key=private,
                                      register=False, log_stem="intruder")
    intruder_exit = wait_for_exit(intruder.supernode, timeout=60)
    intruder.stop()
    deployment.nodes.remove(intruder)
    watcher = AppProcesses(deployment.server_runtime.pid,
                           [node.runtime.pid for node in deployment.nodes])
    watcher.start()
    try:
        code = secure_deployment.run(run_config)
    finally:
        watcher.done.set()
    out = capfd.readouterr().out
    assert code == 0, out[-3000:]
    # TLS: the connection trusts the CA; the unregistered node was refused, the others activated
    config = (flwr_home / "config.toml").read_text()
    assert "root-certificates" in config and "insecure" not in config
    intruder_log = (logs / "intruder.log").read_text(errors="replace")
    assert intruder_exit not in (None, 0), intruder_log[-2000:]
    assert "Failed to activate SuperNode" in intruder_log, intruder_log[-2000:]
    assert "SuperNode ID" not in intruder_log
    superlink_log = (logs / "superlink.log").read_text(errors="replace")
    assert "No SuperNode found with the given public key" in superlink_log
    for i in range(2):  # registered nodes were activated over TLS
        assert "SuperNode ID" in (logs / f"supernode-{i}.log").read_text(errors="replace")
    assert superlink_log.count("Activated node_id") == 2
    # the launcher shows each SuperNode building its cache, read from the node's log file
    for i in range(2):
        assert any(line.startswith(f"supernode-{i}-clientapp: ") and "100%|" in line
                   for line in out.splitlines()), out[-3000:]
    assert out.splitlines()[-1].startswith("final accuracy ")
    # process isolation, as in compose: the runtimes, not SuperLink/SuperNodes, ran the apps;
    # the SuperLink's forks each run's ServerApp (ops/clientapp_runtime.py --serverapps)
    assert watcher.seen["server"], watcher.seen
    assert "Start `flwr-serverapp` process" in (logs / "serverapp.log").read_text(errors="replace")
    # the nodes' runtimes fork each ClientApp (ops/clientapp_runtime.py): a child of theirs
    # per message, which logs as flwr-clientapp does (below)
    assert watcher.seen["nodes"], watcher.seen
    for i in range(2):
        log = (logs / f"supernode-{i}-clientapp.log").read_text(errors="replace")
        assert "Start `flwr-clientapp` process" in log
    summary = json.loads((results / "deploy" / "summary.json").read_text())
    logged_as_its_results(local_store(results), "digits", results / "deploy")
    assert summary["num_clients"] == 2 and [r["round"] for r in summary["rounds"]] == [1]
    assert summary["rounds"][0]["clients_trained"] == 2
    assert summary["partition"]["kind"] == "iid of node-local data"
    assert summary["final_accuracy"] > 0.5
    # the ridge start from the statistics of each node's own data, sent once each, summed
    # under SecAgg+
    assert summary["head_init"]["clients_sent"] == 2 and summary["initial_accuracy"] > 0.85
    assert summary["head_init"]["aggregation"] == "secagg+"
    for i in range(2):  # each SuperNode built and kept its own cache and rows
        cache = secure_deployment.node_dir(i) / "cache"
        assert (cache / "digits__pixels" / "manifest.json").exists()
        assert len(list((cache / ".rows").rglob("*.safetensors"))) == 1
    # the personalization phase ran on the real nodes; each keeps its model in its own dir.
    # (One method: they all travel the same way; every method's results through `flwr run`
    # are the in-process runner's, tests/test_launch.py, and each one's model files,
    # tests/test_phase.py.)
    phase = summary["personalization"]
    assert list(phase["methods"]) == ["global", "ft"]
    assert all(len(result["clients"]) == 2 for result in phase["methods"].values())
    assert phase["methods"]["ft"]["summary"]["local"] >= 0.5
    for i in range(2):
        arrays, metadata = read_model(secure_deployment.node_dir(i) / "models" / "deploy"
                                      / "ft.safetensors")
        assert (metadata["partition-id"], metadata["method"]) == (str(i), "ft")
        assert arrays["weight"].shape == (10, 64)
    assert secure_deployment.left_behind() == set(), "the run left processes behind"


@pytest.mark.xdist_group("deployment")
@pytest.mark.e2e(seconds=135)
def test_flora_fine_tunes_an_encoder_on_real_supernodes(secure_deployment, capfd):
    """The encoder path on real processes: every message a fresh ClientApp process, so FLoRA's
    merged update lives only in the node's context state, which the SuperNode keeps. One of
    two nodes trains per round: in 3 rounds one of them trains again from its kept state."""
    results = secure_deployment.root / "results"
    code = secure_deployment.run(
        f"finetune='flora' encoder='tiny-cnn' head-init='random' drift-correction='none' "
        f"limit-per-class=12 num-server-rounds=3 local-epochs=1 batch-size=8 partition='iid' "
        f"fraction-train=0.5 run-name='flora' results-dir='{results}'")
    out = capfd.readouterr().out
    assert code == 0, out[-3000:]
    summary = json.loads((results / "flora" / "summary.json").read_text())
    assert summary["finetune"]["method"] == "flora"
    rounds = summary["rounds"]
    assert [r["clients_trained"] for r in rounds] == [1, 1, 1]
    assert all(not r["clients_failed"] and not r["clients_rejected"] for r in rounds)
    assert rounds[1]["bytes_sent_per_client"] > rounds[0]["bytes_sent_per_client"]
    assert secure_deployment.left_behind() == set(), "the run left processes behind"


@pytest.mark.xdist_group("deployment")
@pytest.mark.e2e(seconds=45)
def test_a_round_refused_on_real_supernodes_is_the_last_line_and_fails_the_run(
        secure_deployment, capfd):
    """Deployed, the ServerApp is a process of its own: its refusal during the rounds (Multi-Krum
    with f = 1 of 2 clients) is still the last line shown, the exit is 2, and the SuperLink
    records the run failed with that line."""
    results = secure_deployment.root / "results"
    code = secure_deployment.run(
        f"encoder='pixels' partition='iid' num-server-rounds=2 robust-aggregation='multi-krum' "
        f"robust-fraction=0.3 run-name='refused' results-dir='{results}' "
        f"feature-cache-dir='{secure_deployment.root / 'server-cache'}'")
    lines = capfd.readouterr().out.splitlines()
    said = ("round 1: multi-krum with robust-fraction=0.3 assumes f = 1 hostile of the 2 "
            "clients, and Krum needs n > 2f + 2 = 4; use a smaller robust-fraction or more "
            "clients a round")
    assert code == 2 and lines[-1] == f"error: {said}", lines[-5:]
    runs = json.loads(launch.flwr_cli(secure_deployment.flwr_home, "ls", deploy.CONNECTION,
                                      "--format", "json"))
    assert [r["status"] for r in runs["runs"] if said in r["status-details"]] == ["finished:failed"]
    assert secure_deployment.left_behind() == set(), "the run left processes behind"


# --- faults and a late node on real deployments of their own --------------------------------------


def wait_for(path, pattern: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and re.search(pattern, path.read_text(errors="replace"), re.DOTALL):
            return
        time.sleep(0.5)
    raise TimeoutError(f"{pattern!r} did not appear in {path} within {timeout:.0f} s")


def signal_apps(node: deploy.Node, signum: int) -> None:
    """`signum` to every process a SuperNode's apps run in (its ClientApp runtime and the
    ClientApps), not to the SuperNode itself, which goes on heartbeating."""
    for process in node.processes():
        pids = descendants(process.pid) + ([process.pid] if process is node.runtime else [])
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)


def start_run(deployment: deploy.Deployment, run_config: str, outcome: dict) -> threading.Thread:
    runner = threading.Thread(target=lambda: outcome.update(
        result=deploy.run_app(deployment, deploy.PROJECT, ["--run-config", run_config])))
    runner.start()
    return runner


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
    """The ServerApps under the SuperLink's runtime: each a fork of it (ClientApps fork on the
    nodes' runtimes), or Flower's `flwr-serverapp`."""
    return list(descendants(deployment.server_runtime.pid))


@pytest.mark.e2e(seconds=300)
def test_a_run_survives_its_serverapp_killed_and_its_superlink_restarted(tmp_path, capfd):
    """Killed after its round-1 checkpoint, resumed; after round 2 the server host reboots (its
    ServerApp killed, the SuperLink restarted on the same `--database`), resumed again: round 3
    on the nodes that reconnected by themselves, and the same rounds as the run uninterrupted.
    Two SuperNodes: each resume describes the federation again, a message per node. Processes
    of its own: a SuperLink it restarts, ServerApps it kills. (Resume is
    the same code under every runtime: this is its `flwr run` test. The set-up with feature
    normalisation's own exchange, and the digest a resume checks, are in
    tests/test_checkpoint.py; on real nodes in the secure deployment.)"""
    flwr_home, results = tmp_path / "flwr-home", tmp_path / "results"
    options = {"encoder": "pixels", "num-server-rounds": 3, "partition": "shard",
               "feature-norm": "none",  # set-up in one exchange: 3 runs set up
               "feature-cache-dir": str(tmp_path / "cache"), "results-dir": str(results)}
    run_config = " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                          for k, v in {**options, "run-name": "survivor"}.items())
    run_dir = results / "survivor"
    outcomes: list[dict] = [{}, {}, {}]
    with deploy.local_deployment(2, flwr_home, state_on_disk=True) as deployment:
        first = start_run(deployment, run_config, outcomes[0])
        wait_for_round(run_dir, 1)
        for pid in serverapp_pids(deployment):
            os.kill(pid, signal.SIGKILL)
        # at once, as a supervisor would: the SuperLink notices the dead run only after its
        # heartbeats stop (minutes), and the new run does not wait for that
        second = start_run(deployment, run_config + " resume=true", outcomes[1])
        wait_for_round(run_dir, 2)
        # the ServerApp runs on the SuperLink's host and goes with it (left alone, it may
        # reconnect to the new SuperLink and finish round 3 itself: then no round would run
        # after the restart)
        for pid in serverapp_pids(deployment):
            os.kill(pid, signal.SIGKILL)
        deploy.restart_superlink(deployment)
        third = start_run(deployment, run_config + " resume=true", outcomes[2])
        third.join(timeout=600)
        first.join(timeout=60)
        second.join(timeout=60)
    code, final_line = outcomes[2]["result"]
    assert code == 0 and final_line.startswith("0."), final_line
    out = capfd.readouterr().out
    assert f"resume: going on from round 1 of {run_dir}" in out
    assert f"resume: going on from round 2 of {run_dir}" in out
    resumed = read_summary(run_dir)
    assert [r["round"] for r in resumed["resumes"]] == [1, 2]
    whole = read_summary(run_local({**options, "run-name": "whole"}, 2))
    assert [(r["accuracy"], r["train_loss"]) for r in resumed["rounds"]] == \
        [(r["accuracy"], r["train_loss"]) for r in whole["rounds"]]
    assert json.loads((run_dir / "summary.json").read_text())["final_accuracy"] == \
        whole["final_accuracy"]
    assert (run_dir / CHECKPOINT).exists()
    assert left_behind(flwr_home) == set()


@pytest.mark.e2e(seconds=290)
def test_faulty_and_late_supernodes_leave_the_run_to_the_others(tmp_path, capfd):
    """A run of 5 rounds on real processes, where every fault a node brings happens in round 2
    and a node joins late, one partition each:
    - node 1's apps freeze once it has sent its round-1 reply (SIGSTOP to its ClientApp runtime
      and ClientApps): the SuperNode stays connected and heartbeating and takes round 2's
      message, but never answers (a stuck driver); with round-timeout=60 its round ends without
      it after 60 s, not Flower's 3600, and once thawed (round 3 under way) it trains again.
    - node 2 runs with `chaos='nan'`: every train reply it sends has a NaN, and every one is
      rejected.
    - node 3 dies (the host fails) as its round-2 train message arrives: the SuperLink answers
      for a node that went offline with an error, so its rounds fail at once and the others
      finish the run. (Killed right after sending a reply, that reply is lost too.)
    - node 4 connects once round 2's train messages are out (partition 4 had no node until
      then): admitted from the next round and trained in every round from then on; the heads
      started without it.
    The SuperLink and node 3 run under Flower's default subprocess isolation (they start their
    apps themselves, a fresh `flwr-clientapp` per message: node 3's takes seconds to start, so
    it dies before it answers); the other nodes under process isolation with ClientApp runtimes,
    as compose's. (60 s: under the full suite's load, a fresh ClientApp process importing torch
    once took 40 s.) No feature normalisation: the set-up is one exchange (describe, with the
    statistics). The assertions allow for a busy machine, where a round can time out a slow
    node too. Processes of its own: nodes it freezes, kills and starts late."""
    flwr_home, results = tmp_path / "flwr-home", tmp_path / "results"
    logs = flwr_home / "deploy"
    run_config = (f"encoder='pixels' num-server-rounds=5 partition='iid' run-name='faults' "
                  f"feature-norm='none' round-timeout=60.0 results-dir='{results}' "
                  f"feature-cache-dir='{tmp_path / 'cache'}'")
    train = "Receiving: train message"
    round_2, round_3 = rf"{train}.*?{train}", rf"{train}.*?{train}.*?{train}"
    outcome: dict = {}
    with deploy.local_deployment(0, flwr_home, isolation="subprocess",
                                 num_partitions=5) as deployment:
        for i, chaos in ((0, ""), (1, ""), (2, "chaos='nan'")):
            deploy.start_supernode(deployment, i, 5, None, extra_config=chaos, isolation="process")
        deploy.start_supernode(deployment, 3, 5, None)  # subprocess, as the SuperLink
        runner = start_run(deployment, run_config, outcome)
        frozen, dead = deployment.nodes[1], deployment.nodes[3]
        # a forked ClientApp answers within a second: frozen before round 2's message comes
        # (the node sleeps 3 s after each reply before it asks for more)
        wait_for(logs / "supernode-1.log", "Sending: train message")
        signal_apps(frozen, signal.SIGSTOP)
        wait_for(logs / "supernode-3.log", round_2)
        dead.stop()  # the host fails: the SuperNode and the apps it started
        wait_for(logs / "supernode-0.log", round_2)
        deploy.start_supernode(deployment, 4, 5, None, isolation="process")  # late
        wait_for(logs / "supernode-0.log", round_3)  # round 2 ended without node 1
        signal_apps(frozen, signal.SIGCONT)
        runner.join(timeout=600)
    out = capfd.readouterr().out
    code, final_line = outcome["result"]
    assert code == 0 and final_line.startswith("0."), out[-3000:]
    summary = read_summary(results / "faults")
    rounds = summary["rounds"]
    # round 1, before any fault: the 3 honest nodes trained
    assert (rounds[0]["clients_trained"], rounds[0]["clients_failed"]) == (3, 0)
    # the poisoning node: each of its replies that came in time was rejected, none averaged
    assert all(r["clients_rejected"] <= 1 for r in rounds)
    assert sum(r["clients_rejected"] for r in rounds) >= 4
    assert all("non-finite" in x["reason"] for r in rounds for x in r["rejections"])
    # the frozen node: round 2 ended without it after the timeout, not after 3600 s (nor did
    # any other round wait longer; the late node's admission adds its set-up to its round) ...
    assert rounds[1]["clients_timed_out"] >= 1 and rounds[1]["clients_trained"] <= 1
    assert 60 <= rounds[1]["round_seconds"]
    admitted = re.search(r"round (\d+): 1 node\(s\) connected late, 1 admitted; "
                         r"5 in the federation", out)
    assert admitted, out[-3000:]
    first = int(admitted[1])  # the first round the late node was in
    assert max(r["round_seconds"] for r in rounds if r["round"] != first) < 60 + 15
    # ... and once thawed it trained again (with 0 and the late node)
    assert max(r["clients_trained"] for r in rounds[2:]) == 3
    # the dead node: failed at once (not timed out) from the round it died in, never trained
    # again, and the others finished the run
    assert [r["clients_failed"] for r in rounds[1:3]] == [1, 1]
    assert all(r["clients_failed"] <= 1 for r in rounds)
    assert summary["final_accuracy"] > 0.8  # no NaN reached the global head
    # the late node: admitted, not in the start's statistics, then sampled and trained in every
    # round from the one after it connected (round 3, or 4 if it came as round 3 began)
    assert summary["head_init"]["clients_sent"] == 4
    sampled = [r["clients_sampled"] for r in rounds]
    assert 3 <= first <= 4 and max(sampled[:first - 1]) == 4, sampled
    late_log = (logs / "supernode-4.log").read_text(errors="replace")
    assert late_log.count("Receiving: train message") == late_log.count(
        "Sending: train message") == 6 - first
    assert left_behind(flwr_home) == set()


def test_a_deployment_starts_from_a_fresh_superlink_state(tmp_path):
    """The last deployment's SuperNodes would still look online in its state."""
    database = tmp_path / "deploy" / "state.db"
    database.parent.mkdir()
    for name in ("state.db", "state.db-wal", "state.db-shm"):
        (database.parent / name).write_text("last deployment")
    (database.parent / "superlink.log").write_text("kept")
    assert deploy.fresh_state(database) == database
    assert sorted(p.name for p in database.parent.iterdir()) == ["superlink.log"]


def test_the_superlink_keeps_its_state_in_memory_unless_a_restart_needs_it(tmp_path):
    """As compose's (Flower's default): SQLite only where a restart must find the runs again."""
    in_memory = deploy.superlink_command(9091, "process", None)
    assert "--database" not in in_memory
    on_disk = deploy.superlink_command(9091, "process", None, tmp_path / "state.db")
    assert on_disk[on_disk.index("--database") + 1] == str(tmp_path / "state.db")
    deployment = deploy.Deployment("127.0.0.1:9091", tmp_path, superlink=None,
                                   superlink_command=in_memory)
    with pytest.raises(ValueError, match=r"state_on_disk=True"):
        deploy.restart_superlink(deployment)


def test_a_run_of_the_encoder_path_gets_runtimes_that_preload_its_libraries(monkeypatch):
    """`deploy` reads the run's `finetune`: a FLoRA run's nodes fork their ClientApps from a
    process that has imported timm, peft and sklearn's datasets (ops/clientapp_runtime.py)."""
    from ovalp_flwr.ops import clientapp_runtime

    flora = ["--run-config", "finetune='flora' encoder='tiny-cnn'"]
    assert deploy.runs_encoder_path(deploy.PROJECT, flora)
    assert not deploy.runs_encoder_path(deploy.PROJECT, ["--run-config", "num-server-rounds=2"])
    assert not deploy.runs_encoder_path(deploy.PROJECT / "benchmarks" / "floor_app", flora)
    command = deploy.warm_runtime_command("127.0.0.1:9094", encoder_path=True)
    assert command[-1] == "--preload-encoder-path"
    assert "--preload-encoder-path" not in deploy.warm_runtime_command("127.0.0.1:9094")
    started = []
    monkeypatch.setattr(clientapp_runtime, "run", lambda *args: started.append(args))
    clientapp_runtime.main(command[3:])  # after `python -m ovalp_flwr.ops.clientapp_runtime`
    assert started == [("127.0.0.1:9094", None, False, True, False)]
    # the SuperLink's runtime forks ServerApps (what they import: SERVER_PRELOAD)
    clientapp_runtime.main(deploy.warm_server_runtime_command("127.0.0.1:9091", Path("ca.crt"))[3:])
    assert started[-1] == ("127.0.0.1:9091", "ca.crt", False, False, True)



def test_the_deploy_command_hands_its_flags_to_the_deployment_and_the_run(tmp_path, monkeypatch,
                                                                        capsys):
    """`python -m ovalp_flwr.ops.deploy`'s own wiring, in process (the e2e scenarios start their
    deployments through `local_deployment` and `run_app`, as it does): each flag reaches the
    deployment, the run gets what follows `--`, and a run without a result line fails."""
    started, submitted = [], []

    @contextlib.contextmanager
    def fake_deployment(num_supernodes, flwr_home, node_dir, app, **options):
        started.append((num_supernodes, flwr_home, node_dir, app, options))
        yield "deployment"

    monkeypatch.setattr(deploy, "local_deployment", fake_deployment)
    monkeypatch.setattr(deploy, "run_app", lambda deployment, app, flwr_args, console:
                        submitted.append((deployment, app, flwr_args)) or (0, None))
    run_config = ["--run-config", "finetune='flora' encoder='tiny-cnn' head-init='random' "
                                  "drift-correction='none'"]
    code = deploy.main(["-n", "2", "--tls", "--node-dir", "nodes/{i}", "--flwr-home",
                        str(tmp_path), "--isolation", "subprocess", "--cold-clientapps", "--",
                        *run_config])
    assert code == 1 and "run failed (flwr run exit 0)" in capsys.readouterr().out
    assert started == [(2, tmp_path, "nodes/{i}", deploy.PROJECT,
                        {"secure": True, "isolation": "subprocess", "warm_clientapps": False,
                         "encoder_path": True})]
    assert submitted == [("deployment", deploy.PROJECT, run_config)]
