"""The test session: SIGTERM (a CI timeout, `kill`) stops it the way Ctrl-C does; the e2e units
start first, longest first, and the in-process tests run niced around them; one thread per
worker; the test deployments' task polls at 0.5 s; Flower's warnings in every test; the digits
feature cache most tests run on; the shared federations of the e2e scenarios (tests/e2e.py).

Python's default for SIGTERM is to die on the spot, leaving every SuperLink, SuperNode and
Ray process that the running test started. As a KeyboardInterrupt it unwinds that test's
`finally` blocks and fixtures, which stop them by PID, and pytest ends the session.

`make test` runs the suite on pytest-xdist workers (Makefile, `--dist loadgroup`) with the
scheduler of tests/scheduling.py. The e2e tests start real Flower processes and spend much of
their time waiting on Flower's polls (3 s each way), so they go first: started early, their
waits overlap the in-process tests instead of trailing them. Each one's marker says about how
long it takes in a full run (`@pytest.mark.e2e(seconds=...)`); the scenarios that share a
federation are one unit (their `xdist_group`), every other e2e test a unit of its own. Each
worker, and every process its tests start, computes on one thread: workers and Flower processes
already fill both cores, and OpenMP threads that wait for a core of their own spin on it.
"""

import contextlib
import logging
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # before anything imports torch
    os.environ["OMP_NUM_THREADS"] = "1"
# The deployments the e2e tests start poll for their apps' tasks every 1 s (Flower's default),
# not the product's 0.1 s (ops/clientapp_runtime.py): an idle deployment of 2 SuperNodes used
# 9.4 CPU-s a minute at 0.1 s, 4.8 at 0.5 s and 3.3 at 1 s, CPU the suite's other tests need on
# 2 cores; a message waits at most 0.9 s longer, and no test asserts that latency.
os.environ.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "1.0")

from e2e import ray_federation, secure_deployment  # noqa: E402,F401 - the shared federations
from scheduling import UNITS_ENV, LongestFirst, write_units  # noqa: E402


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """Digits through the `pixels` encoder: real data, 64-d, built in milliseconds."""
    from ovalp_flwr.features.cache import load_or_build

    path = tmp_path_factory.mktemp("cache")
    load_or_build("digits", "pixels", path, progress=False)
    return path


@pytest.fixture(autouse=True)
def flower_warnings():
    """Flower's logger at WARNING in every test, whatever a test before it in this process set
    (a sweep's `quiet_flower` sets ERROR): tests read Flower's warnings through `caplog`."""
    from flwr.supercore.logger import FLOWER_LOGGER  # importing Flower sets its level first

    level = FLOWER_LOGGER.level
    FLOWER_LOGGER.setLevel(logging.WARNING)
    yield
    FLOWER_LOGGER.setLevel(level)


# How long the test session waits, on SIGTERM, for its workers' tests to stop what they started
WORKERS_STOP_SECONDS = 45.0
_interrupted: list[int] = []
_xdist_workers: list[bool] = []  # set in pytest_configure: this session hands tests to workers


def _interrupt(signum: int, _frame: object) -> None:
    """SIGTERM as Ctrl-C, once: a second one (a whole process group signalled, then the
    controller passing it on) must not break into the clean-up the first one started. Under
    pytest-xdist the controller first passes it on to its workers (`_stop_workers`)."""
    if _interrupted:
        return
    _interrupted.append(signum)
    if _xdist_workers:
        _stop_workers(signum)
    raise KeyboardInterrupt(f"signal {signum}")


