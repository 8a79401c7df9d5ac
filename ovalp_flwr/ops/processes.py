"""The processes a launcher starts: their trees (Linux /proc), stopping them by PID with all
they started, and SIGTERM unwinding like Ctrl-C so that a killed launcher stops them too.

A process is named by its PID and its start time (`start_time`), so a PID taken over by a new
process after the first one ended is not mistaken for it. No Flower here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path


def process_tree() -> dict[int, list[int]]:
    """Each live process's children (Linux /proc: the parent pid of every process)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return children


def children(pid: int) -> list[int]:
    """The live processes `pid` started itself."""
    return process_tree().get(pid, [])


def descendants(pid: int) -> list[int]:
    """All live descendants of `pid` (Linux /proc), detached sessions included.

    The SuperLink starts `flower-superexec` in a new session, which starts the simulation
    and Ray; they are outside our process group but still in our process tree.
    """
    tree = process_tree()
    found, frontier = [], [pid]
    while frontier:
        kids = tree.get(frontier.pop(), [])
        found += kids
        frontier += kids
    return found


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), None if it is gone or a zombie: with its PID,
    it names one process, not whichever took the PID over later."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to reap it counts as gone)."""
    return start_time(pid) is not None


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_group(process: subprocess.Popen, grace: float = 15.0) -> None:
    """Stop `process`, its process group and every process it started, by PID.

    SIGTERM first (Flower shuts its children down), SIGKILL for whatever is left.
    """
    stop_groups([process], grace)


def stop_groups(processes: Sequence[subprocess.Popen], grace: float = 15.0) -> None:
    """`stop_group` for several processes at once: all are signalled together and share one
    grace period, instead of one each (a deployment's SuperLink, SuperNodes and runtimes)."""
    trees = [pid for process in processes for pid in descendants(process.pid)]
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
    signal_all(trees, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(alive(pid) for pid in trees) and time.monotonic() < deadline:
        time.sleep(0.2)
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    signal_all([pid for pid in trees if alive(pid)], signal.SIGKILL)
    for process in processes:
        process.wait()


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    sys.exit(128 + signum)


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """While the block runs, SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so every
    process started in it is stopped on the way out. A handler someone else installed (a
    test session's) is left alone; the default comes back afterwards."""
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
