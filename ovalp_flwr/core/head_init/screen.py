"""Each client's statistics against a robust consensus of the others: forgers that act together.

The leave-out check (`leave_out`) takes one client out at a time, so ten forgers that each move
the start less than its margin pass it together. What colluding forgers cannot hide is that
their statistics disagree with the median client's, each on its own, whatever the others send:

- **Scale**: the mean square norm of a client's rows (its square norms over its count) against
  the median client's. A Gram matrix and square norms ten times too large (`stats-gram`) put it
  ten times up; counts ten times too large (`stats-count`), ten times down. Honest clients sit
  within a few percent of each other on IID data and within about 15% under label skew (CIFAR-10
  and TinyImageNet-100, Lite0 features), so `SCALE_FACTOR` (3) leaves a wide berth.
- **Direction**: each class mean a client holds against the coordinate-wise median of the class
  means of every client holding that class (at least `MIN_HOLDERS`). Negated class sums
  (`stats-flip`) point away from it (cosine about -0.9); honest ones toward it (0.65 or more).
- **Consistency**: a class mean's square norm cannot exceed its rows' mean square norm
  (Cauchy-Schwarz): statistics that break it were not computed from rows.
- **Its own word**: under `feature-norm = "standardize"` each client first described its rows'
  moments (count, per-feature sums and square sums), from which the server made the global
  mean and std. Its standardised class sums must then total (S - n·μ)/σ and its square norms
  Σ (Q - 2μS + nμ²)/σ² (`normalize.standardized_totals`), to float error. Negated sums or a
  Gram ×10 break that whoever else holds their classes; `repaired` makes such a client agree
  with its own moments (each class sum rescaled, then one common shift; its square norms and
  Gram rescaled), which mends exactly those two forgeries.

A class one client holds alone has no consensus to break: only a client's own moments can
contradict its forgery there (docs/robustness.md). The screen reads each client's counts, sums and square norms once,
never its Gram matrix: O(clients · classes · D), nothing beside the start's solve.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ovalp_flwr.core.head_init.statistics import ClassStatistics

SCALE_FACTOR = 3.0  # a client's mean square norm this far from the median's (either way) is out
MIN_HOLDERS = 3  # a class needs this many holders for a consensus of its mean
TOLERANCE = 1e-6  # float error allowed in the consistency check
WORD_TOLERANCE = 1e-3  # relative difference from its own moments allowed (float32 rows: ~1e-6)

Described = tuple[np.ndarray, float]  # a client's standardised rows' sum and square norms' sum


def _mean_square_norm(stats: ClassStatistics) -> float:
    return float(stats.square_norms.sum() / stats.counts.sum())


def _inconsistent(stats: ClassStatistics) -> str | None:
    held = stats.counts > 0
    mean_norms = np.sum(stats.sums[held] ** 2, axis=1) / stats.counts[held] ** 2
    row_norms = stats.square_norms[held] / stats.counts[held]
    if np.any(mean_norms > row_norms * (1 + TOLERANCE) + TOLERANCE):
        return "a class mean longer than its rows (not computed from rows)"
    return None


def against_its_word(stats: ClassStatistics, described: Described) -> str | None:
    """Why a client's statistics disagree with the moments it described, if they do."""
    total, square = described
    sums = stats.sums.sum(axis=0)
    off = float(np.linalg.norm(sums - total) / (np.linalg.norm(sums) + np.linalg.norm(total) + 1))
    if off > WORD_TOLERANCE:
        return f"class sums off the total its moments give (relative {off:.2g})"
    ratio = float(stats.square_norms.sum() / square) if square > 0 else 1.0
    if abs(ratio - 1) > WORD_TOLERANCE:
        return f"square norms {ratio:.3g}x what its moments give"
    return None


def repaired(stats: ClassStatistics, described: Described) -> ClassStatistics:
    """The least change that makes `stats` agree with its moments: each class's sum rescaled
    by the factor that best makes them total its moments' sum (least squares over its classes),
    what is left shared by count (every class mean moved by one vector), and the square norms
    and Gram matrix rescaled to the square total. Negated or scaled class sums, and a Gram and
    square norms ×10, come back as they were."""
    total, square = described
    held = stats.counts > 0
    sums = stats.sums.copy()
    if held.any():
        factors = np.linalg.lstsq(sums[held].T, total, rcond=None)[0]
        sums[held] *= factors[:, None]
    share = stats.counts / max(stats.counts.sum(), 1e-12)
    sums += np.outer(share, total - sums.sum(axis=0))
    reported = float(stats.square_norms.sum())
    factor = square / reported if reported > 0 else 1.0
    return ClassStatistics(stats.counts, sums, stats.square_norms * factor,
                           None if stats.gram is None else stats.gram * factor)


def _class_directions(parts: Mapping[int, ClassStatistics]) -> dict[int, float]:
    """Each client's lowest cosine between a class mean it holds and the median holder's."""
    lowest: dict[int, float] = {}
    num_classes = len(next(iter(parts.values())).counts)
    for label in range(num_classes):
        holders = [node for node, stats in parts.items() if stats.counts[label] > 0]
        if len(holders) < MIN_HOLDERS:
            continue
        means = np.stack([parts[node].sums[label] / parts[node].counts[label] for node in holders])
        consensus = np.median(means, axis=0)
        cosines = means @ consensus / (np.linalg.norm(means, axis=1)
                                       * np.linalg.norm(consensus) + 1e-12)
        for node, cosine in zip(holders, cosines):
            lowest[node] = min(lowest.get(node, 1.0), float(cosine))
    return lowest


def screen(parts: Mapping[int, ClassStatistics],
           described: Mapping[int, Described] | None = None) -> dict[int, str]:
    """The clients whose statistics break the consensus or their own moments (`described`,
    where the run has them), each with why (node -> reason). `parts` is read once per client
    (each may be unpacked when read)."""
    held = {node: ClassStatistics(stats.counts, stats.sums, stats.square_norms, None)
            for node, stats in parts.items() if stats.num_samples > 0}
    if not held:
        return {}
    out = {node: why for node, stats in held.items() if node in (described or {})
           and (why := against_its_word(stats, described[node]))}
    out.update({node: why for node, stats in held.items()
                if node not in out and (why := _inconsistent(stats))})
    scales = {node: _mean_square_norm(stats) for node, stats in held.items()}
    median = float(np.median(list(scales.values())))
    for node, scale in scales.items():
        ratio = scale / median if median > 0 else 1.0
        if node not in out and not 1 / SCALE_FACTOR <= ratio <= SCALE_FACTOR:
            out[node] = f"rows {ratio:.3g}x the median client's mean square norm"
    for node, cosine in _class_directions(held).items():
        if node not in out and cosine < 0:
            out[node] = f"a class mean against its holders' median (cosine {cosine:.2f})"
    return out
