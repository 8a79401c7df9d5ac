"""federation/polling.py: Flower's send_and_receive semantics, pulled promptly, through the
public Grid interface around the run's grid."""

from __future__ import annotations

import time
from types import SimpleNamespace

from flwr.serverapp import Grid

from ovalp_flwr.federation.local_grid import InProcessGrid
from ovalp_flwr.federation.polling import PromptGrid, prompt_replies, send_and_receive


class SlowGrid:
    """Replies come in one per pull, after `delay` seconds; never for ids in `lost`."""

    def __init__(self, delay: float = 0.0, lost: tuple[str, ...] = ()) -> None:
        self.delay, self.lost, self.pulls, self.start = delay, set(lost), 0, time.monotonic()

    def push_messages(self, messages):
        return [f"m{i}" for i, _ in enumerate(messages)]

    def send_and_receive(self, messages, *, timeout=None):
        raise AssertionError("Flower's own wait (3 s between pulls) was used")

    def pull_messages(self, ids):
        self.pulls += 1
        ready = sorted(i for i in ids if i not in self.lost)
        if not ready or time.monotonic() - self.start < self.delay:
            return []
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=ready[0]))]


def test_every_reply_is_collected_one_pull_after_another():
    grid = SlowGrid()
    replies = send_and_receive(grid, ["a", "b", "c"], timeout=5, first=0.001, interval=0.001)
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0", "m1", "m2"]
    assert grid.pulls == 3


def test_a_reply_that_never_comes_ends_the_wait_at_the_timeout():
    grid = SlowGrid(lost=("m1",))
    started = time.monotonic()
    replies = send_and_receive(grid, ["a", "b"], timeout=0.3, first=0.01, interval=0.01)
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


def test_the_pause_doubles_from_the_first_pull_to_the_interval():
    grid = SlowGrid(lost=("m0",))
    pauses = []
    real_sleep = time.sleep
    time.sleep = pauses.append  # the pauses asked for, none slept
    try:
        send_and_receive(grid, ["a"], timeout=0.05, first=0.01, interval=0.1)
    finally:
        time.sleep = real_sleep
    assert pauses[:6] == [0.01, 0.02, 0.04, 0.08, 0.1, 0.1]


def test_a_long_wait_pulls_at_a_share_of_its_length(monkeypatch):
    """Past 5 s of waiting, a pause of 2% of the wait so far (a reply waits at most 2% longer
    than it took), up to 1 s: a minute's wait for a straggler pulls ~180 times, not 600."""
    from ovalp_flwr.federation import polling

    assert [polling.longest_pause(w) for w in (0, 2, 5, 10, 30, 50, 600)] == \
        [0.1, 0.1, 0.1, 0.2, 0.6, 1.0, 1.0]
    clock = [0.0]
    monkeypatch.setattr(polling.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(polling.time, "sleep", lambda pause: clock.__setitem__(0, clock[0] + pause))
    grid = SlowGrid(lost=("m0",))
    send_and_receive(grid, ["a"], timeout=60)
    assert 150 <= grid.pulls <= 200, grid.pulls


def test_the_run_grid_is_wrapped_as_a_flower_grid_that_delegates_all_but_the_wait():
    inner = SlowGrid()
    inner.get_node_ids = lambda: [3, 1]
    inner.marker = "inner's own attribute"
    grid = prompt_replies(inner)
    assert isinstance(grid, PromptGrid) and isinstance(grid, Grid)
    assert list(grid.get_node_ids()) == [3, 1] and grid.marker == "inner's own attribute"
    replies = grid.send_and_receive(["a", "b"], timeout=5)  # SlowGrid's own would raise
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0", "m1"]
    assert prompt_replies(grid) is grid  # wrapped once


def test_the_in_process_grid_is_left_as_it_is():
    from client_app import app as client_app

    grid = InProcessGrid(client_app, 2, {})
    assert prompt_replies(grid) is grid
