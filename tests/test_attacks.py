"""Attack rehearsal (`federation.attacks`, the attacks in `federation.adversary`): the attackers are the seed's choice, the poisoned
updates are what they claim, and on a small federation each defence beats a scaled update that
FedAvg's mean does not survive (`federation.robust`)."""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ovalp_flwr.federation.aggregators import RULES
import ovalp_flwr
from ovalp_flwr.federation.adversary import ATTACKS, attack
from ovalp_flwr.federation.attacks import attackers
from ovalp_flwr.federation.local_grid import run_local
from ovalp_flwr.federation.results import read_summary


def test_the_attackers_are_a_seeded_share_of_the_partitions():
    chosen = attackers(0, [5] * 100, 0.1)
    assert len(chosen) == 10 and chosen == attackers(0, [5] * 100, 0.1)
    assert chosen != attackers(1, [5] * 100, 0.1)
    assert len(attackers(0, [5] * 100, 0.01)) == 1 and len(attackers(0, [5] * 10, 0.01)) == 1
    assert attackers(3, [1] * 7, 1.0) == frozenset(range(7))


def test_the_attackers_hold_data():
    """Under heavy label skew most clients hold no rows: the share is of those that do."""
    sizes = [0] * 100
    for holder in (3, 17, 40, 41, 42, 60, 61, 62, 80, 99, 12):
        sizes[holder] = 500
    for seed in range(20):
        chosen = attackers(seed, sizes, 0.1)
        assert len(chosen) == 1 and all(sizes[i] > 0 for i in chosen)
    assert len(attackers(0, sizes, 0.2)) == 2
    assert attackers(0, [0] * 10, 0.5) == frozenset()


def test_an_update_attack_scales_the_update_and_a_gradient_reply_itself():
    sent = {"weight": np.ones((2, 2), np.float32)}
    trained = {"weight": np.full((2, 2), 1.5, np.float32)}
    assert np.allclose(attack("scale-10").update(trained, sent, gradient=False)["weight"], 6.0)
    assert np.allclose(attack("sign-flip").update(trained, sent, gradient=False)["weight"], 0.5)
    assert np.allclose(attack("scale-100").update(trained, sent, gradient=True)["weight"], 150.0)
    assert attack("scale-10").update(trained, sent, gradient=False)["weight"].dtype == np.float32


def final_accuracy(cache_dir, tmp_path, name, **overrides):
    options = {"encoder": "pixels", "feature-cache-dir": str(cache_dir), "head-init": "random",
               "results-dir": str(tmp_path / "results"), "num-server-rounds": 4,
               "partition": "iid", "run-name": name, **overrides}
    return read_summary(run_local(options, 10))["rounds"][-1]["accuracy"]


@pytest.fixture(scope="module")
def baselines(cache_dir, tmp_path_factory):
    """The clean run's accuracy, and FedAvg's under one client of ten scaling its update x100."""
    tmp = tmp_path_factory.mktemp("attacks")
    return (final_accuracy(cache_dir, tmp, "clean"),
            final_accuracy(cache_dir, tmp, "undefended", attack="scale-100", **{"attack-fraction": 0.1}))


@pytest.mark.slow
@pytest.mark.parametrize("defence", list(RULES))
def test_each_defence_beats_a_scaled_update_that_the_mean_does_not_survive(
        cache_dir, tmp_path, baselines, defence):
    """SCAFFOLD on (the default): the variates learn only from admitted updates."""
    clean, undefended = baselines
    assert undefended < clean - 0.2  # without a defence the attack wins
    defended = final_accuracy(cache_dir, tmp_path, defence, attack="scale-100",
                              **{"attack-fraction": 0.1, "robust-aggregation": defence})
    assert defended > clean - 0.03, (defence, clean, defended)


def test_label_flip_trains_on_labels_moved_one_class_on(cache_dir, tmp_path):
    """Every client flipping: the federation learns the shifted labels, so it scores near 0."""
    flipped = final_accuracy(cache_dir, tmp_path, "all-flip", attack="label-flip",
                             **{"attack-fraction": 1.0})
    assert flipped < 0.1


def test_a_statistics_attack_forges_what_every_check_still_passes():
    from ovalp_flwr.core.head_init.statistics import ClassStatistics
    from ovalp_flwr.federation.validation import check_statistics

    def forged(arrays, kind):
        return attack(kind).statistics(arrays)

    rows, labels = np.random.default_rng(0).normal(size=(30, 4)), np.arange(30) % 3
    honest = ClassStatistics.of(torch.from_numpy(rows), torch.from_numpy(labels), 3, True).to_arrays()
    for kind in ("stats-flip", "stats-gram", "stats-count"):
        sent = forged(honest, kind)
        examples = 300 if kind == "stats-count" else 30  # it describes 10x its rows too
        assert check_statistics(sent, 3, 4, examples) is None, kind
    assert np.array_equal(forged(honest, "stats-flip")["sums"], -honest["sums"])
    assert np.allclose(forged(honest, "stats-gram")["gram-triu"], 10 * honest["gram-triu"])
    assert np.array_equal(forged(honest, "stats-count")["counts"], 10 * honest["counts"])


def test_each_attack_lies_only_where_it_says():
    sent, trained = {"weight": np.ones(2, np.float32)}, {"weight": np.full(2, 2.0, np.float32)}
    labels = torch.tensor([0, 1, 2])
    for kind in ATTACKS:
        lie = attack(kind)
        moved_update = not np.array_equal(lie.update(trained, sent, False)["weight"],
                                          trained["weight"])
        assert moved_update == (kind in ("scale-10", "scale-100", "sign-flip")), kind
        assert lie.updates_only == moved_update, kind  # what the encoder path may rehearse
        assert torch.equal(lie.labels(labels, 3), labels) == (kind != "label-flip"), kind
        assert (lie.count(5) == 5) == (kind != "stats-count"), kind


NEW_ATTACK = '''"""`zero-update`: sends the global model back unchanged (a free rider)."""

from ovalp_flwr.federation.adversary.base import Attack


class ZeroUpdate(Attack):
    name = "zero-update"
    updates_only = True

    def update(self, arrays, sent, gradient):
        return {key: 0 * value if gradient else sent[key] for key, value in arrays.items()}
'''


def test_a_new_attack_is_one_file(tmp_path):
    """A file dropped into `federation/adversary/` is an attack the config accepts, on both
    paths (it lies only in its update), with nothing else edited."""
    package = Path(ovalp_flwr.__file__).parent
    shutil.copytree(package, tmp_path / "ovalp_flwr", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "ovalp_flwr" / "federation" / "adversary" / "zero_update.py").write_text(NEW_ATTACK)
    check = ("from ovalp_flwr.config import RunConfig; "
             "from ovalp_flwr.federation.adversary import ATTACKS, UPDATES_ONLY, attack; "
             "RunConfig.from_mapping({'attack': 'zero-update', 'finetune': 'lp', 'head-init': 'random'}); "
             "print(sorted(set(ATTACKS) - set(sys.argv[1:])), 'zero-update' in UPDATES_ONLY, "
             "type(attack('zero-update')).__name__)")
    out = subprocess.run([sys.executable, "-c", "import sys; " + check, *ATTACKS], cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    assert out.split() == ["['zero-update']", "True", "ZeroUpdate"]
