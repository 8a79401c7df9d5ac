"""The robustness report's tables and plot, from the committed run summaries of six presets.

- `conf/robustness.toml`: update attacks x every defence, per setting (10% attackers, seed 0);
- `conf/robustness-statistics.toml`: forged statistics x (no defence, the recommended one);
- `conf/robustness-recommended.toml`: the recommended defence on three seeds, and at one
  attacker and at 20%;
- `conf/robustness-count-cap.toml`: inflated counts (stats-count) against `weight-cap`, and the
  cap's clean cost under quantity skew;
- `conf/robustness-start.toml`: the start alone against 10% forging together, by check;
- `conf/privacy.toml`: accuracy against ε for the DP start and the DP rounds.

Each cell is a final accuracy (%) with, in brackets, its points against the clean run with no
defence (the same seed). A run that is not in `results/` reads "not run". Writes
`reports/robustness/pivot.md`, `reports/robustness/privacy.md` and `privacy.png`:

    .venv/bin/python benchmarks/robustness_table.py
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

from ovalp_flwr.core.durable import replace_durably
from ovalp_flwr.experiments.sweep import Preset, is_done, load_preset
from ovalp_flwr.federation.results import read_summary

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "robustness"
UPDATE_ATTACKS = ["scale-10", "scale-100", "sign-flip", "label-flip"]
STATISTICS_ATTACKS = ["stats-flip", "stats-gram", "stats-count"]
EPSILONS = ["eps1", "eps2", "eps4", "eps8", "none"]
SCALES = (1000, 10000)  # conf/privacy-<n>.toml: DP at scale, 100 clients sampled a round


def summaries(preset: Preset) -> dict[tuple[tuple[str, str], ...], dict]:
    """(axis choices..., ("seed", s)) -> summary, for the preset's runs in results/ that today's
    code would make as they were made (`sweep.is_done`): a run of older behaviour is missing."""
    found = {}
    for spec in preset.runs():
        if is_done(preset, spec, ROOT / "results"):
            path = preset.results_dir(ROOT / "results") / spec.name
            found[(*spec.choices, ("seed", str(spec.seed)))] = read_summary(path)
    return found


def final(summary: dict | None) -> float | None:
    return None if summary is None else 100.0 * summary["final_accuracy"]


def cell(value: float | None, clean: float | None) -> str:
    if value is None:
        return "not run"
    return f"{value:.2f}" if clean is None else f"{value:.2f} ({value - clean:+.2f})"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
            + ["| " + " | ".join(row) + " |" for row in rows] + [""])


class Grids:
    """The presets' summaries, and the cells the tables read."""

    def __init__(self) -> None:
        self.presets = {name: load_preset(ROOT / "conf" / f"{name}.toml") for name in
                        ("robustness", "robustness-statistics", "robustness-recommended",
                         "robustness-count-cap", "robustness-start", "privacy",
                         *(f"privacy-{n}" for n in SCALES))}
        self.runs = {name: summaries(preset) for name, preset in self.presets.items()}

    def get(self, preset: str, seed: int = 0, **choices: str) -> dict | None:
        axes = self.presets[preset].axes
        key = (*((axis, choices[axis]) for axis in axes), ("seed", str(seed)))
        return self.runs[preset].get(key)

    def clean(self, setting: str, seed: int) -> float | None:
        """The clean run with no defence: seed 0's from the grid, the others' from the
        recommended preset's clean-undefended rows."""
        if seed == 0:
            return final(self.get("robustness", setting=setting, attack="clean", defence="mean"))
        return final(self.get("robustness-recommended", seed, setting=setting,
                              attackers="ten-percent", attack="clean-undefended"))

    def recommended(self, setting: str, attack: str, seed: int, attackers: str) -> float | None:
        """The recommended defence (norm clipping + the leave-out start) under an attack. Seed
        0 at 10%: the statistics grid's "recommended" column for the clean run and forged
        statistics, the recommended preset's own seed-0 runs for update attacks (the grid's
        norm-clip runs hold no validation rows back, so they are not the same runs)."""
        if seed == 0 and attackers == "ten-percent" and \
                (attack == "clean" or attack in STATISTICS_ATTACKS):
            return final(self.get("robustness-statistics", setting=setting, attack=attack,
                                  defence="recommended"))
        return final(self.get("robustness-recommended", seed, setting=setting,
                              attackers=attackers, attack=attack))


