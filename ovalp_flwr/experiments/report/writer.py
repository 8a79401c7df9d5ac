"""Puts a preset's report on disk: its figures, CSVs and report.md under `<out>/<preset>/`.

Every file is replaced atomically, so a report remade while someone reads it (or one whose
making is interrupted) never shows half a file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ovalp_flwr.core.durable import replace_durably
from ovalp_flwr.experiments.ceiling import CEILING_FILE
from ovalp_flwr.experiments.report import personalization
from ovalp_flwr.experiments.report.document import Context, markdown
from ovalp_flwr.experiments.report.plots import PLOTS, plots
from ovalp_flwr.experiments.report.runs import ReportError, load_runs, personalized_runs
from ovalp_flwr.experiments.report.tables import runs_csv, table_csv
from ovalp_flwr.experiments.sweep import Preset, RunSpec


def write_report(preset: Preset, specs: Sequence[RunSpec], results_root: Path, out_root: Path,
                 command: str, ceilings: Path = CEILING_FILE) -> Path:
    """Everything under out_root/<preset>/; returns report.md. ReportError if no run is done."""
    runs, missing = load_runs(preset, specs, results_root, ceilings)
    results_dir = preset.results_dir(results_root)
    if not runs:
        raise ReportError(f"preset {preset.name}: none of its {len(specs)} runs is done under "
                          f"{results_dir}; run `python -m ovalp_flwr.experiments.sweep "
                          f"{preset.path}` first")
    out_dir = out_root / preset.name
    out_dir.mkdir(parents=True, exist_ok=True)
    images = plots(preset, runs)
    for stale in set(PLOTS) - images.keys():  # a plot this report cannot make must not linger
        (out_dir / stale).unlink(missing_ok=True)
    personalized = personalized_runs(preset, runs, results_dir)
    files = {**images, **(personalization.files(personalized) if personalized else {}),
             "runs.csv": runs_csv(preset, runs), "table.csv": table_csv(preset, runs)}
    seeds = list(dict.fromkeys(s.seed for s in specs))
    context = Context(preset, runs, missing, seeds, results_dir, command, list(images),
                      personalized)
    for name, data in {**files, "report.md": markdown(context)}.items():
        replace_durably(out_dir / name, data)
    return out_dir / "report.md"
