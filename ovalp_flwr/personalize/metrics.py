"""The study's personalization metrics, from the clients' cross-scores (`pft-global =
"clients"`) or from the server's scores (`pft-global = "server"`).

With `clients`, client j scores every client i's personalized model on j's own test split and reports right
predictions and summed feature distances (no test row leaves j). From that matrix:
- Local: mean over clients of their own model's accuracy on their own test split;
- Global: mean over clients i of the mean accuracy of i's model on the *other* clients' splits;
- C-Std: standard deviation (population) of the clients' Local accuracies;
- Worst: the lowest Local accuracy;
- Average: the mean of Local and Global (this issue's definition);
- Distortion Δ: mean over clients i of the mean L2 distance, over every client's test rows,
  between the features of i's model and the global model's.
Clients with an empty test split have no Local accuracy and score nothing for others.

With `server`, client i reports its own model's right predictions on its own test split
(Local, as above) and the server scores every model on its own test split, the global
distribution: Global of client i is its model's accuracy there, and its distortion the mean L2
feature distance to the global model over those rows. C-Std, Worst, Average: as above.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CrossScores:
    """`correct[i, j]`, `distance[i, j]`: client i's model on client j's test split."""

    clients: list[int]  # partition ids, the order of both axes
    correct: np.ndarray
    distance: np.ndarray
    num_test: np.ndarray  # [j]

    def accuracy(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.num_test > 0, self.correct / np.maximum(self.num_test, 1), np.nan)


def per_client(scores: CrossScores) -> list[dict]:
    """One row per client: Local, Global (mean over the other clients) and distortion."""
    acc = scores.accuracy()
    total_test = scores.num_test.sum()
    rows = []
    for i, partition in enumerate(scores.clients):
        others = [acc[i, j] for j in range(len(scores.clients))
                  if j != i and scores.num_test[j] > 0]
        rows.append({
            "partition": partition,
            "num_test": int(scores.num_test[i]),
            "local": None if scores.num_test[i] == 0 else float(acc[i, i]),
            "global": float(np.mean(others)) if others else None,
            "distortion": float(scores.distance[i].sum() / total_test) if total_test else 0.0,
        })
    return rows


@dataclass(frozen=True)
class ServerScores:
    """Client i's model on the server's test split (`correct[i]` right, `distance[i]` summed
    over its `num_server_test` rows) and on i's own (`own_correct[i]` of `num_test[i]`, as i
    reported it)."""

    clients: list[int]  # partition ids
    own_correct: np.ndarray
    num_test: np.ndarray
    correct: np.ndarray
    distance: np.ndarray
    num_server_test: int


def per_client_on_server(scores: ServerScores) -> list[dict]:
    """One row per client, as `per_client`'s: Local on its own split, Global and distortion
    on the server's."""
    rows = []
    for i, partition in enumerate(scores.clients):
        own = int(scores.num_test[i])
        rows.append({
            "partition": partition,
            "num_test": own,
            "local": None if own == 0 else float(scores.own_correct[i] / own),
            "global": float(scores.correct[i] / scores.num_server_test),
            "distortion": float(scores.distance[i] / scores.num_server_test),
        })
    return rows


def mean_global(rows: list[dict]) -> float:
    """Global over the clients that have one (NaN if none): the summary's, and the curve's."""
    global_ = np.array([r["global"] for r in rows if r["global"] is not None])
    return float(global_.mean()) if len(global_) else float("nan")


def summarize(rows: list[dict]) -> dict[str, float]:
    """Local / Global / C-Std / Worst / Average / Distortion over the clients' rows."""
    local = np.array([r["local"] for r in rows if r["local"] is not None])
    summary = {
        "local": float(local.mean()),
        "global": mean_global(rows),
        "c_std": float(local.std()),
        "worst": float(local.min()),
        "distortion": float(np.mean([r["distortion"] for r in rows])),
    }
    summary["average"] = (summary["local"] + summary["global"]) / 2
    return summary


METRIC_NAMES = {"local": "Local", "global": "Global", "c_std": "C-Std", "worst": "Worst",
                "average": "Average", "distortion": "Δ"}
