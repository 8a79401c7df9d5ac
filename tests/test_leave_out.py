"""The start checked before it is used (`core.head_init.leave_out`): a client whose absence
makes the start better is left out, one at a time, and on honest statistics no one is."""

import numpy as np
import pytest
import torch

from ovalp_flwr.core.head_init.leave_out import group_gain, leave_out_check, without
from ovalp_flwr.core.head_init.ridge import RidgeInit
from ovalp_flwr.core.head_init.statistics import ClassStatistics
from ovalp_flwr.federation.local_grid import run_local
from ovalp_flwr.federation.results import read_summary


def blobs(rng, n, classes):
    labels = rng.choice(classes, n)
    centres = np.eye(8)[:4] * 3.0
    return centres[labels] + rng.normal(size=(n, 8)), labels


def stats_of(rows, labels):
    return ClassStatistics.of(torch.from_numpy(rows), torch.from_numpy(labels), 4, True)


def test_a_forged_client_is_left_out_and_honest_ones_are_not():
    rng = np.random.default_rng(0)
    parts = {node: stats_of(*blobs(rng, 200, [node % 4, (node + 1) % 4])) for node in range(8)}
    test_rows, test_labels = blobs(rng, 2000, [0, 1, 2, 3])
    honest = ClassStatistics.merge(list(parts.values()))
    init = RidgeInit(0.01)
    clean = leave_out_check(init, honest, parts, test_rows, test_labels, 0, margin=0.005)
    assert clean.left_out == []
    bad = parts[3]
    parts[3] = ClassStatistics(bad.counts, -10 * bad.sums, bad.square_norms, bad.gram)
    forged = ClassStatistics.merge(list(parts.values()))
    check = leave_out_check(init, forged, parts, test_rows, test_labels, 0, margin=0.005)
    assert check.left_out == [3] and check.gains[0] > 0.005
    assert np.allclose(without(forged, parts[3]).sums, without(honest, bad).sums)


def test_the_checked_starts_drop_a_forged_gram_that_the_plain_start_is_hurt_by(cache_dir, tmp_path):
    """Label skew, one attacker scaling its Gram matrix: the start falls; checked, the
    attacker alone is found (its square norms disagree with the moments it described) and
    mended, which beats taking it out (it alone holds its class), and no one is found on the
    clean run."""
    options = {"encoder": "pixels", "feature-cache-dir": str(cache_dir), "num-server-rounds": 0,
               "results-dir": str(tmp_path), "partition": "shard", "classes-per-client": 1,
               "attack-fraction": 0.1, "ridge-lambda": 0.001}
    def start(name, **overrides):
        return read_summary(run_local({**options, "run-name": name, **overrides}, 10))
    clean, forged_run = start("clean"), start("forged", attack="stats-gram")
    checked = start("checked", attack="stats-gram", **{"robust-start": "leave-out"})
    screened = start("screened", attack="stats-gram", **{"robust-start": "screen"})
    clean_checked = start("clean-checked", **{"robust-start": "leave-out"})
    assert forged_run["initial_accuracy"] < clean["initial_accuracy"] - 0.2
    clean_held = start("clean-held", **{"validation-fraction": 0.1})
    for run in (checked, screened):
        (out,) = run["head_init"]["screened"]
        assert out["why"] == "square norms 10x what its moments give"
        assert run["head_init"]["screen_repaired"] and not run["head_init"]["screened_out"]
        assert run["head_init"]["repair_gain"] > run["head_init"]["screen_gain"] > 0.2
        assert run["initial_accuracy"] == pytest.approx(clean_held["initial_accuracy"], abs=1e-9)
    assert checked["head_init"]["left_out"] == [] and "left_out" not in screened["head_init"]
    assert clean_checked["head_init"]["left_out"] == []
    assert clean_checked["head_init"]["screened"] == []
    assert not clean_checked["head_init"]["screened_out"]
    # the check holds back its validation rows (`validation-fraction` "auto": 0.1); on them it
    # changes nothing
    assert clean_checked["initial_accuracy"] == clean_held["initial_accuracy"]


def test_a_screened_group_stays_in_when_the_start_is_worse_without_it():
    """Label skew where the forgers alone hold their classes: leaving them out loses the
    classes, which costs more than their forgery; the group is judged on validation rows."""
    rng = np.random.default_rng(1)
    parts = {node: stats_of(*blobs(rng, 200, [node % 4])) for node in range(4)}
    rows, labels = blobs(rng, 2000, [0, 1, 2, 3])
    honest = ClassStatistics.merge(list(parts.values()))
    assert group_gain(RidgeInit(0.01), honest, parts, [3], rows, labels, 0) < -0.2
    assert group_gain(RidgeInit(0.01), honest, parts, [], rows, labels, 0) == 0.0
