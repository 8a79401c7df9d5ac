"""`flwr run .` in local simulation, with a SuperLink this process starts and stops.

Flower's default `local` connection starts a detached SuperLink that outlives the run
and lets the number of virtual SuperNodes default to 2. This launcher instead starts
`flower-superlink --simulation` in its own process group on free loopback ports, points
a project-local Flower config (`.flwr/config.toml`, so `~/.flwr` is untouched) at it,
runs `flwr run <app> ovalp-local --stream` with the requested number of SuperNodes, and
stops the whole process group by PID on exit, error or Ctrl-C.

    python -m ovalp_flwr.ops.launch --num-supernodes 100 -- --run-config "head='softmax'"
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ovalp_flwr.ops.console import RunConsole, new_log_path, relative
from ovalp_flwr.ops.ports import free_port
from ovalp_flwr.tracking.tracker import git_commit
from ovalp_flwr.ops.processes import sigterm_unwinds, stop_group
from ovalp_flwr.federation.results import read_summary
from ovalp_flwr.federation.single_run import iid_twin, summary_lines
from ovalp_flwr.ops.timings import LineClock, write_clock

PROJECT = Path(__file__).resolve().parents[2]
CONNECTION = "ovalp-local"
FINAL_LINE = "final accuracy "  # the ServerApp's closing log line starts like this
RESULTS_IN = "; results in "  # ... and ends with its results folder


def flower_env(flwr_home: Path, ray_address: str | None = None) -> dict[str, str]:
    """Environment for Flower's processes: local state, no telemetry, no runtime pip.

    Our interpreter's bin/ goes first on PATH: the SuperLink starts `flower-superexec` and the
    simulation runtime by name. `ray_address`: the Ray cluster it joins (`ops/ray_cluster.py`).
    The code's commit goes along: the installed app has no repository to ask (`tracking`).
    """
    return {
        **os.environ,
        "OVALP_GIT_COMMIT": git_commit(),
        **({"RAY_ADDRESS": ray_address} if ray_address else {}),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_HOME": str(flwr_home),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "PYTHONUNBUFFERED": "1",
    }


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def _wait_for_port(port: int, process: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"flower-superlink exited with {process.returncode}; see {log}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.2)
    raise RuntimeError(f"flower-superlink did not listen on port {port} in {timeout:.0f} s; see {log}")


@contextlib.contextmanager
def simulation_superlink(flwr_home: Path, cwd: Path = PROJECT, ray_address: str | None = None
                         ) -> Iterator[tuple[subprocess.Popen, str]]:
    """A simulation SuperLink in its own process group; yields (process, address)."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = flwr_home / "superlink.log"
    command = [_bin("flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
               "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "ab") as log_file:
        env = flower_env(flwr_home, ray_address)
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=log_file,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_port(port, process, log)
        yield process, f"127.0.0.1:{port}"
    finally:
        stop_group(process)


def flwr_cli(flwr_home: Path, *args: str, timeout: float = 120) -> str:
    """`flwr <args>` against this Flower home; its output (raises with it on failure)."""
    done = subprocess.run([_bin("flwr"), *args], env=flower_env(flwr_home), capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"flwr {' '.join(args)} failed ({done.returncode}):\n"
                           f"{done.stdout}{done.stderr}")
    return done.stdout


def write_connection(flwr_home: Path, name: str, address: str,
                     root_certificates: Path | None = None) -> None:
    """Make `name` the default connection of this Flower home, pointing at our SuperLink
    (TLS trusting `root_certificates` when given, else insecure)."""
    security = (f'root-certificates = "{root_certificates}"\n' if root_certificates is not None
                else "insecure = true\n")
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\naddress = "{address}"\n{security}'
    )


def federation_config(num_supernodes: int, num_gpus: float) -> str:
    return (f"num-supernodes={num_supernodes} client-resources-num-cpus=1 "
            f"client-resources-num-gpus={num_gpus}")


def simulate(app: Path, num_supernodes: int, flwr_args: list[str], flwr_home: Path, num_gpus:
             float | None = None, verbose: bool = False, ray_address: str | None = None) -> int:
    """Run the app on `num_supernodes` virtual SuperNodes (on the Ray cluster at `ray_address`),
    on a simulation SuperLink of its own, stopped with all it started once the run ends.

    Returns `flwr run`'s exit code, or 1 if the run printed no result line (a failed
    ServerApp still lets `flwr run --stream` exit 0).
    """
    console = _simulation_console(flwr_home, num_supernodes, verbose)
    with simulation_superlink(flwr_home, cwd=app, ray_address=ray_address) as (_, address):
        write_connection(flwr_home, CONNECTION, address)
        code, final_line = stream_flwr_run(
            app, CONNECTION, flwr_home, _simulation_args(num_supernodes, num_gpus, flwr_args),
            console)
        status = failure_status(final_line, console, flwr_home, CONNECTION)
    return report_result(code, final_line, console, status)


def simulate_on(app: Path, num_supernodes: int, flwr_args: list[str], flwr_home: Path,
                num_gpus: float | None = None, verbose: bool = False) -> int:
    """`simulate` on the simulation SuperLink already running for `flwr_home` (its connection
    written): runs one after another share it, and its Ray, instead of starting both per run."""
    console = _simulation_console(flwr_home, num_supernodes, verbose)
    code, final_line = stream_flwr_run(
        app, CONNECTION, flwr_home, _simulation_args(num_supernodes, num_gpus, flwr_args), console)
    return report_result(code, final_line, console,
                         failure_status(final_line, console, flwr_home, CONNECTION))


def _simulation_console(flwr_home: Path, num_supernodes: int, verbose: bool) -> RunConsole:
    console = LineClock().attach(RunConsole(new_log_path(flwr_home), verbose))  # ops/timings.py
    console.also_search(flwr_home / "superlink.log")
    print(f"simulating {num_supernodes} SuperNodes; full log: {relative(console.log_path)}",
          flush=True)
    return console


def _simulation_args(num_supernodes: int, num_gpus: float | None, flwr_args: list[str]
                     ) -> list[str]:
    if num_gpus is None:
        num_gpus = 0.25 if _has_cuda() else 0.0
    return ["--federation-config", federation_config(num_supernodes, num_gpus), *flwr_args]


def app_files(app: Path) -> dict[str, Path]:
    """What `flwr run <app>` packs from `app`, before its FAB rules: Flower's own publish
    filter (.gitignore, file types) over a walk that skips the folders that filter drops
    whole (`.venv/`, `.flwr/`, `__pycache__/`) instead of listing them file by file."""
    # late: flwr.cli (~0.6 s); only packing an app needs it (not the report, via sweep)
    from flwr.cli.utils import build_pathspec, filter_paths_for_publish
    from flwr.supercore.constant import APP_PUBLISH_EXCLUDE_PATTERNS  # late: likewise

    dropped = build_pathspec(APP_PUBLISH_EXCLUDE_PATTERNS)
    files: dict[str, Path] = {}
    for folder, subfolders, names in os.walk(app):
        relative_folder = Path(folder).relative_to(app)
        subfolders[:] = [name for name in subfolders
                         if not dropped.match_file((relative_folder / name / "-").as_posix())]
        for name in names:
            path = Path(folder) / name
            if not path.is_symlink():  # Flower skips links too
                files[(relative_folder / name).as_posix()] = path
    return filter_paths_for_publish(files)


@contextlib.contextmanager
def packable_app(app: Path, under: Path) -> Iterator[Path]:
    """A folder holding only the files `flwr run` would pack from `app`: it builds the same FAB
    (same hash) from it. `flwr run` itself lists every file under the app folder first
    (flwr/cli/utils.py, `collect_files`): with make's .venv inside the project, ~57,000 files
    and 4-8 s of CPU per run. Files are hard links where `under` shares `app`'s file system;
    pyproject.toml and .gitignore are copies (Flower may rewrite a legacy pyproject)."""
    under.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="app-", dir=under))
    try:
        for relative_path, source in app_files(app).items():
            target = folder / relative_path
            target.parent.mkdir(parents=True, exist_ok=True)
            if relative_path in ("pyproject.toml", ".gitignore"):
                shutil.copyfile(source, target)
                continue
            try:
                os.link(source, target)
            except OSError:  # another file system
                shutil.copyfile(source, target)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def stream_flwr_run(app: Path, connection: str, flwr_home: Path, flwr_args: list[str],
                    console: RunConsole) -> tuple[int, str | None]:
    """`flwr run <app> <connection> --stream ...` through `console`; (exit code, closing line).
    Flower packs the app from `packable_app`'s folder; the run's working directory is `app`."""
    with packable_app(app, flwr_home / "staged-apps") as packable:
        command = [_bin("flwr"), "run", str(packable), connection, "--stream", *flwr_args]
        run = subprocess.Popen(command, cwd=app, env=flower_env(flwr_home), start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return _follow(run, console)


def _follow(run: subprocess.Popen, console: RunConsole) -> tuple[int, str | None]:
    final_line = None
    try:
        assert run.stdout is not None
        for line in run.stdout:  # stream the run's log, remember its closing line
            if FINAL_LINE in line:
                final_line = line.split(FINAL_LINE, 1)[1].strip()
                console.log.write(line)  # shown once, last, by report_result
                continue
            console.feed(line)
        code = run.wait()
    finally:
        stop_group(run)
    return code, final_line


def report_result(code: int, final_line: str | None, console: RunConsole,
                  status: str | None = None) -> int:
    """The run's summary table and result line, last; a run without one failed (`flwr run
    --stream` exits 0 even when the ServerApp fails). A failed run's last line is its own
    reason where it said one (`console.refusal`, exit 2), else what Flower recorded of it
    (`status`, from `failure_status`), with the log's path (exit 1)."""
    console.close(failed=final_line is None)
    if final_line is None:
        if console.refusal is not None:
            print(f"error: {console.refusal}")
            return 2
        said = f"Flower: {status}" if status else f"flwr run exit {code}"
        print(f"error: the run failed ({said}); full log: {relative(console.log_path)}")
        return code or 1
    run_dir = Path(final_line.rsplit(RESULTS_IN, 1)[1]) if RESULTS_IN in final_line else None
    if run_dir is not None and (run_dir / "summary.json").is_file():
        write_clock(console, run_dir)  # launcher.json: seconds from the command to each round
        summary = read_summary(run_dir)
        print(summary_lines(summary, iid_twin(run_dir.parent, summary)))
        final_line = f"{final_line.rsplit(RESULTS_IN, 1)[0]}{RESULTS_IN}{relative(run_dir)}"
    print(f"{FINAL_LINE}{final_line}")
    return code


def failure_status(final_line: str | None, console: RunConsole, flwr_home: Path,
                   connection: str) -> str | None:
    """For a run that failed without saying why: Flower's record of it (`run_status`), asked
    while its SuperLink still runs; None for any other run."""
    if final_line is not None or console.refusal is not None:
        return None
    return run_status(flwr_home, connection, console.run_id)


def run_status(flwr_home: Path, connection: str, run_id: int | None) -> str | None:
    """Flower's record of a run (`flwr ls --run-id`): its status and, where it has them, the
    details ("finished:failed: Simulation failed with exception: ..."); None if not known."""
    if run_id is None:
        return None
    try:
        listed = json.loads(flwr_cli(flwr_home, "ls", connection, "--run-id", str(run_id),
                                     "--format", "json", timeout=60))
        run = listed["runs"][0]
    except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError, IndexError):
        return None
    details = str(run.get("status-details", "")).strip()
    return str(run["status"]) + (f": {details}" if details and details != "N/A" else "")


