"""A deployment on this machine, with the processes users start across hosts: one
`flower-superlink` and N `flower-supernode`s on loopback, then `flwr run` against them.

    python -m ovalp_flwr.deploy --num-supernodes 3 -- --run-config "num-server-rounds=5"
    python -m ovalp_flwr.deploy -n 3 --node-dir 'nodes/{i}' -- --run-config "..."

Each SuperNode gets `--node-config "partition-id=i num-partitions=N"`; with `--node-dir`
(`{i}` is the partition id) also `data-dir='<dir>/data' feature-cache-dir='<dir>/cache'`, so
every node owns its data and builds and keeps its own cache there (`client_data`). Every
process is started in its own session and stopped by PID, with all it started, on exit,
error, Ctrl-C or SIGTERM. Logs go to `<flwr-home>/deploy/`.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ovalp_flwr.launch import (
    FINAL_LINE,
    PROJECT,
    _bin,
    _wait_for_port,
    flower_env,
    free_port,
    stop_group,
)

CONNECTION = "ovalp-deploy"


@dataclass
class Deployment:
    """The running processes and where they listen."""

    address: str
    flwr_home: Path
    superlink: subprocess.Popen
    supernodes: list[subprocess.Popen] = field(default_factory=list)

    def processes(self) -> list[subprocess.Popen]:
        return [self.superlink, *self.supernodes]


def node_config(partition_id: int, num_partitions: int, node_dir: str | None) -> str:
    """`--node-config` of one SuperNode; with a node dir, its own data and cache dirs."""
    config = f"partition-id={partition_id} num-partitions={num_partitions}"
    if node_dir:
        root = Path(node_dir.format(i=partition_id)).resolve()
        config += f" data-dir='{root / 'data'}' feature-cache-dir='{root / 'cache'}'"
    return config


def _start(command: list[str], log: Path, flwr_home: Path, cwd: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as handle:
        return subprocess.Popen(command, cwd=cwd, env=flower_env(flwr_home), stdout=handle,
                                stderr=subprocess.STDOUT, start_new_session=True)


def start_supernode(deployment: Deployment, partition_id: int, num_partitions: int,
                    node_dir: str | None, cwd: Path = PROJECT) -> subprocess.Popen:
    """One more SuperNode (also for a node that joins a running federation late)."""
    command = [_bin("flower-supernode"), "--insecure", "--superlink", deployment.address,
               "--port", str(free_port()),
               "--node-config", node_config(partition_id, num_partitions, node_dir)]
    log = deployment.flwr_home / "deploy" / f"supernode-{partition_id}.log"
    process = _start(command, log, deployment.flwr_home, cwd)
    deployment.supernodes.append(process)
    return process


@contextlib.contextmanager
def local_deployment(num_supernodes: int, flwr_home: Path, node_dir: str | None = None,
                     cwd: Path = PROJECT) -> Iterator[Deployment]:
    """SuperLink + N SuperNodes; everything stopped on the way out, whatever happens."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = flwr_home / "deploy" / "superlink.log"
    superlink = _start([_bin("flower-superlink"), "--insecure", "--host", "127.0.0.1",
                        "--port", str(port), "--database", str(flwr_home / "deploy" / "state.db")],
                       log, flwr_home, cwd)
    deployment = Deployment(f"127.0.0.1:{port}", flwr_home, superlink)
    try:
        _wait_for_port(port, superlink, log)
        for i in range(num_supernodes):
            start_supernode(deployment, i, num_supernodes, node_dir, cwd)
        write_connection(flwr_home, deployment.address)
        yield deployment
    finally:
        for process in reversed(deployment.processes()):
            stop_group(process)


def write_connection(flwr_home: Path, address: str) -> None:
    """`ovalp-deploy`, the default connection of this Flower home, pointing at our SuperLink."""
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n\n'
        f'[superlink.{CONNECTION}]\naddress = "{address}"\ninsecure = true\n'
    )


def run_app(deployment: Deployment, app: Path, flwr_args: Sequence[str]) -> tuple[int, str | None]:
    """`flwr run <app> ovalp-deploy --stream ...`; (exit code, the run's closing line)."""
    command = [_bin("flwr"), "run", str(app), CONNECTION, "--stream", *flwr_args]
    run = subprocess.Popen(command, cwd=app, env=flower_env(deployment.flwr_home),
                           start_new_session=True, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    final_line = None
    try:
        assert run.stdout is not None
        for line in run.stdout:
            sys.stdout.write(line)
            if FINAL_LINE in line:
                final_line = line.split(FINAL_LINE, 1)[1].strip()
        code = run.wait()
    finally:
        stop_group(run)
    return code, final_line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--num-supernodes", type=int, default=3)
    parser.add_argument("--node-dir", default=None,
                        help="per-node folder, '{i}' = partition id (holds data/ and cache/)")
    parser.add_argument("--app", type=Path, default=PROJECT)
    parser.add_argument("--flwr-home", type=Path, default=PROJECT / ".flwr-deploy")
    parser.add_argument("flwr_args", nargs=argparse.REMAINDER,
                        help="passed to `flwr run` after `--` (e.g. --run-config ...)")
    args = parser.parse_args(argv)
    flwr_args = args.flwr_args[1:] if args.flwr_args[:1] == ["--"] else args.flwr_args
    if args.num_supernodes < 1:
        parser.error(f"--num-supernodes={args.num_supernodes} is not allowed; use 1 or more")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    started = time.monotonic()
    with local_deployment(args.num_supernodes, args.flwr_home.resolve(), args.node_dir,
                          args.app.resolve()) as deployment:
        code, final_line = run_app(deployment, args.app.resolve(), flwr_args)
    seconds = time.monotonic() - started
    print(f"{FINAL_LINE}{final_line}" if final_line
          else f"run ended (exit {code}) without a result line")
    print(f"deployment of {args.num_supernodes} SuperNodes: {seconds:.0f} s in all")
    return code if final_line else (code or 1)


if __name__ == "__main__":
    sys.exit(main())
