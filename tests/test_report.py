"""The preset report: numbers checked by hand on fabricated runs, then one report of real runs."""

import contextlib
import csv
import io
import json
import shutil
import subprocess
import sys

import pytest

from ovalp_flwr.config import RunConfig
from ovalp_flwr.experiments.report import main
from ovalp_flwr.federation.results import read_summary, write_run
from ovalp_flwr.experiments.sweep import load_preset, sweep


ABLATION = """\
[preset]
description = "tiny ablation"
num-supernodes = 10
seeds = [0, 1]
[config]
dataset = "digits"
encoder = "pixels"
num-server-rounds = 4
[axes.method]
a = { head = "softmax", schedule = "single-stage" }
b = { head = "ova", schedule = "two-stage" }
[axes.partition]
iid = { partition = "iid" }
shard-1 = { partition = "shard", classes-per-client = 1 }
"""

NOISE = """\
[preset]
description = "tiny noise"
num-supernodes = 10
seeds = [0, 1]
[config]
dataset = "digits"
encoder = "pixels"
num-server-rounds = 3
[axes.method]
a = { head = "ova", schedule = "two-stage" }
[axes.noise]
none = { label-noise = "none", noise-rate = 0.0 }
"sym-0.5" = { label-noise = "symmetric", noise-rate = 0.5 }
"""

# every round costs 0.5 client s, 0.1 + 0.05 server s and 10 x 1000 bytes each way (0.02 MB)
ROUND_COSTS = {"stage": 2, "client_train_seconds_mean": 0.5, "server_aggregate_seconds": 0.1,
               "server_eval_seconds": 0.05, "bytes_sent_per_client": 1000, "clients_sampled": 10,
               "bytes_received_per_client": 1000, "clients_trained": 10}

ABLATION_CURVES = {  # b-shard-1-seed1 is left out: a missing run
    "a-iid-seed0": [0.5, 0.7, 0.8, 0.8],       # Acc@95 = 3 (0.76)
    "a-iid-seed1": [0.6, 0.9, 1.0, 1.0],       # Acc@95 = 3 (0.95)
    "a-shard-1-seed0": [0.1, 0.2, 0.3, 0.4],   # R = 50, Acc@95 = 4 (0.38)
    "a-shard-1-seed1": [0.2, 0.6, 0.58, 0.6],  # R = 60, Acc@95 = 2 (0.57)
    "b-iid-seed0": [0.8, 0.8, 0.8, 0.8],
    "b-iid-seed1": [0.9, 0.9, 0.9, 0.9],
    "b-shard-1-seed0": [0.4, 0.6, 0.72, 0.72],  # R = 90
}

NOISE_CURVES = {  # decline 25% and 50%: 37.5 ± 17.68; realised rate 49% and 51%
    "a-none-seed0": ([0.7, 0.8, 0.8], 0.0),
    "a-none-seed1": ([0.8, 0.9, 0.9], 0.0),
    "a-sym-0.5-seed0": ([0.5, 0.6, 0.6], 0.49),
    "a-sym-0.5-seed1": ([0.4, 0.45, 0.45], 0.51),
}


def write_preset(tmp_path, text, name):
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return load_preset(path)


def fabricate(preset, results, name, curve, realised=0.0, initial=0.1, setup=None, extra=None,
              **config_changes):
    """A summary in the real format, with the resolved run config `sweep.is_done` checks."""
    spec = next(s for s in preset.runs() if s.name == name)
    resolved = RunConfig.from_mapping(spec.run_config).to_dict()
    rounds = [{"round": t, "accuracy": a, **ROUND_COSTS} for t, a in enumerate(curve, 1)]
    summary = {
        "final_accuracy": (curve or [initial])[-1], "best_accuracy": max(curve or [initial]),
        "initial_accuracy": initial, **({"setup": setup} if setup else {}),
        "config": {**resolved, "run-name": name, **config_changes}, "rounds": rounds,
        "label_noise": {"kind": spec.run_config.get("label-noise", "none"),
                        "rate": spec.run_config.get("noise-rate", 0.0), "realised_rate": realised},
        **(extra or {}),
    }
    write_run(preset.results_dir(results), name, summary)


