"""federation/polling.py: Flower's send_and_receive semantics at a short pull interval."""

from __future__ import annotations

import time
from types import SimpleNamespace

from ovalp_flwr.federation.polling import fast_replies, send_and_receive


class SlowGrid:
    """Replies come in one per pull, after `delay` seconds; never for ids in `lost`."""

    def __init__(self, delay: float = 0.0, lost: tuple[str, ...] = ()) -> None:
        self.delay, self.lost, self.pulls, self.start = delay, set(lost), 0, time.monotonic()

    def push_messages(self, messages):
        return [f"m{i}" for i, _ in enumerate(messages)]

    def pull_messages(self, ids):
        self.pulls += 1
        ready = sorted(i for i in ids if i not in self.lost)
        if not ready or time.monotonic() - self.start < self.delay:
            return []
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=ready[0]))]


def test_every_reply_is_collected_one_pull_after_another():
    grid = SlowGrid()
    replies = send_and_receive(grid, ["a", "b", "c"], timeout=5, interval=0.001)
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0", "m1", "m2"]
    assert grid.pulls == 3


def test_a_reply_that_never_comes_ends_the_wait_at_the_timeout():
    grid = SlowGrid(lost=("m1",))
    started = time.monotonic()
    replies = send_and_receive(grid, ["a", "b"], timeout=0.3, interval=0.01)
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0"]
    assert 0.3 <= time.monotonic() - started < 1.0


def test_nothing_to_send_pulls_nothing():
    grid = SlowGrid()
    assert send_and_receive(grid, [], timeout=1) == [] and grid.pulls == 0


def test_the_wait_takes_the_interval_not_flowers_3_s():
    grid = SlowGrid(delay=0.2)
    started = time.monotonic()
    send_and_receive(grid, ["a"], timeout=10, interval=0.05)
    assert time.monotonic() - started < 0.5


def test_other_grids_are_left_as_they_are():
    grid = SlowGrid()
    assert fast_replies(grid) is grid and "send_and_receive" not in vars(grid)
