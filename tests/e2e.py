"""What the e2e tests share: the long-lived federations their scenarios submit runs to, and the
checks that a run leaves no process behind.

Flower serves many runs on one SuperLink, so a scenario whose property is about the run, not
about the processes' own lives, submits its run to a federation started once for them (module-scoped: the scenarios name its
`xdist_group`, so they run one after another on one worker, tests/scheduling.py, and it stops
as that worker moves on to another module's tests, not idling until the session ends):
- `ray_federation` ("ray"): a Ray cluster of two raylets (the stand-in of two machines) and a
  simulation SuperLink whose runs join it, as `python -m ovalp_flwr.ops.ray_cluster` does;
- `secure_deployment` ("deployment"): a SuperLink with TLS and SuperNode authentication and two
  SuperNodes that each own their data, cache and models (`deploy --tls --node-dir`), under
  process isolation with their ClientApp runtimes, as docker/compose.yml.
Tests whose property needs processes of their own (a node killed or frozen, a SuperLink
restarted, the launcher's own SuperLink and Ray) start them, and say why.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ovalp_flwr.ops import deploy, launch
from ovalp_flwr.ops.console import RunConsole, new_log_path
from ovalp_flwr.ops.processes import alive
from ovalp_flwr.ops.ray_cluster import LocalCluster, local_cluster


def processes_of(flwr_home: Path) -> set[int]:
    """Live processes started for one Flower home: they all inherit its FLWR_HOME.

    Matching on the environment (not on names) keeps concurrent Flower runs on the same
    machine out of the count.
    """
    marker = f"FLWR_HOME={flwr_home}".encode()
    found = set()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        pid = int(environ.parent.name)
        with contextlib.suppress(OSError):
            if marker in environ.read_bytes().split(b"\0") and alive(pid):
                found.add(pid)
    return found - {os.getpid()}


def left_behind(flwr_home: Path, grace: float = 10.0, resident: frozenset[int] = frozenset()
                ) -> set[int]:
    """Our processes still alive after `grace` seconds (exiting ones get time to go), besides
    the `resident` ones: a shared federation's, which outlive each run by design."""
    deadline = time.monotonic() + grace
    while (alive := processes_of(flwr_home) - resident) and time.monotonic() < deadline:
        time.sleep(0.5)
    return alive


def ray_processes_under(temp_dir: Path) -> set[int]:
    """Live processes of a Ray whose temp dir is `temp_dir` (it is on their command lines)."""
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if str(temp_dir).encode() in cmdline.read_bytes() and alive(int(cmdline.parent.name)):
                found.add(int(cmdline.parent.name))
    return found


@dataclass(frozen=True)
class RayFederation:
    """A simulation SuperLink (connection written to `flwr_home`) whose runs join `cluster`."""

    cluster: LocalCluster
    flwr_home: Path
    resident: frozenset[int]  # the SuperLink and the runtime it started: they stay

    def left_behind(self) -> set[int]:
        """What a finished run left running besides the federation's own processes."""
        return left_behind(self.flwr_home, resident=self.resident)


@pytest.fixture(scope="module")
def ray_federation(tmp_path_factory) -> Iterator[RayFederation]:
    """Started on first use, stopped (by PID, all it started) after the module's last user."""
    flwr_home = tmp_path_factory.mktemp("ray-federation") / "flwr-home"
    # the suite's first minutes load both cores: a raylet's start can take minutes then
    with local_cluster(nodes=2, cpus_per_node=1, timeout=240.0) as cluster, \
            launch.simulation_superlink(flwr_home, ray_address=cluster.address) as (_, address):
        launch.write_connection(flwr_home, launch.CONNECTION, address)
        yield RayFederation(cluster, flwr_home, frozenset(processes_of(flwr_home)))
    assert left_behind(flwr_home) == set(), "the shared Ray federation outlived its stop"
    assert ray_processes_under(cluster.temp_dir) == set(), "the cluster's processes outlived it"


@dataclass(frozen=True)
class SecureDeployment:
    """A running `deploy --tls --node-dir <root>/node{i}` of two SuperNodes."""

    deployment: deploy.Deployment
    root: Path

    @property
    def flwr_home(self) -> Path:
        return self.deployment.flwr_home

    def node_dir(self, partition_id: int) -> Path:
        return self.root / f"node{partition_id}"

    def resident(self) -> frozenset[int]:
        """The deployment's own processes (SuperLink, SuperNodes, runtimes): they stay."""
        return frozenset(process.pid for process in self.deployment.processes())

    def left_behind(self) -> set[int]:
        return left_behind(self.flwr_home, resident=self.resident())

    def run(self, run_config: str) -> int:
        """One run, shown as `deploy` shows it (its progress, summary and result line)."""
        console = RunConsole(new_log_path(self.flwr_home, "deploy"))
        console.also_search(self.flwr_home / "deploy" / "superlink.log")
        code, final_line = deploy.run_app(self.deployment, deploy.PROJECT,
                                          ["--run-config", run_config], console)
        status = launch.failure_status(final_line, console, self.flwr_home, deploy.CONNECTION)
        return launch.report_result(code, final_line, console, status)


@pytest.fixture(scope="module")
def secure_deployment(tmp_path_factory) -> Iterator[SecureDeployment]:
    root = tmp_path_factory.mktemp("secure-deployment")
    flwr_home = root / "flwr-home"
    # its runs include the encoder path's (FLoRA): the nodes' runtimes preload it, as `deploy`
    # does for such a run
    with deploy.local_deployment(2, flwr_home, node_dir=str(root / "node{i}"), secure=True,
                                 encoder_path=True) as deployment:
        yield SecureDeployment(deployment, root)
    assert left_behind(flwr_home) == set(), "the shared deployment outlived its stop"
