"""The error that ends a run with one line: the federation cannot run this configuration."""


class FederationError(RuntimeError):
    """The clients cannot run this configuration (a set-up exchange failed, a round the
    configuration cannot defend)."""
