"""ops/timings.py: a run's seconds per round and from the command to a target accuracy."""

from __future__ import annotations

import json

import pytest

from ovalp_flwr.ops import timings
from ovalp_flwr.ops.timings import LineClock, main, run_timings


def write_summary(run_dir, seconds, accuracies, initial=0.5):
    run_dir.mkdir(parents=True)
    rounds = [{"round": r, "accuracy": a, "round_seconds": s}
              for r, (s, a) in enumerate(zip(seconds, accuracies), 1)]
    (run_dir / "summary.json").write_text(json.dumps(
        {"rounds": rounds, "initial_accuracy": initial, "total_seconds": 12.0,
         "setup": {"seconds": 2.0}}))


def test_round_seconds_leave_out_the_first_round(tmp_path):
    write_summary(tmp_path / "run", [9.0, 3.0, 4.0, 5.0], [0.6, 0.7, 0.8, 0.9])
    timings = run_timings(tmp_path / "run")
    assert timings["median_round_seconds"] == 4.0 and timings["mean_round_seconds"] == 4.0
    assert timings["target_round"] == 4  # 95% of 0.9 = 0.855: only round 4
    assert timings["command_seconds"] is None and timings["seconds_to_target"] is None


def test_the_launcher_clock_gives_the_seconds_to_the_target(tmp_path, capsys):
    write_summary(tmp_path / "run", [9.0, 3.0], [0.6, 0.9], initial=0.88)
    clock = LineClock(started=0.0)
    clock.seen("\x1b[92mINFO \x1b[0m:      » round 0/2  start    accuracy 0.8800")
    clock.seen("\x1b[92mINFO \x1b[0m:      configure_train: round 1, stage 1, 3 clients")
    clock.rounds[1] = 99.0
    clock.write(tmp_path / "run")
    timings = run_timings(tmp_path / "run", target=0.85)
    assert timings["target_round"] == 0 and timings["seconds_to_target"] > 0
    assert timings["seconds_to_target"] == clock.rounds[0]
    assert set(clock.rounds) == {0, 1}
    assert main([str(tmp_path / "run"), "--target", "0.95"]) == 0
    assert json.loads(capsys.readouterr().out)["target_round"] is None


NODE_LOG = """INFO 2026-11-26 23:32:51,840:      Receiving: query.describe message (ID: 1)
INFO 2026-11-26 23:32:52,260:      Received successfully
\x1b[92mINFO 2026-11-26 23:32:55,000\x1b[0m:      Receiving: train message (ID: 2)
INFO 2026-11-26 23:32:55,200:      Received successfully
DEBUG 2026-11-26 23:32:55,300:     a line in between
INFO 2026-11-26 23:32:55,700:      Sending: train message (ID: 3)
INFO 2026-11-26 23:32:55,850:      Sent successfully
INFO 2026-11-26 23:32:58,900:      Receiving: train message (ID: 4)
INFO 2026-11-26 23:32:59,000:      Received successfully
INFO 2026-11-26 23:59:59,500:      Sending: train message (ID: 5)
INFO 2026-11-27 00:00:00,100:      Sent successfully
INFO 2026-11-27 00:00:03,000:      Receiving: train message (ID: 6)
INFO:     a uvicorn line without Flower's stamp
"""


def test_a_nodes_train_messages_are_split_into_flowers_phases():
    first, second = timings.node_timeline(NODE_LOG)  # the third never finished: left out
    assert first == pytest.approx({"pull": 0.2, "reply_wait": 0.5, "push": 0.15, "idle": 3.05})
    # across midnight: the date counts
    assert second == pytest.approx({"pull": 0.1, "reply_wait": 1620.5, "push": 0.6})
    assert timings.node_timeline("INFO:     no stamps\n") == []
