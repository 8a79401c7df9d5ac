"""Rerun committed runs with today's code and say whether they compute the same numbers, bit for
bit: the check a refactor owes ("one run per preset family bit-identical to today's results").

Each `preset:run` is run again from its preset (the same spec the sweep made it from, in this
process: `--runner local`) into a scratch folder, and every round's accuracy, stage, train loss
and client counts, and summary.json's final and best accuracy, are compared with the committed
results/<preset>/<run>/ as exact floats. Seconds and bytes are not compared (they are the
machine's). Writes a Markdown table (`--out`) and exits 1 if any run differs.

    python benchmarks/rerun_identical.py server-optimizer:digits-lbfgs-iid-seed0 ...
    python benchmarks/rerun_identical.py --out benchmarks/results/identical.md PRESET:RUN ...
    python benchmarks/rerun_identical.py --against-code ../older PRESET:RUN ...  # today vs a checkout
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPARED = ("round", "accuracy", "stage", "train_loss", "clients_sampled", "clients_trained",
            "clients_failed", "clients_timed_out", "clients_rejected")
SUMMARY_KEYS = ("initial_accuracy", "final_accuracy", "best_accuracy")


def rounds(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return [{key: row.get(key, "") for key in COMPARED} for row in csv.DictReader(handle)]


def summary(path: Path) -> dict:
    data = json.loads(path.read_text())
    return {key: data.get(key) for key in SUMMARY_KEYS}


def rerun(preset: str, run: str, scratch: Path, code: Path = ROOT) -> float:
    """The code of the checkout `code` (today's: this one) on the run's spec (that checkout's
    preset), in a fresh process started there; its seconds. `finetune-compare` is
    benchmarks/finetune_compare.py's grid (its CPU sizes), not a preset."""
    if preset == "finetune-compare":
        if code != ROOT:
            raise SystemExit("--against-code: finetune-compare runs in this process, with today's code only")
        return rerun_finetune(run, scratch)
    program = ("import sys; from pathlib import Path; "
            "from ovalp_flwr.experiments.sweep import load_preset, run_one; "
            "preset = load_preset(Path(sys.argv[1])); "
            "seed = int(sys.argv[2].rsplit('seed', 1)[1]); "
            "spec = next(s for s in preset.runs([seed]) if s.name == sys.argv[2]); "
            "run_one(preset, spec, Path(sys.argv[3]), 'local')")
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", program, str(code / "conf" / f"{preset}.toml"), run,
                    str(scratch)], check=True, cwd=code, capture_output=True)  # cwd: its code
    return time.perf_counter() - started


def rerun_finetune(run: str, scratch: Path) -> float:
    """A run of finetune_compare.py's CPU grid (`<dataset>-<partition>-<method>-s<seed>`)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import finetune_compare as grid  # late: a script beside this one, not a package

    for dataset, partition, method in itertools.product(grid.DATASETS, grid.PARTITIONS,
                                                        grid.METHODS):
        seed = int(run.rsplit("-s", 1)[1])
        config = grid.overrides(grid.DATASETS[dataset], partition, method, seed, rounds=8)
        if config["run-name"] == run:
            started = time.perf_counter()
            grid.run_one({**config, "results-dir": str(scratch / "finetune-compare")}, 20)
            return time.perf_counter() - started
    raise SystemExit(f"finetune-compare has no run {run!r}")


def compare(preset: str, run: str, scratch: Path, committed: Path | None = None
            ) -> tuple[bool, str]:
    """Whether the rerun is the committed run (or the run in `committed`), and if not, which
    columns differ and by how much at most (a column of numbers), or which summary figures."""
    committed = committed or ROOT / "results" / preset / run
    made = scratch / preset / run
    before, now = rounds(committed / "rounds.csv"), rounds(made / "rounds.csv")
    differs = []
    for column in COMPARED:
        old, new = [r[column] for r in before], [r[column] for r in now]
        if old != new:
            try:
                gap = max(abs(float(a) - float(b)) for a, b in zip(old, new, strict=True))
                differs.append(f"{column} (max |Δ| {gap:.1e})")
            except ValueError:
                differs.append(column)
    old_summary, new_summary = summary(committed / "summary.json"), summary(made / "summary.json")
    differs += [key for key in SUMMARY_KEYS if old_summary[key] != new_summary[key]]
    if not differs:
        return True, "identical"
    same = [c for c in (*COMPARED, *SUMMARY_KEYS) if not any(d.startswith(c) for d in differs)]
    return False, f"differs: {', '.join(differs)}; identical: {', '.join(same)}"


def _commit(checkout: Path) -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=checkout).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="preset:run, e.g. server-optimizer:digits-lbfgs-iid-seed0")
    parser.add_argument("--out", type=Path, help="write the table here too")
    parser.add_argument("--against-code", type=Path,
                        help="a checkout of older code (git worktree add): run each there too "
                             "and compare today's run with it, not with the committed one")
    args = parser.parse_args(argv)
    commit = _commit(ROOT)
    against = "the committed results" if args.against_code is None else (
        f"the same runs by the code at {_commit(args.against_code)}")
    flags = "" if args.against_code is None else f"--against-code {args.against_code} "
    lines = [f"Runs rerun at {commit} (`python benchmarks/rerun_identical.py {flags}"
             f"{' '.join(args.runs)}`), compared with {against}: every round's accuracy, stage, "
             "train loss and client counts, and the summary's initial, final and best accuracy, "
             "as exact floats.", "", "| preset | run | seconds | result |", "|---|---|---:|---|"]
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for item in args.runs:
            preset, run = item.split(":", 1)
            seconds = rerun(preset, run, Path(tmp) / "today")
            older = None
            if args.against_code is not None:
                rerun(preset, run, Path(tmp) / "older", args.against_code.resolve())
                older = Path(tmp) / "older" / preset / run
            same, what = compare(preset, run, Path(tmp) / "today", older)
            failed += not same
            lines.append(f"| {preset} | {run} | {seconds:.0f} | {what} |")
            print(lines[-1], flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
