"""Every personalization method's hyperparameters and their checks, without torch.

A run config is validated before anything trains (`personalize/options.PersonalizeOptions`), so
what it needs from the methods lives here: their names, each one's frozen dataclass of
hyperparameters with its defaults and its `check`, and `HyperparameterError`. The method
modules (`ft`, `lp`, `lp_ft`, ...) import their `Hyperparameters` from here and add the
training, which needs torch. A knob's `doc` metadata is its line in docs/config.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

PFT_OPTIMIZERS = ("adamw", "sgd")  # ovalp_flwr.core.training's local optimizers


class HyperparameterError(ValueError):
    """A bad method name or `pft.<method>.<key>` value; one line naming the run-config key, the
    value and what is allowed (`PersonalizeOptions.check` turns it into its `ConfigError`)."""

    def __init__(self, method: str | None, key: str, value: Any, allowed: str) -> None:
        self.key = key if method is None else f"pft.{method}.{key}"
        self.value, self.allowed = value, allowed
        super().__init__(f"run config: {self.key}={value!r} is not allowed; {allowed}")


def knob(default: Any, doc: str) -> Any:
    """A method's own hyperparameter (`pft.<method>.<name>`): its default and what it does."""
    return dataclasses.field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class FineTuning:
    """The study's PFT setting: 15 epochs of Adam at 1e-3 (AdamW without decay), batch 32.
    Every method shares these; a run config sets them with the `pft-*` keys."""

    epochs: int = 15
    learning_rate: float = 1e-3
    batch_size: int = 32
    optimizer: str = "adamw"
    weight_decay: float = 0.0

    def check(self) -> dict[str, str]:
        """{hyperparameter: what is allowed} for each bad value (subclasses add theirs)."""
        bad = {}
        if self.epochs < 1:
            bad["epochs"] = "use an integer >= 1"
        if not self.learning_rate > 0:
            bad["learning-rate"] = "use a value > 0"
        if self.batch_size < 1:
            bad["batch-size"] = "use an integer >= 1"
        if self.optimizer not in PFT_OPTIMIZERS:
            bad["optimizer"] = f"choose one of: {', '.join(PFT_OPTIMIZERS)}"
        if self.weight_decay < 0:
            bad["weight-decay"] = "use a value >= 0"
        return bad


@dataclass(frozen=True)
class LPFTHyperparameters(FineTuning):
    lp_epochs: int = knob(5, "Of the `pft-epochs`, how many train the heads alone first; the "
                             "rest train everything.")

    def check(self) -> dict[str, str]:
        bad = super().check()
        if not 0 <= self.lp_epochs <= self.epochs:
            bad["lp-epochs"] = f"use an integer in [0, epochs={self.epochs}]"
        return bad


@dataclass(frozen=True)
class ProximalHyperparameters(FineTuning):
    mu: float = knob(0.1, "Weight of μ‖θ − θ_G‖² in the loss, which holds the personalized "
                          "model near the global one.")

    def check(self) -> dict[str, str]:
        bad = super().check()
        if self.mu < 0:
            bad["mu"] = "use a value >= 0"
        return bad


@dataclass(frozen=True)
class SoupHyperparameters(FineTuning):
    candidates: int = knob(3, "How many FT candidates are trained from the global model and "
                              "averaged.")
    lr_spread: float = knob(2.0, "The candidates' learning rates run geometrically from "
                                 "`pft-learning-rate` / spread to `pft-learning-rate` × spread "
                                 "(1: every candidate at `pft-learning-rate`).")

    def check(self) -> dict[str, str]:
        bad = super().check()
        if self.candidates < 1:
            bad["candidates"] = "use an integer >= 1"
        if not self.lr_spread >= 1:
            bad["lr-spread"] = "use a value >= 1 (1: every candidate at learning-rate)"
        return bad


@dataclass(frozen=True)
class SparseHyperparameters(FineTuning):
    share: float = knob(0.1, "The share of all parameter entries (adapter and heads together) "
                             "that move: those with the largest local-loss gradient at the "
                             "global model.")

    def check(self) -> dict[str, str]:
        bad = super().check()
        if not 0 < self.share <= 1:
            bad["share"] = "use a value in (0, 1]"
        if self.weight_decay > 0:  # decay moves every entry, masked or not
            bad["weight-decay"] = "sparse keeps unselected entries fixed; use weight-decay = 0"
        return bad


@dataclass(frozen=True)
class LSSHyperparameters(FineTuning):
    models: int = knob(3, "Ingredients of the local superior soup, trained one after another; "
                          "the `pft-epochs` are split among them.")
    affinity: float = knob(1.0, "Weight of ‖θ_m − θ_G‖², which keeps each ingredient in the "
                                "global model's basin.")
    diversity: float = knob(0.1, "Weight of −mean ‖θ_m − θ_i‖² over the earlier ingredients, "
                                 "which spreads them apart; 0, or below `affinity` (else the "
                                 "loss is unbounded below).")

    def check(self) -> dict[str, str]:
        bad = super().check()
        if not 1 <= self.models <= self.epochs:
            bad["models"] = f"use an integer in [1, epochs={self.epochs}]"
        if self.affinity < 0:
            bad["affinity"] = "use a value >= 0"
        if self.diversity < 0 or 0 < self.diversity >= self.affinity:
            # the two quadratics sum to (affinity − diversity)‖θ_m‖² + linear terms
            bad["diversity"] = (f"use 0, or a value >= 0 and < affinity={self.affinity} "
                                f"(else the loss is unbounded below)")
        return bad


