"""Personalization's knobs (run config): the methods each client runs after the last round,
the knobs they share (`pft-*`) and each method's own (`pft.<method>.<knob>`, declared by its
Hyperparameters beside its code). Torch-free."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any

from ovalp_flwr.options import ConfigError, Options, key, one_of
from ovalp_flwr.personalize.hyperparameters import (HYPERPARAMETERS, METHOD_NAMES,
                                                    PFT_OPTIMIZERS, FineTuning,
                                                    HyperparameterError, parse_hyperparameters)

PFT_GLOBALS = ("server", "clients")  # who scores Global: ovalp_flwr.personalize.phase
PFT_PREFIX = "pft."  # pft.<method>.<hyperparameter>: a personalization method's own knobs
# the knobs every method shares (personalize.hyperparameters.FineTuning) and their run-config keys
SHARED_PFT = {"epochs": "pft-epochs", "learning-rate": "pft-learning-rate",
              "batch-size": "pft-batch-size", "optimizer": "pft-optimizer",
              "weight-decay": "pft-weight-decay"}


def default_pft() -> tuple[tuple[str, Any], ...]:
    """Every method's own knobs at the defaults its class declares, as `pft` holds them."""
    shared = {f.name for f in fields(FineTuning)}
    return tuple(sorted((f"{name}.{f.name.replace('_', '-')}", f.default)
                        for name, hyperparameters in HYPERPARAMETERS.items()
                        for f in fields(hyperparameters) if f.name not in shared))


@dataclass(frozen=True)
class PersonalizeOptions(Options):
    """Fine-tuning the final global model on each client's own data."""

    TITLE = "Personalization"
    INTRO = ("Fine-tuning the final global model on each client's own data after the last round "
             "([Personalization after federation](personalization.md)).")

    personalize: str = key(
        "", "The methods each client runs on the final global model, "
        'space-separated, each once (`""`: none).', METHOD_NAMES)
    personalize_curve: str = key(
        "", "PFT epochs (space-separated, in 1..`pft-epochs`) at which Global "
        "is also measured; Local is measured every epoch.")
    pft_global: str = key(
        "server", "Who scores a personalized model's Global accuracy. "
        "`server`: the server, on its own test split (the global distribution, the one every "
        "round is scored on): each model travels once, N uploads per method. `clients`: every "
        "client scores every client's model on its own test split (N² transfers), for a "
        "federation whose server holds no test data. The default is `server` because the "
        "ServerApp always holds the test split and Global is meant as accuracy on the global "
        "distribution; Local is each client's own either way.", PFT_GLOBALS)
    pft_epochs: int = key(
        15, "Fine-tuning epochs, shared by every method (the study: 15 epochs "
        "of Adam at 1e-3).")
    pft_learning_rate: float = key(
        1e-3, "The methods' learning rate.")
    pft_batch_size: int = key(
        32, "The methods' mini-batch size.")
    pft_optimizer: str = key(
        "adamw", "The methods' optimiser.", PFT_OPTIMIZERS)
    pft_weight_decay: float = key(
        0.0, "The methods' weight decay; `sparse` and `own-heads` need 0 (decay "
        "would move the entries they keep fixed).")
    # ("<method>.<hyperparameter>", value) pairs of `pft.*` keys: each method's own knobs,
    # described by their Hyperparameters (ovalp_flwr.personalize.hyperparameters)
    pft: tuple[tuple[str, Any], ...] = dataclasses.field(default_factory=lambda: default_pft())

    @property
    def personalization_methods(self) -> list[str]:
        return self.personalize.split()

    @property
    def curve_epochs(self) -> list[int]:
        """`personalize-curve` as sorted epochs (validated)."""
        return sorted({int(e) for e in self.personalize_curve.split()})

    def personalizer_options(self, method: str) -> dict[str, Any]:
        """One method's hyperparameters: the shared `pft-*` keys, then its own `pft.<method>.*`."""
        shared = {name: getattr(self, key.replace("-", "_")) for name, key in SHARED_PFT.items()}
        own = {key.split(".", 1)[1]: value for key, value in self.pft
               if key.split(".", 1)[0] == method}
        return {**shared, **own}

    def check(self) -> None:
        """The methods' names and every method's knobs."""
        one_of("pft-global", self.pft_global, PFT_GLOBALS)
        for name, value in self.pft:
            if "." not in name or name.split(".", 1)[0] not in METHOD_NAMES:
                raise ConfigError(PFT_PREFIX + name, value, "use pft.<method>.<hyperparameter> "
                                  f"with a method from: {', '.join(METHOD_NAMES)}")
        for method in self.personalization_methods:
            if method not in METHOD_NAMES:
                raise ConfigError("personalize", method,
                                  f"choose methods from: {', '.join(METHOD_NAMES)}")
        if len(set(self.personalization_methods)) != len(self.personalization_methods):
            raise ConfigError("personalize", self.personalize, "name each method once")
        try:  # the shared knobs; a method this run uses with all it gets; the others' own knobs
            parse_hyperparameters("ft", self.personalizer_options("ft"))
            for method in METHOD_NAMES:
                options = self.personalizer_options(method)
                if method not in self.personalization_methods:
                    options = {k: v for k, v in options.items() if k not in SHARED_PFT}
                parse_hyperparameters(method, options)
        except HyperparameterError as err:
            raise ConfigError(self._written_key(err.key), err.value, err.allowed) from None
        for epoch in self.personalize_curve.split():
            if not epoch.isdigit() or not 1 <= int(epoch) <= self.pft_epochs:
                raise ConfigError("personalize-curve", self.personalize_curve,
                                  f"use space-separated epochs in 1..pft-epochs={self.pft_epochs}")

    def _written_key(self, name: str) -> str:
        """The key a user wrote for a method's knob: `pft.<method>.<name>`, or the shared
        `pft-<name>` it came from."""
        own = name[len(PFT_PREFIX):] if name.startswith(PFT_PREFIX) else ""
        knob = own.split(".", 1)[-1]
        return SHARED_PFT[knob] if own and own not in dict(self.pft) and knob in SHARED_PFT \
            else name
