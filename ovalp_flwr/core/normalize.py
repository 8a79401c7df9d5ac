"""Feature normalisation with global statistics gathered the federated way.

Why it matters: pooled CNN features are one-sided (mostly non-negative). Under label
skew a client sees only positives or only negatives for most heads, and Adam's
per-coordinate step turns that one-sided signal into equal-size steps for every head;
the averaged heads then drift apart. Standardising with the *global* mean/std removes
the shared offset the heads would otherwise fight over (README, "Feature
normalisation", has the measurements).

Statistics never leave a client as data: each client sends its count, per-feature sum
and sum of squares (of the per-sample-normalised features); the server merges them into
a mean and std and broadcasts those.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

NEEDS_STATS = {"none": False, "l2": False, "standardize": True, "center-l2": True}
STD_FLOOR = 1e-6


@dataclass(frozen=True)
class FeatureMoments:
    """What one client reveals: how many rows, and their per-feature sums."""

    count: int
    total: np.ndarray  # float64 [D]
    total_sq: np.ndarray  # float64 [D]

    @classmethod
    def of(cls, features: np.ndarray) -> "FeatureMoments":
        rows = features.astype(np.float64, copy=False)
        return cls(len(rows), rows.sum(axis=0), np.square(rows).sum(axis=0))

    @staticmethod
    def merge(parts: list["FeatureMoments"]) -> "FeatureMoments":
        if not parts:
            raise ValueError("no client reported feature statistics")
        return FeatureMoments(
            sum(p.count for p in parts),
            np.sum([p.total for p in parts], axis=0),
            np.sum([p.total_sq for p in parts], axis=0),
        )


@dataclass(frozen=True)
class NormStats:
    """Global mean and std the server broadcasts."""

    mean: np.ndarray  # float32 [D]
    std: np.ndarray  # float32 [D]

    @classmethod
    def from_moments(cls, moments: FeatureMoments) -> "NormStats":
        if moments.count == 0:
            raise ValueError("feature statistics over zero samples")
        mean = moments.total / moments.count
        var = np.maximum(moments.total_sq / moments.count - np.square(mean), 0.0)
        std = np.maximum(np.sqrt(var), STD_FLOOR)
        return cls(mean.astype(np.float32), std.astype(np.float32))

    def digest(self) -> str:
        """Short fingerprint sent with every round so clients detect stale statistics."""
        return hashlib.sha256(self.mean.tobytes() + self.std.tobytes()).hexdigest()[:16]


def standardized_totals(moments: FeatureMoments, stats: NormStats) -> tuple[np.ndarray, float]:
    """What a client's rows, standardised with `stats`, add up to by the moments it described:
    their sum and the sum of their square norms, which its class statistics' sums and square
    norms must total (`head_init.screen` holds each client to its own word)."""
    mean, std = stats.mean.astype(np.float64), stats.std.astype(np.float64)
    total = (moments.total - moments.count * mean) / std
    square = (moments.total_sq - 2 * mean * moments.total + moments.count * mean ** 2) / std ** 2
    return total, float(square.sum())


def _l2(features: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(features, axis=1, keepdims=True)
    return features / np.maximum(norms, 1e-12)


def per_sample(kind: str, features: np.ndarray) -> np.ndarray:
    """The part of the normalisation a client can do alone (before global statistics)."""
    return _l2(features) if kind in ("l2", "center-l2") else features


def normalize(kind: str, features: np.ndarray, stats: NormStats | None) -> np.ndarray:
    """Apply the full normalisation `kind`; `stats` are required where NEEDS_STATS says so."""
    if kind not in NEEDS_STATS:
        raise ValueError(f"feature-norm={kind!r} is not allowed; choose one of {list(NEEDS_STATS)}")
    if NEEDS_STATS[kind] and stats is None:
        raise ValueError(f"feature-norm={kind!r} needs the global statistics; none were given")
    rows = per_sample(kind, features)
    if kind == "standardize":
        rows = (rows - stats.mean) / stats.std
    elif kind == "center-l2":
        rows = _l2(rows - stats.mean)
    return rows.astype(np.float32, copy=False)
