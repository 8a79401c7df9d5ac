"""The cached-feature path (OvA-LP): the ServerApp's run and the client's handlers."""
