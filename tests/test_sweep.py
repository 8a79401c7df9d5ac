"""Presets and the sweep runner: expansion, pairing, checks, resume, subsets."""

from pathlib import Path

import pytest

from ovalp_flwr.data.domains import num_domains
from ovalp_flwr.experiments.sweep import (
    PAPER_SEEDS,
    PresetError,
    RunSpec,
    config_mismatch,
    is_done,
    load_preset,
    main,
    run_config_arg,
    select,
    sweep,
)

CONF = Path(__file__).resolve().parent.parent / "conf"

TINY = """
[preset]
description = "digits through pixels, for tests"
num-supernodes = 10
seeds = [0, 1]

[config]
dataset = "digits"
encoder = "pixels"
num-server-rounds = 2
feature-cache-dir = "{cache}"

[axes.method]
ova-lp = {{ head = "ova", schedule = "two-stage" }}
lp-softmax = {{ head = "softmax", schedule = "single-stage" }}

[axes.partition]
iid = {{ partition = "iid" }}
shard-1 = {{ partition = "shard", classes-per-client = 1 }}
"""


def write(tmp_path: Path, text: str, name: str = "tiny") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text.format(cache=tmp_path / "cache"))
    return path


def test_every_shipped_preset_loads_and_validates_every_run():
    presets = sorted(CONF.glob("*.toml"))
    assert len(presets) >= 5
    for path in presets:
        preset = load_preset(path)
        partitions = {spec.run_config.get("partition") for spec in preset.runs()}
        if "domain" in partitions:  # clients that differ in what they see: one per domain
            assert preset.seeds == PAPER_SEEDS[:3] and preset.config["num-server-rounds"] == 20
            assert preset.num_supernodes == num_domains(preset.config["dataset"])
        elif "personalize" in preset.config:  # the personalization study's protocol
            assert preset.seeds == PAPER_SEEDS[:3] and preset.num_supernodes == 20
        elif any(s.run_config.get("server-optimizer") == "lbfgs" for s in preset.runs()):
            # the server optimiser's study (issue 31): three seeds, 20 rounds; 30 where the
            # weight decay's path (7 values x 2 rounds at most) comes first (issue 45)
            assert preset.seeds == PAPER_SEEDS[:3] and preset.num_supernodes == 100
            walks = any(s.run_config.get("weight-decay") == "auto" for s in preset.runs())
            assert preset.config["num-server-rounds"] == (30 if walks else 20)
        elif any(s.run_config.get("attack", "none") != "none" for s in preset.runs()):
            # the robustness grid (issue 32): one seed (three for the recommended defence's
            # rows), 100 clients, the default's rounds, or the start alone (issue 46)
            assert preset.seeds in (PAPER_SEEDS[:1], PAPER_SEEDS[:3])
            assert preset.num_supernodes == 100
            assert preset.config.get("num-server-rounds", "default") in ("default", 0)
        elif any(s.run_config.get(key, 0) for key in ("dp-statistics-epsilon", "dp-rounds-epsilon")
                 for s in preset.runs()):
            # the DP table (issue 32): one seed, 100 clients, accuracy against epsilon; and at
            # scale (issue 46): 1,000 and 10,000 clients, sampled
            assert preset.seeds == PAPER_SEEDS[:1]
            assert preset.num_supernodes == 100 or (
                preset.name == f"privacy-{preset.num_supernodes}"
                and preset.config["fraction-train"] < 1)
        elif preset.name.startswith("one-round-heads"):
            # today's one-round heads beside ours (issue 58): three seeds, 100 clients, FedCOF's
            # protocol among the partitions; the heads alone, or 5 (digits) or 20 rounds from them
            assert preset.seeds == PAPER_SEEDS[:3] and preset.num_supernodes == 100
            assert "flwr:DirichletPartitioner" in partitions
            assert preset.config["num-server-rounds"] in (0, 5, 20)
            assert {"fedcof", "fed3r", "lda"} <= {s.run_config.get("head-init") for s in preset.runs()}
        else:  # the OvA-LP paper's
            assert preset.seeds == PAPER_SEEDS and preset.num_supernodes == 100
            assert preset.config["num-server-rounds"] == 50
        names = [s.name for s in preset.runs()]
        assert len(names) == len(set(names))  # one folder per run


