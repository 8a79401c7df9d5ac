"""Test count and seconds per test file from a JUnit XML report of `make test`, or before and
after a change from two.

    make test ARGS="--junitxml=benchmarks/results/test_suite_after.xml"
    python benchmarks/suite_times.py benchmarks/results/test_suite_after.xml  # docs/testing.md
    python benchmarks/suite_times.py benchmarks/results/test_suite_before.xml \
        benchmarks/results/test_suite_after.xml

Seconds are the sum of the tests' own durations (setup, call, teardown): under pytest-xdist
several tests share the cores, so a file's seconds there are longer than alone, and the rows
add up to more than the wall time. A shared federation's start (tests/e2e.py) counts in the
setup of the first test that uses it. Comparing two reports, test files that were renamed,
merged or split between them are one row (`SAME_TESTS`), so each row compares the same tests.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

# (files before, files after) holding the same tests: what #44 split (the SIGTERM tests left
# test_launch for test_processes, named after ops/processes.py)
SAME_TESTS: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    (("test_launch",), ("test_launch", "test_processes")),
]


def per_file(report: Path) -> tuple[dict[str, int], dict[str, float], float]:
    """(tests per file, seconds per file, the session's wall seconds) of a JUnit report."""
    root = ElementTree.parse(report).getroot()
    counts: dict[str, int] = defaultdict(int)
    seconds: dict[str, float] = defaultdict(float)
    for case in root.iter("testcase"):
        name = case.get("classname", "").split(".")[-1]
        counts[name] += 1
        seconds[name] += float(case.get("time", 0.0))
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    wall = float(suite.get("time", 0.0)) if suite is not None else 0.0
    return dict(counts), dict(seconds), wall


def rows(before: Path, after: Path) -> list[tuple[str, str, int, int, float, float]]:
    """(file now, files before, tests before, tests now, s before, s now), slowest first."""
    count_0, seconds_0, _ = per_file(before)
    count_1, seconds_1, _ = per_file(after)
    groups = [group for group in SAME_TESTS if set(group[0]) & set(count_0)
              or set(group[1]) & set(count_1)]
    grouped = {name for old, new in groups for name in (*old, *new)}
    for name in sorted((set(count_0) | set(count_1)) - grouped):
        groups.append(((name,), (name,)))
    table = []
    for old, new in groups:  # a name on either side counts on both (test_deploy stayed)
        old, new = (*old, *(n for n in new if n not in old)), (*new, *(n for n in old if n not in new))
        now = " + ".join(name for name in new if name in count_1) or "(gone)"
        was = " + ".join(name for name in old if name in count_0)
        table.append((now, "same" if was == now else was,
                      sum(count_0.get(n, 0) for n in old), sum(count_1.get(n, 0) for n in new),
                      sum(seconds_0.get(n, 0.0) for n in old),
                      sum(seconds_1.get(n, 0.0) for n in new)))
    return sorted(table, key=lambda row: -row[4])


def markdown(before: Path, after: Path) -> str:
    table = rows(before, after)
    wall_0, wall_1 = per_file(before)[2], per_file(after)[2]
    lines = ["| file now | before | tests before | tests now | s before | s now |",
             "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {now} | {was} | {n0} | {n1} | {s0:.1f} | {s1:.1f} |"
              for now, was, n0, n1, s0, s1 in table]
    lines.append(f"| **all** | | {sum(r[2] for r in table)} | {sum(r[3] for r in table)} | "
                 f"{sum(r[4] for r in table):.0f} | {sum(r[5] for r in table):.0f} |")
    lines.append(f"| **wall (pytest's own)** | | | | {wall_0:.0f} | {wall_1:.0f} |")
    return "\n".join(lines)


def one_report(report: Path) -> str:
    """Per file: its tests and their seconds, slowest first; then the sum and pytest's wall."""
    counts, seconds, wall = per_file(report)
    lines = ["| file | tests | s |", "|---|---:|---:|"]
    lines += [f"| {name} | {counts[name]} | {seconds[name]:.1f} |"
              for name in sorted(counts, key=lambda name: -seconds[name])]
    lines.append(f"| **all** | {sum(counts.values())} | {sum(seconds.values()):.0f} |")
    lines.append(f"| **wall (pytest's own)** | | {wall:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", type=Path, nargs="+",
                        help="one JUnit XML of the suite, or two: before and after a change")
    args = parser.parse_args(argv)
    if len(args.reports) > 2:
        parser.error(f"{len(args.reports)} reports are not allowed; give one, or two (before, after)")
    for report in args.reports:
        if not report.is_file():
            print(f"error: {report} is not a file (make test ARGS=\"--junitxml={report}\")",
                  file=sys.stderr)
            return 2
    print(one_report(args.reports[0]) if len(args.reports) == 1 else markdown(*args.reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
