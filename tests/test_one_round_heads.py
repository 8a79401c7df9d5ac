"""benchmarks/one_round_heads.py: the one-round heads' tables in docs/closed-form-starts.md and
the README are the ones the committed runs give today."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from one_round_heads import (Head, budget_table, front_table, heads, on_front, table,  # noqa: E402
                             wide_table)

DOC = (ROOT / "docs" / "closed-form-starts.md").read_text()


def test_the_digits_table_in_the_docs_is_the_committed_runs():
    made = table(ROOT / "conf" / "one-round-heads-digits.toml")
    assert made.count("\n") == 1 + 8 * 5  # header, rule, 8 heads x 5 partitions, 3 seeds each
    assert all(line.endswith("| 3 |") for line in made.splitlines()[2:])
    assert made in DOC


def test_each_head_on_each_partition_in_the_docs_is_the_committed_runs():
    made = wide_table(ROOT / "conf" / "one-round-heads.toml")
    assert made.count("\n") == 1 + 4 * 9  # 4 datasets x 9 heads, one column a partition
    assert all(line.endswith("| 3 |") for line in made.splitlines()[2:])
    assert made in DOC


def test_the_rounds_from_each_head_in_the_docs_are_the_committed_runs():
    made = wide_table(ROOT / "conf" / "one-round-heads-rounds.toml", (0, 1, 5, 20))
    assert made.count("\n") == 1 + 4 * 7  # 4 datasets x 7 heads
    assert made in DOC


def test_the_front_is_in_the_docs_and_its_budgets_in_the_readme():
    found = heads()
    assert {h.dataset for h in found} == {"digits", "cifar10", "mnist", "ag-news",
                                          "tinyimagenet-100"}
    assert front_table(found) in DOC
    assert budget_table(found) in (ROOT / "README.md").read_text()


def test_a_head_is_on_the_front_unless_one_no_dearer_is_more_accurate():
    cheap = Head("cifar10", "fedcof", kilobytes=51.7, ours=[0.72])
    dear_worse = Head("cifar10", "ridge", kilobytes=3331.2, ours=[0.70])
    dear_better = Head("cifar10", "lda", kilobytes=3331.2, ours=[0.78])
    other_dataset = Head("mnist", "fedncm", kilobytes=1.0, ours=[0.99])
    rivals = [cheap, dear_worse, dear_better, other_dataset]
    assert on_front(cheap, rivals) and on_front(dear_better, rivals)
    assert not on_front(dear_worse, rivals)


def test_runs_not_made_are_left_out(tmp_path):
    assert table(ROOT / "conf" / "one-round-heads.toml", tmp_path).count("\n") == 1
    assert wide_table(ROOT / "conf" / "one-round-heads.toml", results_root=tmp_path).count("\n") == 1