def report(tmp_path, preset, *extra, results=None):
    """The preset's report of `results` (default tmp_path/results) in tmp_path/reports."""
    argv = [str(preset.path), "--results-dir", str(results or tmp_path / "results"),
            "--out", str(tmp_path / "reports"), *extra]
    assert main(argv) == 0
    return tmp_path / "reports" / preset.name


@pytest.fixture(scope="module")
def ablation_once(tmp_path_factory):
    """The tiny ablation's preset and fabricated runs, written once for the module: each
    `write_run` draws the run's accuracy plot (~0.3 s of CPU, 7 runs), which no report reads."""
    root = tmp_path_factory.mktemp("ablation")
    preset = write_preset(root, ABLATION, "tiny-ablation")
    for name, curve in ABLATION_CURVES.items():
        fabricate(preset, root / "results", name, curve)
    return preset


@pytest.fixture
def ablation(ablation_once, tmp_path):
    """The tiny ablation in this test's tmp_path: a copy of the module's, which a test may
    add runs to."""
    shutil.copytree(ablation_once.path.parent, tmp_path, dirs_exist_ok=True)
    return load_preset(tmp_path / ablation_once.path.name)


@pytest.fixture(scope="module")
def ablation_report(ablation_once, tmp_path_factory):
    """The tiny ablation's report with the default options, made once (~3 s of CPU: its plots)
    for the tests that only read it: (its folder, what `main` printed)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        out = report(tmp_path_factory.mktemp("ablation-report"), ablation_once,
                     results=ablation_once.path.parent / "results")
    return out, printed.getvalue()


def ablation_variant(tmp_path, ablation_once, text, name):
    """An ABLATION preset that differs in preset options only, with ABLATION_CURVES' runs:
    copies of the module's fabrications (its runs' configs are checked to be the same)."""
    preset = write_preset(tmp_path, text, name)
    assert [s.run_config for s in preset.runs()] == [s.run_config for s in ablation_once.runs()]
    shutil.copytree(ablation_once.results_dir(ablation_once.path.parent / "results"),
                    preset.results_dir(tmp_path / "results"))
    return preset


def rows_of(path):
    """runs.csv rows by run name; table.csv rows by `method-partition`."""
    with open(path) as handle:
        rows = list(csv.DictReader(handle))
    return {row.get("run") or f"{row['method']}-{row['partition']}": row for row in rows}


def test_main_table_has_r_final_acc95_and_costs_by_hand(ablation_once, ablation_report):
    out, printed = ablation_report
    assert printed.strip() == str(out / "report.md")
    text = (out / "report.md").read_text()
    # a, shard-1: final 40/60, best 40/60, R 50/60, Acc@95 4/2, client s 2/1, server s .6/.3,
    # MB .08/.04
    assert ("| a | shard-1 | 50.00 ± 14.14 | 50.00 ± 14.14 | 55.00 ± 7.07 | 3.0 ± 1.4 | "
            "1.50 ± 0.71 | 0.450 ± 0.212 | 0.060 ± 0.028 | 2 |") in text
    assert "| a | iid | 90.00 ± 14.14 | 90.00 ± 14.14 |  | 3.0 ± 0.0 |" in text  # no R for IID
    assert "| b | shard-1 | 72.00 ± — | 72.00 ± — | 90.00 ± — | 3.0 ± — |" in text  # one seed
    assert "**R(t)** = Acc_nonIID(t) / Acc_IID(t) x 100" in text
    assert f"python -m ovalp_flwr.experiments.report {ablation_once.path}" in text
    assert "3 cell(s) with 2 seed(s); 1 cell(s) with 1 seed(s)" in text


def test_ablation_pivots_rows_methods_columns_partitions(ablation_report):
    text = (ablation_report[0] / "report.md").read_text()
    r_pivot = text.split("## Ablation: R(final) (%)")[1].split("##")[0]
    assert "| method | shard-1 |" in r_pivot and "| method | iid |" not in r_pivot
    assert "| a | 55.00 ± 7.07 |" in r_pivot and "| b | 90.00 ± — |" in r_pivot
    acc_pivot = text.split("## Ablation: final accuracy (%)")[1].split("##")[0]
    assert "| method | iid | shard-1 |" in acc_pivot
    assert "| b | 85.00 ± 7.07 | 72.00 ± — |" in acc_pivot


@pytest.mark.slow
def test_round_to_a_target_accuracy_by_hand(ablation_once, tmp_path):
    preset = ablation_variant(tmp_path, ablation_once, ABLATION.replace(
        "seeds = [0, 1]", "seeds = [0, 1]\ntarget-accuracy = 0.6"), "tiny-target")
    out = report(tmp_path, preset)
    text = (out / "report.md").read_text()
    assert "**Round to 60%** = the first round" in text
    # a-iid reaches 0.6 in rounds 2 and 1; a-shard-1 only with seed 1 (round 2); b-shard-1 round 2
    pivot = text.split("## Ablation: round to 60%")[1].split("##")[0]
    assert "| a | 1.5 ± 0.7 | 2.0 ± — (n=1) |" in pivot
    assert "| b | 1.0 ± 0.0 | 2.0 ± — |" in pivot
    assert "| a | shard-1 | 50.00 ± 14.14 |" in text and "| 2.0 ± — (n=1) | 2 |" in text
    rows = rows_of(out / "runs.csv")
    assert rows["a-shard-1-seed0"]["rounds_to_target"] == ""
    assert rows["a-shard-1-seed1"]["rounds_to_target"] == "2"
    assert float(rows_of(out / "table.csv")["a-iid"]["rounds_to_target_mean"]) == 1.5

    never = ablation_variant(tmp_path, ablation_once, ABLATION.replace(
        "seeds = [0, 1]", "seeds = [0, 1]\ntarget-accuracy = 0.95"), "tiny-never")
    pivot = (report(tmp_path, never) / "report.md").read_text().split(
        "## Ablation: round to 95%")[1].split("##")[0]
    assert "| a | 3.0 ± — (n=1) | never |" in pivot and "| b | never | never |" in pivot


CEILING = """\
[preset]
description = "tiny ceiling"
num-supernodes = 10
seeds = [0, 1]
ceiling-fraction = 0.95
[config]
dataset = "digits"
encoder = "pixels"
num-server-rounds = 4
[axes.method]
ridge = { head-init = "ridge" }
fed3r = { head-init = "ridge", num-server-rounds = 0 }
[axes.partition]
iid = { partition = "iid" }
"""


def write_ceilings(tmp_path):
    """digits / pixels: multinomial is better on validation (0.70) and scores 0.8 on test; the
    one-vs-rest fit scores higher on test (0.85) but is not chosen."""
    fit = {"multinomial": (0.70, 0.8), "one-vs-rest": (0.69, 0.85)}
    case = {kind: {"best_lambda": 0.01, "validation_accuracy": {"0.01": val},
                   "test_accuracy": test} for kind, (val, test) in fit.items()}
    path = tmp_path / "ceilings.json"
    path.write_text(json.dumps({"cases": {"digits:pixels": case}}))
    return path


def test_speed_to_the_ceiling_by_hand(tmp_path):
    """Bar = 95% of a ceiling of 0.8 = 0.76; set-up: 5,000 bytes; rounds: 20,000 bytes each."""
    preset = write_preset(tmp_path, CEILING, "tiny-ceiling")
    ceilings = write_ceilings(tmp_path)
    setup = {"bytes_sent": 1000.0, "bytes_received": 4000.0}
    fabricate(preset, tmp_path / "results", "ridge-iid-seed0", [0.7, 0.8, 0.9, 0.9], initial=0.5,
              setup=setup)  # the bar in round 2
    fabricate(preset, tmp_path / "results", "ridge-iid-seed1", [0.77, 0.8, 0.9, 0.9],
              initial=0.5, setup=setup)  # in round 1
    fabricate(preset, tmp_path / "results", "fed3r-iid-seed0", [], initial=0.78, setup=setup)
    fabricate(preset, tmp_path / "results", "fed3r-iid-seed1", [], initial=0.6, setup=setup)
    out = report(tmp_path, preset, "--ceilings", str(ceilings))
    text = (out / "report.md").read_text()
    assert "kind (multinomial or one-vs-rest) chosen on a held-out tenth" in text
    assert "digits / pixels 80.00%" in text  # the kind better on validation, not on test
    speed = text.split("## Speed to the ceiling")[1].split("##")[0]
    # start, rounds 1, 2, 3, 5 (past the last round: the last), final, R, round to bar, MB
    assert ("| ridge | iid | 50.00 ± 0.00 | 73.50 ± 4.95 | 80.00 ± 0.00 | 90.00 ± 0.00 | "
            "90.00 ± 0.00 | 90.00 ± 0.00 |  | 1.5 ± 0.7 | 0.035 ± 0.014 | 2 |") in speed
    # no rounds: the start at every round; only seed 0 is at the bar, in round 0 (set-up bytes)
    assert ("| fed3r | iid | 69.00 ± 12.73 | 69.00 ± 12.73 | 69.00 ± 12.73 | 69.00 ± 12.73 | "
            "69.00 ± 12.73 | 69.00 ± 12.73 |  | 0.0 ± — (n=1) | 0.005 ± — (n=1) | 2 |") in speed
    rows = rows_of(out / "runs.csv")
    assert rows["fed3r-iid-seed1"]["rounds_to_target"] == ""
    assert float(rows["ridge-iid-seed0"]["target_pct"]) == pytest.approx(76.0)
    assert float(rows["ridge-iid-seed0"]["megabytes_to_target"]) == pytest.approx(0.045)
    assert (out / "ceiling.png").stat().st_size > 10_000
    pivot = text.split("## Ablation: accuracy after round 1 (%)")[1].split("##")[0]
    assert "| fed3r | 69.00 ± 12.73 |" in pivot


def test_worst_partition_names_it_and_counts_never_and_missing_partitions(tmp_path):
    """Bar = 76%: ridge is there from the start on iid, in round 2 on shard-1 (seed 0) and never
    on shard-1 (seed 1); fed3r has run on iid only."""
    preset = write_preset(tmp_path, CEILING + 'shard-1 = { partition = "shard" }\n',
                          "tiny-ceiling")
    ceilings = write_ceilings(tmp_path)
    results = tmp_path / "results"
    for seed in (0, 1):
        fabricate(preset, results, f"ridge-iid-seed{seed}", [0.8, 0.8, 0.9, 0.9], initial=0.78)
        fabricate(preset, results, f"fed3r-iid-seed{seed}", [], initial=0.78)
    fabricate(preset, results, "ridge-shard-1-seed0", [0.7, 0.8, 0.7, 0.72], initial=0.68)
    fabricate(preset, results, "ridge-shard-1-seed1", [0.7, 0.7, 0.7, 0.72], initial=0.68)
    text = (report(tmp_path, preset, "--ceilings", str(ceilings)) / "report.md").read_text()
    worst = text.split("## Worst partition")[1].split("## Plots")[0]
    tables = {block.split("\n")[0]: block for block in worst.split("### ")[1:]}
    assert "| ridge | 70.00 (shard-1) |" in tables["Round 3 (%)"]  # iid: 90
    assert "| ridge | 72.00 (shard-1) |" in tables["Final acc. (%)"]
    assert "| ridge | 80.00 (shard-1) |" in tables["R(final) (%)"]  # 72 / 90
    assert "| ridge | never (shard-1) |" in tables["Round to 95% of ceiling"]
    # fed3r: every run at the bar from the start, on the one partition it has so far
    assert "| fed3r | 0.0 (iid, 1/2) |" in tables["Round to 95% of ceiling"]
    assert "| fed3r |  |" in tables["R(final) (%)"]  # no shard-1 run, so no R


def test_a_ceiling_preset_without_a_measured_ceiling_says_how_to_measure_it(tmp_path, capsys):
    preset = write_preset(tmp_path, CEILING, "tiny-ceiling")
    fabricate(preset, tmp_path / "results", "fed3r-iid-seed0", [], initial=0.78)
    argv = [str(preset.path), "--results-dir", str(tmp_path / "results"), "--out",
            str(tmp_path / "reports"), "--ceilings", str(tmp_path / "none.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: preset tiny-ceiling: no centralised ceiling for digits:pixels in "
                   f"{tmp_path / 'none.json'}; measure it with `python benchmarks/"
                   "centralised_ceiling.py --case digits:pixels`")


def validated(final, best_round, test_at_best):
    return {"validation": {"fraction": 0.1, "rows": 50, "initial_accuracy": 0.5,
                           "final_accuracy": final},
            "best_val_round": best_round, "accuracy_at_best_val_round": test_at_best}


def test_validation_rows_table_by_hand(ablation, tmp_path):
    """Runs that held validation rows back get the table a choice is made on: the validation
    accuracy beside the test's, the round it picks and the test accuracy there."""
    for name, curve in ABLATION_CURVES.items():
        if name.startswith("a-iid"):
            seed = int(name[-1])
            fabricate(ablation, tmp_path / "results", name, curve,
                      extra=validated([0.5, 0.7][seed], 3 + seed, curve[2 + seed]))
    text = (report(tmp_path, ablation) / "report.md").read_text()
    table = text.split("## Validation rows")[1].split("##")[0]
    assert ("| Final val. acc. (%) | Final acc. (%) | Best round on val. | Test acc. there (%) |"
            in table)
    # a / iid: validation 50 and 70; test finals as fabricated; rounds 3 and 4
    a_iid = next(line for line in table.splitlines() if line.startswith("| a | iid |"))
    assert "60.00 ± 14.14" in a_iid and "3.5 ± 0.7" in a_iid
    # b never held rows back: blank validation cells, its test figures still there
    b_iid = next(line for line in table.splitlines() if line.startswith("| b | iid |"))
    assert b_iid.split("|")[3].strip() == ""


