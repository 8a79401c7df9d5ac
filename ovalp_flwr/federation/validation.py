"""Checks on what a client sends, before any of it reaches the global model.

FedAvg trusts every reply: one NaN poisons every head it is averaged into, an array of
another shape breaks the average, and a client claiming 10⁹ samples takes the whole of
FedAvg's weight. Each check here looks at one reply as plain arrays and numbers (no Flower)
and returns the reason it is refused, one line, or None. The strategy drops a refused reply
and records why (`clients_rejected`); the set-up leaves a node out that describes itself
impossibly. A node that lies *consistently* about a dataset only it holds (its own
`data-dir`) cannot be caught by counts; everything it sends must still be finite and shaped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ovalp_flwr.core.head_init.statistics import WIRE_DTYPE
from ovalp_flwr.federation import protocol as p

TRAIN_METRICS = (p.NUM_EXAMPLES, p.TRAIN_LOSS, p.TRAIN_SECONDS, p.LOCAL_STEPS)


def check_arrays(arrays: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
                 what: str = "arrays", finite: bool = True) -> str | None:
    """The same names, shapes and dtypes as `expected`, and (if `finite`) every value finite."""
    if set(arrays) != set(expected):
        missing, extra = sorted(set(expected) - set(arrays)), sorted(set(arrays) - set(expected))
        return f"{what} {sorted(arrays)} are not {sorted(expected)} (missing {missing}, extra {extra})"
    for key, reference in expected.items():
        array = arrays[key]
        if array.shape != reference.shape or array.dtype != reference.dtype:
            return (f"{what} {key!r} is {array.dtype}{list(array.shape)}; "
                    f"expected {reference.dtype}{list(reference.shape)}")
        reason = _non_finite(array, f"{what} {key!r}") if finite else None
        if reason:
            return reason
    return None


def check_finite(arrays: Mapping[str, np.ndarray], what: str = "arrays") -> str | None:
    """Every value of every array finite; else the first array's count of those that are not."""
    for key, array in arrays.items():
        reason = _non_finite(array, f"{what} {key!r}")
        if reason:
            return reason
    return None


def check_train_reply(arrays: Mapping[str, np.ndarray], metrics: Mapping[str, Any],
                      global_arrays: Mapping[str, np.ndarray], described_examples: int,
                      planned_steps: int, finite: bool = True) -> str | None:
    """A train reply: the global model's arrays (finite, unless `finite` is False: the strategy
    checks that on the average, `Staged.aggregate_train`); the sample count the node described;
    the steps its local schedule takes on them; a finite, non-negative loss and time."""
    missing = [key for key in TRAIN_METRICS if key not in metrics]
    if missing:
        return f"metrics lack {missing}"
    for key in TRAIN_METRICS:
        if not _is_number(metrics[key]):
            return f"{key}={metrics[key]!r} is not a finite number"
    examples, steps = metrics[p.NUM_EXAMPLES], metrics[p.LOCAL_STEPS]
    if examples != described_examples:
        return f"{p.NUM_EXAMPLES}={examples:g}, but the node described {described_examples} samples"
    if examples and steps != planned_steps:
        return f"{p.LOCAL_STEPS}={steps:g}, but its local schedule takes {planned_steps} on {examples:g} samples"
    for key in (p.TRAIN_LOSS, p.TRAIN_SECONDS):
        if metrics[key] < 0:
            return f"{key}={metrics[key]:g} is negative"
    return check_arrays(arrays, global_arrays, finite=finite)


