"""benchmarks/suite_times.py, and docs/testing.md's per-file table kept current with it: the table
is what the script prints for the committed report of `make test`, and that report has every
end-to-end test the suite holds now (a new one without a new report fails here)."""

from __future__ import annotations

import ast
import importlib.util
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
AFTER = ROOT / "benchmarks" / "results" / "test_suite_after.xml"
TESTING = ROOT / "docs" / "testing.md"


def _suite_times():
    spec = importlib.util.spec_from_file_location("suite_times", ROOT / "benchmarks" / "suite_times.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


suite_times = _suite_times()


def _is_e2e(decorator: ast.expr) -> bool:
    """`@pytest.mark.e2e` or `@pytest.mark.e2e(seconds=...)`."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr == "e2e" \
        and isinstance(target.value, ast.Attribute) and target.value.attr == "mark"


def e2e_tests() -> set[tuple[str, str]]:
    """(module, test function) of every e2e-marked test under tests/, read from the source."""
    found = set()
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and any(map(_is_e2e, node.decorator_list)):
                found.add((path.stem, node.name))
    return found


def write_report(path: Path, cases: list[tuple[str, str, float]], wall: float) -> Path:
    body = "".join(f'<testcase classname="tests.{module}" name="{name}" time="{seconds}"/>'
                   for module, name, seconds in cases)
    path.write_text(f'<testsuites><testsuite name="pytest" time="{wall}">{body}'
                    "</testsuite></testsuites>")
    return path


def test_the_per_file_table_in_docs_is_the_committed_reports():
    table = suite_times.one_report(AFTER)
    assert table in TESTING.read_text(), (
        "docs/testing.md's per-file table is not what `python benchmarks/suite_times.py "
        f"{AFTER.relative_to(ROOT)}` prints: paste its output")


def test_the_committed_report_has_every_end_to_end_test():
    e2e = e2e_tests()
    assert len(e2e) >= 8  # the scan finds the markers (tests/test_launch.py, test_deploy.py)
    reported = {(case.get("classname", "").split(".")[-1], case.get("name", "").split("[")[0])
                for case in ElementTree.parse(AFTER).getroot().iter("testcase")}
    missing = sorted(e2e - reported)
    assert not missing, (f"end-to-end tests not in {AFTER.relative_to(ROOT)}: {missing}; rerun "
                         "`make test ARGS=\"--junitxml=...\"` and update docs/testing.md's table")


def test_one_report_lists_files_slowest_first_with_their_sums(tmp_path):
    report = write_report(tmp_path / "r.xml", [("test_a", "x", 1.0), ("test_b", "y", 5.0),
                                               ("test_a", "z", 2.5)], wall=7.0)
    assert suite_times.one_report(report).splitlines()[2:] == [
        "| test_b | 1 | 5.0 |", "| test_a | 2 | 3.5 |", "| **all** | 3 | 8 |",
        "| **wall (pytest's own)** | | 7 |"]


def test_two_reports_compare_the_same_tests_in_one_row_when_a_file_was_split(tmp_path):
    before = write_report(tmp_path / "before.xml", [("test_launch", "a", 10.0),
                                                   ("test_launch", "b", 4.0),
                                                   ("test_gone", "c", 1.0)], wall=12.0)
    after = write_report(tmp_path / "after.xml", [("test_launch", "a", 6.0),
                                                 ("test_processes", "b", 3.0),
                                                 ("test_new", "d", 2.0)], wall=9.0)
    rows = {row[0]: row[1:] for row in suite_times.rows(before, after)}
    assert rows["test_launch + test_processes"] == ("test_launch", 2, 2, 14.0, 9.0)
    assert rows["(gone)"] == ("test_gone", 1, 0, 1.0, 0.0)
    assert rows["test_new"] == ("", 0, 1, 0.0, 2.0)


def test_three_reports_are_refused_with_one_line(tmp_path, capsys):
    reports = [str(write_report(tmp_path / f"{name}.xml", [], wall=0.0)) for name in "abc"]
    with pytest.raises(SystemExit) as stopped:
        suite_times.main(reports)
    assert stopped.value.code == 2
    assert "3 reports are not allowed; give one, or two (before, after)" in capsys.readouterr().err


def test_a_missing_report_says_how_to_make_one(tmp_path, capsys):
    assert suite_times.main([str(tmp_path / "missing.xml")]) == 2
    assert f"{tmp_path / 'missing.xml'} is not a file (make test ARGS=" in capsys.readouterr().err