def flwr_args_after_dashes(parser: argparse.ArgumentParser, argv: list[str] | None
                           ) -> tuple[argparse.Namespace, list[str]]:
    """Parse our options; everything after `--` goes to `flwr run` untouched."""
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show Flower's (and in simulation Ray's) whole log, not only the "
                             "run's own lines")
    parser.add_argument("flwr_args", nargs=argparse.REMAINDER,
                        help="passed to `flwr run` after `--` (e.g. --run-config ...)")
    args = parser.parse_args(argv)
    flwr_args = args.flwr_args[1:] if args.flwr_args[:1] == ["--"] else args.flwr_args
    if args.num_supernodes < 1:
        parser.error(f"--num-supernodes={args.num_supernodes} is not allowed; use 1 or more")
    return args, flwr_args


def _has_cuda() -> bool:
    import torch  # late: ~1 s; only a run without --num-gpus asks

    return torch.cuda.is_available()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ovalp_flwr.ops.launch",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-supernodes", type=int, default=100,
                        help="virtual SuperNodes, one client each (default: %(default)s)")
    parser.add_argument("--num-gpus", type=float, default=None,
                        help="GPU share per virtual client (default 0.25 with CUDA, else 0)")
    parser.add_argument("--app", type=Path, default=PROJECT,
                        help="the Flower app's folder (default: this project)")
    parser.add_argument("--flwr-home", type=Path, default=PROJECT / ".flwr",
                        help="Flower's state and the runs' logs (default: %(default)s)")
    parser.add_argument("--ray-address", default=None,
                        help="an existing Ray cluster's head (host:port, or 'auto': the last "
                             "`ray start` here) to run on, instead of a Ray of its own")
    args, flwr_args = flwr_args_after_dashes(parser, argv)
    if args.ray_address not in (None, "auto") and not re.fullmatch(r"[^:]+:\d{1,5}", args.ray_address):
        parser.error(f"--ray-address={args.ray_address!r} is not allowed; use the Ray head's "
                     "host:port (its GCS port, e.g. 10.0.0.5:6379) or 'auto'")
    if not preflight(args.app.resolve(), flwr_args, args.num_supernodes):
        return 2
    with sigterm_unwinds():
        return simulate(args.app.resolve(), args.num_supernodes, flwr_args,
                        args.flwr_home.resolve(), args.num_gpus, args.verbose, args.ray_address)


def preflight(app: Path, flwr_args: list[str], num_supernodes: int | None = None) -> bool:
    """This app's run config and data checked before any Flower process starts (another
    app's is Flower's to check), and with `num_supernodes` what their number decides
    (`preflight.check_clients`); False (and one line on stderr) when the run cannot work."""
    from ovalp_flwr.ops.preflight import PreflightError, check_run, is_this_app  # late: ~0.4 s

    try:
        if is_this_app(app):
            check_run(app, flwr_args, num_supernodes)
    except PreflightError as err:
        print(f"error: {err}", file=sys.stderr)
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
