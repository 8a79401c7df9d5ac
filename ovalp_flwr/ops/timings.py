"""Where a run's time went, from its results folder: seconds per round (the ServerApp's
`round_seconds` in summary.json) and, for a run started by a launcher here (`deploy`,
`launch`), seconds from the command to each round's score line (`launcher.json`, written
beside summary.json by `LineClock`).

    python -m ovalp_flwr.ops.timings results/<run> [--target 0.9025]

`run_timings(run_dir, target=None) -> dict`: rounds, round_seconds (per round), median and
mean round seconds (rounds 2.. : round 1 also pays for the first message's set-up), the
ServerApp's total seconds and set-up seconds, and with `launcher.json` the command's seconds
and, for `target` (an accuracy; default 95% of the final accuracy, Acc@95), the first round
(0 = the start) at or above it and the seconds from the command to its score line.

`node_timeline(log) -> list[dict]`: a SuperNode's train messages, phase by phase, from its log
written with Flower's timestamps on (`update_console_handler(timestamps=True)`; the overhead
benchmark turns them on in every Flower process): `pull` (from "Receiving" to "Received
successfully": the message's objects from the SuperLink), `reply_wait` (until "Sending": the
ClientApp's run, seen in Flower's 0.5 s steps), `push` (until "Sent successfully") and `idle`
(until the next "Receiving": Flower's 3 s sleeps and the server's turn).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from ovalp_flwr.core.durable import replace_durably

LAUNCHER_FILE = "launcher.json"
# a Flower log line with timestamps: "INFO 2026-11-26 23:32:56,041:      Receiving: train ..."
STAMPED = re.compile(r"^[A-Z]+ (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}):\s+(.*)$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Flower colours the level and the time in a terminal's log
NODE_EVENTS = {"Receiving: train": "received", "Received successfully": "pulled",
               "Sending: train": "sending", "Sent successfully": "sent"}
# the ServerApp's score line of a round ("» round  3/20  stage 2  accuracy ..", evaluation.py)
ROUND_LINE = re.compile(r"(?:^|» )round +(\d+)/\d+ ")
FRACTION = 0.95


class LineClock:
    """Seconds from a command's start to the first line of each round's score, as the
    launcher sees the run's log stream (Flower streams logs every 0.5 s or so: a line comes
    up to about a second after the ServerApp wrote it)."""

    def __init__(self, started: float | None = None) -> None:
        """`started`: a time.monotonic() reading; default: when this process started."""
        self.started = time.monotonic() - process_age() if started is None else started
        self.rounds: dict[int, float] = {}

    def attach(self, console):
        """`console` (a launcher's `RunConsole`), stamping every line it is fed with this
        clock (`console.clock`)."""
        feed = console.feed

        def stamped(line: str) -> None:
            self.seen(line)
            feed(line)

        console.feed, console.clock = stamped, self
        return console

    def seen(self, line: str) -> None:
        found = ROUND_LINE.search(line.strip())
        if found and int(found.group(1)) not in self.rounds:
            self.rounds[int(found.group(1))] = time.monotonic() - self.started

    def write(self, run_dir: Path) -> Path:
        """`launcher.json` in the run's folder (atomically): the rounds' times and the
        command's seconds so far."""
        record = {"command_seconds": time.monotonic() - self.started,
                  "round_line_seconds": {str(r): s for r, s in sorted(self.rounds.items())}}
        path = run_dir / LAUNCHER_FILE
        replace_durably(path, json.dumps(record, indent=1))
        return path


def write_clock(console, run_dir: Path) -> None:
    """The `LineClock` attached to `console`, if any, to the run's folder."""
    clock = getattr(console, "clock", None)
    if clock is not None:
        clock.write(run_dir)


def process_age() -> float:
    """Seconds since this process started (Linux /proc): the command's, for a launcher."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))


def run_timings(run_dir: Path, target: float | None = None) -> dict:
    """The run's timings (see the module); raises FileNotFoundError without summary.json."""
    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    rounds = summary["rounds"]
    seconds = [float(r["round_seconds"]) for r in rounds]
    steady = seconds[1:] or seconds
    curve = [float(summary["initial_accuracy"])] + [float(r["accuracy"]) for r in rounds]
    bar = FRACTION * curve[-1] if target is None else float(target)
    reached = next((t for t, accuracy in enumerate(curve) if accuracy >= bar), None)
    timings = {
        "rounds": len(rounds),
        "round_seconds": seconds,
        "median_round_seconds": statistics.median(steady) if steady else None,
        "mean_round_seconds": statistics.fmean(steady) if steady else None,
        "serverapp_seconds": summary.get("total_seconds"),
        "setup_seconds": (summary.get("setup") or {}).get("seconds"),
        "target_accuracy": bar,
        "target_round": reached,
        "command_seconds": None,
        "seconds_to_target": None,
    }
    launcher = Path(run_dir) / LAUNCHER_FILE
    if launcher.is_file():
        record = json.loads(launcher.read_text())
        timings["command_seconds"] = record["command_seconds"]
        if reached is not None:
            timings["seconds_to_target"] = record["round_line_seconds"].get(str(reached))
    return timings


def _stamped(line: str) -> tuple[float, str] | None:
    """(POSIX seconds, message) of a timestamped Flower line; None for any other line. The
    date is kept: a run that crosses midnight must not get negative phases."""
    found = STAMPED.match(ANSI.sub("", line))
    if not found:
        return None
    stamp, message = found.groups()
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp(), message


def node_timeline(log: str) -> list[dict]:
    """Each train message in a SuperNode's log (text), phase by phase in seconds (module doc);
    the last message has no `idle`. A message whose four lines are not all there is left out."""
    messages: list[dict] = []
    current: dict[str, float] = {}
    for line in log.splitlines():
        stamped = _stamped(line)
        if stamped is None:
            continue
        at, message = stamped
        event = next((name for text, name in NODE_EVENTS.items() if message.startswith(text)),
                     None)
        if event == "received":
            current = {"received": at}
        elif event and current and event not in current and (event != "sent"
                                                             or "sending" in current):
            current[event] = at
            if event == "sent" and "pulled" in current:
                messages.append(current)
                current = {}
    phases = [{"pull": m["pulled"] - m["received"], "reply_wait": m["sending"] - m["pulled"],
               "push": m["sent"] - m["sending"]} for m in messages]
    for phase, message, following in zip(phases, messages, messages[1:]):
        phase["idle"] = following["received"] - message["sent"]
    return phases


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ovalp_flwr.ops.timings",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a run's results folder (holds summary.json)")
    parser.add_argument("--target", type=float, default=None,
                        help="accuracy to reach (default: 95%% of the run's final accuracy)")
    args = parser.parse_args(argv)
    print(json.dumps(run_timings(args.run_dir, args.target), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
