"""A preset's results as one report: Markdown tables, CSVs and plots under `reports/<preset>/`.

Reads every run of the preset that is done (`results/<preset>/<run>/summary.json` with the
config the preset asks for); runs not there are listed in the report, not fatal, so a report
can be made while a sweep is still going. Numbers are mean ± std over the seeds found:

- R(t) = Acc_nonIID(t) / Acc_IID(t) x 100, each non-IID run against the IID run with the same
  other choices and seed (`RunSpec.reference()`), then averaged over seeds;
- Acc@95 and the costs summed over rounds 1..Acc@95 (`ovalp_flwr.federation.metrics`);
- with `target-accuracy` in the preset, the round each run first reaches that accuracy; with
  `ceiling-fraction`, the round it reaches that share of its dataset's centralised ceiling
  (`benchmarks/centralised_ceiling.py`), the bytes moved to get there, and its accuracy at the
  start and after the first rounds;
- with a `noise` axis, the decline rate against the noise-free run of the same choices and seed;
- with `personalize` in the runs, the personalization section (`personalization`).

    python -m ovalp_flwr.experiments.report conf/tinyimagenet-ablation.toml --seeds 0 42

One concern per module, each importing only those before it: `runs` (reading and pairing
finished runs), `cells` (mean ± std, metric columns, formats), `tables` (Markdown and CSV),
`plots` (figures), `personalization` (its section), `document` (report.md as a list of
sections), `writer` (the files on disk), `cli` (the command line; `__main__` runs it).
"""

from ovalp_flwr.experiments.report.cli import main
from ovalp_flwr.experiments.report.runs import ReportError, RunResult, load_runs
from ovalp_flwr.experiments.report.writer import write_report

__all__ = ["ReportError", "RunResult", "load_runs", "main", "write_report"]
