"""Label noise on the training split, as in the FedLTF / FedCorr noisy-label benchmarks.

Applied to the training labels before partitioning (the partitioner sees the noisy labels, as a
federation would), seeded by the run seed, never to the test split. Flips go to any of the K
classes of the dataset: FedCorr's reference code draws noisy labels from classes 0-9 only, which
on CIFAR-100 makes "symmetric" noise anything but symmetric; we do not copy that.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NOISE_KINDS = ("none", "symmetric", "asymmetric")
_NOISE_STREAM = 0x6E6F69  # keeps noise draws independent of the partition's and the heads'


@dataclass(frozen=True)
class NoiseSpec:
    """kind: none | symmetric (a uniformly drawn other class) | asymmetric (class c -> c+1 mod K).
    rate: the fraction of training labels flipped (exactly round(rate * n), per class for
    asymmetric)."""

    kind: str = "none"
    rate: float = 0.0
    seed: int = 0

    @property
    def active(self) -> bool:
        return self.kind != "none" and self.rate > 0


def noisy_labels(labels: np.ndarray, num_classes: int, spec: NoiseSpec) -> np.ndarray:
    """A noisy copy of `labels`; the input is never modified."""
    if spec.kind not in NOISE_KINDS:
        raise ValueError(f"label-noise={spec.kind!r} is not allowed; choose one of: "
                         f"{', '.join(NOISE_KINDS)}")
    if not 0 <= spec.rate < 1:
        raise ValueError(f"noise-rate={spec.rate!r} is not allowed; use a fraction in [0, 1)")
    noisy = np.array(labels, dtype=np.int64, copy=True)
    if not spec.active or len(noisy) == 0:
        return noisy
    if num_classes < 2:
        raise ValueError(f"label noise needs at least 2 classes; the dataset has {num_classes}")
    rng = np.random.default_rng([spec.seed, _NOISE_STREAM])
    if spec.kind == "symmetric":
        flip = rng.choice(len(noisy), size=round(spec.rate * len(noisy)), replace=False)
        # an offset in 1..K-1 lands uniformly on the K-1 other classes
        noisy[flip] = (noisy[flip] + rng.integers(1, num_classes, size=len(flip))) % num_classes
    else:
        for c in np.unique(labels):
            members = np.flatnonzero(labels == c)
            flip = rng.choice(members, size=round(spec.rate * len(members)), replace=False)
            noisy[flip] = (c + 1) % num_classes
    return noisy


def realised_rate(clean: np.ndarray, noisy: np.ndarray) -> float:
    """The fraction of labels that differ: what a run records, not what it asked for."""
    return float(np.mean(clean != noisy)) if len(clean) else 0.0
