"""The centralised ceiling of a dataset's features: what `benchmarks/centralised_ceiling.py`
measured (logistic regression on all training features in one place, C tuned on a held-out
tenth), read back for reports that measure federated runs against it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CEILING_FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / \
    "centralised_ceiling.json"


class CeilingError(ValueError):
    """No measured ceiling for a case; the message says which and how to measure it."""


def read_ceilings(path: Path = CEILING_FILE) -> dict[str, Any]:
    """`{"<dataset>:<encoder>": {...}}` as the benchmark wrote it; {} if it never ran."""
    if not path.exists():
        return {}
    try:
        return dict(json.loads(path.read_text())["cases"])
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise CeilingError(f"{path}: not a ceiling file the benchmark wrote ({err}); rerun "
                           "`python benchmarks/centralised_ceiling.py --refit`") from None


def ceiling(dataset: str, encoder: str, path: Path = CEILING_FILE) -> float:
    """Test accuracy (a fraction) of the better centralised logistic regression."""
    key = f"{dataset}:{encoder}"
    cases = read_ceilings(path)
    if key not in cases:
        raise CeilingError(f"no centralised ceiling for {key} in {path}; measure it with "
                           f"`python benchmarks/centralised_ceiling.py --case {key}`")
    return float(cases[key]["ceiling"])
