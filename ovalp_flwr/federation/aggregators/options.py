"""Robustness's knobs (run config): the robust rule that combines the rounds' updates, the cap
on what a stated count buys, and the check of the start's statistics. Torch- and Flower-free."""

from __future__ import annotations

from dataclasses import dataclass

from ovalp_flwr.federation.aggregators import RULES
from ovalp_flwr.options import ConfigError, Options, Whole, key, one_of, share

ROBUST_AGGREGATIONS = ("none", *RULES)  # one file a rule, in this folder
ROBUST_STARTS = ("none", "screen", "leave-out")  # core.head_init.screen, .leave_out
NEEDS_A_SHARE = ("trimmed-mean", "multi-krum")  # at robust-fraction 0 these are the mean


@dataclass(frozen=True)
class RobustOptions(Options):
    """Defences against hostile clients, in the rounds and at the start."""

    TITLE = "Robustness"
    INTRO = ("Defences against hostile clients: in the rounds' mean and in the start's "
             "statistics ([Robustness](robustness.md)).")

    robust_aggregation: str = key(
        "none", "How the server combines the heads' updates: `none`, FedAvg's mean; "
        "or one of the robust rules of `federation/aggregators/` (one file each), which bound a "
        "hostile client's pull ([Robustness](robustness.md#robust-aggregation)).",
        ROBUST_AGGREGATIONS)
    robust_fraction: float = key(
        0.1, "The share of clients `robust-aggregation` assumes hostile: Multi-Krum "
        "leaves ⌈fraction · n⌉ out, the trimmed mean cuts that share at each end.")
    weight_cap: float = key(
        0.0, "The most weight one reply can have in the rounds' mean, as a multiple of "
        "the median sample count the clients holding data described (`0`: no cap). A client "
        "that states ten times its rows (the `stats-count` attack) buys at most this "
        "([Robustness](robustness.md#a-cap-on-what-a-count-buys)).")
    robust_start: str = key(
        "none", "`screen`: the server keeps each client's statistics, finds those "
        "that break the consensus of the others (rows 3x off the median client's mean square "
        "norm, a class mean against the median of its holders', statistics no rows could give) "
        "and leaves them out of the sums (not of the rounds) together, if the start without "
        "them is more accurate on the validation rows (`validation-fraction`) by more than "
        "`robust-start-margin`: two solves, and it holds against forgers acting together. "
        "`leave-out`: the screen, then the start built once without each remaining client in "
        "turn; a client whose absence raises the accuracy by more than the margin is left out "
        "too ([Robustness](robustness.md)).", ROBUST_STARTS)
    robust_start_margin: float = key(
        0.005, "With `robust-start`: the accuracy gain (a fraction) that leaves a "
        "client out.")

    def check(self) -> None:
        one_of("robust-aggregation", self.robust_aggregation, ROBUST_AGGREGATIONS)
        share("robust-fraction", self.robust_fraction, 0, 0.5, high_open=True)
        if self.robust_fraction == 0 and self.robust_aggregation in NEEDS_A_SHARE:
            raise ConfigError("robust-fraction", self.robust_fraction, f"with robust-aggregation="
                              f'"{self.robust_aggregation}" use a share > 0: at 0 it is the mean')
        if not self.weight_cap >= 0:
            raise ConfigError("weight-cap", self.weight_cap, "use a multiple >= 0 (0: no cap)")
        one_of("robust-start", self.robust_start, ROBUST_STARTS)
        share("robust-start-margin", self.robust_start_margin, 0, 1, high_open=True,
              what="an accuracy gain")

    def requires(self, config: Whole) -> None:
        """Where the rounds' mean is not a count-weighted mean of updates, and where the
        server holds no client's own statistics, these defences do not apply."""
        if self.weight_cap > 0 and (config.server_steps or config.dp_rounds_epsilon > 0):
            raise ConfigError("weight-cap", self.weight_cap, "use 0: the rounds' mean is not "
                              "weighted by counts here (server-optimizer \"lbfgs\" sums every "
                              "gradient; DP rounds average unweighted)")
        if self.robust_aggregation != "none" and config.server_steps:
            raise ConfigError("robust-aggregation", self.robust_aggregation, 'server-optimizer='
                              '"lbfgs" needs the exact sum of every gradient; use "none"')
        if self.robust_aggregation != "none" and config.finetune == "flora":
            raise ConfigError("robust-aggregation", self.robust_aggregation, "FLoRA stacks the "
                              "clients' LoRA factors instead of averaging them; use \"none\"")
        if self.robust_start != "none" and (config.statistics_aggregation == "secagg+"
                                            or config.finetune != "none"):
            raise ConfigError("robust-start", self.robust_start, "the check needs each client's "
                              'statistics: use statistics-aggregation="plain" on the cached-'
                              "feature path")