def _stop_workers(signum: int, timeout: float = WORKERS_STOP_SECONDS) -> None:
    """Pass `signum` on to the xdist workers at once (each unwinds its test, whose `finally`
    blocks and fixtures stop what it started), wait until every process their tests started
    is gone (at most `timeout`), then kill what is left by PID. Left to itself xdist would
    interrupt a worker after 5 s and kill it after 10: too soon for a deployment to stop."""
    from ovalp_flwr.ops.processes import children, descendants, start_time

    workers = children(os.getpid())
    started = {pid: start_time(pid) for worker in workers for pid in descendants(worker)}
    for worker in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signum)

    def left() -> list[int]:
        now = {pid: start_time(pid) for worker in workers for pid in descendants(worker)}
        return [pid for pid, began in {**started, **now}.items()
                if began is not None and start_time(pid) == began]

    deadline = time.monotonic() + timeout
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left():  # the same process (its start time), not a new one with its PID
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def pytest_configure(config) -> None:
    if config.getoption("numprocesses", None) and not os.environ.get("PYTEST_XDIST_WORKER"):
        _xdist_workers.append(True)
        # where the workers (started later, with this environment) write the e2e units
        os.environ[UNITS_ENV] = str(Path(tempfile.mkdtemp(prefix="pytest-units-")) / "units.json")
    signal.signal(signal.SIGTERM, _interrupt)


def pytest_unconfigure(config) -> None:
    if _xdist_workers and (units := os.environ.pop(UNITS_ENV, None)):
        shutil.rmtree(Path(units).parent, ignore_errors=True)


def e2e_seconds(item) -> float | None:
    """An e2e test's expected seconds (its marker's `seconds`, else 60); None if not e2e."""
    marker = item.get_closest_marker("e2e")
    return None if marker is None else float(marker.kwargs.get("seconds", 60))


def unit_of(item) -> str | None:
    """The unit an e2e test is handed out in: its `xdist_group`'s name (a shared federation's),
    else its own id; None for an in-process test (a unit of its own, not a long one)."""
    if e2e_seconds(item) is None:
        return None
    marker = item.get_closest_marker("xdist_group")
    if marker is None:
        return item.nodeid
    return str(marker.args[0] if marker.args else marker.kwargs.get("name", "default"))


ON_REQUEST = ("docker", "browser")  # markers whose tests run only under `-m <marker>`


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """The `docker` and `browser` tests only when asked for (`pytest -m docker`, `-m browser`:
    `.ci/run` runs them after the suite, with a docker engine started and Chromium installed).
    e2e units first, longest first (their tests in file order); then the `slow` in-process
    tests, then the rest, each in its file's order: so that no worker ends the session alone on
    a long test."""
    for marker in ON_REQUEST:
        if marker not in (config.getoption("markexpr", "") or ""):
            asked = [item for item in items if item.get_closest_marker(marker)]
            if asked:
                config.hook.pytest_deselected(items=asked)
                items[:] = [item for item in items if not item.get_closest_marker(marker)]
    units: dict[str, list] = {}
    for item in items:
        if (unit := unit_of(item)) is not None:
            units.setdefault(unit, []).append(item)
    e2e = sorted(units.values(), key=lambda unit: -sum(e2e_seconds(item) for item in unit))
    rest = [item for item in items if unit_of(item) is None]
    rest.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable
    items[:] = [item for unit in e2e for item in unit] + rest


@pytest.hookimpl(tryfirst=True)  # before xdist tells the controller that collection finished
def pytest_collection_finish(session) -> None:
    """An xdist worker: each e2e test's unit, for the controller's scheduler."""
    if (path := os.environ.get(UNITS_ENV)) and os.environ.get("PYTEST_XDIST_WORKER"):
        write_units({item.nodeid: unit for item in session.items
                     if (unit := unit_of(item)) is not None}, Path(path))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, absent without it
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup`: longest units first, one at a time (tests/scheduling.py)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return LongestFirst(config, log, Path(os.environ[UNITS_ENV]))


# A worker's in-process tests yield the CPU to the e2e tests' processes (which other workers
# started at nice 0): the e2e scenarios are the suite's longest path and spend most of it
# waiting on Flower, so the in-process tests fill the cores around them instead of slowing them.
IN_PROCESS_NICENESS = 10
_niced: list[bool] = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    """Once per xdist worker, at its first in-process test (niceness cannot be lowered again
    without privileges: its e2e units come first, tests/scheduling.py)."""
    if os.environ.get("PYTEST_XDIST_WORKER") and not _niced and unit_of(item) is None:
        _niced.append(True)
        os.nice(IN_PROCESS_NICENESS)
