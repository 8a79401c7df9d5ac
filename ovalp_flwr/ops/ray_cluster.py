"""A Ray cluster for the simulation: a stand-in of two machines on this one, and where the
ClientApp actors ran.

Flower's simulation calls `ray.init()` with its backend config's `init_args`; in flwr 1.41-1.42 the
federation config carries only `init-args-num-cpus`, `-num-gpus`, `-logging-level` and
`-log-to-driver` (`flwr/proto/federation_config.proto`), no address. `ray.init()` without one
joins the cluster named by `RAY_ADDRESS` in its environment, so the launcher's `--ray-address`
puts it into the environment of the SuperLink, whose simulation process inherits it
(`launch.flower_env`). `local_cluster` starts a head and further raylets with `ray start
--block`, each in its own process group with its own ports and a private temp dir (so no other
Ray on this machine joins it by accident), and stops them by PID: never `ray stop`, which stops
every Ray on the machine.

    python -m ovalp_flwr.ops.ray_cluster --nodes 2 -- --num-supernodes 8 -- --run-config "..."
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ovalp_flwr.ops.launch import _bin
from ovalp_flwr.ops.processes import sigterm_unwinds, stop_groups
from ovalp_flwr.ops.ports import free_port, free_ports

ACTOR_CLASS = "ClientAppActor"  # Flower's Ray actor that runs the ClientApp
OBJECT_STORE_BYTES = 300 * 2**20  # per raylet: the heads' messages are kilobytes
START_ATTEMPTS = 5  # a node whose `ray start` exits retries on new ports: a port taken since it
# was picked, or a raylet that did not register within Ray's fixed 30 s (ray/_private/node.py)
# on a loaded machine (the test suite's first minute: 3 tries were not always enough)
LOG_TAIL_LINES = 20  # of a failed node's log, in the error
STARTED = b"Ray runtime started."  # `ray start` prints it once the GCS lists the node
POLL_SECONDS = 0.2  # between reads of a starting node's log


def node_command(temp_dir: Path, num_cpus: int, head_port: int | None) -> list[str]:
    """`ray start --block` for the head (listening on `head_port`) or, with head_port None, for
    a raylet (the caller adds `--address`); every port its own, so several fit on one machine.

    Workers bind random ports (`--min/max-worker-port 0`): Ray's default reserves 10002-19999
    whole, so a free port picked inside that range (where a machine's ephemeral ports start
    lower) makes `ray start` exit, and two raylets on one machine would share the range."""
    flags = ["--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
             "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port"]
    if head_port is not None:
        flags += ["--dashboard-port", "--ray-client-server-port"]
    command = [_bin("ray"), "start", "--block", "--num-cpus", str(num_cpus), "--num-gpus", "0",
               "--object-store-memory", str(OBJECT_STORE_BYTES), "--disable-usage-stats",
               "--node-ip-address", "127.0.0.1", "--min-worker-port", "0",
               "--max-worker-port", "0"]
    for flag, port in zip(flags, free_ports(len(flags))):
        command += [flag, str(port)]
    return command + (["--head", "--port", str(head_port), "--temp-dir", str(temp_dir),
                       "--dashboard-host", "127.0.0.1"] if head_port is not None else [])


ANSWER = "ray-query-answer: "  # marks the query's line among what Ray itself prints


def ray_query(address: str, code: str, timeout: float = 60.0) -> object:
    """Run `code` (which calls `answer(value)` once, with a JSON value) in a fresh Python
    connected to `address`: this process never becomes a Ray driver. Ray may print its own
    lines after the answer (a raylet's log, under load), so the answer is found by its mark."""
    script = ("import json, ray, logging\n"
              f"def answer(value): print({ANSWER!r} + json.dumps(value), flush=True)\n"
              f"ray.init(address={address!r}, logging_level=logging.ERROR, log_to_driver=False)\n"
              + code)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=timeout)
    answers = [line.split(ANSWER, 1)[1] for line in done.stdout.splitlines() if ANSWER in line]
    if done.returncode != 0 or not answers:
        raise RuntimeError(f"ray query on {address} failed ({done.returncode}):\n"
                           f"{done.stdout[-1000:]}{done.stderr[-2000:]}")
    return json.loads(answers[-1])


def alive_nodes(address: str) -> list[str]:
    """Node ids of the cluster's live raylets."""
    return ray_query(address, "answer([n['NodeID'] for n in ray.nodes() if n['Alive']])")


def actor_placement(address: str) -> dict[str, int]:
    """How many ClientApp actors each node (by node id) hosted in this cluster's life, dead
    actors included: the GCS's actor table (`ray._private.state.actors`), which, unlike the
    state API (`ray.util.state.list_actors`), needs no dashboard (and `ray[default]`) running."""
    code = ("from ray._private.state import actors\n"
            "answer([a['Address']['NodeID'] for a in actors().values()"
            f" if a['ActorClassName'] == {ACTOR_CLASS!r}])")
    return dict(Counter(ray_query(address, code)))


