"""A deployment on this machine, with the processes users start across hosts: one
`flower-superlink` and N `flower-supernode`s on loopback, then `flwr run` against them.

    python -m ovalp_flwr.ops.deploy --num-supernodes 3 -- --run-config "num-server-rounds=5"
    python -m ovalp_flwr.ops.deploy -n 3 --node-dir 'nodes/{i}' -- --run-config "..."
    python -m ovalp_flwr.ops.deploy -n 3 --isolation subprocess -- --run-config "..."

Each SuperNode gets `--node-config "partition-id=i num-partitions=N"`; with `--node-dir`
(`{i}` is the partition id) also `data-dir='<dir>/data' feature-cache-dir='<dir>/cache'`, so
every node owns its data and builds and keeps its own cache there (`client_data`); without
it, nodes read the run's data files but each keeps its own cache under
`<flwr-home>/nodes/<i>/cache`, so no two SuperNodes share a cache. Every
process is started in its own session and stopped by PID, with all it started, on exit,
error, Ctrl-C or SIGTERM. Logs go to `<flwr-home>/deploy/`.

Isolation is `process` by default, as in `docker/compose.yml`: the SuperLink and every
SuperNode run with `--isolation process`, and separate `flower-superexec` runtimes (one for
the ServerApp, attached to the SuperLink's port; one per SuperNode, attached to that node's
`--port`) start the app processes, the way the compose file's `serverapp` and
`clientapp-<i>` containers do. `--isolation subprocess` lets the SuperLink and SuperNodes start
them themselves, which is Flower's default and needs no runtime processes.

With `--tls` (`secure=True`) the deployment is encrypted and authenticated: throwaway
certificates and SuperNode keys are made under `<flwr-home>/certs` (`ovalp_flwr.ops.certs`),
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

from ovalp_flwr.ops import certs as certs_module
from ovalp_flwr.ops.timings import LineClock
from ovalp_flwr.ops.console import LogFollower, RunConsole, new_log_path, relative
from ovalp_flwr.ops.launch import (
    PROJECT,
    _bin,
    _wait_for_port,
    failure_status,
    flower_env,
    flwr_args_after_dashes,
    flwr_cli,
    preflight,
    report_result,
    stream_flwr_run,
    write_connection,
)
from ovalp_flwr.ops.processes import sigterm_unwinds, stop_group, stop_groups
from ovalp_flwr.ops.ports import free_port

CONNECTION = "ovalp-deploy"
ISOLATIONS = ("process", "subprocess")
DEFAULT_ISOLATION = "process"  # as docker/compose.yml


@dataclass
class Node:
    """One SuperNode and, under process isolation, the ClientApp runtime attached to it."""

    partition_id: int
    supernode: subprocess.Popen
    runtime: subprocess.Popen | None = None

    def processes(self) -> list[subprocess.Popen]:
        return [self.supernode, *([self.runtime] if self.runtime is not None else [])]

    def stop(self) -> None:
        """What a host failure does: the node and its runtime are gone."""
        stop_groups(self.processes())


@dataclass
class Deployment:
    """The running processes and where they listen."""

    address: str
    flwr_home: Path
    superlink: subprocess.Popen
    isolation: str = DEFAULT_ISOLATION
    server_runtime: subprocess.Popen | None = None  # process isolation: the ServerApp's
    nodes: list[Node] = field(default_factory=list)
    certs: Path | None = None  # set when secure: CA cert, server cert/key, node keys
    superlink_command: list[str] = field(default_factory=list)  # to start it again
    cwd: Path = PROJECT
    warm_clientapps: bool = True  # process isolation: ClientApps forked (clientapp_runtime)
    encoder_path: bool = False  # ... from a process that has the encoder path's imports too

    @property
    def secure(self) -> bool:
        return self.certs is not None

    def processes(self) -> list[subprocess.Popen]:
        """Every process, in start order (stop them in reverse)."""
        server = [self.superlink, *([self.server_runtime] if self.server_runtime else [])]
        return server + [process for node in self.nodes for process in node.processes()]


def node_config(partition_id: int, num_partitions: int, node_dir: str | None,
                default_cache: Path | None = None) -> str:
    """`--node-config` of one SuperNode. With a node dir: its own data and cache dirs. Without:
    the run's data files, but still its own cache dir (`default_cache`), so that no two
    SuperNodes share a cache and each keeps its rows file (see client_data). Either way a
    model dir beside the cache, where the node keeps its personalized models."""
    config = f"partition-id={partition_id} num-partitions={num_partitions}"
    if node_dir:
        root = Path(node_dir.format(i=partition_id)).resolve()
        config += (f" data-dir='{root / 'data'}' feature-cache-dir='{root / 'cache'}'"
                   f" model-dir='{root / 'models'}'")
    elif default_cache is not None:
        config += (f" feature-cache-dir='{default_cache}'"
                   f" model-dir='{default_cache.parent / 'models'}'")
    return config


def _start(command: list[str], log: Path, flwr_home: Path, cwd: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as handle:
        return subprocess.Popen(command, cwd=cwd, env=flower_env(flwr_home), stdout=handle,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _check_isolation(isolation: str) -> None:
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation={isolation!r} is not allowed; choose one of {ISOLATIONS}")


def superlink_command(port: int, isolation: str, certs: Path | None,
                      database: Path | None = None) -> list[str]:
    """compose's `superlink` on loopback. Its state in memory, as compose's (Flower's default),
    or in `database` (SQLite), which a restarted SuperLink reads again: Flower's SQL state costs
    the SuperLink 2.3x the CPU (74 against 32 CPU-s over the secure deployment's three test
    runs, docs/testing.md). `certs`: TLS with the files `certs.make_all` writes, and SuperNode
    authentication."""
    if certs is not None:
        security = ["--ssl-certfile", str(certs / certs_module.SERVER_CERT),
                    "--ssl-keyfile", str(certs / certs_module.SERVER_KEY),
                    "--ssl-ca-certfile", str(certs / certs_module.CA_CERT), "--enable-supernode-auth"]
    else:
        security = ["--insecure"]
    return [_bin("flower-superlink"), *security, "--isolation", isolation,
            "--host", "127.0.0.1", "--port", str(port),
            *(["--database", str(database)] if database is not None else [])]


def supernode_command(superlink: str, port: int, isolation: str, config: str,
                      certs: Path | None = None, private_key: Path | None = None) -> list[str]:
    """compose's `supernode-<i>` on loopback: `port` is its runtime API (its own per node)."""
    if certs is not None:
        security = ["--root-certificates", str(certs / certs_module.CA_CERT),
                    "--auth-supernode-private-key", str(private_key)]
    else:
        security = ["--insecure"]
    return [_bin("flower-supernode"), *security, "--superlink", superlink,
            "--isolation", isolation, "--port", str(port), "--node-config", config]


def runtime_command(runtime_api_address: str, root_certificates: Path | None = None) -> list[str]:
    """`flower-superexec` attached to a SuperLink's or SuperNode's runtime API (compose's
    `serverapp` / `clientapp-<i>`): it starts the app process for each run or message."""
    security = (["--root-certificates", str(root_certificates)] if root_certificates is not None
                else ["--insecure"])
    return [_bin("flower-superexec"), *security, "--runtime-api-address", runtime_api_address]


def warm_runtime_command(runtime_api_address: str, encoder_path: bool = False) -> list[str]:
    """`runtime_command` for a SuperNode, with ClientApps forked from a process that has
    already imported them (`ovalp_flwr.ops.clientapp_runtime`): same flags, same tasks;
    `encoder_path`: the encoder path's imports too."""
    return [sys.executable, "-m", "ovalp_flwr.ops.clientapp_runtime", "--insecure",
            "--runtime-api-address", runtime_api_address,
            *(["--preload-encoder-path"] if encoder_path else [])]


def warm_server_runtime_command(runtime_api_address: str,
                                root_certificates: Path | None = None) -> list[str]:
    """`runtime_command` for the SuperLink, with each run's ServerApp forked from a process
    that has imported it (torch, Flower, the app: ~6 CPU-s a run here)."""
    return [sys.executable, "-m", "ovalp_flwr.ops.clientapp_runtime",
            *runtime_command(runtime_api_address, root_certificates)[1:], "--serverapps"]


def register_supernode(deployment: Deployment, public_key: Path) -> str:
    """`flwr supernode register <public_key> ovalp-deploy`; its output (raises on failure)."""
    return flwr_cli(deployment.flwr_home, "supernode", "register", str(public_key), CONNECTION)


def start_supernode(deployment: Deployment, partition_id: int, num_partitions: int,
                    node_dir: str | None, cwd: Path = PROJECT, private_key: Path | None = None,
                    register: bool = True, log_stem: str | None = None,
                    extra_config: str = "", isolation: str | None = None) -> Node:
    """One more SuperNode (also for a node that joins a running federation late), with its
    ClientApp runtime under process isolation.

    Secure deployments: the node authenticates with `private_key` (default: the key pair
    `supernode-<partition_id>` under the deployment's certs, made if missing), whose public
    half is registered first unless `register=False` (a node the SuperLink must refuse).
    Logs: `<flwr-home>/deploy/<log_stem>.log` (default `supernode-<i>`) and, for the runtime,
    `<log_stem>-clientapp.log`. `extra_config`: more `--node-config` entries (e.g. `chaos='nan'`,
    `ovalp_flwr.federation.chaos`). `isolation`: this node's, if not the deployment's (a
    federation whose nodes differ: some start their ClientApps themselves).
    """
    isolation = isolation or deployment.isolation
    _check_isolation(isolation)
    if deployment.secure:
        assert deployment.certs is not None
        if private_key is None:
            private_key = deployment.certs / certs_module.node_key_name(partition_id)
            if not private_key.exists():
                certs_module.make_node_keys(deployment.certs, private_key.name)
        if register:
            register_supernode(deployment, private_key.with_name(private_key.name + ".pub"))
    port = free_port()  # the node's runtime API, where its ClientApp runtime attaches
    cache = deployment.flwr_home / "nodes" / str(partition_id) / "cache"
    config = " ".join([node_config(partition_id, num_partitions, node_dir, cache), extra_config])
    command = supernode_command(deployment.address, port, isolation, config.strip(),
                                deployment.certs, private_key)
    name = log_stem or f"supernode-{partition_id}"
    logs = deployment.flwr_home / "deploy"
    node = Node(partition_id, _start(command, logs / f"{name}.log", deployment.flwr_home, cwd))
    deployment.nodes.append(node)
    if isolation == "process":
        address = f"127.0.0.1:{port}"
        command = (warm_runtime_command(address, deployment.encoder_path)
                   if deployment.warm_clientapps else runtime_command(address))
        node.runtime = _start(command, logs / f"{name}-clientapp.log", deployment.flwr_home, cwd)
    return node


def fresh_state(database: Path) -> Path:
    """`database` (the SuperLink's SQLite state) with the last deployment's removed, its
    journal files too: that deployment's SuperNodes stay registered in it and count as online
    until their heartbeats lapse, so a run started meanwhile would send to them and fail
    ("Node Unavailable"). A restart within one deployment (`restart_superlink`) keeps it."""
    database.parent.mkdir(parents=True, exist_ok=True)
    for stale in database.parent.glob(f"{database.name}*"):
        stale.unlink()
    return database


@contextlib.contextmanager
def local_deployment(num_supernodes: int, flwr_home: Path, node_dir: str | None = None,
                     cwd: Path = PROJECT, secure: bool = False, isolation: str = DEFAULT_ISOLATION,
                     num_partitions: int | None = None, warm_clientapps: bool = True,
                     encoder_path: bool = False, state_on_disk: bool = False
                     ) -> Iterator[Deployment]:
    """SuperLink + N SuperNodes (+ their runtimes under process isolation); everything
    stopped on the way out, whatever happens.

    `secure`: TLS + SuperNode authentication, with throwaway certs under `<flwr_home>/certs`.
    `num_partitions` (default N): more than N leaves partitions N.. for nodes that join later
    (`start_supernode`). `warm_clientapps` (process isolation): each node's runtime forks its
    ClientApps, and the SuperLink's its ServerApps, from a process that has imported them
    (`ovalp_flwr.ops.clientapp_runtime`); False: Flower's `flower-superexec`, a fresh
    `flwr-clientapp` process with all its imports per message (`flwr-serverapp` per run). `encoder_path`: the forking processes import the encoder path's libraries too
    (runs with `finetune` other than "none"). `state_on_disk`: the SuperLink's state in a fresh
    `<flwr_home>/deploy/state.db`, so that `restart_superlink` finds its runs and nodes again;
    else in memory, as compose's.
    """
    _check_isolation(isolation)
    flwr_home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = flwr_home / "deploy" / "superlink.log"
    certs = ca_cert = None
    if secure:
        certs = flwr_home / "certs"
        certs_module.make_all(certs, num_supernodes)
        ca_cert = certs / certs_module.CA_CERT
    database = fresh_state(flwr_home / "deploy" / "state.db") if state_on_disk else None
    command = superlink_command(port, isolation, certs, database)
    superlink = _start(command, log, flwr_home, cwd)
    deployment = Deployment(f"127.0.0.1:{port}", flwr_home, superlink, isolation, certs=certs,
                            superlink_command=command, cwd=cwd,
                            warm_clientapps=warm_clientapps, encoder_path=encoder_path)
    try:
        _wait_for_port(port, superlink, log)
        if isolation == "process":
            command = (warm_server_runtime_command(deployment.address, ca_cert)
                       if warm_clientapps else runtime_command(deployment.address, ca_cert))
            deployment.server_runtime = _start(command, flwr_home / "deploy" / "serverapp.log",
                                               flwr_home, cwd)
        # the connection first: `flwr supernode register` (secure) goes through it
        write_connection(flwr_home, CONNECTION, deployment.address, ca_cert)
        for i in range(num_supernodes):
            start_supernode(deployment, i, num_partitions or num_supernodes, node_dir, cwd)
        yield deployment
    finally:
        stop_groups(deployment.processes())


def restart_superlink(deployment: Deployment) -> None:
    """Stop the SuperLink and start it again, same port, same `--database`. The nodes and
    runtimes reconnect by themselves. Only the SuperLink: a running ServerApp process may
    reconnect too and finish its run; a reboot of the server host takes it as well (kill it
    first, as tests/test_deploy.py does), and the run goes on with `resume`
    (`ovalp_flwr.federation.checkpoint`).
    Stopped as a reboot stops it: SIGTERM, then SIGKILL after 2 s, since with nodes connected
    the SuperLink would otherwise wait for their connections to close; the longer it is down,
    the longer the nodes' reconnection backoff (up to tens of seconds). Needs the state on disk
    (`local_deployment(state_on_disk=True)`): one in memory would forget the runs and nodes."""
    if "--database" not in deployment.superlink_command:
        raise ValueError("restart_superlink needs the SuperLink's state on disk: start the "
                         "deployment with local_deployment(state_on_disk=True)")
    stop_group(deployment.superlink, grace=2.0)
    log = deployment.flwr_home / "deploy" / "superlink.log"
    deployment.superlink = _start(deployment.superlink_command, log, deployment.flwr_home,
                                  deployment.cwd)
    _wait_for_port(int(deployment.address.rsplit(":", 1)[1]), deployment.superlink, log)


def run_app(deployment: Deployment, app: Path, flwr_args: Sequence[str],
            console: RunConsole | None = None) -> tuple[int, str | None]:
    """`flwr run <app> ovalp-deploy --stream ...`; (exit code, the run's closing line). The
    SuperNodes' progress (their cache builds), which the stream lacks, is followed in their
    log files."""
    console = console or RunConsole(new_log_path(deployment.flwr_home, "deploy"))
    node_logs = sorted((deployment.flwr_home / "deploy").glob("supernode-*.log"))
    with LogFollower(console, node_logs):
        return stream_flwr_run(app, CONNECTION, deployment.flwr_home, list(flwr_args), console)


def runs_encoder_path(app: Path, flwr_args: Sequence[str]) -> bool:
    """Whether this app's run trains through the encoder (`finetune` other than "none"): its
    nodes' runtimes then preload that path's libraries (`ops/clientapp_runtime.py`)."""
    from ovalp_flwr.ops.preflight import fused_run_config, is_this_app  # late: as launch.preflight

    return is_this_app(app) and fused_run_config(app, flwr_args).get("finetune", "none") != "none"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ovalp_flwr.ops.deploy",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--num-supernodes", type=int, default=3,
                        help="SuperNodes to start, one partition each (default: %(default)s)")
    parser.add_argument("--node-dir", default=None,
                        help="per-node folder, '{i}' = partition id (holds data/ and cache/)")
    parser.add_argument("--app", type=Path, default=PROJECT,
                        help="the Flower app's folder (default: this project)")
    parser.add_argument("--flwr-home", type=Path, default=PROJECT / ".flwr-deploy",
                        help="Flower's state, certificates and every process's log "
                             "(default: %(default)s)")
    parser.add_argument("--tls", action="store_true",
                        help="TLS + SuperNode authentication (throwaway certs in <flwr-home>/certs)")
    parser.add_argument("--isolation", choices=ISOLATIONS, default=DEFAULT_ISOLATION,
                        help="process: separate flower-superexec runtimes, as docker/compose.yml "
                             "(default); subprocess: SuperLink and SuperNodes start the apps")
    parser.add_argument("--cold-clientapps", action="store_true",
                        help="process isolation: Flower's flower-superexec for the nodes and the "
                             "SuperLink, a fresh flwr-clientapp process with all its imports per "
                             "message, a fresh flwr-serverapp per run (default: forked from one "
                             "that has imported them, ops/clientapp_runtime.py)")
    started = time.monotonic()
    args, flwr_args = flwr_args_after_dashes(parser, list(argv) if argv is not None else None)
    if not preflight(args.app.resolve(), flwr_args, args.num_supernodes):
        return 2
    flwr_home = args.flwr_home.resolve()
    console = RunConsole(new_log_path(flwr_home, "deploy"), args.verbose)
    LineClock().attach(console)  # launcher.json: seconds from the command (ops/timings.py)
    console.also_search(flwr_home / "deploy" / "superlink.log")
    print(f"deploying {args.num_supernodes} SuperNodes ({args.isolation} isolation"
          f"{', TLS + node auth' if args.tls else ''}); full log: {relative(console.log_path)}, "
          f"each process's in {relative(flwr_home / 'deploy')}/", flush=True)
    with sigterm_unwinds(), local_deployment(args.num_supernodes, flwr_home,
                                             args.node_dir, args.app.resolve(), secure=args.tls,
                                             isolation=args.isolation,
                                             warm_clientapps=not args.cold_clientapps,
                                             encoder_path=runs_encoder_path(args.app.resolve(),
                                                                            flwr_args)) as deployment:
        code, final_line = run_app(deployment, args.app.resolve(), flwr_args, console)
        status = failure_status(final_line, console, flwr_home, CONNECTION)
    print(f"deployment of {args.num_supernodes} SuperNodes: {time.monotonic() - started:.0f} s")
    return report_result(code, final_line, console, status)


if __name__ == "__main__":
    sys.exit(main())
