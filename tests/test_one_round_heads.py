"""benchmarks/one_round_heads.py: the one-round heads' table in docs/closed-form-starts.md is the
one the committed runs give today."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from one_round_heads import table  # noqa: E402


def test_the_digits_table_in_the_docs_is_the_committed_runs():
    made = table(ROOT / "conf" / "one-round-heads-digits.toml")
    assert made.count("\n") == 1 + 5 * 5  # header, rule, 5 heads x 5 partitions, 3 seeds each
    assert all(line.endswith("| 3 |") for line in made.splitlines()[2:])
    assert made in (ROOT / "docs" / "closed-form-starts.md").read_text()


def test_runs_not_made_are_left_out(tmp_path):
    assert table(ROOT / "conf" / "one-round-heads.toml", tmp_path).count("\n") == 1
