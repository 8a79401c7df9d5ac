"""A preset's results as one report: Markdown tables, CSVs and plots under `reports/<preset>/`.

Or, given one run's folder, that run summarised: its lines printed, its accuracy plot redrawn.

    python -m ovalp_flwr.experiments.report conf/tinyimagenet-ablation.toml --seeds 0 42
    python -m ovalp_flwr.experiments.report results/<run>
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from ovalp_flwr.core.durable import replace_durably
from ovalp_flwr.experiments.ceiling import CEILING_FILE
from ovalp_flwr.experiments.report.runs import ReportError
from ovalp_flwr.experiments.report.writer import write_report
from ovalp_flwr.experiments.sweep import PresetError, load_preset, select
from ovalp_flwr.federation.results import read_summary
from ovalp_flwr.federation.single_run import PLOT_FILE, iid_twin, plot_run, summary_lines

PROG = "python -m ovalp_flwr.experiments.report"


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; 2 with one line on stderr for a preset or run it cannot report."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(args_list)
    if args.preset.is_dir():
        return report_run(args.preset)
    command = shlex.join([*PROG.split(), *args_list])  # report.md says how to remake it
    try:
        path = report_preset(args, command)
    except (PresetError, ReportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0


def parser() -> argparse.ArgumentParser:
    """The options; `--results-dir`, `--out` and `--ceilings` let tests report on a temp copy."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("preset", type=Path,
                        help="conf/<name>.toml, or one run's folder (results/<run>) to summarise")
    parser.add_argument("--results-dir", type=Path, default=Path("results"),
                        help="where results/<preset>/ is (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("reports"),
                        help="the report goes to <out>/<preset>/ (default: %(default)s)")
    parser.add_argument("--ceilings", type=Path, default=CEILING_FILE,
                        help="the centralised ceilings a preset with ceiling-fraction is measured "
                             "against (benchmarks/centralised_ceiling.py writes them)")
    parser.add_argument("--seeds", type=int, nargs="+", help="default: the preset's")
    parser.add_argument("--only", action="append", default=[],
                        help="axis=choice[,choice] (repeatable): report the subset a sweep ran "
                             "with the same --only; the other choices are left out, not missing")
    return parser


def report_preset(args: argparse.Namespace, command: str) -> Path:
    """The preset's report, restricted to the seeds and `--only` choices asked for."""
    preset = load_preset(args.preset)
    specs = select(preset.runs(args.seeds), args.only)
    if not specs:
        raise ReportError(f"--only {' '.join(args.only)} leaves no run of {preset.name}")
    return write_report(preset.restricted_to(specs), specs, args.results_dir, args.out, command,
                        args.ceilings)


def report_run(run_dir: Path) -> int:
    """One run folder: its summary lines, and its accuracy plot redrawn (with R(t) when its IID
    twin is among its siblings)."""
    try:
        summary = read_summary(run_dir)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    twin = iid_twin(run_dir.resolve().parent, summary)
    config = summary["config"]
    print(f"{run_dir}: {config['dataset']} ({config['encoder']}), {config['head']} "
          f"{config['schedule']}, partition {config['partition']}, seed {config['seed']}"
          f"{'; R(t) against its IID twin' if twin else ''}")
    print(summary_lines(summary, twin))
    replace_durably(run_dir / PLOT_FILE, plot_run(summary, twin))
    print(run_dir / PLOT_FILE)
    return 0
