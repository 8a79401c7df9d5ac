"""The errors that end a run with one line, and how the ServerApp ends it with that line."""

from logging import ERROR


class FederationError(RuntimeError):
    """The clients cannot run this configuration (a set-up exchange failed, a round the
    configuration cannot defend)."""


class RunRefused(RuntimeError):
    """Raised by the ServerApp once it has said why the run stops (`refuse`): Flower then ends
    the run failed (`flwr ls`: finished:failed, the line in its status details) instead of
    completed, and a launcher shows the line last and exits non-zero."""


def refuse(err: Exception) -> RunRefused:
    """`err`'s one line said to the run's user (an ERROR the launchers' console keeps for the
    end), and the exception that ends the run failed with it."""
    from ovalp_flwr.ops.console import say  # late: the console imports Flower's logger

    line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    say(ERROR, "%s", line)
    return RunRefused(line)
