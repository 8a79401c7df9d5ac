"""Validation rows: a seeded, stratified share of the training split that no client trains on.

Every choice a run makes (which clients the start check leaves out, the best round) is made on
these rows, so the test split only scores. They are carved before the partition, from each
(domain, class) stratum of the clean labels, so the partition spreads the rest as it spread the
whole split; the server and every node compute the same rows from the same cache and seed.
No Flower, no torch.
"""

from __future__ import annotations

import numpy as np

HOLDOUT_STREAM = 0x7A11D  # the holdout's own random stream beside the partition's (same seed)


def validation_rows(labels: np.ndarray, domains: np.ndarray | None, fraction: float,
                    seed: int, stream: int | None = None) -> np.ndarray:
    """Sorted row indices: round(fraction x size) rows of every (domain, class) stratum, drawn
    without replacement, and never a stratum's last row (the clients keep every class they
    had). `fraction = 0` holds back nothing. `stream`: a draw of its own (each client's, where
    the clients keep their rows)."""
    labels = np.asarray(labels)
    if not 0 <= fraction < 1:
        raise ValueError(f"validation fraction {fraction!r} is not allowed; use a share in [0, 1)")
    if fraction == 0 or len(labels) == 0:
        return np.empty(0, np.int64)
    domains = np.zeros(len(labels), np.int64) if domains is None else np.asarray(domains)
    rng = np.random.default_rng([seed, HOLDOUT_STREAM, *(() if stream is None else (stream,))])
    picks = []
    for domain, label in sorted({(int(d), int(y)) for d, y in zip(domains, labels)}):
        stratum = np.flatnonzero((domains == domain) & (labels == label))
        take = min(len(stratum) - 1, round(fraction * len(stratum)))
        if take > 0:
            picks.append(rng.choice(stratum, take, replace=False))
    return np.sort(np.concatenate(picks)).astype(np.int64) if picks else np.empty(0, np.int64)


def training_rows(num_rows: int, held: np.ndarray) -> np.ndarray:
    """The rows left to partition: every row but the held ones, in order."""
    keep = np.ones(num_rows, bool)
    keep[held] = False
    return np.flatnonzero(keep)
