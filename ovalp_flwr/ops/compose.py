"""The compose demo (`docker/compose.yml`, with `compose.tls.yml` on top for TLS and node
authentication) driven from Python, with the commands the README lists: bring it up, wait
until the SuperLink has every SuperNode online, `flwr run . docker`, stop and start a node,
take it down with its volumes. The docker test runs it end to end.

    python -m ovalp_flwr.ops.compose [--tls] -- --run-config "num-server-rounds=5"

brings the demo up, runs the app on it (Flower state in `.flwr-docker/`), copies the run's
results out of the serverapp container into `results/`, prints the result and takes the demo
down again (`--keep` leaves it up).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ovalp_flwr.ops import certs as certs_module
from ovalp_flwr.ops.console import RunConsole, new_log_path, relative
from ovalp_flwr.ops.images import DOCKER, PROJECT, docker_available
from ovalp_flwr.ops.launch import (
    RESULTS_IN,
    flwr_args_after_dashes,
    flwr_cli,
    failure_status,
    preflight,
    report_result,
    stream_flwr_run,
    write_connection,
)

CONNECTION = "docker"  # compose.yml's comment and the README name it so
ADDRESS = "127.0.0.1:8000"  # the SuperLink's published port
NUM_SUPERNODES = 3
CERTS_ENV = "OVALP_CERTS"  # compose.tls.yml mounts ${OVALP_CERTS:-../.flwr-deploy/certs}
DEFAULT_CERTS = PROJECT / ".flwr-deploy" / "certs"
SERVER_RESULTS = "/app/results"  # the serverapp container's results folder (volume server-results)


def compose_command() -> list[str]:
    """`docker compose` (v2) where the plugin is installed, else `docker-compose` (v1)."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise RuntimeError("neither `docker compose` nor `docker-compose` is installed")


@dataclass
class Demo:
    """One compose project: compose.yml (+ compose.tls.yml), certificates when TLS."""

    tls: bool = False
    certs: Path = DEFAULT_CERTS
    command: list[str] = field(default_factory=compose_command)

    @property
    def files(self) -> list[Path]:
        return [DOCKER / "compose.yml", *([DOCKER / "compose.tls.yml"] if self.tls else [])]

    def compose(self, *args: str, timeout: float = 600, check: bool = True
                ) -> subprocess.CompletedProcess:
        command = [*self.command, *(a for f in self.files for a in ("-f", str(f))), *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, CERTS_ENV: str(self.certs)}, cwd=PROJECT)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n"
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return done

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).stdout.strip()

    def logs(self, *services: str) -> str:
        return self.compose("logs", "--no-color", "--tail=15", *services, check=False).stdout

    def up(self, flwr_home: Path, timeout: float = 180) -> None:
        """SuperLink first; under TLS, each SuperNode's public key registered with it before
        the nodes start (the SuperLink refuses unknown keys). Then everything, and wait until
        the SuperLink lists every SuperNode online."""
        certificate = None
        flwr_home.mkdir(parents=True, exist_ok=True)
        if self.tls:
            certs_module.make_all(self.certs, NUM_SUPERNODES, owner=certs_module.CONTAINER_UID)
            certificate = self.certs / certs_module.CA_CERT
        write_connection(flwr_home, CONNECTION, ADDRESS, certificate)
        self.compose("up", "-d", "superlink")
        self.wait_for_superlink(flwr_home, timeout)
        if self.tls:
            for i in range(NUM_SUPERNODES):
                public = self.certs / f"{certs_module.node_key_name(i)}.pub"
                flwr_cli(flwr_home, "supernode", "register", str(public), CONNECTION,
                         timeout=timeout)
        self.compose("up", "-d")
        self.wait_for_nodes(flwr_home, NUM_SUPERNODES, timeout)

    def wait_for_superlink(self, flwr_home: Path, timeout: float) -> None:
        """Until the SuperLink answers on its published port (TLS included)."""
        deadline = time.monotonic() + timeout
        while online_nodes(flwr_home) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the SuperLink did not answer on {ADDRESS} within "
                                   f"{timeout:.0f} s; its log:\n{self.logs('superlink')}")
            time.sleep(1)

    def wait_for_nodes(self, flwr_home: Path, count: int, timeout: float) -> None:
        deadline, online = time.monotonic() + timeout, 0
        while time.monotonic() < deadline:
            online = len(online_nodes(flwr_home) or [])
            if online >= count:
                return
            time.sleep(2)
        raise TimeoutError(f"{online} of {count} SuperNodes online at the SuperLink after "
                           f"{timeout:.0f} s; their logs:\n"
                           f"{self.logs(*(f'supernode-{i}' for i in range(NUM_SUPERNODES)))}")

    def summary(self, run_name: str) -> dict:
        """The run's summary.json, read from the serverapp container."""
        done = subprocess.run(["docker", "exec", self.container("serverapp"), "cat",
                               f"{SERVER_RESULTS}/{run_name}/summary.json"],
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"no summary for run {run_name!r} in the serverapp: {done.stderr}")
        return json.loads(done.stdout)

    def copy_results(self, run_dir: str, into: Path) -> Path:
        """A run's results folder, out of the serverapp container (before `down -v` drops
        its volume), to `into/<run-name>`."""
        into.mkdir(parents=True, exist_ok=True)
        target = into / Path(run_dir).name
        done = subprocess.run(["docker", "cp", f"{self.container('serverapp')}:{run_dir}",
                               str(target)], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"docker cp of {run_dir} failed: {done.stderr.strip()}")
        return target

    def down(self) -> None:
        """Containers, the network and every volume: nothing left behind."""
        self.compose("down", "-v", "--remove-orphans", "--timeout", "5")


