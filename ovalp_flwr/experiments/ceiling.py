"""The centralised ceiling of a dataset's features: what `benchmarks/centralised_ceiling.py`
measured (logistic regression on all training features in one place, C tuned on a held-out
tenth), read back for reports that measure federated runs against it. The model kind whose
figure is the ceiling is chosen on those validation rows too: the test split only scores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CEILING_FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / \
    "centralised_ceiling.json"


KINDS = ("multinomial", "one-vs-rest")  # a tie on validation goes to the first


class CeilingError(ValueError):
    """No measured ceiling for a case; the message says which and how to measure it."""


def chosen_kind(case: dict[str, Any]) -> str:
    """The model kind with the better validation accuracy at its own chosen λ."""
    def validation(kind: str) -> float:
        fit = case[kind]
        return float(fit["validation_accuracy"][f"{fit['best_lambda']:g}"])

    return max(KINDS, key=lambda kind: (validation(kind), -KINDS.index(kind)))


def case_ceiling(case: dict[str, Any]) -> float:
    """The chosen kind's test accuracy (a fraction)."""
    return float(case[chosen_kind(case)]["test_accuracy"])


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
    """Test accuracy (a fraction) of the centralised logistic regression chosen on validation."""
    key = f"{dataset}:{encoder}"
    cases = read_ceilings(path)
    if key not in cases:
        raise CeilingError(f"no centralised ceiling for {key} in {path}; measure it with "
                           f"`python benchmarks/centralised_ceiling.py --case {key}`")
    return case_ceiling(cases[key])
