"""The test session: SIGTERM (a CI timeout, `kill`) stops it the way Ctrl-C does; the digits
feature cache most tests run on.

Python's default for SIGTERM is to die on the spot, leaving every SuperLink, SuperNode and
Ray process that the running test started. As a KeyboardInterrupt it unwinds that test's
`finally` blocks and fixtures, which stop them by PID, and pytest ends the session.
"""

import signal

import pytest


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """Digits through the `pixels` encoder: real data, 64-d, built in milliseconds."""
    from ovalp_flwr.cache import load_or_build

    path = tmp_path_factory.mktemp("cache")
    load_or_build("digits", "pixels", path, progress=False)
    return path


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config) -> None:
    signal.signal(signal.SIGTERM, _interrupt)
