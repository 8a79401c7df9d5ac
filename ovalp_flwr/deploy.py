"""A deployment on this machine, with the processes users start across hosts: one
`flower-superlink` and N `flower-supernode`s on loopback, then `flwr run` against them.

    python -m ovalp_flwr.deploy --num-supernodes 3 -- --run-config "num-server-rounds=5"
    python -m ovalp_flwr.deploy -n 3 --node-dir 'nodes/{i}' -- --run-config "..."

Each SuperNode gets `--node-config "partition-id=i num-partitions=N"`; with `--node-dir`
(`{i}` is the partition id) also `data-dir='<dir>/data' feature-cache-dir='<dir>/cache'`, so
every node owns its data and builds and keeps its own cache there (`client_data`); without
it, nodes read the run's data files but each keeps its own cache under
`<flwr-home>/nodes/<i>/cache`, so no two SuperNodes share a cache. Every
process is started in its own session and stopped by PID, with all it started, on exit,
error, Ctrl-C or SIGTERM. Logs go to `<flwr-home>/deploy/`.

With `--tls` (`secure=True`) the deployment is encrypted and authenticated: throwaway
certificates and SuperNode keys are made under `<flwr-home>/certs` (`ovalp_flwr.certs`),
the SuperLink runs with `--ssl-*` and `--enable-supernode-auth`, the connection trusts the
CA (`root-certificates`), and each SuperNode's public key is registered with `flwr supernode
register` before the node starts with `--root-certificates --auth-supernode-private-key`.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ovalp_flwr import certs as certs_module
from ovalp_flwr.launch import (
    PROJECT,
    _bin,
    _wait_for_port,
    flower_env,
    flwr_args_after_dashes,
    free_port,
    report_result,
    stop_group,
    stream_flwr_run,
    write_connection,
)

CONNECTION = "ovalp-deploy"


@dataclass
class Deployment:
    """The running processes and where they listen."""

    address: str
    flwr_home: Path
    superlink: subprocess.Popen
    supernodes: list[subprocess.Popen] = field(default_factory=list)
    certs: Path | None = None  # set when secure: CA cert, server cert/key, node keys

    @property
    def secure(self) -> bool:
        return self.certs is not None

    def processes(self) -> list[subprocess.Popen]:
        return [self.superlink, *self.supernodes]


def node_config(partition_id: int, num_partitions: int, node_dir: str | None,
                default_cache: Path | None = None) -> str:
    """`--node-config` of one SuperNode. With a node dir: its own data and cache dirs. Without:
    the run's data files, but still its own cache dir (`default_cache`), so that no two
    SuperNodes share a cache and each keeps its rows file (see client_data)."""
    config = f"partition-id={partition_id} num-partitions={num_partitions}"
    if node_dir:
        root = Path(node_dir.format(i=partition_id)).resolve()
        config += f" data-dir='{root / 'data'}' feature-cache-dir='{root / 'cache'}'"
    elif default_cache is not None:
        config += f" feature-cache-dir='{default_cache}'"
    return config


def _start(command: list[str], log: Path, flwr_home: Path, cwd: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as handle:
        return subprocess.Popen(command, cwd=cwd, env=flower_env(flwr_home), stdout=handle,
                                stderr=subprocess.STDOUT, start_new_session=True)


def register_supernode(deployment: Deployment, public_key: Path) -> str:
    """`flwr supernode register <public_key> ovalp-deploy`; its output (raises on failure)."""
    done = subprocess.run([_bin("flwr"), "supernode", "register", str(public_key), CONNECTION],
                          env=flower_env(deployment.flwr_home), capture_output=True, text=True,
                          timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"flwr supernode register {public_key} failed ({done.returncode}):\n"
                           f"{done.stdout}{done.stderr}")
    return done.stdout


def start_supernode(deployment: Deployment, partition_id: int, num_partitions: int,
                    node_dir: str | None, cwd: Path = PROJECT, private_key: Path | None = None,
                    register: bool = True, log_name: str | None = None) -> subprocess.Popen:
    """One more SuperNode (also for a node that joins a running federation late).

    Secure deployments: the node authenticates with `private_key` (default: the key pair
    `supernode-<partition_id>` under the deployment's certs, made if missing), whose public
    half is registered first unless `register=False` (a node the SuperLink must refuse).
    """
    if deployment.secure:
        assert deployment.certs is not None
        if private_key is None:
            private_key = deployment.certs / certs_module.node_key_name(partition_id)
            if not private_key.exists():
                certs_module.make_node_keys(deployment.certs, private_key.name)
        if register:
            register_supernode(deployment, private_key.with_name(private_key.name + ".pub"))
        security = ["--root-certificates", str(deployment.certs / "ca.crt"),
                    "--auth-supernode-private-key", str(private_key)]
    else:
        security = ["--insecure"]
    command = [_bin("flower-supernode"), *security, "--superlink", deployment.address,
               "--port", str(free_port()),
               "--node-config", node_config(partition_id, num_partitions, node_dir,
                                            deployment.flwr_home / "nodes" / str(partition_id) / "cache")]
    log = deployment.flwr_home / "deploy" / (log_name or f"supernode-{partition_id}.log")
    process = _start(command, log, deployment.flwr_home, cwd)
    deployment.supernodes.append(process)
    return process


@contextlib.contextmanager
def local_deployment(num_supernodes: int, flwr_home: Path, node_dir: str | None = None,
                     cwd: Path = PROJECT, secure: bool = False) -> Iterator[Deployment]:
    """SuperLink + N SuperNodes; everything stopped on the way out, whatever happens.

    `secure`: TLS + SuperNode authentication, with throwaway certs under `<flwr_home>/certs`.
    """
    flwr_home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = flwr_home / "deploy" / "superlink.log"
    certs = None
    if secure:
        certs = flwr_home / "certs"
        server, _ = certs_module.make_all(certs, num_supernodes)
        security = ["--ssl-certfile", str(server.server_cert),
                    "--ssl-keyfile", str(server.server_key),
                    "--ssl-ca-certfile", str(server.ca_cert), "--enable-supernode-auth"]
    else:
        security = ["--insecure"]
    superlink = _start([_bin("flower-superlink"), *security, "--host", "127.0.0.1",
                        "--port", str(port), "--database", str(flwr_home / "deploy" / "state.db")],
                       log, flwr_home, cwd)
    deployment = Deployment(f"127.0.0.1:{port}", flwr_home, superlink, certs=certs)
    try:
        _wait_for_port(port, superlink, log)
        # the connection first: `flwr supernode register` (secure) goes through it
        write_connection(flwr_home, CONNECTION, deployment.address,
                         certs / "ca.crt" if certs is not None else None)
        for i in range(num_supernodes):
            start_supernode(deployment, i, num_supernodes, node_dir, cwd)
        yield deployment
    finally:
        for process in reversed(deployment.processes()):
            stop_group(process)


def run_app(deployment: Deployment, app: Path, flwr_args: Sequence[str]) -> tuple[int, str | None]:
    """`flwr run <app> ovalp-deploy --stream ...`; (exit code, the run's closing line)."""
    return stream_flwr_run(app, CONNECTION, deployment.flwr_home, list(flwr_args))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--num-supernodes", type=int, default=3)
    parser.add_argument("--node-dir", default=None,
                        help="per-node folder, '{i}' = partition id (holds data/ and cache/)")
    parser.add_argument("--app", type=Path, default=PROJECT)
    parser.add_argument("--flwr-home", type=Path, default=PROJECT / ".flwr-deploy")
    parser.add_argument("--tls", action="store_true",
                        help="TLS + SuperNode authentication (throwaway certs in <flwr-home>/certs)")
    args, flwr_args = flwr_args_after_dashes(parser, list(argv) if argv is not None else None)
    started = time.monotonic()
    with local_deployment(args.num_supernodes, args.flwr_home.resolve(), args.node_dir,
                          args.app.resolve(), secure=args.tls) as deployment:
        code, final_line = run_app(deployment, args.app.resolve(), flwr_args)
    print(f"deployment of {args.num_supernodes} SuperNodes{' (TLS + node auth)' if args.tls else ''}: "
          f"{time.monotonic() - started:.0f} s")
    return report_result(code, final_line)


if __name__ == "__main__":
    sys.exit(main())
