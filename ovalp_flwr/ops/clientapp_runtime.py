"""A SuperNode's ClientApp runtime that starts each ClientApp by forking a process that has
already imported Flower's ClientApp runtime and this app's modules (torch included).

    python -m ovalp_flwr.ops.clientapp_runtime --insecure --runtime-api-address 127.0.0.1:9094

It is `flower-superexec` (Flower's own loop, `flwr.supercore.superexec.run_superexec`, same
flags) with one change: a ClientApp task is run by `os.fork()` of this process, whose child
runs Flower's `run_clientapp` with the task's token, exactly as the `flwr-clientapp` process
that `flower-superexec` would start (Flower 1.41-1.42: `SubprocessExecutor.launch`). Every
message still gets a fresh process: nothing one message leaves in memory reaches the next,
and the node's state goes through Flower's `Context` as before. What the fork saves is the
interpreter's start and the imports, about 2 s of CPU per message here (`python -X
importtime -c "import client_app"`: torch alone 1 s), on a machine where three nodes share two
cores. The app's `client_app.py` itself is still imported in the child, from the FAB Flower
installed for the run, so the code that runs is the run's.

With `--preload-encoder-path` it also imports the encoder path's libraries (timm, peft, sklearn's
datasets): a ClientApp of a FLoRA run spent 8-11 s of its CPU importing them, per message. A run
of the default path never imports them, so a runtime that serves only such runs leaves them out.

With `--serverapps` it is the SuperLink's runtime instead (compose's `serverapp`): each run's
ServerApp is forked the same way (`run_forked_serverapp`: what `flwr-serverapp` does, its output
mirrored to the run's log), from a process that has imported torch, Flower and the ServerApp's
modules, about 6 CPU-s a run here.

Other task types (and every task when `--cold` is given) go to Flower's `flwr-*` processes
unchanged. Its poll for tasks (Flower: every 1 s, `FLWR_SUPEREXEC_TASK_POLL_INTERVAL`) is
`POLL_INTERVAL` unless that variable is set.

A forked ClientApp also asks for its message's objects more often (`PROMPT_PULL`). Flower's
SuperNode creates the task before it has pulled the message's objects from the SuperLink
(`flwr/supernode/start_client_internal.py`, `state.create_task` before `pull_objects`), so a
ClientApp started at once finds them missing and waits Flower's first back-off, 1 s
(`PULL_INITIAL_BACKOFF`, `flwr/supercore/constant.py:48`), for objects that land ~0.1 s later.
And it installs the run's FAB once (`install_once`): Flower unzips it and checks every file's
hash for every message (`flwr/cli/install.py`, `install_from_fab`), 0.1-0.2 s of CPU, then
keeps the copy already installed; a FAB whose bytes (sha256) were installed and checked before
goes straight to that copy, whose modules were compiled to bytecode once (`compile_once`).
"""

from __future__ import annotations

import argparse
import compileall
import functools
import hashlib
import importlib
import os
import signal
import sys
import traceback
from queue import Queue
from collections.abc import Sequence
from pathlib import Path

from flwr.cli.install import install_from_fab
from flwr.supercore import log
from flwr.supercore.constant import TaskType
from flwr.supercore.exit.exit_handler import registered_exit_handlers
from flwr.supercore.inflatable import inflatable_utils
from flwr.supercore.superexec import run_superexec as superexec
from flwr.supercore.superexec.executor import LaunchResult
from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor
from flwr.supercore.tls import validate_and_resolve_root_certificates
from flwr.supercore.utils import get_flwr_home
from flwr.supernode.runtime import run_clientapp as clientapp_process
from flwr.supercore.logger import mirror_output_to_queue, restore_output

from ovalp_flwr.core.durable import replace_durably

# the module (its package exports the function of the same name over it)
serverapp_process = importlib.import_module("flwr.superlink.runtime.run_serverapp")

TASK_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"  # flwr/supercore/superexec/run_superexec.py
POLL_INTERVAL = 0.1  # s; Flower's default 1 s adds up to 1 s to every message
# what a ClientApp process of this app imports (client_app.py's imports), loaded once here
PRELOAD = ("flwr.supernode.runtime.run_clientapp", "flwr.clientapp", "ovalp_flwr.ova.client",
           "ovalp_flwr.finetune.client", "ovalp_flwr.federation.chaos")