def check_gradient_metrics(metrics: Mapping[str, Any], num_heads: int) -> str | None:
    """A gradient reply's extras: each head's mean curvature σ(1-σ), K numbers in [0, 1/4]; and
    the loss split K ways, K numbers >= 0 that add up to its train-loss."""
    curvature, losses = metrics.get(p.CURVATURE), metrics.get(p.LOSSES)
    for key, value in ((p.CURVATURE, curvature), (p.LOSSES, losses)):
        if not isinstance(value, list) or len(value) != num_heads \
                or not all(_is_number(v) for v in value):
            return f"{key} is {value!r:.60}, not a list of {num_heads} finite numbers"
    if not all(0.0 <= h <= 0.25 for h in curvature):
        return f"{p.CURVATURE} has entries outside [0, 0.25] (a mean of σ(1-σ))"
    if min(losses) < 0 or not math.isclose(sum(losses), metrics[p.TRAIN_LOSS], rel_tol=1e-6,
                                           abs_tol=1e-9):
        return (f"{p.LOSSES} (sum {sum(losses):.6g}) are not {num_heads} numbers >= 0 adding up to "
                f"{p.TRAIN_LOSS}={metrics[p.TRAIN_LOSS]:.6g}")
    return None


def check_description(metrics: Mapping[str, Any], max_examples: int | None) -> str | None:
    """A `describe` reply's counts: whole numbers, and no more samples than the dataset holds
    (when the server knows it: nodes that read the run's data)."""
    for key in (p.PARTITION_ID, p.NUM_PARTITIONS, p.NUM_EXAMPLES, p.NOISY_EXAMPLES):
        value = metrics.get(key)
        if not _is_number(value) or value != int(value) or value < 0:
            return f"{key}={value!r} is not a whole number >= 0"
    examples = int(metrics[p.NUM_EXAMPLES])
    if max_examples is not None and examples > max_examples:
        return f"{p.NUM_EXAMPLES}={examples} is more than the dataset's {max_examples} samples"
    if metrics[p.NOISY_EXAMPLES] > examples:
        return f"{p.NOISY_EXAMPLES}={metrics[p.NOISY_EXAMPLES]:g} exceeds its {examples} samples"
    return None


def check_moments(moments: Mapping[str, np.ndarray], num_features: int) -> str | None:
    """Feature moments: a sum and a sum of squares per feature (float64), finite, squares >= 0."""
    vector = np.zeros(num_features, np.float64)
    reason = check_arrays(moments, {"sum": vector, "sum-sq": vector}, "moments")
    if reason is None and (moments["sum-sq"] < 0).any():
        return "moments 'sum-sq' has negative entries"
    return reason


def check_statistics(arrays: Mapping[str, np.ndarray], num_classes: int, num_features: int,
                     num_examples: int) -> str | None:
    """Class statistics in their wire form (`ClassStatistics.to_arrays`): the run's K and D,
    finite, counts that are whole, non-negative and add up to the node's samples."""
    k, d = num_classes, num_features
    expected = {"counts": np.zeros(k, WIRE_DTYPE), "sums": np.zeros((k, d), WIRE_DTYPE),
                "square-norms": np.zeros(k, WIRE_DTYPE)}
    if "gram-triu" in arrays:
        expected["gram-triu"] = np.zeros(d * (d + 1) // 2, WIRE_DTYPE)
    if "scatter-factor" in arrays:  # low-rank: [r, D], r as asked, at most D
        rank = np.shape(arrays["scatter-factor"])[0] if np.ndim(arrays["scatter-factor"]) == 2 else 0
        expected["scatter-factor"] = np.zeros((min(rank, d), d), WIRE_DTYPE)
    reason = check_arrays(arrays, expected, "statistics")
    if reason:
        return reason
    counts = arrays["counts"]
    if (counts < 0).any() or (counts != np.round(counts)).any() or (arrays["square-norms"] < 0).any():
        return "statistics have negative or fractional counts, or negative square norms"
    if int(counts.sum()) != num_examples:
        return f"statistics count {int(counts.sum())} samples, but the node described {num_examples}"
    return None


def _non_finite(array: np.ndarray, what: str) -> str | None:
    if np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.complexfloating):
        if np.isfinite(array).all():  # the common case, without counting (4x faster)
            return None
        bad = int(array.size - np.isfinite(array).sum())
        if bad:
            return f"{what} has {bad} non-finite value(s)"
    return None


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))
