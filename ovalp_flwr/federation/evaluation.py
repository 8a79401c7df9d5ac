"""The server's score of the global model after every round, on its own test split (and on the
validation rows, where the run holds some back), and the run's one line per round. Each path
says how a model predicts (`_right`); the rest is here."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from logging import INFO

import torch
from flwr.app import ArrayRecord, MetricRecord

from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.exchange import FederationError
from ovalp_flwr.ops.console import say


# per-round counts of what went wrong, as the round's line names them
ROUND_FAULTS = (("clients_failed", "client(s) failed"), ("clients_timed_out", "timed out"),
                ("clients_rejected", "reply(ies) rejected"))


class CentralEvaluator(ABC):
    """Scores the global model on the server's test split after every round; remembers when and
    how long. A subclass says how a model predicts (`_right`)."""

    def __init__(self, num_rounds: int, stage_of: Callable[[int], int], labels: torch.Tensor,
                 domains: torch.Tensor, domain_names: tuple[str, ...]) -> None:
        self.labels, self.domains = labels, domains  # of the test rows, on the model's device
        # with several domains, accuracy on each domain's test rows too (the union is `accuracy`)
        self.domain_names = domain_names if len(domain_names) > 1 else ()
        self.domain_accuracy: dict[int, dict[str, float]] = {}
        self.seconds: dict[int, float] = {}  # round -> seconds of its evaluation
        self.round_seconds: dict[int, float] = {}  # round -> seconds from the last one's end
        self.done_at: dict[int, float] = {}  # round -> when its evaluation ended
        self.validation_accuracy: dict[int, float] = {}  # round -> on the validation rows
        self.num_rounds, self.stage_of = num_rounds, stage_of  # for the round's log line
        self.round_info: Callable[[int], dict] = lambda _round: {}  # the strategy's record
        # federated validation: the federation's validation accuracy of a round, if summed
        self.federated_validation: Callable[[int], float | None] = lambda _round: None

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        start = time.perf_counter()
        right = self._right(arrays)
        acc = float(right.float().mean())
        on_validation = self._right_on_validation(arrays)
        if on_validation is not None:
            self.validation_accuracy[server_round] = float(on_validation.float().mean())
        elif (federated := self.federated_validation(server_round)) is not None:
            self.validation_accuracy[server_round] = federated
        if self.domain_names:
            self.domain_accuracy[server_round] = self._per_domain(right)
        ended = self.done_at[server_round] = time.perf_counter()
        self.seconds[server_round] = ended - start
        if server_round:
            self.round_seconds[server_round] = ended - self.done_at.get(server_round - 1, ended)
        self._say_round(server_round, acc)
        return MetricRecord({p.ACCURACY: acc})

    def score(self, arrays: ArrayRecord) -> float:
        """Test accuracy of `arrays`, recorded nowhere (a trial point's, beside the round's)."""
        return float(self._right(arrays).float().mean())

    def validation_score(self, arrays: ArrayRecord) -> float:
        """Validation accuracy of `arrays`, recorded nowhere: what a choice is made on."""
        right = self._right_on_validation(arrays)
        if right is None:
            raise ValueError("a choice needs validation rows, and this run holds none back")
        return float(right.float().mean())

    @abstractmethod
    def _right(self, arrays: ArrayRecord) -> torch.Tensor:
        """Which test rows the model `arrays` predicts right (bool [N]): one forward pass for
        the union and every domain."""

    def _right_on_validation(self, arrays: ArrayRecord) -> torch.Tensor | None:
        """Which validation rows the model predicts right, or None where the run holds none."""
        return None

    def state(self) -> dict:
        """What a checkpoint keeps of the rounds scored so far."""
        return {"domain_accuracy": self.domain_accuracy, "seconds": self.seconds,
                "round_seconds": self.round_seconds,
                "validation_accuracy": self.validation_accuracy}

    def restore(self, state: dict) -> None:
        """Back to `state`; the next round's seconds count from now."""
        for name in ("domain_accuracy", "seconds", "round_seconds", "validation_accuracy"):
            setattr(self, name, {int(r): value for r, value in state.get(name, {}).items()})
        last = max(self.seconds)
        self.done_at[last] = time.perf_counter()

    def recheck(self, server_round: int, arrays: ArrayRecord, recorded: float) -> None:
        """A resumed head must score on this test set what it scored at `server_round`: else
        the server's data or normalisation changed, and the rounds would not go on the same."""
        scored = self.score(arrays)
        if abs(scored - recorded) * len(self.labels) > 0.5:
            raise FederationError(f"resume: the checkpoint's head scores {scored:.4f} here but "
                                  f"{recorded:.4f} at round {server_round}: the server's test "
                                  "features are not the ones the run was scored on")

    def _per_domain(self, right: torch.Tensor) -> dict[str, float]:
        """Accuracy on each domain's test rows, from the rows predicted right (NaN-free: a
        domain without test rows is left out)."""
        return {name: float(right[self.domains == d].float().mean())
                for d, name in enumerate(self.domain_names) if bool((self.domains == d).any())}

    def _say_round(self, server_round: int, acc: float) -> None:
        """The run's one line per round for its user: stage, accuracy, the round's seconds,
        and failed clients if any."""
        width = len(str(self.num_rounds))
        where = f"round {server_round:>{width}}/{self.num_rounds}"
        validation = self.validation_accuracy.get(server_round)
        on_validation = f"  validation {validation:.4f}" if validation is not None else ""
        if server_round == 0:
            say(INFO, "%s  %-8s accuracy %.4f%s", where, "start", acc, on_validation)
            return
        info = self.round_info(server_round)
        faults = ", ".join(f"{info[key]} {what}" for key, what in ROUND_FAULTS if info.get(key))
        say(INFO, "%s  stage %d  accuracy %.4f%s  %5.1f s%s", where,
            self.stage_of(server_round), acc, on_validation,
            self.round_seconds[server_round], f"  ({faults})" if faults else "")