# what the encoder path (finetune != "none") imports on top, inside its functions: timm (through
# its compat guard), peft and sklearn's datasets, 8-11 s of a ClientApp's CPU per message here
ENCODER_PATH = ("ovalp_flwr.features.timm_compat", "peft", "sklearn.datasets")
# what a ServerApp process of this app imports (server_app.py's imports), for `--serverapps`
SERVER_PRELOAD = ("flwr.superlink.runtime.run_serverapp", "flwr.serverapp", "ovalp_flwr.ova.server",
                  "ovalp_flwr.finetune.server")
APP_PACKAGES = ("ovalp_flwr", "client_app", "server_app")  # the FAB's own: imported from it
# a missing object is asked for again after 10 ms, doubling to at most 0.1 s (Flower: 1 s to
# 10 s); no cap on tries, so Flower's bound on the time (PULL_MAX_TIME, 2 h) is the one that holds
PROMPT_PULL = {"initial_backoff": 0.01, "backoff_cap": 0.1, "max_tries_per_object": None}
INSTALLED = "ovalp-installed-fabs"  # under FLWR_HOME: one file per FAB sha256, naming its copy


def preload(modules: Sequence[str] = PRELOAD) -> None:
    """Import what every ClientApp imports, once, before any fork, then forget this app's own
    modules: a child imports them again from the run's FAB (about 0.16 s here), as a fresh
    `flwr-clientapp` would, and only the third-party ones (torch, numpy, Flower) are shared.
    No torch op runs here: a parent with torch's thread pools started would hand them broken
    to its children. With `ENCODER_PATH` in `modules`, timm is imported through its guard
    (`timm_compat.import_timm`), whose stub, if it needs one, stays for the children."""
    for module in modules:
        imported = importlib.import_module(module)
        if module == ENCODER_PATH[0]:
            imported.import_timm()
    for name in [name for name in sys.modules if name.split(".")[0] in APP_PACKAGES]:
        del sys.modules[name]


def install_once(fab_content: bytes, **kwargs) -> Path:
    """Flower's `install_from_fab`, done once per FAB: a FAB with the same sha256 as one this
    function installed (and Flower checked) before is that FAB, so its installed copy is used."""
    marker = get_flwr_home() / INSTALLED / hashlib.sha256(fab_content).hexdigest()
    if marker.is_file() and (installed := Path(marker.read_text())).is_dir():
        return installed
    installed = install_from_fab(fab_content, **kwargs)
    compile_once(installed)
    marker.parent.mkdir(parents=True, exist_ok=True)
    replace_durably(marker, str(installed))
    return installed


def compile_once(installed: Path) -> None:
    """The FAB's Python files compiled to bytecode beside them, once: every ClientApp child
    imports the app's modules from there, and where bytecode is not written on import
    (PYTHONDONTWRITEBYTECODE, a read-only install) each child compiled every module again,
    0.13 s of CPU per message here. Python checks each file's bytecode against its source."""
    compileall.compile_dir(installed, quiet=1, workers=1)


def warm_clientapp_steps() -> None:
    """In the fork's child, before Flower's ClientApp process runs: its message objects asked
    for every 10-100 ms (`PROMPT_PULL`), its FAB installed once (`install_once`)."""
    clientapp_process.pull_and_inflate_object_from_tree = functools.partial(
        inflatable_utils.pull_and_inflate_object_from_tree, **PROMPT_PULL)
    clientapp_process.install_from_fab = install_once


def run_forked_clientapp(spec) -> None:
    """In the fork's child: Flower's ClientApp process for `spec` (an `ExecutionSpec`), then
    exit without returning into the parent's loop."""
    def clientapp() -> None:
        warm_clientapp_steps()
        clientapp_process.run_clientapp(**process_arguments(spec))
    _run_forked("flwr-clientapp", clientapp)


def run_forked_serverapp(spec) -> None:
    """In the fork's child: what `flwr-serverapp` does for `spec` (its output mirrored to the
    queue Flower uploads as the run's log, then Flower's ServerApp process), then exit."""
    def serverapp() -> None:
        serverapp_process.install_from_fab = install_once
        log_queue: Queue = Queue()
        mirror_output_to_queue(log_queue)
        try:
            serverapp_process.run_serverapp(log_queue=log_queue, **process_arguments(spec))
        finally:
            restore_output()
    _run_forked("flwr-serverapp", serverapp)


