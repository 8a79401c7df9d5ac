"""A start checked before it is used: the clients whose statistics make it worse, left out.

The server adds every client's class sums and Gram matrix, so one client's forged statistics
move every head before any round can correct them, and under label skew a class one client
holds alone is only that client's word: no robust mean of the clients' statistics can tell its
forgery from its data. What the server can tell is whether the start is better without it. It
builds the start once without each client in turn, scores each on its own held-out rows, and
leaves out the clients whose absence raises the accuracy by more than a margin: an honest
client's rows can only help (or, in IID, change nothing), a forgery's removal helps.

The linear heads are scored before calibration: calibration's one scale and one bias keep the
argmax, so the score is the calibrated start's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ovalp_flwr.core.head_init.base import HeadInit
from ovalp_flwr.core.head_init.statistics import ClassStatistics


def without(total: ClassStatistics, part: ClassStatistics) -> ClassStatistics:
    """The federation's statistics less one client's."""
    gram = None if total.gram is None else total.gram - part.gram
    return ClassStatistics(total.counts - part.counts, total.sums - part.sums,
                           total.square_norms - part.square_norms, gram)


def accuracy(init: HeadInit, stats: ClassStatistics, features: np.ndarray, labels: np.ndarray,
             seed: int) -> float:
    """The uncalibrated start's accuracy on the rows (calibration keeps the argmax)."""
    weight, bias = init.linear_head(stats, features.shape[1], stats.num_classes, seed)
    return float(np.mean(np.argmax(features @ weight.T + bias, axis=1) == labels))


@dataclass(frozen=True)
class LeaveOutCheck:
    """What the check found: the start's accuracy with everyone, the clients left out in the
    order they were, and each one's gain when it was."""

    accuracy: float
    left_out: list[int]
    gains: list[float]


def gains_without_each(init: HeadInit, total: ClassStatistics,
                       parts: Mapping[int, ClassStatistics], nodes: list[int],
                       features: np.ndarray, labels: np.ndarray,
                       seed: int) -> tuple[float, dict[int, float]]:
    """The start's accuracy, and each node's gain from leaving it out: n + 1 solves."""
    base = accuracy(init, total, features, labels, seed)
    return base, {node: accuracy(init, without(total, parts[node]), features, labels, seed) - base
                  for node in nodes}


def changed(total: ClassStatistics, parts: Mapping[int, ClassStatistics],
            changes: Mapping[int, ClassStatistics | None]) -> ClassStatistics:
    """`total` with some clients' statistics taken out (None) or replaced."""
    for node, new in changes.items():
        total = without(total, parts[node])
        if new is not None:
            total = ClassStatistics.merge([total, new])
    return total


def gains(init: HeadInit, total: ClassStatistics, parts: Mapping[int, ClassStatistics],
          candidates: Mapping[str, Mapping[int, ClassStatistics | None]], features: np.ndarray,
          labels: np.ndarray, seed: int) -> dict[str, float]:
    """How much more accurate the start is under each candidate change (`changed`) than as
    sent: one solve each, and one for the start as sent."""
    if not candidates:
        return {}
    base = accuracy(init, total, features, labels, seed)
    return {name: accuracy(init, changed(total, parts, change), features, labels, seed) - base
            for name, change in candidates.items()}


def group_gain(init: HeadInit, total: ClassStatistics, parts: Mapping[int, ClassStatistics],
               group: list[int], features: np.ndarray, labels: np.ndarray, seed: int) -> float:
    """How much more accurate the start is without `group` (together): two solves. 0 for an
    empty group."""
    if not group:
        return 0.0
    return gains(init, total, parts, {"out": dict.fromkeys(group)}, features, labels, seed)["out"]


def leave_out_check(init: HeadInit, total: ClassStatistics,
                    parts: Mapping[int, ClassStatistics], features: np.ndarray,
                    labels: np.ndarray, seed: int, margin: float) -> LeaveOutCheck:
    """Left out one at a time: the client whose absence helps most, while that gain exceeds
    `margin`. One at a time, because a forgery still in the sums makes honest clients look
    harmful too (their rows pull against it). `parts` is read one client at a time, so it may
    unpack each client's statistics when read (`setup.StatisticsSum.kept`)."""
    remaining = [node for node in parts if parts[node].num_samples > 0]
    first = None
    left, gains = [], []
    while remaining:
        base, gain = gains_without_each(init, total, parts, remaining, features, labels, seed)
        first = base if first is None else first
        node = max(gain, key=gain.get)
        if gain[node] <= margin:
            break
        total = without(total, parts[node])
        remaining.remove(node)
        left.append(node)
        gains.append(gain[node])
    return LeaveOutCheck(first if first is not None else 0.0, left, gains)