def attack_grid(grids: Grids, preset: str, columns: str, clean_of) -> list[str]:
    """Per setting, a table of the preset's attacks (rows) by the `columns` axis, each cell
    against `clean_of(setting)`."""
    axes, lines = grids.presets[preset].axes, []
    for setting in axes["setting"]:
        clean = clean_of(setting)
        rows = [[attack] + [cell(final(grids.get(preset, setting=setting, attack=attack,
                                                 **{columns: column})), clean)
                            for column in axes[columns]] for attack in axes["attack"]]
        lines += [f"### {setting}", ""] + table(["attack", *axes[columns]], rows)
    return lines


def update_attack_tables(grids: Grids) -> list[str]:
    return (["## Update attacks x every defence (10% attackers, seed 0)", ""]
            + attack_grid(grids, "robustness", "defence", lambda setting: grids.clean(setting, 0)))


def statistics_tables(grids: Grids) -> list[str]:
    axes = grids.presets["robustness-statistics"].axes
    lines = ["## Forged statistics (10% attackers, seed 0)", "",
             "Start: the accuracy before round 1. Left out: the clients the leave-out check took "
             "out of the start's sums (of the attackers drawn).", ""]
    for setting in axes["setting"]:
        clean = grids.clean(setting, 0)
        rows = []
        for attack in axes["attack"]:
            row = [attack]
            for defence in axes["defence"]:
                run = grids.get("robustness-statistics", setting=setting, attack=attack,
                                defence=defence)
                start = "" if run is None else f"; start {100 * run['initial_accuracy']:.2f}"
                left = "" if run is None or "left_out" not in run["head_init"] else \
                    f"; left out {len(run['head_init']['left_out'])}"
                row.append(cell(final(run), clean) + start + left)
            rows.append(row)
        lines += [f"### {setting}", ""] + table(["attack", *axes["defence"]], rows)
    return lines


def seed_tables(grids: Grids) -> list[str]:
    seeds = list(grids.presets["robustness-recommended"].seeds)
    attacks = ["clean", *UPDATE_ATTACKS, "stats-gram"]
    lines = ["## The recommended defence on three seeds (10% attackers)", "",
             "Points against each seed's clean run with no defence; the last column is their "
             "mean and the worst seed.", ""]
    for setting in grids.presets["robustness"].axes["setting"]:
        rows = []
        for attack in attacks:
            diffs, row = [], [attack]
            for seed in seeds:
                value, clean = grids.recommended(setting, attack, seed, "ten-percent"), \
                    grids.clean(setting, seed)
                row.append(cell(value, clean))
                if value is not None and clean is not None:
                    diffs.append(value - clean)
            row.append(f"{statistics.mean(diffs):+.2f} (worst {min(diffs):+.2f})"
                       if len(diffs) == len(seeds) else "incomplete")
            rows.append(row)
        lines += [f"### {setting}", ""] + table(
            ["attack", *(f"seed {s}" for s in seeds), "mean (worst)"], rows)
    return lines


def fraction_tables(grids: Grids) -> list[str]:
    shares = {"one": "1 attacker", "ten-percent": "10%", "twenty-percent": "20%"}
    lines = ["## The recommended defence against how many attack (seed 0)", "",
             "The share is of the clients that hold data (CIFAR-10 Bernoulli-Dirichlet: 11 of "
             "100; TinyImageNet-100: 64 of 100; IID: all 100).", ""]
    for setting in grids.presets["robustness"].axes["setting"]:
        clean = grids.clean(setting, 0)
        rows = [[attack] + [cell(grids.recommended(setting, attack, 0, share), clean)
                            for share in shares]
                for attack in ["scale-100", "sign-flip", "label-flip", "stats-gram"]]
        lines += [f"### {setting}", ""] + table(["attack", *shares.values()], rows)
    return lines


