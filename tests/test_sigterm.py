"""SIGTERM to a test session or a CLI stops what it started, by PID."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ovalp_flwr.launch import _alive, _exit_on_sigterm, sigterm_unwinds

TESTS = Path(__file__).resolve().parent
PROJECT = TESTS.parent

# a test that starts a process the way the e2e tests do, stops it in `finally`, and waits
STARTS_A_PROCESS = """\
import subprocess, time
from pathlib import Path
from ovalp_flwr.launch import stop_group

def test_waits(tmp_path):
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        staged = Path(__file__).parent / "child.pid.tmp"
        staged.write_text(str(child.pid))
        staged.rename(staged.with_suffix(""))  # the reader never sees a half-written file
        time.sleep(120)
    finally:
        stop_group(child, grace=5)
"""


def _term_pytest_mid_test(tmp_path: Path, *plugin: str) -> tuple[int, int]:
    """Run the test above, SIGTERM pytest once the child runs: (pytest's exit code, child pid).
    The inner session is killed by PID if it does not end by itself."""
    (tmp_path / "test_waits.py").write_text(STARTS_A_PROCESS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(PROJECT)])}
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
        return session.wait(timeout=60), child
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()


def test_sigterm_to_the_test_session_stops_what_the_running_test_started(tmp_path):
    code, child = _term_pytest_mid_test(tmp_path, "-p", "conftest")
    try:
        assert code == 2  # pytest: interrupted
        assert not _alive(child)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_without_the_session_handler_sigterm_leaves_the_process_behind(tmp_path):
    """The control: what the conftest handler prevents does happen without it."""
    code, child = _term_pytest_mid_test(tmp_path)
    try:
        assert code == -signal.SIGTERM
        assert _alive(child)
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
