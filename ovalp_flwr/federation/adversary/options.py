"""Attack rehearsal's knobs (run config): which attack, and how many clients make it.
Torch- and Flower-free."""

from __future__ import annotations

from dataclasses import dataclass

from ovalp_flwr.federation.adversary import ATTACKS as ADVERSARY
from ovalp_flwr.federation.adversary import UPDATES_ONLY
from ovalp_flwr.options import ConfigError, Options, Whole, key, one_of, share

ATTACKS = ("none", *ADVERSARY)  # one file an attack, in this folder


@dataclass(frozen=True)
class AttackOptions(Options):
    """Clients that lie within the rules, to rehearse a defence against."""

    TITLE = "Attack rehearsal"
    INTRO = ("Clients that lie within the rules, chosen by `seed`, to rehearse a defence "
             "against ([Robustness](robustness.md#rehearsing-an-attack)).")

    attack: str = key(
        "none", "Attack rehearsal: `attack-fraction` of the clients (chosen by "
        "`seed`) lie within the rules, as one of the attacks of `federation/adversary/` (one "
        "file each: scaled or sign-flipped updates, flipped labels, forged statistics and "
        "counts) ([Robustness](robustness.md#rehearsing-an-attack)).", ATTACKS)
    attack_fraction: float = key(
        0.1, "The share of clients that attack (at least one when `attack` is "
        "set).")

    def check(self) -> None:
        one_of("attack", self.attack, ATTACKS)
        share("attack-fraction", self.attack_fraction, 0, 1, low_open=True)

    def requires(self, config: Whole) -> None:
        if self.attack not in ("none", *UPDATES_ONLY) and config.finetune != "none":
            raise ConfigError("attack", self.attack, f"{self.attack} rehearses on the cached-"
                              'feature path; with finetune use "scale-10", "scale-100" or '
                              '"sign-flip"')