def count_cap_tables(grids: Grids) -> list[str]:
    def clean(setting: str) -> float | None:
        return final(grids.get("robustness-count-cap", setting=setting, attack="clean",
                               cap="none"))

    return (["## A cap on what a count buys (10% attackers, seed 0)", "",
             "`conf/robustness-count-cap.toml`: FedAvg's mean without a cap and with "
             "`weight-cap`; points against its own clean run without a cap.", ""]
            + attack_grid(grids, "robustness-count-cap", "cap", clean))


def start_cell(run: dict | None, clean: float | None) -> str:
    """The start's accuracy against the clean one; the clients the check took out; the check's
    seconds against the start's own (its set-up exchanges and solve)."""
    if run is None:
        return "not run"
    start = run["head_init"]
    screened = len(start.get("screened", []))
    verdict = "" if not screened else \
        f"; screened {screened}, " + ("out" if start["screened_out"] else "mended"
                                      if start.get("screen_repaired") else "kept")
    left = len(start.get("left_out", []))
    own = run["setup"]["seconds"] + start["server_seconds"]
    check = start.get("check_seconds", start.get("screen_seconds"))
    return (cell(100.0 * run["initial_accuracy"], clean) + verdict
            + (f"; left out {left}" if left else "")
            + ("" if check is None else f"; check {check / own:.2f}x the start"))


def start_check_tables(grids: Grids) -> list[str]:
    axes = grids.presets["robustness-start"].axes
    lines = ["## The start against 10% forging together, by check (seed 0)", "",
             "`conf/robustness-start.toml`, the start alone: its accuracy (%) and, in brackets, "
             "points against the clean start without a check; screened: the clients that broke "
             "the consensus or their own moments, and whether they went out of the sums "
             "together, were mended to agree with their moments (whichever made the start better "
             "on validation rows by the margin) or stayed as sent; left out: the leave-out "
             "check's, after; the check's time against the start's own (set-up exchanges and "
             "solve).", ""]
    for setting in axes["setting"]:
        clean_run = grids.get("robustness-start", setting=setting, attack="clean", check="none")
        clean = None if clean_run is None else 100.0 * clean_run["initial_accuracy"]
        rows = [[attack] + [start_cell(grids.get("robustness-start", setting=setting,
                                                 attack=attack, check=check), clean)
                            for check in axes["check"]] for attack in axes["attack"]]
        lines += [f"### {setting}", ""] + table(["attack", *axes["check"]], rows)
    return lines


def privacy_cell(run: dict | None, kind: str) -> tuple[str, float | None]:
    """A DP run's final accuracy (%) with the ε its accountant reports, and the accuracy."""
    if run is None:
        return "not run", None
    spent = run.get("privacy", {}).get("rounds" if kind == "rounds" else "statistics")
    value = 100.0 * run["final_accuracy"]
    return f"{value:.2f}" + (f" (ε {spent['epsilon']:.3f})" if spent else ""), value


def epsilon_table(columns: list[tuple[str, str]], get, offered) -> tuple[list[str], dict]:
    """Rows ε, columns (label, kind): each cell `get(column, eps)`'s run; "—" where the
    column's preset has no such run (`offered(column, eps)` false)."""
    points: dict = {column: [] for column in columns}
    rows = []
    for eps in EPSILONS:
        row = ["∞ (no noise)" if eps == "none" else eps.removeprefix("eps")]
        for column in columns:
            if not offered(column, eps):
                row.append("—")
                continue
            text, value = privacy_cell(get(column, eps), column[1])
            row.append(text)
            if value is not None:
                points[column].append((math.inf if eps == "none" else float(eps[3:]), value))
        rows.append(row)
    return table(["ε", *(f"{label} {kind}" for label, kind in columns)], rows), points


def privacy_rows(grids: Grids) -> tuple[list[str], dict]:
    preset = grids.presets["privacy"]
    columns = [(setting, kind) for setting in preset.axes["setting"]
               for kind in ("start", "secagg", "rounds")]
    return epsilon_table(
        columns, lambda c, eps: grids.get("privacy", setting=c[0], privacy=f"{c[1]}-{eps}"),
        lambda c, eps: True)


