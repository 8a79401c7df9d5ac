"""Set-up exchanges with every node, as one request and its replies; what they cost.

A failed exchange is a `FederationError`: the clients cannot run this configuration."""

from __future__ import annotations

import time
from collections.abc import Iterator

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.errors import FederationError
from ovalp_flwr.federation.costs import message_bytes


def wait_for_nodes(grid: Grid, timeout: float = 120.0, settle: float = 1.0) -> list[int]:
    """All connected nodes, once their number has stopped changing for `settle` seconds
    (SuperNodes connect one by one). A grid whose nodes are all there from the start
    (`static_nodes`, the in-process one) is answered at once."""
    if getattr(grid, "static_nodes", False):
        return sorted(grid.get_node_ids())
    deadline = time.monotonic() + timeout
    previous: list[int] = []
    while time.monotonic() < deadline:
        nodes = sorted(grid.get_node_ids())
        if nodes and nodes == previous:
            return nodes
        previous = nodes
        time.sleep(settle)
    raise FederationError(f"no SuperNode connected within {timeout:.0f} s")


def exchange(grid: Grid, message_type: str, contents: dict[int, RecordDict],
             costs: SetupCosts | None = None) -> dict[int, RecordDict]:
    """Send one message to each node and return the replies, in `contents`' order (not their
    arrival order: what is added up from them comes out the same under every runtime); any
    client error stops the run."""
    started = time.perf_counter()
    messages = [Message(content=c, message_type=message_type, dst_node_id=n) for n, c in contents.items()]
    replies = list(grid.send_and_receive(messages))
    if costs is not None:
        costs.add(list(contents.values()), [m.content for m in replies if not m.has_error()],
                  time.perf_counter() - started)
    failed = [m for m in replies if m.has_error()]
    if failed:
        raise FederationError(f"{message_type}: {p.describe_failures(failed)}")
    if len(replies) != len(messages):
        raise FederationError(f"{message_type}: {len(replies)} of {len(messages)} clients replied")
    by_node = {m.metadata.src_node_id: m.content for m in replies}
    return {node: by_node[node] for node in contents if node in by_node}


def exchange_in_chunks(grid: Grid, message_type: str, contents: dict[int, RecordDict],
                       costs: SetupCosts | None = None, chunk: int | None = None
                       ) -> Iterator[dict[int, RecordDict]]:
    """`exchange` with at most `chunk` nodes at a time (None: all at once), yielding each
    chunk's replies: a caller that folds them in (class statistics, megabytes per node) holds
    one chunk's replies, not the federation's, and so does the SuperLink."""
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk={chunk} is not allowed; use 1 or more nodes (or None: all)")
    nodes = list(contents)
    size = chunk or max(len(nodes), 1)
    for start in range(0, len(nodes), size):
        yield exchange(grid, message_type, {n: contents[n] for n in nodes[start:start + size]},
                       costs)


class SetupCosts:
    """Bytes and seconds of the set-up exchanges (describe, set_norm), as the rounds record
    theirs: totals over all clients, so a report can add them to the rounds' bytes."""

    def __init__(self) -> None:
        self.bytes_sent = self.bytes_received = self.seconds = 0.0
        self.messages = 0

    def add(self, sent: list[RecordDict], received: list[RecordDict], seconds: float) -> None:
        self.bytes_sent += sum(message_bytes(c) for c in sent)
        self.bytes_received += sum(message_bytes(c) for c in received)
        self.messages += len(sent)
        self.seconds += seconds

    def to_dict(self) -> dict:
        return {"bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
                "messages": self.messages, "seconds": self.seconds}


class CountingGrid:
    """A grid that remembers what went through `send_and_receive` (SecAgg+'s exchanges)."""

    def __init__(self, grid: Grid) -> None:
        self.grid, self.sent, self.received = grid, [], []
        self.errors: list[tuple[int, str]] = []  # (node, reason) of failed replies

    def __getattr__(self, name: str):
        return getattr(self.grid, name)

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        self.sent += [m.content for m in messages]
        self.received += [m.content for m in replies if not m.has_error()]
        self.errors += [(m.metadata.src_node_id, m.error.reason) for m in replies if m.has_error()]
        return replies