def test_runs_are_the_product_of_axes_times_seeds_paired_with_iid(tmp_path):
    preset = load_preset(write(tmp_path, TINY))
    runs = preset.runs()
    assert [s.name for s in runs[:4]] == ["ova-lp-iid-seed0", "ova-lp-shard-1-seed0",
                                          "lp-softmax-iid-seed0", "lp-softmax-shard-1-seed0"]
    assert len(runs) == 8
    shard = runs[3]
    assert shard.run_config["head"] == "softmax" and shard.run_config["classes-per-client"] == 1
    assert shard.run_config["seed"] == 0
    assert shard.reference() == (("method", "lp-softmax"), ("partition", "iid"))
    assert runs[2].reference() is None


def test_only_keeps_matching_runs_and_names_the_axes_on_a_typo(tmp_path):
    runs = load_preset(write(tmp_path, TINY)).runs()
    kept = select(runs, ["method=ova-lp", "seed=1"])
    assert [s.name for s in kept] == ["ova-lp-iid-seed1", "ova-lp-shard-1-seed1"]
    with pytest.raises(PresetError, match="axis one of: seed, method, partition"):
        select(runs, ["methd=ova-lp"])


@pytest.mark.parametrize("change, match", [
    (("head = \"ova\"", "head = \"mlp\""), "run ova-lp-iid-seed0: run config: head='mlp'"),
    (("[config]", "[config]\nseed = 3"), "seed is set by the sweep"),
    (("num-supernodes = 10", "num-supernodes = 0"), "num-supernodes=0 is not allowed"),
    (("[preset]", "[preset]\nrounds = 3"), "key 'rounds' is not allowed"),
    (("[preset]", "[preset]\ntarget-accuracy = 60"), "target-accuracy=60 is not allowed"),
    (("[preset]", "[preset]\ntarget-accuracy = '0.6'"), "target-accuracy='0.6' is not allowed"),
])
def test_bad_presets_fail_before_anything_runs_with_one_line(tmp_path, change, match):
    with pytest.raises(PresetError, match=match):
        load_preset(write(tmp_path, TINY.replace(*change)))


def test_run_config_arg_quotes_strings_only():
    assert run_config_arg({"head": "ova", "seed": 3, "noise-rate": 0.5}) == \
        "head='ova' seed=3 noise-rate=0.5"


@pytest.mark.slow
def test_sweep_runs_what_is_missing_and_resumes(tmp_path, capsys):
    preset = load_preset(write(tmp_path, TINY))
    specs = select(preset.runs(), ["seed=0"])
    assert sweep(preset, specs[:1], tmp_path / "results", "local") == {}
    assert is_done(preset, specs[0], tmp_path / "results")
    assert not is_done(preset, specs[1], tmp_path / "results")
    assert sweep(preset, specs, tmp_path / "results", "local") == {}
    out = capsys.readouterr().out
    assert "4 runs, 1 already done, 3 to run" in out
    assert all(is_done(preset, s, tmp_path / "results") for s in specs)
    # a summary from another config is not taken for this run
    changed = load_preset(write(tmp_path, TINY.replace("num-server-rounds = 2",
                                                       "num-server-rounds = 3")))
    assert not is_done(changed, changed.runs()[0], tmp_path / "results")


def test_a_run_another_sweep_finished_meanwhile_is_skipped(tmp_path, capsys, monkeypatch):
    from ovalp_flwr.experiments import sweep as sweep_module

    preset = load_preset(write(tmp_path, TINY))
    first, second = select(preset.runs(), ["seed=0"])[:2]
    run_one, ran = sweep_module.run_one, []

    def and_another_sweep(preset, spec, results_root, runner):
        ran.append(spec.name)
        if spec == first:  # meanwhile a second sweep of the preset finishes `second`
            run_one(preset, second, results_root, runner)
        return run_one(preset, spec, results_root, runner)

    monkeypatch.setattr(sweep_module, "run_one", and_another_sweep)
    assert sweep(preset, [first, second], tmp_path / "results", "local") == {}
    assert ran == [first.name]
    assert f"{second.name}: done meanwhile, skipped" in capsys.readouterr().out


