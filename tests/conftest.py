"""The test session: SIGTERM (a CI timeout, `kill`) stops it the way Ctrl-C does; the e2e tests
start first; one thread per worker; Flower's warnings in every test; the digits feature cache
most tests run on.

Python's default for SIGTERM is to die on the spot, leaving every SuperLink, SuperNode and
Ray process that the running test started. As a KeyboardInterrupt it unwinds that test's
`finally` blocks and fixtures, which stop them by PID, and pytest ends the session.

`make test` runs the suite on pytest-xdist workers (Makefile), handing each one test at a time.
The e2e tests start real Flower processes and spend much of their minutes waiting on Flower's
polls (3 s each way), so they go first, each file's in the order it lists them (longest first):
started early, their waits overlap the in-process tests instead of trailing them. Each worker,
and every process its tests start, computes on one thread: workers and Flower processes
already fill both cores, and OpenMP threads that wait for a core of their own spin on it.
"""

import logging
import os
import signal

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # before anything imports torch
    os.environ["OMP_NUM_THREADS"] = "1"

# e2e files in the order their tests start (README, "Tests")
E2E_FILES = ("test_deploy.py", "test_launch.py")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """Digits through the `pixels` encoder: real data, 64-d, built in milliseconds."""
    from ovalp_flwr.cache import load_or_build

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


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config) -> None:
    signal.signal(signal.SIGTERM, _interrupt)


def pytest_collection_modifyitems(config, items) -> None:
    """e2e tests first, then the `slow` in-process ones, then the rest (a stable sort: each
    keeps its file's order), so that no worker ends the session alone on a long test."""
    def start_rank(item) -> int:
        if item.get_closest_marker("e2e") is not None:
            name = item.path.name
            return E2E_FILES.index(name) if name in E2E_FILES else 0
        return len(E2E_FILES) + (item.get_closest_marker("slow") is None)

    items.sort(key=start_rank)
