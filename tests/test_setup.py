"""The set-up's class statistics: summed in wire form, the same bits as merging full matrices;
asked for in chunks that bound the replies in flight."""

import numpy as np
import pytest
from flwr.app import RecordDict

from ovalp_flwr.core.head_init.statistics import ClassStatistics, wire_bytes
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.setup import STATISTICS_BUDGET, StatisticsSum, statistics_chunk


def client_statistics(seed: int, rows: int = 7, classes: int = 4, dim: int = 9,
                      gram: bool = True) -> ClassStatistics:
    import torch

    rng = np.random.default_rng(seed)
    features = torch.from_numpy(rng.normal(size=(rows, dim)).astype(np.float32) * 10.0 ** (seed - 3))
    labels = torch.from_numpy(rng.integers(0, classes, rows))
    return ClassStatistics.of(features, labels, classes, gram)


def reply(stats: ClassStatistics) -> RecordDict:
    return RecordDict({p.STATISTICS: p.to_record(stats.to_arrays())})


@pytest.mark.parametrize("gram", [True, False])
def test_the_sum_in_wire_form_is_merge_of_the_full_statistics_bit_for_bit(gram):
    parts = [client_statistics(seed, gram=gram) for seed in range(7)]
    summed = StatisticsSum()
    for part in parts:
        summed.add(reply(part))
    expected = None
    for part in parts:  # what the set-up did before: unpack each reply, merge pairwise
        wire = ClassStatistics.from_arrays(part.to_arrays())
        expected = wire if expected is None else ClassStatistics.merge([expected, wire])
    total = summed.total
    assert summed.senders == len(parts)
    for name in ("counts", "sums", "square_norms", "gram"):
        got, want = getattr(total, name), getattr(expected, name)
        assert (got is None) == (want is None)
        if got is not None:
            assert got.dtype == np.float64 and got.tobytes() == want.tobytes(), name


def test_a_reply_unlike_the_first_is_refused_and_one_without_statistics_skipped():
    summed = StatisticsSum()
    summed.add(RecordDict())
    assert summed.total is None and summed.senders == 0
    summed.add(reply(client_statistics(0)))
    with pytest.raises(ValueError, match="some clients sent a Gram matrix and others did not"):
        summed.add(reply(client_statistics(1, gram=False)))
    with pytest.raises(ValueError, match="'sums' have shape"):
        summed.add(reply(client_statistics(1, dim=8)))
    assert summed.senders == 1


class Cache:
    """What statistics_chunk reads of a feature cache: the feature width."""

    class train:
        x = np.zeros((1, 784), np.float32)


def test_chunks_keep_the_statistics_in_flight_within_the_budget():
    request = {p.STATISTICS_KIND: "gram", p.NUM_CLASSES: 10}
    chunk = statistics_chunk(request, Cache)
    assert chunk * wire_bytes("gram", 10, 784) <= STATISTICS_BUDGET
    assert (chunk + 1) * wire_bytes("gram", 10, 784) > STATISTICS_BUDGET
    assert statistics_chunk({}, Cache) is None  # nothing big asked for: all at once
    assert statistics_chunk(request, None) is None
    assert statistics_chunk(request, Cache, budget=1) == 1