@dataclass(frozen=True)
class OwnHeadsHyperparameters(ProximalHyperparameters):
    mu: float = knob(1.0, "Weight of μ‖V − V_G‖² over the heads of the client's own classes: "
                          "how far they may move (0: freely). 1.0 keeps Global within a few "
                          "points of the global model's.")

    def check(self) -> dict[str, str]:
        bad = super().check()
        if self.weight_decay > 0:  # decay moves every entry, masked or not
            bad["weight-decay"] = ("own-heads keeps the other classes' heads fixed; "
                                   "use weight-decay = 0")
        return bad


# Every method by its run-config name, in the order runs and reports list them: its
# hyperparameters, and what it does (docs/config.md; its module says how).
# `ovalp_flwr.personalize.METHODS` holds the `Personalizer` classes, with these names and
# these `Hyperparameters`.
HYPERPARAMETERS: dict[str, type[FineTuning]] = {
    "ft": FineTuning,
    "lp": FineTuning,
    "lp-ft": LPFTHyperparameters,
    "proximal": ProximalHyperparameters,
    "soup": SoupHyperparameters,
    "sparse": SparseHyperparameters,
    "lss": LSSHyperparameters,
    "own-heads": OwnHeadsHyperparameters,
}
METHOD_NAMES: tuple[str, ...] = tuple(HYPERPARAMETERS)
METHOD_DOCS: dict[str, str] = {
    "ft": "FT: every parameter (adapter and heads) fine-tuned on the client's data.",
    "lp": "LP: the heads alone fine-tuned; the features (adapter B) stay the global model's.",
    "lp-ft": "LP-FT (Kumar et al., 2022): the heads first, for `lp-epochs`, then everything. "
             "Fitting the heads before the features move keeps the early, large head gradients "
             "from distorting the features.",
    "proximal": "Proximal FT: FT with μ‖θ − θ_G‖² added to the loss (FedProx's term, applied "
                "after federation), which holds the personalized model near the global one.",
    "soup": "Soup FT (Wortsman et al., 2022, the uniform soup): `candidates` FT runs from the "
            "global model, at learning rates spread around `pft-learning-rate`, averaged "
            "parameter by parameter.",
    "sparse": "Sparse FT: only the `share` of parameter entries with the largest local-loss "
              "gradient at the global model move; the rest stay exactly the global model's.",
    "lss": "Local Superior Soups (Chen et al., 2024): `models` ingredients trained one after "
           "another, each on the loss of a random interpolation of those so far, held near the "
           "global model (`affinity`) and apart (`diversity`), then averaged.",
    "own-heads": "Own heads (ours): only the heads of the classes in the client's training "
                 "labels move, pulled towards the global heads; the adapter and every other "
                 "class's head stay the global model's.",
}


def own_knobs(method: str) -> list[dataclasses.Field]:
    """The fields of `method`'s hyperparameters that are its own (not `FineTuning`'s)."""
    shared = {f.name for f in dataclasses.fields(FineTuning)}
    return [f for f in dataclasses.fields(HYPERPARAMETERS[method]) if f.name not in shared]


def parse_hyperparameters(method: str, options: dict[str, Any]) -> FineTuning:
    """Build `method`'s hyperparameters from `{dash-name: value}` (defaults for the rest);
    raise `HyperparameterError` naming an unknown method, or the first unknown key or bad
    value."""
    if method not in HYPERPARAMETERS:
        raise HyperparameterError(None, "personalize", method,
                                  f"choose methods from: {', '.join(METHOD_NAMES)}")
    hyperparameters = HYPERPARAMETERS[method]
    fields = {f.name.replace("_", "-"): f for f in dataclasses.fields(hyperparameters)}
    values = {}
    for key, value in options.items():
        if key not in fields:
            raise HyperparameterError(method, key, value,
                                      f"{method}'s hyperparameters: {', '.join(fields)}")
        values[fields[key].name] = _typed(method, key, value, type(getattr(
            hyperparameters(), fields[key].name)))
    hp = hyperparameters(**values)
    for key, allowed in hp.check().items():
        raise HyperparameterError(method, key, options.get(key, getattr(
            hp, key.replace("-", "_"))), allowed)
    return hp


def _typed(method: str, key: str, value: Any, kind: type) -> Any:
    """Run-config values arrive typed; an int may stand for a float, nothing else converts."""
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, kind) and not isinstance(value, bool):
        return value
    raise HyperparameterError(method, key, value, f"expected a value of type {kind.__name__}")
