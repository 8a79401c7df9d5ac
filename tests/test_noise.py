"""Label noise: exact rates, the right targets, seeded, and wired into runs."""

import numpy as np
import pytest

from ovalp_flwr.data.noise import NoiseSpec, noisy_labels, realised_rate

LABELS = np.repeat(np.arange(100), 50)  # CIFAR-100-like: 100 classes, 50 each


def test_symmetric_flips_the_exact_fraction_to_other_classes_across_all_k():
    noisy = noisy_labels(LABELS, 100, NoiseSpec("symmetric", 0.4, seed=3))
    flipped = noisy != LABELS
    assert flipped.sum() == round(0.4 * len(LABELS))
    assert realised_rate(LABELS, noisy) == pytest.approx(0.4)
    # targets cover the whole label set, not classes 0-9 only (FedCorr's bug)
    assert len(np.unique(noisy[flipped])) == 100
    assert noisy[flipped].min() == 0 and noisy[flipped].max() == 99


def test_symmetric_targets_are_uniform_over_the_other_classes():
    labels = np.zeros(200_000, dtype=np.int64)
    noisy = noisy_labels(labels, 5, NoiseSpec("symmetric", 0.5, seed=0))
    counts = np.bincount(noisy[noisy != 0], minlength=5)[1:]
    assert counts.sum() == 100_000
    assert np.all(np.abs(counts / 25_000 - 1) < 0.02)


def test_asymmetric_flips_each_class_to_the_next_one():
    noisy = noisy_labels(LABELS, 100, NoiseSpec("asymmetric", 0.3, seed=1))
    for c in (0, 57, 99):
        members = noisy[LABELS == c]
        assert np.sum(members != c) == 15
        assert set(members[members != c]) == {(c + 1) % 100}


def test_noise_is_seeded_and_leaves_the_input_alone():
    labels = LABELS.copy()
    a = noisy_labels(labels, 100, NoiseSpec("symmetric", 0.2, seed=7))
    assert np.array_equal(labels, LABELS)
    assert np.array_equal(a, noisy_labels(labels, 100, NoiseSpec("symmetric", 0.2, seed=7)))
    assert not np.array_equal(a, noisy_labels(labels, 100, NoiseSpec("symmetric", 0.2, seed=8)))
    assert np.array_equal(noisy_labels(labels, 100, NoiseSpec("none", 0.5)), labels)


@pytest.mark.parametrize("spec, match", [
    (NoiseSpec("gaussian", 0.2), "label-noise='gaussian' is not allowed"),
    (NoiseSpec("symmetric", 1.0), "noise-rate=1.0 is not allowed"),
])
def test_bad_noise_settings_say_what_is_allowed(spec, match):
    with pytest.raises(ValueError, match=match):
        noisy_labels(LABELS, 100, spec)
