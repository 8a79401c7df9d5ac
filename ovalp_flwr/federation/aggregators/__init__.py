"""The rounds' robust rules (`robust-aggregation`), one file each, found by name.

A new rule is its file here (an `Aggregator` subclass, `base.py`) and its line in `RULES`.
This module imports neither torch nor Flower, so `config` reads the names from it; a rule's
module is imported only when a run uses it.
"""

from __future__ import annotations

import importlib

RULES = {  # robust-aggregation -> "module:class" in this package
    "median": "median:Median",
    "trimmed-mean": "trimmed_mean:TrimmedMean",
    "multi-krum": "multi_krum:MultiKrum",
    "norm-clip": "norm_clip:NormClip",
    "geometric-median": "geometric_median:GeometricMedian",
}


def aggregator(kind: str, fraction: float):
    """The rule `kind` with its `fraction` of assumed attackers (an `Aggregator`)."""
    if kind not in RULES:
        raise ValueError(f"robust-aggregation={kind!r} is not allowed; use one of "
                         f"{', '.join(['none', *RULES])}")
    module, name = RULES[kind].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)(fraction)