@dataclass(frozen=True)
class LocalCluster:
    """A running stand-in cluster: the head's address and the Ray temp dir of all its nodes."""

    address: str
    temp_dir: Path


class NodeExited(RuntimeError):
    """A node's `ray start` exited while the cluster was starting."""

    def __init__(self, index: int, returncode: int, log: Path) -> None:
        tail = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        super().__init__(f"ray start (node {index}) exited with {returncode}; the end of {log}:\n"
                         + "\n".join(tail))
        self.index = index


@contextlib.contextmanager
def local_cluster(nodes: int = 2, cpus_per_node: int = 1, timeout: float = 90.0
                  ) -> Iterator[LocalCluster]:
    """A head and `nodes - 1` more raylets on this machine; yields it once all are in the
    cluster. Everything it started is stopped by PID on the way out."""
    if nodes < 1 or cpus_per_node < 1:
        raise ValueError(f"nodes={nodes}, cpus_per_node={cpus_per_node} are not allowed; "
                         "use 1 or more of each")
    temp_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # Ray's socket paths: keep it short
    processes: list[subprocess.Popen] = []
    address = ""
    try:
        for i in range(nodes):
            address = _start_node(i, address, temp_dir, cpus_per_node, processes, timeout)
        yield LocalCluster(address, temp_dir)
    finally:
        stop_groups(processes)
    shutil.rmtree(temp_dir, ignore_errors=True)  # kept, with its logs, when start-up failed


def _start_node(index: int, address: str, temp_dir: Path, num_cpus: int,
                processes: list[subprocess.Popen], timeout: float) -> str:
    """Start node `index` (0: the head) and wait until it says it started; a node that exits
    on the way is retried on new ports, `START_ATTEMPTS` in all. Returns the head's address."""
    for _ in range(START_ATTEMPTS - 1):
        try:
            return _try_node(index, address, temp_dir, num_cpus, processes, timeout)
        except NodeExited as exited:
            if exited.index != index:
                raise
            stop_groups([processes.pop()])  # whatever it left in its group goes with it
    return _try_node(index, address, temp_dir, num_cpus, processes, timeout)


def _try_node(index: int, address: str, temp_dir: Path, num_cpus: int,
              processes: list[subprocess.Popen], timeout: float) -> str:
    head_port = free_port() if index == 0 else None
    command = node_command(temp_dir, num_cpus, head_port)
    if head_port is None:
        command += ["--address", address]
    else:
        address = f"127.0.0.1:{head_port}"
    log_path = temp_dir / f"node-{index}.log"
    with open(log_path, "ab") as log:
        this_try_from = log.tell()  # a retry appends: read only what this try writes
        processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
    _wait_until_started(index, log_path, this_try_from, processes, timeout)
    return address


def _wait_until_started(index: int, log_path: Path, offset: int,
                        processes: list[subprocess.Popen], timeout: float) -> None:
    """Wait for node `index`'s `ray start` to print STARTED, which Ray does once the GCS lists
    the node (ray/_private/node.py). Its own log is read, not the cluster asked: a query is a
    fresh Python that imports Ray and joins as a driver, seconds of CPU taken every second
    from the raylet that has a fixed 30 s to register (the suite's 86-243 s Ray starts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for i, process in enumerate(processes):
            if process.poll() is not None:
                raise NodeExited(i, process.returncode, log_path.with_name(f"node-{i}.log"))
        with open(log_path, "rb") as log:
            log.seek(offset)
            if STARTED in log.read():
                return
        time.sleep(POLL_SECONDS)
    raise RuntimeError(f"ray start (node {index}) did not say it started in {timeout:.0f} s; "
                       f"see {log_path}")


def main(argv: list[str] | None = None) -> int:
    """Start the stand-in cluster, run the launcher on it, print the actors' placement."""
    from ovalp_flwr.ops import launch  # late: only the command line runs a launch

    parser = argparse.ArgumentParser(prog="python -m ovalp_flwr.ops.ray_cluster",
                                     description=main.__doc__)
    parser.add_argument("--nodes", type=int, default=2, help="raylets (default: %(default)s)")
    parser.add_argument("--cpus-per-node", type=int, default=1)
    parser.add_argument("launch_args", nargs=argparse.REMAINDER,
                        help="after `--`: the launcher's arguments")
    args = parser.parse_args(argv)
    launch_args = args.launch_args[1:] if args.launch_args[:1] == ["--"] else args.launch_args
    with sigterm_unwinds(), local_cluster(args.nodes, args.cpus_per_node) as cluster:
        code = launch.main(["--ray-address", cluster.address, *launch_args])
        placement = actor_placement(cluster.address)
    print(f"ClientApp actors per Ray node: {json.dumps(placement)}")
    return code


if __name__ == "__main__":
    sys.exit(main())