def test_a_report_of_runs_without_validation_rows_has_no_such_table(ablation_report):
    assert "## Validation rows" not in (ablation_report[0] / "report.md").read_text()


def test_no_target_accuracy_no_column(ablation_report):
    out = ablation_report[0]
    assert "Round to" not in (out / "report.md").read_text()
    assert "rounds_to_target" not in (out / "runs.csv").read_text()


def test_missing_and_stale_runs_are_listed_not_fatal(ablation, tmp_path):
    fabricate(ablation, tmp_path / "results", "b-shard-1-seed1", [0.5] * 4,
              **{"num-server-rounds": 9})  # run with another config: does not count
    text = (report(tmp_path, ablation) / "report.md").read_text()
    missing = text.split("## Missing runs (1)")[1]
    assert "`b-shard-1-seed1`: ran with num-server-rounds=9, preset asks 4" in missing
    assert "7 of 8 runs found" in text


def test_runs_csv_has_one_row_per_run_with_choices_and_metrics(ablation_report):
    rows = rows_of(ablation_report[0] / "runs.csv")
    assert sorted(rows) == sorted(ABLATION_CURVES)
    row = rows["a-shard-1-seed1"]
    assert (row["preset"], row["seed"], row["method"], row["partition"]) == (
        "tiny-ablation", "1", "a", "shard-1")
    assert float(row["r_final_pct"]) == pytest.approx(60.0)
    assert row["acc_at_95"] == "2"
    assert float(row["client_seconds"]) == pytest.approx(1.0)
    assert float(row["server_seconds"]) == pytest.approx(0.3)
    assert float(row["megabytes"]) == pytest.approx(0.04)
    assert rows["a-iid-seed0"]["r_final_pct"] == ""
    assert "decline_pct" not in row  # no noise axis


