"""The ServerApp's wait for replies, polled at the pace of a round instead of Flower's.

Flower 1.41's deployment grid (`flwr/superlink/grid/http_grid.py`, `HttpGrid.send_and_receive`,
line 412) sleeps 3 s between two pulls of replies: every exchange with the nodes (set-up
messages and each round) waited up to 3 s after its last reply had arrived. `fast_replies`
gives a grid the same `send_and_receive` (push, then pull until every reply is in or the
timeout passes; the replies in the order they came) with `PULL_INTERVAL` between pulls. The
simulation's grid (`InMemoryGrid`, 0.1 s) pulls from memory: it gets `MEMORY_PULL_INTERVAL`.
Any other grid (the in-process one) is left as it is.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from functools import partial

from flwr.app import Message
from flwr.serverapp import Grid
from flwr.superlink.grid.http_grid import HttpGrid
from flwr.superlink.grid.inmemory_grid import InMemoryGrid

PULL_INTERVAL = 0.1  # s: one PullMessages call to the SuperLink per interval while waiting
MEMORY_PULL_INTERVAL = 0.01  # s: the simulation's in-memory state, no network


def send_and_receive(grid: Grid, messages: Iterable[Message], *, timeout: float | None = None,
                     interval: float = PULL_INTERVAL) -> list[Message]:
    """Flower's `send_and_receive` (same semantics, `timeout` None: wait for ever) with
    `interval` seconds between pulls; no pull at all when there is nothing to send."""
    pending = set(grid.push_messages(messages))
    replies: list[Message] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending and (deadline is None or time.monotonic() < deadline):
        pulled = list(grid.pull_messages(pending))
        replies.extend(pulled)
        pending.difference_update(m.metadata.reply_to_message_id for m in pulled)
        if pending:
            time.sleep(interval)
    return replies


def fast_replies(grid: Grid, interval: float = PULL_INTERVAL) -> Grid:
    """`grid`, waiting for replies `interval` apart (see the module); the same object."""
    if isinstance(grid, InMemoryGrid):
        grid.pull_interval = min(grid.pull_interval, MEMORY_PULL_INTERVAL)
    elif isinstance(grid, HttpGrid):
        grid.send_and_receive = partial(send_and_receive, grid, interval=interval)  # type: ignore[method-assign]
    return grid
