"""Class geometry of a feature space: how compact each class is and how far apart classes are.

OvA-LP (Sec. 3.2) argues that pretrained features suit one-vs-all linear heads because classes
are tight and well separated, and it reports four numbers for that: alignment, intra, inter and
ratio. Their exact formulas are not available to us, so this module defines its own. Every
metric is computed on the L2-normalised rows z_i = f(x_i) / ||f(x_i)|| (direction only; an
OvA head's score is a dot product, and the scale of a raw feature says nothing about its
class). Classes are averaged with equal weight (macro), so a large class does not dominate.
For K classes, class c with n_c samples and sum S_c = sum_{i in c} z_i:

- intra (compactness, in [-1, 1], higher = tighter): mean over classes of the mean cosine
  between a sample and its class-mean direction, *leave-one-out*: cos(z_i, S_c - z_i). Including
  the sample in its own mean biases the value upwards by about 1/sqrt(n_c) (0.1 at 100 per
  class) even for pure noise; leaving it out makes noise score ~0 and a collapsed class 1.
- inter (separation, in [-1/(K-1), 1], lower = more separated): mean cosine between the
  mean directions u_c = S_c / ||S_c|| of distinct classes. Orthogonal means give 0; a regular
  simplex, the most separated arrangement (neural collapse), gives -1/(K-1). Caveat: on
  globally centred features (feature-norm standardize) with balanced classes the class means
  sum to about zero, which by itself pins inter near -1/(K-1); there the information is in
  intra and alignment, and inter is informative on uncentred (raw) features.
- ratio = (1 - inter) / (1 - intra): separation over spread, in cosine distance. 1 is what
  isotropic random directions give (intra ~ inter ~ 0); larger is better; inf for collapsed
  classes. A ratio rather than a difference because features often sit in a narrow cone
  (pooled post-activation CNN features are non-negative), which pushes intra and inter
  towards 1 together; the ratio compares the two gaps to 1, which the cone shrinks alike.
  (Only roughly: inside a cone class means, being averages, sit closer together than single
  samples do, so raw-feature ratios fall below 1 even for useful features.)
- alignment (Wang & Isola, 2020, with same-class pairs as the positives; in [0, 4], lower =
  tighter): E ||z - z'||^2 over pairs of distinct samples of one class, averaged over classes.
  Computed exactly, not sampled: for unit rows the sum over pairs i != j in c of z_i . z_j is
  ||S_c||^2 - n_c, so alignment_c = 2 - 2 (||S_c||^2 - n_c) / (n_c (n_c - 1)).

Alignment alone rewards collapsing everything to one point, which is why Wang & Isola pair it
with uniformity; so a fifth, supplementary number:

- uniformity = log E exp(-2 ||z - z'||^2) over pairs of distinct samples, any classes (in
  [-4, 0], lower = spread more evenly over the sphere). This one is sampled (`pairs` pairs,
  seeded), since the exact value needs every pair.

Memory: the features are read in row chunks; the state is K x D class sums, one float per
sample and the sampled pairs, never an N x N matrix or a normalised copy of the features
(at the default chunk, a few float64 [2048, D] buffers: ~120 MB peak at D = 1280 whatever
N; 50k x 1280 takes ~2 s on one CPU core).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np

DEFAULT_PAIRS = 100_000
DEFAULT_CHUNK = 2048
METRICS = ("alignment", "intra", "inter", "ratio", "uniformity")


class GeometryError(ValueError):
    """Features and labels the metrics are undefined for; the message names what is wrong."""


@dataclass(frozen=True)
class Geometry:
    """The metrics of one feature set (see the module docstring for definitions)."""

    alignment: float
    intra: float
    inter: float
    ratio: float
    uniformity: float
    num_samples: int
    num_classes: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def feature_geometry(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    num_classes: int | None = None,
    pairs: int = DEFAULT_PAIRS,
    seed: int = 0,
    chunk: int = DEFAULT_CHUNK,
) -> Geometry:
    """All metrics of `features` [N, D] with integer `labels` [N] in [0, num_classes).

    num_classes defaults to max(label) + 1; every class must have at least two samples
    (leave-one-out and same-class pairs need them), so a gap in the labels is an error rather
    than a silently smaller K.
    """
    labels, k = _check(features, labels, num_classes, pairs, chunk)
    sums, norms = class_sums(features, labels, k, chunk)
    counts = np.bincount(labels, minlength=k)
    u = _mean_directions(sums)
    intra = _intra(features, labels, sums, norms, counts, chunk)
    inter = _inter(u)
    return Geometry(
        alignment=_alignment(sums, counts),
        intra=intra,
        inter=inter,
        ratio=_ratio(intra, inter),
        uniformity=uniformity(features, norms, pairs=pairs, seed=seed, chunk=chunk),
        num_samples=len(labels),
        num_classes=k,
    )


def _check(
    features: np.ndarray, labels: np.ndarray, num_classes: int | None, pairs: int, chunk: int
) -> tuple[np.ndarray, int]:
    """Fail early, with one line, on inputs for which the metrics mean nothing."""
    if features.ndim != 2 or features.shape[1] < 1:
        raise GeometryError(f"features must be 2-d [N, D]; got shape {features.shape}")
    labels = np.asarray(labels)
    if labels.ndim != 1 or len(labels) != len(features):
        raise GeometryError(
            f"labels must be 1-d with one label per row: features have {len(features)} rows, "
            f"labels have shape {labels.shape}"
        )
    if not np.issubdtype(labels.dtype, np.integer):
        raise GeometryError(f"labels must be integers; got dtype {labels.dtype}")
    if len(labels) < 2:
        raise GeometryError(f"need at least 2 samples; got {len(labels)}")
    if labels.min() < 0:
        raise GeometryError(f"labels must be >= 0; found {labels.min()}")
    k = int(labels.max()) + 1 if num_classes is None else num_classes
    if k < 2 or labels.max() >= k:
        raise GeometryError(
            f"need labels in [0, num_classes) with num_classes >= 2; "
            f"got num_classes={k}, max label {labels.max()}"
        )
    counts = np.bincount(labels, minlength=k)
    if (counts < 2).any():
        c = int(np.flatnonzero(counts < 2)[0])
        raise GeometryError(f"class {c} has {counts[c]} sample(s); every class needs >= 2")
    if pairs < 1 or chunk < 1:
        raise GeometryError(f"pairs and chunk must be >= 1; got pairs={pairs}, chunk={chunk}")
    return labels.astype(np.int64, copy=False), k


def _chunks(n: int, chunk: int) -> Iterator[slice]:
    for start in range(0, n, chunk):
        yield slice(start, min(start + chunk, n))


def _unit_rows(rows: np.ndarray, norms: np.ndarray) -> np.ndarray:
    return rows.astype(np.float64) / norms[:, None]


def class_sums(
    features: np.ndarray, labels: np.ndarray, k: int, chunk: int = DEFAULT_CHUNK
) -> tuple[np.ndarray, np.ndarray]:
    """S_c (float64 [K, D], sums of unit rows per class) and the row norms (float64 [N]).

    One pass in row chunks, so no normalised copy of all features is ever held.
    """
    sums = np.zeros((k, features.shape[1]), dtype=np.float64)
    norms = np.empty(len(features), dtype=np.float64)
    for part in _chunks(len(features), chunk):
        rows = features[part].astype(np.float64)
        if not np.isfinite(rows).all():
            i = part.start + int(np.flatnonzero(~np.isfinite(rows).all(axis=1))[0])
            raise GeometryError(f"feature row {i} has non-finite values")
        norms[part] = np.linalg.norm(rows, axis=1)
        if (norms[part] == 0).any():
            i = part.start + int(np.flatnonzero(norms[part] == 0)[0])
            raise GeometryError(f"feature row {i} is all zeros: it has no direction")
        rows /= norms[part][:, None]
        np.add.at(sums, labels[part], rows)
    return sums, norms


def _mean_directions(sums: np.ndarray) -> np.ndarray:
    lengths = np.linalg.norm(sums, axis=1)
    if (lengths <= 1e-12).any():
        c = int(np.flatnonzero(lengths <= 1e-12)[0])
        raise GeometryError(f"class {c}'s unit features sum to zero: its mean has no direction")
    return sums / lengths[:, None]


def _intra(
    features: np.ndarray,
    labels: np.ndarray,
    sums: np.ndarray,
    norms: np.ndarray,
    counts: np.ndarray,
    chunk: int,
) -> float:
    """Macro mean of cos(z_i, S_c - z_i): with d_i = z_i . S_c, that is
    (d_i - 1) / sqrt(||S_c||^2 - 2 d_i + 1); a row whose classmates sum to zero counts 0."""
    sq = np.einsum("kd,kd->k", sums, sums)
    cos = np.empty(len(labels), dtype=np.float64)
    for part in _chunks(len(labels), chunk):
        y = labels[part]
        d = np.einsum("nd,nd->n", _unit_rows(features[part], norms[part]), sums[y])
        rest = np.sqrt(np.maximum(sq[y] - 2 * d + 1, 0.0))
        cos[part] = np.divide(d - 1, rest, out=np.zeros_like(d), where=rest > 1e-12)
    per_class = np.bincount(labels, weights=np.clip(cos, -1, 1), minlength=len(counts)) / counts
    return float(per_class.mean())


def _inter(u: np.ndarray) -> float:
    """Mean off-diagonal of the K x K cosine matrix of class-mean directions."""
    k = len(u)
    gram = u @ u.T
    return float((gram.sum() - np.trace(gram)) / (k * (k - 1)))


def _alignment(sums: np.ndarray, counts: np.ndarray) -> float:
    """Exact macro mean of ||z_i - z_j||^2 over same-class pairs i != j (see docstring)."""
    sq = np.einsum("kd,kd->k", sums, sums)
    pair_cos = (sq - counts) / (counts * (counts - 1))
    return float(np.mean(2 - 2 * pair_cos))


def _ratio(intra: float, inter: float) -> float:
    spread = 1 - intra
    return math.inf if spread <= 1e-12 else (1 - inter) / spread


def uniformity(
    features: np.ndarray,
    norms: np.ndarray | None = None,
    *,
    pairs: int = DEFAULT_PAIRS,
    seed: int = 0,
    chunk: int = DEFAULT_CHUNK,
) -> float:
    """log mean exp(-2 ||z_i - z_j||^2) over `pairs` seeded uniform pairs with i != j."""
    n = len(features)
    if norms is None:
        norms = np.linalg.norm(features.astype(np.float64), axis=1)
    rng = np.random.default_rng(seed)
    i = rng.integers(n, size=pairs)
    j = rng.integers(n - 1, size=pairs)
    j += j >= i  # uniform over the other n - 1 rows
    total = 0.0
    for part in _chunks(pairs, chunk):
        a, b = i[part], j[part]
        za, zb = _unit_rows(features[a], norms[a]), _unit_rows(features[b], norms[b])
        cos = np.einsum("nd,nd->n", za, zb)
        total += float(np.exp(-2 * (2 - 2 * cos)).sum())
    return math.log(total / pairs)
