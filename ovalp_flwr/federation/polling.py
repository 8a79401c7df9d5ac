"""The ServerApp's wait for replies, polled at the pace of a round instead of Flower's.

Flower's deployment grid (`flwr/superlink/grid/http_grid.py`, `HttpGrid.send_and_receive`;
the same in 1.41 and 1.42) sleeps 3 s between two pulls of replies: every exchange with the
nodes (set-up messages and each round) waited up to 3 s after its last reply had arrived; the
simulation's (`InMemoryGrid`) sleeps 0.1 s. `PromptGrid` is a `Grid` (Flower's public interface)
around the run's grid: the same `send_and_receive` (push, then pull until every reply is in or
the timeout passes; the replies in the order they came) through the grid's own public
`push_messages` and `pull_messages`, pulling 10 ms after the push and backing off to one pull
every 0.1 s, and past 5 s of waiting to one every 2% of the wait so far (at most 1 s): a reply
waits at most 2% longer than it took, and a round waiting a minute for a straggler (or a node
that went silent until `round-timeout`) asks the SuperLink ~180 times, not 600 (each pull, a
query of its state: ~6 ms of the SuperLink's CPU on 1.42, about as much of the ServerApp's).
Everything else is the wrapped grid's. Nothing of Flower is patched.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

FIRST_PULL = 0.01  # s after the push: a round of in-memory replies is often in by then
PULL_INTERVAL = 0.1  # s: the most between two pulls (one PullMessages call to the SuperLink)...
LATE_SHARE = 0.02  # ... but for this share of the time waited so far (past 5 s of waiting) ...
LONGEST_PULL_INTERVAL = 1.0  # s: ... up to this


def send_and_receive(grid: Grid, messages: Iterable[Message], *, timeout: float | None = None,
                     first: float = FIRST_PULL, interval: float = PULL_INTERVAL
                     ) -> list[Message]:
    """Flower's `send_and_receive` (same semantics, `timeout` None: wait for ever), pulling
    `first` seconds after the push, the pause doubling up to `interval` (or `LATE_SHARE` of
    the wait so far, up to `LONGEST_PULL_INTERVAL`); no pull at all when there is nothing to
    send."""
    pending = set(grid.push_messages(messages))
    replies: list[Message] = []
    pushed = time.monotonic()
    deadline = None if timeout is None else pushed + timeout
    pause = first
    while pending and (deadline is None or time.monotonic() < deadline):
        pulled = list(grid.pull_messages(pending))
        replies.extend(pulled)
        pending.difference_update(m.metadata.reply_to_message_id for m in pulled)
        if pending:
            time.sleep(pause)
            pause = min(2 * pause, longest_pause(time.monotonic() - pushed, interval))
    return replies


def longest_pause(waited: float, interval: float = PULL_INTERVAL) -> float:
    """The longest pause between two pulls after `waited` seconds: `interval`, or a share of
    the wait past it, up to `LONGEST_PULL_INTERVAL`."""
    return max(interval, min(LATE_SHARE * waited, LONGEST_PULL_INTERVAL))


class PromptGrid(Grid):
    """`grid` with replies pulled promptly (`send_and_receive`); its other methods and
    attributes are the wrapped grid's."""

    def __init__(self, grid: Grid, first: float = FIRST_PULL,
                 interval: float = PULL_INTERVAL) -> None:
        self.grid, self.first, self.interval = grid, first, interval

    def __getattr__(self, name: str) -> Any:  # what the wrapped grid has beyond Grid's API
        return getattr(self.grid, name)

    def set_run(self, run) -> None:
        self.grid.set_run(run)

    @property
    def run(self):
        return self.grid.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> list[Message]:
        return send_and_receive(self.grid, messages, timeout=timeout, first=self.first,
                                interval=self.interval)


def prompt_replies(grid: Grid) -> Grid:
    """The run's grid, pulling replies promptly; a grid whose replies are in when the push
    returns (the in-process one, `static_nodes`) is left as it is."""
    if getattr(grid, "static_nodes", False) or isinstance(grid, PromptGrid):
        return grid
    return PromptGrid(grid)
