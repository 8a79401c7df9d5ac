"""The test session: SIGTERM (a CI timeout, `kill`) stops it the way Ctrl-C does.

Python's default for SIGTERM is to die on the spot, leaving every SuperLink, SuperNode and
Ray process that the running test started. As a KeyboardInterrupt it unwinds that test's
`finally` blocks and fixtures, which stop them by PID, and pytest ends the session.
"""

import signal


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config) -> None:
    signal.signal(signal.SIGTERM, _interrupt)
