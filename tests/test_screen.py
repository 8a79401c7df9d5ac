"""The consensus screen (`core.head_init.screen`): forgers acting together are each out of line
with the median client, whatever the others send; honest clients, IID or label-skewed, are not."""

import numpy as np
import torch

from ovalp_flwr.config import RunConfig
from ovalp_flwr.core.head_init.screen import repaired, screen
from ovalp_flwr.core.head_init.statistics import ClassStatistics
from ovalp_flwr.core.normalize import standardized_totals

CLASSES = 4


def client(rng, n, classes):
    labels = rng.choice(classes, n)
    rows = np.eye(8)[:CLASSES][labels] * 3.0 + rng.normal(size=(n, 8))
    return ClassStatistics.of(torch.from_numpy(rows), torch.from_numpy(labels), CLASSES, True)


def federation(skewed: bool, clients: int = 20) -> dict[int, ClassStatistics]:
    rng = np.random.default_rng(0)
    return {node: client(rng, 200, [node % CLASSES, (node + 1) % CLASSES] if skewed
                         else list(range(CLASSES))) for node in range(clients)}


def forged(stats: ClassStatistics, kind: str) -> ClassStatistics:
    if kind == "stats-gram":
        return ClassStatistics(stats.counts, stats.sums, 10 * stats.square_norms, 10 * stats.gram)
    if kind == "stats-count":
        return ClassStatistics(10 * stats.counts, stats.sums, stats.square_norms, stats.gram)
    if kind == "stats-flip":
        return ClassStatistics(stats.counts, -stats.sums, stats.square_norms, stats.gram)
    return ClassStatistics(stats.counts, 10 * stats.sums, stats.square_norms, stats.gram)


def test_honest_clients_iid_or_label_skewed_are_not_screened():
    assert screen(federation(False)) == {} and screen(federation(True)) == {}


def test_a_third_of_the_clients_forging_together_are_each_screened_out():
    for skewed in (False, True):
        for kind, why in (("stats-gram", "mean square norm"), ("stats-count", "mean square norm"),
                          ("stats-flip", "against its holders' median"),
                          ("sums-x10", "longer than its rows")):
            parts = federation(skewed, clients=21)
            for node in range(0, 21, 3):  # 7 of 21
                parts[node] = forged(parts[node], kind)
            out = screen(parts)
            assert sorted(out) == list(range(0, 21, 3)), (skewed, kind, out)
            assert all(why in reason for reason in out.values())


def test_a_class_its_forger_holds_alone_has_no_consensus_to_break():
    parts = federation(True, clients=4)  # each class held by two clients: too few to screen
    parts[0] = forged(parts[0], "stats-flip")
    assert screen(parts) == {}


def test_empty_clients_are_neither_read_as_consensus_nor_screened():
    parts = federation(False)
    parts[99] = ClassStatistics(np.zeros(CLASSES), np.zeros((CLASSES, 8)), np.zeros(CLASSES),
                                np.zeros((8, 8)))
    assert screen(parts) == {}


def test_the_screens_group_is_judged_on_validation_rows():
    assert RunConfig(robust_start="screen").validation_share > 0.0
    assert RunConfig(robust_start="screen").choices == ("robust-start",)


def standardised_federation(clients: int = 6):
    """Clients each holding one class alone (no consensus anywhere), with the moments they
    described and their statistics of rows standardised by the federation's mean and std."""
    from ovalp_flwr.core.normalize import FeatureMoments, NormStats, normalize

    rng = np.random.default_rng(1)
    raw = {node: (np.abs(np.eye(8)[node % CLASSES] * 3.0 + rng.normal(size=(50 + node, 8))),
                  np.full(50 + node, node % CLASSES)) for node in range(clients)}
    moments = {node: FeatureMoments.of(rows) for node, (rows, _) in raw.items()}
    norm = NormStats.from_moments(FeatureMoments.merge(list(moments.values())))
    parts = {node: ClassStatistics.of(torch.from_numpy(normalize("standardize", rows, norm)),
                                      torch.from_numpy(labels), CLASSES, True)
             for node, (rows, labels) in raw.items()}
    return parts, {node: standardized_totals(m, norm) for node, m in moments.items()}


def test_a_forger_is_held_to_its_own_moments_where_no_consensus_can_judge_it():
    parts, described = standardised_federation()
    assert screen(parts, described) == {}  # honest: their statistics total their moments
    for kind, why in (("stats-flip", "class sums off the total its moments give"),
                      ("stats-gram", "square norms 10x what its moments give")):
        honest = parts[0]
        lying = {**parts, 0: forged(honest, kind)}
        if kind == "stats-flip":  # it alone holds class 0: the consensus cannot see it
            assert screen(lying) == {}
        assert screen(lying, described)[0].startswith(why)
        mended = repaired(lying[0], described[0])  # one class: its own word gives it back
        for field in ("counts", "sums", "square_norms", "gram"):
            np.testing.assert_allclose(getattr(mended, field), getattr(honest, field),
                                       rtol=1e-5, atol=1e-5)


def test_mending_gives_back_the_negated_sums_of_a_client_holding_several_classes():
    from ovalp_flwr.core.normalize import FeatureMoments, NormStats, normalize

    rng = np.random.default_rng(2)
    labels = rng.choice(CLASSES, 300)
    rows = np.abs(np.eye(8)[labels] * 3.0 + rng.normal(size=(300, 8)))
    moments = FeatureMoments.of(rows)
    norm = NormStats.from_moments(FeatureMoments.merge([moments, FeatureMoments.of(
        np.abs(rng.normal(size=(100, 8))))]))  # another client's rows in the mean and std
    honest = ClassStatistics.of(torch.from_numpy(normalize("standardize", rows, norm)),
                                torch.from_numpy(labels), CLASSES, True)
    described = standardized_totals(moments, norm)
    for kind in ("stats-flip", "sums-x10"):
        mended = repaired(forged(honest, kind), described)
        np.testing.assert_allclose(mended.sums, honest.sums, rtol=1e-6, atol=1e-6)
