"""Federated statistics equal the centralised ones; each normalisation does what it says."""

import numpy as np
import pytest

from ovalp_flwr.core.normalize import FeatureMoments, NormStats, normalize, per_sample

rng = np.random.default_rng(0)
FEATURES = np.abs(rng.normal(2.0, 1.5, size=(300, 12))).astype(np.float32)


def federated_stats(kind: str, parts: list[np.ndarray]) -> NormStats:
    return NormStats.from_moments(FeatureMoments.merge([FeatureMoments.of(per_sample(kind, x)) for x in parts]))


def test_merged_client_moments_equal_global_mean_and_std():
    parts = np.split(FEATURES, [10, 11, 200])  # uneven clients, one with a single row
    stats = federated_stats("standardize", parts)
    assert np.allclose(stats.mean, FEATURES.mean(0), atol=1e-5)
    assert np.allclose(stats.std, FEATURES.std(0), atol=1e-5)


def test_standardize_gives_zero_mean_unit_std():
    out = normalize("standardize", FEATURES, federated_stats("standardize", [FEATURES]))
    assert np.allclose(out.mean(0), 0, atol=1e-4) and np.allclose(out.std(0), 1, atol=1e-3)


@pytest.mark.parametrize("kind", ["l2", "center-l2"])
def test_l2_kinds_give_unit_rows(kind):
    stats = federated_stats(kind, [FEATURES]) if kind == "center-l2" else None
    out = normalize(kind, FEATURES, stats)
    assert np.allclose(np.linalg.norm(out, axis=1), 1, atol=1e-5)


def test_center_l2_removes_the_shared_direction():
    """Non-negative features share a mean direction; centring removes most of it."""
    l2 = normalize("l2", FEATURES, None)
    centred = normalize("center-l2", FEATURES, federated_stats("center-l2", [FEATURES]))
    assert np.linalg.norm(centred.mean(0)) < 0.2 * np.linalg.norm(l2.mean(0))


def test_constant_feature_does_not_blow_up():
    features = FEATURES.copy()
    features[:, 0] = 3.0
    out = normalize("standardize", features, federated_stats("standardize", [features]))
    assert np.isfinite(out).all() and np.allclose(out[:, 0], 0)


def test_norm_needing_stats_without_them_is_an_error():
    with pytest.raises(ValueError, match="needs the global statistics"):
        normalize("standardize", FEATURES, None)


def test_digest_changes_with_stats():
    a = federated_stats("standardize", [FEATURES])
    b = federated_stats("standardize", [FEATURES[:100]])
    assert a.digest() != b.digest() and a.digest() == federated_stats("standardize", [FEATURES]).digest()
