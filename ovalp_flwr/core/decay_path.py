"""`weight-decay = "auto"` under the server's L-BFGS: a warm-started path down a grid of
weight decays, each value's heads scored on the validation rows, and the run goes on at the best.

The penalty changes the optimum, not the data: the clients' gradients need no new request, and
the server's preconditioner at a new λ is the old eigendecomposition rescaled
(`GramPreconditioner.at`). Each value gets `rounds_each` L-BFGS rounds from the heads the value
before it ended at (a warm start, as glmnet walks its λ path), strongest first, so every value
starts near its optimum. The walk stops two values past the best validation accuracy, or at the
grid's end; among equals the strongest penalty wins (the simpler model).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

PAST_THE_BEST = 2  # values walked after the best before the walk stops


@dataclass
class DecayPath:
    """Where the walk is: the values scored so far and the heads each ended at."""

    grid: tuple[float, ...]  # strongest first
    rounds_each: int
    scores: list[float] = field(default_factory=list)  # validation accuracy per value walked
    points: list[np.ndarray] = field(default_factory=list)  # the heads each value ended at
    rounds_at_value: int = 0
    chosen: float | None = None

    @property
    def walking(self) -> bool:
        return self.chosen is None

    @property
    def value(self) -> float:
        """The weight decay the rounds are at now."""
        return self.chosen if self.chosen is not None else self.grid[len(self.scores)]

    @property
    def best(self) -> int:
        """The index of the best value so far: the strongest among equal scores."""
        return max(range(len(self.scores)), key=lambda i: (self.scores[i], -i))

    def tick(self) -> bool:
        """One more round at this value; whether it was the value's last (walking only)."""
        self.rounds_at_value += 1
        return self.walking and self.rounds_at_value >= self.rounds_each

    def record(self, score: float, point: np.ndarray) -> np.ndarray:
        """The value's heads and their validation accuracy; the heads the next value starts
        from (the best value's, once the walk ends)."""
        self.scores.append(float(score))
        self.points.append(np.array(point, copy=True))
        self.rounds_at_value = 0
        if len(self.scores) == len(self.grid) or len(self.scores) - 1 - self.best >= PAST_THE_BEST:
            self.chosen = self.grid[self.best]
            return self.points[self.best]
        return self.points[-1]

    def summary(self) -> dict:
        """What summary.json says of the walk."""
        return {"grid": list(self.grid[:len(self.scores)]), "val_accuracy": list(self.scores),
                "rounds_each": self.rounds_each, "chosen": self.chosen}

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        arrays = {f"point{i}": point for i, point in enumerate(self.points)}
        return arrays, {"scores": list(self.scores), "rounds_at_value": self.rounds_at_value,
                        "chosen": self.chosen}

    def restore(self, arrays: dict[str, np.ndarray], numbers: dict) -> None:
        self.scores = [float(s) for s in numbers["scores"]]
        self.points = [arrays[f"point{i}"] for i in range(len(self.scores))]
        self.rounds_at_value = int(numbers["rounds_at_value"])
        self.chosen = numbers["chosen"]
