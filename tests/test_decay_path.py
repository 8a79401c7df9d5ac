"""The weight-decay path (`core.decay_path`): its walk down the grid, where it stops, what it
chooses among equal scores, and a restored walk that goes on as the one saved."""

import numpy as np
import pytest

from ovalp_flwr.core.decay_path import DecayPath

GRID = (0.1, 0.03, 0.01, 0.003, 0.001)


def walk(scores, rounds_each=2):
    """The path fed `scores` in order (each value's heads: a constant array of its index);
    the values it was at and the heads each record returned."""
    path, values, starts = DecayPath(GRID, rounds_each), [], []
    for index, score in enumerate(scores):
        assert path.walking
        values.append(path.value)
        assert [path.tick() for _ in range(rounds_each)] == [False] * (rounds_each - 1) + [True]
        starts.append(float(path.record(score, np.full(3, index))[0]))
    return path, values, starts


def test_the_walk_goes_down_the_grid_warm_starting_each_value_from_the_last():
    path, values, starts = walk([0.5, 0.6, 0.7])
    assert values == [0.1, 0.03, 0.01] and starts == [0, 1, 2] and path.walking


def test_the_walk_stops_two_values_past_the_best_and_goes_on_from_its_heads():
    path, values, starts = walk([0.5, 0.8, 0.7, 0.75])
    assert not path.walking and path.chosen == 0.03 and path.value == 0.03
    assert starts[-1] == 1  # the best value's heads, not the last value's
    assert not path.tick()  # past the walk: no more switches
    assert path.summary() == {"grid": [0.1, 0.03, 0.01, 0.003], "val_accuracy":
                              [0.5, 0.8, 0.7, 0.75], "rounds_each": 2, "chosen": 0.03}


def test_equal_scores_choose_the_strongest_penalty_and_the_grids_end_ends_the_walk():
    path, _, starts = walk([0.6, 0.6, 0.6, 0.6, 0.6][:3])
    assert path.chosen == 0.1 and starts[-1] == 0
    path, values, _ = walk([0.1, 0.2, 0.3, 0.4, 0.5], rounds_each=1)
    assert values == list(GRID) and path.chosen == 0.001


@pytest.mark.parametrize("saved_after", [1, 2, 3])
def test_a_restored_walk_goes_on_as_the_one_saved(saved_after):
    scores = [0.5, 0.8, 0.7, 0.75]
    whole, _, _ = walk(scores)
    saved, _, _ = walk(scores[:saved_after])
    saved.tick()  # mid-value
    arrays, numbers = saved.state()
    restored = DecayPath(GRID, 2)
    restored.restore(arrays, numbers)
    assert restored.rounds_at_value == 1 and restored.value == saved.value
    assert restored.tick()
    for index, score in enumerate(scores[saved_after:], saved_after):
        restored.record(score, np.full(3, index))
        if restored.walking:
            restored.tick(), restored.tick()
    assert restored.summary() == whole.summary()
