"""Free loopback ports for the processes the launchers start (SuperLink, SuperNodes, Ray)."""

from __future__ import annotations

import contextlib
import socket


def free_ports(count: int) -> list[int]:
    """`count` free loopback ports, all bound at once so that none repeats (picked one at a
    time, a closed port can come back: two of Ray's components on one port make it exit)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


def free_port() -> int:
    return free_ports(1)[0]