def test_cli_lists_runs_and_reports_a_bad_preset_in_one_line(tmp_path, capsys):
    path = write(tmp_path, TINY)
    assert main([str(path), "--list", "--only", "seed=1",
                 "--results-dir", str(tmp_path / "r")]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "todo  ova-lp-iid-seed1", "todo  ova-lp-shard-1-seed1",
        "todo  lp-softmax-iid-seed1", "todo  lp-softmax-shard-1-seed1"]
    assert main([str(tmp_path / "nope.toml")]) == 2
    assert capsys.readouterr().err.startswith("error: preset ")


def test_a_sweep_refuses_a_robust_rule_its_clients_cannot_hold_before_any_run(tmp_path, capsys):
    path = write(tmp_path, TINY.replace('num-server-rounds = 2', 'num-server-rounds = 2\n'
                                        'robust-aggregation = "multi-krum"\n'
                                        'robust-fraction = 0.4'))
    assert main([str(path), "--runner", "local", "--results-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "run ova-lp-iid-seed0: multi-krum with robust-fraction=0.4" in err[0]
    assert "(10 SuperNodes x fraction-train=1.0: 10 clients a round)" in err[0]
    assert not (tmp_path / "r").exists()


def test_a_failed_run_of_a_sweep_is_its_last_line_and_a_non_zero_exit(tmp_path, capsys,
                                                                     monkeypatch):
    import ovalp_flwr.experiments.sweep as sweep_module

    def refused(preset, spec, results_root, runner):
        raise RuntimeError("round 1: trimmed-mean with robust-fraction=0.1 cuts none")

    monkeypatch.setattr(sweep_module, "run_one", refused)
    path = write(tmp_path, TINY)
    assert main([str(path), "--only", "seed=0", "--only", "method=ova-lp", "--only",
                 "partition=iid", "--results-dir", str(tmp_path / "r")]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: run ova-lp-iid-seed0 failed: round 1: trimmed-mean with robust-fraction=0.1 "
        "cuts none")


def test_a_run_made_under_another_default_is_not_reused():
    from ovalp_flwr.config import RunConfig

    spec = RunSpec(0, (("method", "m"),), {"dataset": "digits", "seed": 0})
    ran = {**RunConfig(seed=0).to_dict(), "results-dir": "/elsewhere", "run-name": "x"}
    assert config_mismatch(spec, ran) is None  # where it was written does not matter
    assert config_mismatch(spec, {**ran, "learning-rate": 0.01}) == \
        "ran with learning-rate=0.01, preset asks 0.05"  # the preset left it to the default


def test_the_knobs_of_a_method_the_run_did_not_use_do_not_count():
    """A run without personalization is the same run whatever own-heads' mu; one that ran
    own-heads is not."""
    from ovalp_flwr.config import RunConfig

    ran = {k: v for k, v in RunConfig(seed=0).to_dict().items() if k != "pft.own-heads.mu"}
    plain = RunSpec(0, (("method", "m"),), {"dataset": "digits", "seed": 0})
    assert config_mismatch(plain, ran) is None
    own = RunSpec(0, (("method", "m"),), {"dataset": "digits", "seed": 0,
                                          "personalize": "own-heads"})
    assert config_mismatch(own, {**ran, "personalize": "own-heads"}) == \
        "ran with pft.own-heads.mu='(absent)', preset asks 1.0"


def test_runs_from_before_pft_global_scored_global_on_the_clients():
    """Who scored Global counts only for a run that personalized; before the key, the clients."""
    from ovalp_flwr.config import RunConfig

    ran = {k: v for k, v in RunConfig(seed=0).to_dict().items() if k != "pft-global"}
    assert config_mismatch(RunSpec(0, (("m", "m"),), {"dataset": "digits", "seed": 0}), ran) is None
    spec = {"dataset": "digits", "seed": 0, "personalize": "ft"}
    ran = {**ran, "personalize": "ft"}
    assert config_mismatch(RunSpec(0, (("m", "m"),), spec), ran) == \
        "ran with pft-global='(absent)', preset asks 'server'"
    assert config_mismatch(RunSpec(0, (("m", "m"),), {**spec, "pft-global": "clients"}), ran) is None


def test_a_summary_from_before_a_key_existed_ran_what_came_before_it():
    """Runs made before the quantity-skew keys took the paper's recipe, today's defaults or not;
    runs made before `head-init` started from torch's random init."""
    from ovalp_flwr.config import RECIPE, RunConfig

    recipe = RunSpec(0, (("method", "m"),), {"dataset": "digits", "seed": 0, **RECIPE})
    new_keys = {"local-optimizer", "local-steps", "aggregation-weights", "drift-correction",
                "server-optimizer", "server-learning-rate", "epoch-size", "head-init",
                "ridge-lambda"}
    older = {k: v for k, v in RunConfig(seed=0).to_dict().items() if k not in new_keys}
    older["learning-rate"], older["weight-decay"] = 0.01, 1e-4
    assert config_mismatch(recipe, older) is None
    today = RunSpec(0, (("method", "m"),), {"dataset": "digits", "seed": 0})  # SCAFFOLD now
    assert config_mismatch(today, older) == \
        "ran with learning-rate=0.01, preset asks 0.05"
    assert config_mismatch(today, {**older, "learning-rate": 0.05}) == \
        "ran with weight-decay=0.0001, preset asks 0.01"
    assert config_mismatch(today, {**older, "learning-rate": 0.05, "weight-decay": 0.01}) == \
        "ran with local-optimizer='(absent)', preset asks 'sgd'"
    started = RunSpec(0, (("method", "m"),), {"dataset": "digits", "seed": 0, **RECIPE,
                                              "head-init": "ridge"})
    assert config_mismatch(started, older) == "ran with head-init='(absent)', preset asks 'ridge'"


def test_runs_are_compared_by_the_validation_rows_they_held_back():
    """A run from before `validation-fraction` held none back: reused where the preset's
    "auto" resolves to 0, rerun where it now holds rows back (its choices read the test split)."""
    from ovalp_flwr.config import RunConfig

    before = {k: v for k, v in RunConfig(seed=0).to_dict().items() if k != "validation-fraction"}
    plain = RunSpec(0, (("m", "m"),), {"dataset": "digits", "seed": 0})
    assert config_mismatch(plain, before) is None
    checked = {"dataset": "digits", "seed": 0, "robust-start": "leave-out"}
    assert config_mismatch(RunSpec(0, (("m", "m"),), checked),
                           {**before, "robust-start": "leave-out"}) == \
        "ran with validation-fraction=0.0, preset asks 0.1"
    today = {**RunConfig.from_mapping(checked).to_dict(), "validation-fraction": "auto"}
    assert config_mismatch(RunSpec(0, (("m", "m"),), checked), today) is None


def test_lbfgs_runs_from_before_the_held_heads_are_rerun_and_other_runs_are_not():
    """Before `lbfgs-patience`, an L-BFGS round reported its trial point: such a run is not
    today's; for a run without L-BFGS the key means nothing."""
    from ovalp_flwr.config import RunConfig

    before = {k: v for k, v in RunConfig(seed=0).to_dict().items() if k != "lbfgs-patience"}
    assert config_mismatch(RunSpec(0, (("m", "m"),), {"dataset": "digits", "seed": 0}),
                           before) is None
    lbfgs = {"dataset": "digits", "seed": 0, "server-optimizer": "lbfgs",
             "drift-correction": "none"}
    assert config_mismatch(RunSpec(0, (("m", "m"),), lbfgs), {**before, **lbfgs}) == \
        "ran with lbfgs-patience='(absent)', preset asks 3"
