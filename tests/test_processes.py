"""ops/processes.py: SIGTERM to a test session or a CLI stops what it started, by PID (the
session's handler is tests/conftest.py's; `sigterm_unwinds` is the CLIs')."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ovalp_flwr.ops import processes
from ovalp_flwr.ops.processes import _exit_on_sigterm, alive, sigterm_unwinds


TESTS = Path(__file__).resolve().parent
PROJECT = TESTS.parent

# a test that starts a process the way the e2e tests do, stops it in `finally`, and waits;
# stopping takes CLEAN_UP seconds, as a deployment's SuperNodes and SuperLink do
STARTS_A_PROCESS = """\
import subprocess, time
from pathlib import Path
from ovalp_flwr.ops.processes import stop_group

CLEAN_UP = {clean_up}

def test_waits(tmp_path):
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        staged = Path(__file__).parent / "child.pid.tmp"
        staged.write_text(str(child.pid))
        staged.rename(staged.with_suffix(""))  # the reader never sees a half-written file
        time.sleep(120)
    finally:
        time.sleep(CLEAN_UP)
        stop_group(child, grace=5)
"""


def _term_pytest_mid_test(tmp_path: Path, *plugin: str, clean_up: float = 0.0
                          ) -> tuple[int, int]:
    """Run the test above, SIGTERM pytest once the child runs: (pytest's exit code, child pid).
    The inner session is killed by PID if it does not end by itself."""
    (tmp_path / "test_waits.py").write_text(STARTS_A_PROCESS.format(clean_up=clean_up))
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_XDIST")}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(PROJECT)])
    session = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                *plugin, "test_waits.py"], cwd=tmp_path, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pid_file = tmp_path / "child.pid"
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pid_file.exists(), "the inner test never started its process"
        child = int(pid_file.read_text())
        session.send_signal(signal.SIGTERM)
        return session.wait(timeout=90), child
    finally:
        if session.poll() is None:
            workers = processes.descendants(session.pid)
            session.kill()
            session.wait()
            processes.signal_all(workers, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize("xdist", [(), ("-n", "1")], ids=["one-process", "xdist"])
def test_sigterm_to_the_test_session_stops_what_the_running_test_started(tmp_path, xdist):
    """Under xdist the test's clean-up takes 8 s: longer than xdist gives a worker on its own
    (interrupted after 5 s, killed after 10), so only the controller passing the signal on at
    once and waiting stops the child (conftest.py)."""
    code, child = _term_pytest_mid_test(tmp_path, "-p", "conftest", *xdist,
                                        clean_up=8.0 if xdist else 0.0)
    try:
        assert code == 2  # pytest: interrupted
        assert not alive(child)
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_without_the_session_handler_sigterm_leaves_the_process_behind(tmp_path):
    """The control: what the conftest handler prevents does happen without it."""
    code, child = _term_pytest_mid_test(tmp_path)
    try:
        assert code == -signal.SIGTERM
        assert alive(child)
    finally:
        os.kill(child, signal.SIGKILL)


def test_sigterm_unwinds_while_its_block_runs_and_leaves_other_handlers_alone():
    session_handler = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with sigterm_unwinds():
            assert signal.getsignal(signal.SIGTERM) is _exit_on_sigterm
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        signal.signal(signal.SIGTERM, session_handler)
        with sigterm_unwinds():  # someone else's handler (the test session's) stays
            assert signal.getsignal(signal.SIGTERM) is session_handler
        assert signal.getsignal(signal.SIGTERM) is session_handler
    finally:
        signal.signal(signal.SIGTERM, session_handler)