def process_arguments(spec) -> dict:
    """What `flwr-clientapp` and `flwr-serverapp` hand Flower's app process from their flags."""
    return {"runtime_api_address": spec.runtime_api_address, "token": spec.token,
            "insecure": spec.insecure,
            "certificates": validate_and_resolve_root_certificates(spec.root_certificates_path,
                                                                   spec.insecure),
            "parent_pid": spec.parent_pid,
            "runtime_dependency_install": spec.runtime_dependency_install}


def _run_forked(executable: str, app) -> None:
    """In the fork's child: `app()` as Flower's `executable` process would run it, then
    `os._exit` with its code, never returning into the parent's loop."""
    code = 1
    try:
        # the parent's exit handlers close the parent's connections: not the child's to run
        registered_exit_handlers.clear()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        sys.argv = [executable, "--token", "<forked>"]  # what Flower reads of argv[0]
        log(20, f"Start `{executable}` process")  # the executable's first line (INFO)
        app()
        code = 0
    except SystemExit as exit_:  # flwr_exit ends every ClientApp process this way
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # noqa: BLE001 - the child must never return to the parent's loop
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class ForkingExecutor(SubprocessExecutor):
    """Flower's SubprocessExecutor, with ClientApp tasks forked (`run_forked_clientapp`), or
    with `serverapps` ServerApp tasks (`run_forked_serverapp`), unless `cold`; reaps its
    children between polls (no zombies)."""

    def __init__(self, cold: bool = False, serverapps: bool = False) -> None:
        self.cold, self.children = cold, set()
        self.forked, self.run_forked = ((TaskType.SERVER_APP, run_forked_serverapp) if serverapps
                                        else (TaskType.CLIENT_APP, run_forked_clientapp))

    def launch(self, spec) -> LaunchResult:
        if self.cold or spec.task_type != self.forked:
            return super().launch(spec)
        pid = os.fork()
        if pid == 0:
            self.run_forked(spec)  # never returns
        self.children.add(pid)
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        for pid in list(self.children):
            if os.waitpid(pid, os.WNOHANG)[0]:
                self.children.discard(pid)


def run(runtime_api_address: str, root_certificates: str | None, cold: bool = False,
        encoder_path: bool = False, serverapps: bool = False) -> None:
    """Flower's SuperExec loop with the forking executor (blocks until stopped).
    `encoder_path`: the encoder path's libraries preloaded too (its runs' messages need them).
    `serverapps`: the SuperLink's runtime (compose's `serverapp`), forking ServerApps."""
    os.environ.setdefault(TASK_POLL_ENV, str(POLL_INTERVAL))
    if not cold:
        preload(SERVER_PRELOAD if serverapps else PRELOAD + (ENCODER_PATH if encoder_path else ()))
    executor = ForkingExecutor(cold, serverapps)
    # Flower's loop asks `get_executor` for its executor: hand it ours
    superexec.get_executor = lambda *_args, **_kwargs: executor
    superexec.run_superexec(runtime_api_address=runtime_api_address,
                            insecure=root_certificates is None,
                            root_certificates_path=root_certificates)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ovalp_flwr.ops.clientapp_runtime",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime-api-address", required=True,
                        help="the SuperNode's runtime API (its --port), as flower-superexec's")
    security = parser.add_mutually_exclusive_group(required=True)
    security.add_argument("--insecure", action="store_true", help="no TLS, as flower-superexec's")
    security.add_argument("--root-certificates", default=None,
                          help="CA certificate for TLS, as flower-superexec's")
    parser.add_argument("--cold", action="store_true",
                        help="start every ClientApp as a fresh flwr-clientapp process (Flower's way)")
    parser.add_argument("--preload-encoder-path", action="store_true",
                        help="also import what the encoder path (finetune) needs, before forking")
    parser.add_argument("--serverapps", action="store_true",
                        help="attached to a SuperLink: fork its ServerApps instead of ClientApps")
    args = parser.parse_args(argv)
    run(args.runtime_api_address, args.root_certificates, args.cold, args.preload_encoder_path,
        args.serverapps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
