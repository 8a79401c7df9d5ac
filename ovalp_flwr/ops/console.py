"""What a launcher shows of a run, and what it keeps in the run's log file.

A simulated run prints ~270 lines of Flower and Ray chatter; its user needs a dozen. The
ServerApp marks the lines meant for its user (`say`: set-up facts, one line per round, the
closing line); a launcher streams `flwr run`'s output through `RunConsole`, which shows the
marked lines, errors and progress bars, writes every line to the run's log file, and on a
failure shows the log's last lines. A marked ERROR is the run's refusal (`federation.errors.
refuse`): it is kept for the end, where the launcher shows it as the last line instead of the
log's tail, and Flower's report of the exception that ended the run after it stays in the log.
`--verbose` shows everything as it comes.

Only the log keeps Flower's warnings that are wrong for this app (that the default number of
simulated SuperNodes changed to 2: the launchers always set it; that federated evaluation is
skipped: the server evaluates centrally), its strategy banner and "Final results" dump (the
per-round lines and the summary say it once), and Ray's FutureWarning about accelerator
environment variables (no GPU is asked for on CPU; with one, each client asks for its share).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import TextIO

MARK = "» "  # precedes the ServerApp's lines for its user
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_FLOWER_LEVEL = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*:\s*")
_PROGRESS = re.compile(r"(\d{1,3})%\|")  # a tqdm bar
_STARTED = re.compile(r"Successfully started run (\d+)")  # `flwr run`'s line naming its run
TAIL_LINES = 12  # what a failed run shows of its log


def say(level: int, message: str, *args: object) -> None:
    """Log a line the launcher shows by default (Flower's logger, as the rest of the run)."""
    from flwr.supercore import log  # late: Flower (~0.4 s); the launchers import this module

    log(level, MARK + message, *args)


def quiet_flower() -> None:
    """For in-process runs that say a line per run (sweeps, benchmarks): Flower's INFO per
    round and its warning that federated evaluation is off (the server evaluates centrally)
    would bury it. Flower sets its logger to DEBUG when first imported, so import it first."""
    from flwr.supercore.logger import FLOWER_LOGGER  # late: Flower (~0.4 s), as in `say`

    FLOWER_LOGGER.setLevel(logging.ERROR)


def relative(path: Path) -> str:
    """`path` relative to the current directory where it lies below it: shorter to read."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def new_log_path(flwr_home: Path, kind: str = "run") -> Path:
    """`<flwr_home>/logs/<kind>-<timestamp>.log`, one per launch."""
    logs = flwr_home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path, n = logs / f"{kind}-{stamp}.log", 1
    while path.exists():
        n += 1
        path = logs / f"{kind}-{stamp}-{n}.log"
    return path


class RunConsole:
    """Filters one run's output for its user; every line lands in `log_path` as it came."""

    def __init__(self, log_path: Path, verbose: bool = False, out: TextIO | None = None) -> None:
        self.log_path, self.verbose = log_path, verbose
        self.out = out if out is not None else sys.stdout  # looked up now: a test's capture replaces sys.stdout
        self.log = open(log_path, "a", encoding="utf-8")
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.tty = self.out.isatty()
        self.bar_open = False  # a progress bar drawn in place, not yet ended by a newline
        self.bar_quarter: dict[str, int] = {}  # per bar: the last quarter printed (no tty)
        self.lock = threading.Lock()  # `LogFollower` feeds from its own thread
        self.cause_logs: dict[Path, int] = {}  # other logs a failure's cause may be in
        self.refusal: str | None = None  # the run's own one line on why it stopped
        self.run_id: int | None = None  # the Flower run this console follows

    def also_search(self, path: Path) -> None:
        """On a failure, look for its cause in what `path` logs from now on (the SuperLink
        refuses a run in its own log, and `flwr run` says only `Invalid run configuration`)."""
        self.cause_logs[path] = path.stat().st_size if path.exists() else 0

    def feed(self, line: str) -> None:
        with self.lock:
            self.log.write(line if line.endswith("\n") else line + "\n")
            parts = [_ANSI.sub("", part).rstrip() for part in line.rstrip("\n").split("\r")]
            for part in parts:  # tqdm redraws with carriage returns
                self._note(part)
            if self.verbose:
                self._print(line.rstrip("\n"))
                return
            for part in parts:
                self._show(part)

    def _note(self, text: str) -> None:
        """What the launcher needs of a line: the run's id, and the run's refusal."""
        if (started := _STARTED.search(text)) is not None and self.run_id is None:
            self.run_id = int(started.group(1))
        if MARK in text and text.startswith(("ERROR", "CRITICAL")) and self.refusal is None:
            self.refusal = text.split(MARK, 1)[1]

    def _show(self, text: str) -> None:
        if MARK in text:
            if text.startswith(("ERROR", "CRITICAL")):
                return  # the run's refusal: shown last (`close`, the launcher)
            warning = "warning: " if text.startswith("WARNING") else ""
            self._print(warning + text.split(MARK, 1)[1])
        elif (bar := _PROGRESS.search(text)) is not None:
            self._progress(_FLOWER_LEVEL.sub("", text).strip(), int(bar.group(1)))
        elif text.startswith(("ERROR", "CRITICAL")) and self.refusal is None:
            self._print(f"error: {_FLOWER_LEVEL.sub('', text)}")
        elif text.strip():  # after a refusal: Flower's report of the exception it ended with
            self.tail.append(text)

    def _progress(self, text: str, percent: int) -> None:
        """In a terminal one bar redrawn in place; in a log its 0/25/50/75/100% states."""
        if self.tty:
            self.out.write("\r" + text[:120].ljust(120))
            self.bar_open = percent < 100
            self.out.write("" if self.bar_open else "\n")
            self.out.flush()
            return
        label = text.split("%|", 1)[0].rsplit(":", 1)[0]
        quarter = percent // 25
        if self.bar_quarter.get(label, -1) < quarter:
            self.bar_quarter[label] = quarter
            self._print(text)

    def _end_bar(self) -> None:
        if self.bar_open:
            self.out.write("\n")
            self.bar_open = False

    def _print(self, text: str) -> None:
        self._end_bar()
        print(text, file=self.out, flush=True)

    def close(self, failed: bool) -> None:
        """A failed run shows the last lines it logged besides the ones already shown, unless
        it said why it stopped (`refusal`: the caller shows that line last)."""
        self._end_bar()
        self.log.close()
        if self.refusal is not None:
            self.out.flush()
            return
        if failed and not self.verbose and self.tail:
            print(f"last lines of the log ({relative(self.log_path)}):", file=self.out)
            for text in self.tail:
                print(f"  {_FLOWER_LEVEL.sub('', text)}", file=self.out)
        for path, offset in self.cause_logs.items() if failed else ():
            cause = first_error(path, offset)
            if cause:
                print(f"error: {cause} (from {relative(path)})", file=self.out)
        self.out.flush()


def first_error(path: Path, offset: int = 0) -> str | None:
    """The first ERROR line `path` logged after `offset`, without its level; None if none."""
    if not path.exists():
        return None
    with open(path, "rb") as handle:
        handle.seek(offset)
        text = handle.read().decode("utf-8", "replace")
    for line in text.splitlines():
        line = _ANSI.sub("", line).strip()
        if line.startswith(("ERROR", "CRITICAL")):
            return _FLOWER_LEVEL.sub("", line)
    return None


class LogFollower:
    """Feeds what other processes log to files (SuperNodes building their caches, which
    `flwr run` does not stream) to a console: their progress bars and errors, each line
    prefixed with its file's name. A thread polls the files from where they ended at start."""

    def __init__(self, console: RunConsole, files: list[Path], interval: float = 1.0) -> None:
        self.console, self.interval = console, interval
        self.offsets = {path: path.stat().st_size if path.exists() else 0 for path in files}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "LogFollower":
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stopped.set()
        self.thread.join()
        self.poll()  # what landed since the last poll

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.poll()

    def poll(self) -> None:
        for path, offset in self.offsets.items():
            if not path.exists() or path.stat().st_size <= offset:
                continue
            with open(path, "rb") as handle:
                handle.seek(offset)
                chunk = handle.read()
            end = max(chunk.rfind(b"\n"), chunk.rfind(b"\r")) + 1  # whole lines only
            self.offsets[path] = offset + end
            self._feed(path.stem, chunk[:end].decode("utf-8", "replace"))

    def _feed(self, name: str, text: str) -> None:
        """Errors, and each bar's latest state in this chunk (not every redraw)."""
        parts = [_ANSI.sub("", part).strip() for part in re.split(r"[\r\n]", text)]
        bars = [part for part in parts if _PROGRESS.search(part)]
        for part in parts:
            if part.startswith(("ERROR", "CRITICAL", "Traceback")):
                self.console.feed(f"ERROR : {name}: {_FLOWER_LEVEL.sub('', part)}\n")
        if bars:
            self.console.feed(f"{name}: {bars[-1]}\n")
