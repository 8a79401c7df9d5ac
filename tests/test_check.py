"""`make check-reports` (`experiments/report/check.py`): each report remade by the command its
head names, compared byte for byte, and the committed files put back whatever it found."""

import pytest

from ovalp_flwr.experiments.report.check import Pending, check, pending, remakes, verdict

MAKER = """from pathlib import Path
value = Path("results.txt").read_text()
Path("reports/demo/report.md").write_text("Made by `python make.py`\\n")
Path("reports/demo/table.csv").write_text(value)
if value == "extra":
    Path("reports/demo/extra.csv").write_text(value)
"""


@pytest.fixture
def project(tmp_path):
    (tmp_path / "make.py").write_text(MAKER)
    (tmp_path / "reports" / "demo").mkdir(parents=True)
    (tmp_path / "reports" / "demo" / "report.md").write_text("Made by `python make.py`\n")
    (tmp_path / "reports" / "demo" / "table.csv").write_text("1")
    return tmp_path


def test_a_report_that_remakes_as_committed_passes(project):
    (project / "results.txt").write_text("1")
    (remake,) = remakes(project / "reports")
    assert remake.command == "python make.py"
    assert check(remake, root=project) == []


def test_a_report_made_from_other_results_fails_and_is_put_back(project):
    (project / "results.txt").write_text("2")
    (remake,) = remakes(project / "reports")
    assert check(remake, root=project) == ["reports/demo/table.csv differs"]
    assert (project / "reports" / "demo" / "table.csv").read_text() == "1"  # committed, back
    (project / "results.txt").write_text("extra")
    assert check(remake, root=project) == ["reports/demo/extra.csv new",
                                           "reports/demo/table.csv differs"]
    assert not (project / "reports" / "demo" / "extra.csv").exists()


def test_a_command_that_fails_says_why_and_a_report_without_one_is_refused(project):
    (remake,) = remakes(project / "reports")  # results.txt missing: the command exits 1
    assert check(remake, root=project)[0].startswith("the command exited 1: FileNotFoundError")
    (project / "reports" / "demo" / "notes.md").write_text("hand-written\n")
    with pytest.raises(ValueError, match="notes.md: its head names no command"):
        remakes(project / "reports")


def test_a_pending_report_waits_without_failing_and_must_leave_the_list_once_it_remakes(project):
    (project / "reports" / "pending.toml").write_text('[demo]\nwhy = "runs not committed"\n')
    waiting = pending(project / "reports")
    assert waiting == {"demo": Pending("runs not committed")}
    (remake,) = remakes(project / "reports")
    label, said = verdict(remake, check(remake, root=project), waiting)  # no results.txt
    assert label == "PENDING" and said[0].startswith("runs not committed (the command exited 1")
    (project / "results.txt").write_text("1")
    assert verdict(remake, check(remake, root=project), waiting) == (
        "FAIL", ["remakes as committed: remove it from reports/pending.toml"])
    assert verdict(remake, [], {}) == ("ok  ", [])
    # runs made by older code: the report remakes from them and still waits for its rerun
    assert verdict(remake, [], {"demo": Pending("older code's runs", stale=True)}) == (
        "PENDING", ["older code's runs"])
