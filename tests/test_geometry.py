"""Geometry metrics on synthetic features whose answers are known in closed form."""

import itertools

import numpy as np
import pytest

from ovalp_flwr.experiments.geometry import GeometryError, feature_geometry, uniformity

K, PER_CLASS, DIM = 5, 40, 64


def labels_for(k: int = K, per_class: int = PER_CLASS) -> np.ndarray:
    return np.repeat(np.arange(k), per_class)


def clusters(spread: float, seed: int = 0, dim: int = DIM) -> tuple[np.ndarray, np.ndarray]:
    """Orthonormal class centres plus isotropic noise of the given size."""
    rng = np.random.default_rng(seed)
    y = labels_for()
    x = np.eye(K, dim)[y] + spread * rng.normal(size=(len(y), dim)) / np.sqrt(dim)
    return x.astype(np.float32), y


def brute_force(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """The definitions written out with every pair, for small inputs."""
    z = x / np.linalg.norm(x, axis=1, keepdims=True)
    intra, align, means = [], [], []
    for c in range(y.max() + 1):
        zc = z[y == c]
        s = zc.sum(0)
        rest = s - zc
        intra.append(np.mean(np.sum(zc * rest, 1) / np.linalg.norm(rest, axis=1)))
        align.append(np.mean([np.sum((a - b) ** 2) for a, b in itertools.permutations(zc, 2)]))
        means.append(s / np.linalg.norm(s))
    u = np.array(means)
    inter = np.mean([u[a] @ u[b] for a, b in itertools.permutations(range(len(u)), 2)])
    return {"intra": np.mean(intra), "alignment": np.mean(align), "inter": inter}


def test_collapsed_orthogonal_classes():
    """Every row is its class vector (at any positive scale): tight, orthogonal classes."""
    y = labels_for()
    scale = np.random.default_rng(1).uniform(0.5, 3.0, size=(len(y), 1))
    g = feature_geometry(np.eye(K, DIM)[y] * scale, y)
    assert g.intra == pytest.approx(1) and g.alignment == pytest.approx(0, abs=1e-12)
    assert g.inter == pytest.approx(0, abs=1e-12) and g.ratio == np.inf


def test_simplex_means_give_minus_one_over_k_minus_one():
    simplex = np.eye(K) - 1 / K  # centred one-hots: a regular simplex
    y = labels_for()
    g = feature_geometry(simplex[y], y)
    assert g.inter == pytest.approx(-1 / (K - 1))
    assert g.ratio == np.inf


def test_matches_brute_force_on_noisy_clusters():
    x, y = clusters(spread=1.0)
    g = feature_geometry(x, y, chunk=7)  # chunks that split classes
    expected = brute_force(x.astype(np.float64), y)
    for name, value in expected.items():
        assert getattr(g, name) == pytest.approx(value, rel=1e-5, abs=1e-9), name
    assert g.ratio == pytest.approx((1 - g.inter) / (1 - g.intra))


def test_pure_noise_scores_about_zero_thanks_to_leave_one_out():
    """Random directions: no compactness, no separation, ratio about 1."""
    rng = np.random.default_rng(0)
    y = labels_for(per_class=50)
    g = feature_geometry(rng.normal(size=(len(y), 512)), y)
    assert abs(g.intra) < 0.02 and abs(g.inter) < 0.05
    assert g.ratio == pytest.approx(1, abs=0.06) and g.alignment == pytest.approx(2, abs=0.02)


def test_shuffled_labels_lower_compactness_and_ratio():
    x, y = clusters(spread=1.5)
    true = feature_geometry(x, y)
    shuffled = feature_geometry(x, np.random.default_rng(0).permutation(y))
    assert shuffled.intra < true.intra - 0.3
    assert shuffled.alignment > true.alignment + 0.3
    assert shuffled.inter > true.inter and shuffled.ratio < true.ratio
    assert shuffled.uniformity == true.uniformity  # labels play no part in it


def test_more_noise_means_looser_classes():
    tight, loose = (feature_geometry(*clusters(spread=s)) for s in (0.5, 2.0))
    assert tight.intra > loose.intra and tight.alignment < loose.alignment
    assert tight.ratio > loose.ratio


def test_uniformity_is_seeded_and_near_the_exact_value():
    x, _ = clusters(spread=1.0)
    z = x.astype(np.float64) / np.linalg.norm(x, axis=1, keepdims=True)
    sq = 2 - 2 * (z @ z.T)
    off = ~np.eye(len(z), dtype=bool)
    exact = np.log(np.exp(-2 * sq[off]).mean())
    a, b = (uniformity(x, pairs=20_000, seed=s, chunk=999) for s in (3, 4))
    assert a == uniformity(x, pairs=20_000, seed=3) and a != b
    assert a == pytest.approx(exact, abs=0.02) and b == pytest.approx(exact, abs=0.02)


def test_whole_result_is_reproducible():
    x, y = clusters(spread=1.0)
    assert feature_geometry(x, y, seed=5) == feature_geometry(x, y, seed=5)


@pytest.mark.parametrize(
    ("features", "labels", "kwargs", "message"),
    [
        (np.ones((10, 3)), np.zeros(9, dtype=int), {}, "features have 10 rows"),
        (np.ones(10), np.zeros(10, dtype=int), {}, "2-d"),
        (np.ones((10, 3)), np.zeros(10), {}, "integers"),
        (np.ones((4, 3)), np.array([0, 0, 2, 2]), {}, "class 1 has 0 sample"),
        (np.ones((4, 3)), np.array([0, 0, 1, 1]), {"num_classes": 3}, "class 2 has 0"),
        (np.ones((3, 3)), np.array([0, 0, 1]), {}, "class 1 has 1 sample"),
        (np.ones((4, 3)), np.array([0, 0, -1, 1]), {}, ">= 0"),
        (np.ones((4, 3)), np.zeros(4, dtype=int), {}, "num_classes >= 2"),
        (np.array([[1.0, 0], [0, 1], [0, 0], [1, 1]]), np.array([0, 0, 1, 1]), {}, "row 2"),
        (np.array([[1.0, 0], [0, 1], [np.nan, 0], [1, 1]]), np.array([0, 0, 1, 1]), {}, "row 2"),
    ],
)
def test_bad_input_is_one_clear_error(features, labels, kwargs, message):
    with pytest.raises(GeometryError, match=message):
        feature_geometry(features, labels, **kwargs)