def online_nodes(flwr_home: Path) -> list[str] | None:
    """Node ids the SuperLink lists online; None while it cannot be reached."""
    try:
        listing = json.loads(flwr_cli(flwr_home, "supernode", "list", CONNECTION,
                                      "--format", "json"))
    except (RuntimeError, json.JSONDecodeError, subprocess.TimeoutExpired):
        return None
    return [n["node-id"] for n in listing.get("nodes", []) if n.get("status") == "online"]


def run(flwr_home: Path, flwr_args: Sequence[str], console: RunConsole | None = None
        ) -> tuple[int, str | None]:
    """`flwr run . docker --stream ...`: (exit code, the run's closing line)."""
    console = console or RunConsole(new_log_path(flwr_home, "docker"))
    return stream_flwr_run(PROJECT, CONNECTION, flwr_home, list(flwr_args), console)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ovalp_flwr.ops.compose",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--tls", action="store_true", help="with compose.tls.yml on top")
    parser.add_argument("--certs", type=Path, default=DEFAULT_CERTS,
                        help="--tls: where the throwaway certificates go (default: %(default)s)")
    parser.add_argument("--keep", action="store_true", help="leave the demo up afterwards")
    parser.add_argument("--flwr-home", type=Path, default=PROJECT / ".flwr-docker")
    parser.add_argument("--results", type=Path, default=Path("results"),
                        help="where the run's results folder is copied out of the serverapp "
                             "container (default: %(default)s)")
    parser.set_defaults(num_supernodes=NUM_SUPERNODES)  # compose.yml's; checked by the parser
    args, flwr_args = flwr_args_after_dashes(parser, list(argv) if argv is not None else None)
    if not preflight(PROJECT, flwr_args, NUM_SUPERNODES):
        return 2
    if (why := docker_available()) is not None:
        print(f"cannot run the compose demo: {why}", file=sys.stderr)
        return 2
    flwr_home = args.flwr_home.resolve()
    flwr_home.mkdir(parents=True, exist_ok=True)  # for the console's log before `up`
    console = RunConsole(new_log_path(flwr_home, "docker"), args.verbose)
    demo = Demo(tls=args.tls, certs=args.certs.resolve())
    print(f"compose up ({'TLS + node auth' if args.tls else 'insecure'}); full log: "
          f"{relative(console.log_path)}", flush=True)
    started = time.monotonic()
    try:
        demo.up(flwr_home)
        code, final_line = run(flwr_home, flwr_args, console)
        status = failure_status(final_line, console, flwr_home, CONNECTION)
        if final_line is not None and RESULTS_IN in final_line:
            head, run_dir = final_line.rsplit(RESULTS_IN, 1)
            final_line = f"{head}{RESULTS_IN}{demo.copy_results(run_dir, args.results)}"
    finally:
        if not args.keep:
            demo.down()
    print(f"compose demo: {time.monotonic() - started:.0f} s")
    return report_result(code, final_line, console, status)


if __name__ == "__main__":
    sys.exit(main())