def test_table_csv_has_mean_and_std_columns(ablation_report):
    rows = rows_of(ablation_report[0] / "table.csv")
    assert float(rows["a-shard-1"]["r_final_mean"]) == pytest.approx(55.0)
    assert float(rows["a-shard-1"]["r_final_std"]) == pytest.approx(50 ** 0.5)
    assert rows["b-shard-1"]["r_final_std"] == "" and rows["b-shard-1"]["seeds"] == "1"


def test_plots_are_written_and_not_empty(ablation_report):
    out = ablation_report[0]
    for name in ("curves.png", "relative.png", "r_final.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / name).stat().st_size > 10_000
    assert not list(out.glob(".*"))  # no temporary files left behind


def test_seeds_option_restricts_the_report(ablation, tmp_path):
    text = (report(tmp_path, ablation, "--seeds", "0") / "report.md").read_text()
    assert "4 of 4 runs found" in text and "## Missing runs" not in text
    assert "| a | shard-1 | 40.00 ± — | 40.00 ± — | 50.00 ± — | 4.0 ± — |" in text


def test_only_option_reports_the_subset_and_leaves_the_rest_out(ablation, tmp_path):
    text = (report(tmp_path, ablation, "--only", "method=a") / "report.md").read_text()
    assert "4 of 4 runs found" in text and "## Missing runs" not in text
    assert "| a | shard-1 |" in text and "| b |" not in text
    assert "--only method=a" in text  # the command that made it
    iid_only = (report(tmp_path, ablation, "--only", "partition=iid") / "report.md").read_text()
    assert "## Ablation: final accuracy" in iid_only and "R(final) (%)\n" not in iid_only


def test_noise_decline_and_realised_rate_by_hand(tmp_path):
    preset = write_preset(tmp_path, NOISE, "tiny-noise")
    for name, (curve, realised) in NOISE_CURVES.items():
        fabricate(preset, tmp_path / "results", name, curve, realised)
    out = report(tmp_path, preset)
    text = (out / "report.md").read_text()
    assert "| method | sym-0.5 decline (%) |" in text
    assert "| a | 37.50 ± 17.68 |" in text
    assert "| sym-0.5 | symmetric | 50.00 | 50.00 ± 1.41 | 2 |" in text
    assert "| none | none | 0.00 | 0.00 ± 0.00 | 2 |" in text
    assert "## Ablation" not in text  # no partition axis: no R anywhere
    rows = rows_of(out / "runs.csv")
    assert float(rows["a-sym-0.5-seed1"]["decline_pct"]) == pytest.approx(50.0)
    assert float(rows["a-sym-0.5-seed0"]["realised_noise_pct"]) == pytest.approx(49.0)
    assert rows["a-none-seed0"]["decline_pct"] == ""
    assert (out / "curves.png").stat().st_size > 10_000
    assert not (out / "relative.png").exists() and not (out / "r_final.png").exists()


def test_zero_runs_is_a_one_line_error(tmp_path):
    preset = write_preset(tmp_path, ABLATION, "tiny-ablation")
    done = subprocess.run(
        [sys.executable, "-m", "ovalp_flwr.experiments.report", str(preset.path),
         "--results-dir", str(tmp_path / "results"), "--out", str(tmp_path / "reports")],
        capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "tiny-ablation" in lines[0] and "none of its 8 runs" in lines[0]
    assert not (tmp_path / "reports").exists()


@pytest.mark.slow
def test_report_of_real_local_runs(tmp_path):
    text = ABLATION.replace("seeds = [0, 1]", "seeds = [0]").replace(
        "num-server-rounds = 4",
        f"num-server-rounds = 3\nfeature-cache-dir = \"{tmp_path / 'cache'}\"")
    preset = write_preset(tmp_path, text, "tiny-real")
    assert sweep(preset, preset.runs(), tmp_path / "results", "local") == {}
    out = report(tmp_path, preset)
    rows = rows_of(out / "runs.csv")
    assert sorted(rows) == ["a-iid-seed0", "a-shard-1-seed0", "b-iid-seed0", "b-shard-1-seed0"]
    for name in ("a-shard-1-seed0", "b-shard-1-seed0"):
        assert 0 < float(rows[name]["r_final_pct"]) < 200
        assert 1 <= int(rows[name]["acc_at_95"]) <= 3
        assert float(rows[name]["megabytes"]) > 0 and float(rows[name]["client_seconds"]) > 0
    assert "4 of 4 runs found" in (out / "report.md").read_text()
    assert all((out / n).stat().st_size > 10_000 for n in ("curves.png", "relative.png",
                                                            "r_final.png"))


PERSONALIZATION = """\
[preset]
description = "tiny personalization"
num-supernodes = 4
seeds = [0, 1]
[config]
dataset = "digits"
encoder = "pixels"
feature-cache-dir = "{cache}"
num-server-rounds = 2
partition = "bernoulli-dirichlet"
dirichlet-p = 1.0
dirichlet-alpha = 0.1
adapter-dim = 8
head-init = "random"
personalize = "ft lp lp-ft soup"
personalize-curve = "1"
pft-epochs = 2
pft.soup.candidates = 2
pft.lp-ft.lp-epochs = 1
[axes.federation]
ova-lp = {{ head = "ova" }}
"""


@pytest.mark.slow
def test_report_of_personalized_runs_has_the_table_and_its_plots(tmp_path):
    preset = write_preset(tmp_path, PERSONALIZATION.format(cache=tmp_path / "cache"), "tiny-pft")
    assert sweep(preset, preset.runs(), tmp_path / "results", "local") == {}
    out = report(tmp_path, preset)
    text = (out / "report.md").read_text()
    assert "## Personalization" in text and "## Plots" in text
    table = text.split("### Table (mean ± std over seeds)")[1].split("###")[0]
    rows = [line for line in table.splitlines() if line.startswith("| ova-lp |")]
    assert [row.split(" | ")[1] for row in rows] == ["global", "ft", "lp", "lp-ft", "soup"]
    assert all(row.split(" | ")[2] == "2" for row in rows)  # both seeds
    summaries = [read_summary(tmp_path / "results" / "tiny-pft" / f"ova-lp-seed{seed}")
                 for seed in (0, 1)]
    ft_local = [s["personalization"]["methods"]["ft"]["summary"]["local"] * 100 for s in summaries]
    mean = sum(ft_local) / 2
    assert f"| ova-lp | ft | 2 | {mean:.1f} ± " in table
    methods = [s["personalization"]["methods"] for s in summaries]
    gaps = [100 * (m["lp-ft"]["summary"]["global"] - m["ft"]["summary"]["global"]) for m in methods]
    paired = text.split("### LP-FT against FT (paired by seed)")[1]
    assert f"| ova-lp | 2 | {sum(gaps) / 2:.1f} ± {abs(gaps[0] - gaps[1]) / 2 ** 0.5:.1f} |" in paired
    assert all((out / n).stat().st_size > 10_000 for n in ("distortion_vs_global.png",
                                                            "pft_epochs.png"))
    assert len((out / "personalization.csv").read_text().splitlines()) == 1 + 5  # header, methods


def test_per_domain_table_by_hand(tmp_path):
    """Multi-domain runs: each domain's final accuracy over seeds, the worst domain and the gap."""
    preset = write_preset(tmp_path, ABLATION, "tiny-domains")
    per_domain = {"a-iid-seed0": {"mnist": 0.9, "usps": 0.7},
                  "a-iid-seed1": {"mnist": 0.8, "usps": 0.8},
                  "b-iid-seed0": {"mnist": 0.6, "usps": 0.4}}
    for name, domains in per_domain.items():
        spec = next(s for s in preset.runs() if s.name == name)
        resolved = RunConfig.from_mapping(spec.run_config).to_dict()
        rounds = [{"round": t, "accuracy": 0.5, "domain_accuracy": domains, **ROUND_COSTS}
                  for t in range(1, 5)]
        write_run(preset.results_dir(tmp_path / "results"), name, {
            "final_accuracy": 0.5, "best_accuracy": 0.5, "initial_accuracy": 0.1,
            "config": {**resolved, "run-name": name}, "rounds": rounds,
            "domain_accuracy": {"initial": domains, "final": domains}})
    text = (report(tmp_path, preset) / "report.md").read_text()
    table = text.split("## Per domain: final accuracy (%)")[1].split("##")[0]
    assert "| domain | a, iid | b, iid |" in table  # only cells with per-domain runs
    assert "| mnist | 85.00 ± 7.07 | 60.00 ± — |" in table
    assert "| usps | 75.00 ± 7.07 | 40.00 ± — |" in table
    assert "| worst domain | 75.00 ± 7.07 | 40.00 ± — |" in table  # 0.7 and 0.8
    assert "| best - worst | 10.00 ± 14.14 | 20.00 ± — |" in table  # 0.2 and 0.0
    assert "![domains.png](domains.png)" in text
    assert (tmp_path / "reports" / preset.name / "domains.png").read_bytes()[:4] == b"\x89PNG"