def scale_rows(grids: Grids) -> tuple[list[str], dict]:
    """CIFAR-10 IID's DP rounds and start at 100 clients (every client, 20 rounds) and at
    1,000 and 10,000 (100 sampled a round, 50 rounds)."""
    columns = [("100 clients", "rounds"), *((f"{n:,} clients", kind) for n in SCALES
                                             for kind in ("start", "rounds"))]

    def preset_of(column: tuple[str, str]) -> str:
        return "privacy" if column[0] == "100 clients" else \
            f"privacy-{column[0].split()[0].replace(',', '')}"

    def get(column: tuple[str, str], eps: str) -> dict | None:
        choices = {"setting": "cifar10-iid"} if preset_of(column) == "privacy" else {}
        return grids.get(preset_of(column), privacy=f"{column[1]}-{eps}", **choices)

    return epsilon_table(columns, get, lambda c, eps: f"{c[1]}-{eps}" in
                         grids.presets[preset_of(c)].axes["privacy"])


def privacy_plot(points: dict, path: Path, title: str = "Accuracy against ε") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.4, 4.0), constrained_layout=True)
    for (setting, kind), values in points.items():
        finite = sorted((e, a) for e, a in values if math.isfinite(e))
        if not finite:
            continue
        line = axis.plot(*zip(*finite), marker="o", label=f"{setting}, DP {kind}")[0]
        for e, a in values:
            if not math.isfinite(e):
                axis.axhline(a, color=line.get_color(), linestyle=":", linewidth=1)
    axis.set(xscale="log", xlabel="ε (δ = 1e-5)", ylabel="final accuracy (%)",
             title=f"{title} (dotted: the same run without noise)")
    axis.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
    if axis.lines:
        axis.legend(fontsize=7)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> int:
    grids = Grids()
    counts = ", ".join(f"{name}: {len(grids.runs[name])} runs" for name in grids.runs)
    lines = ["# Robustness: attacks and defences", "",
             f"Made by `python benchmarks/robustness_table.py` from `results/` ({counts}). "
             "Final accuracy (%) after 20 rounds, 100 clients; in brackets, points against the "
             "clean run with no defence (same seed).", "", *update_attack_tables(grids),
             *statistics_tables(grids), *start_check_tables(grids), *count_cap_tables(grids),
             *seed_tables(grids),
             *fraction_tables(grids)]
    replace_durably(REPORT / "pivot.md", "\n".join(lines))
    privacy_table, points = privacy_rows(grids)
    scale_table, scale_points = scale_rows(grids)
    privacy = ["# Differential privacy: accuracy against ε", "",
               "Made by `python benchmarks/robustness_table.py` from `results/privacy/` "
               "(`conf/privacy.toml`). Final accuracy (%) with, in brackets, the ε the "
               "accountant reports for the noise used (δ = 1e-5; neighbouring datasets: "
               "replace-one; noise from OS entropy, so a rerun gives other figures). Start: "
               "the DP statistics' start alone (example-level), the noise added by the server "
               "(central). Secagg: the same, each client adding its share of the noise before "
               "SecAgg+ masks its statistics (distributed). Rounds: 20 DP rounds from zero heads "
               "(client-level). ∞: the same run without noise.", "", *privacy_table,
               "![accuracy against epsilon](privacy.png)", "",
               "## At scale: 1,000 and 10,000 clients", "",
               "`conf/privacy-1000.toml`, `conf/privacy-10000.toml`: CIFAR-10 IID. Rounds: 50 DP "
               "rounds from zero heads, 100 clients sampled a round (a fixed number, from OS "
               "entropy), accounted with the amplification of that sampling; beside them, the "
               "100-client rounds above (every client, 20 rounds). Start: the DP statistics' "
               "start alone. —: not in the preset.", "", *scale_table,
               "![accuracy against epsilon at scale](privacy_scale.png)", ""]
    replace_durably(REPORT / "privacy.md", "\n".join(privacy))
    privacy_plot(points, REPORT / "privacy.png")
    privacy_plot(scale_points, REPORT / "privacy_scale.png", "CIFAR-10 IID at scale")
    print("\n".join(lines + privacy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
