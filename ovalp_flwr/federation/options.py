"""The rounds' and reliability's knobs (run config): the schedule, who takes part, how the
server combines the replies and steps, and how a run meets slow or failing nodes. Torch- and
Flower-free."""

from __future__ import annotations

from dataclasses import dataclass

from ovalp_flwr.federation.steps import STEPS
from ovalp_flwr.options import (ConfigError, Options, Whole, at_least, key, must_be, one_of,
                                positive, share)

SCHEDULES = ("two-stage", "single-stage")
AGGREGATION_WEIGHTS = ("samples", "uniform")
DRIFT_CORRECTIONS = ("none", "scaffold")
SCAFFOLD_VARIATES = ("server", "clients")  # who computes and keeps c_i: federation.scaffold
SERVER_OPTIMIZERS = (*STEPS, "lbfgs")  # steps/: one file a step; lbfgs: server_lbfgs.py


@dataclass(frozen=True)
class RoundOptions(Options):
    """The rounds, who takes part in them, and the server's and the clients' steps."""

    TITLE = "Schedule and aggregation"
    INTRO = "The rounds, who takes part in them and how the server combines the replies."

    schedule: str = key(
        "two-stage", "`two-stage`: OvA heads train on positives only for "
        "`stage1-rounds`, then all heads with BCE; `single-stage`: all heads from round 1 "
        '(the "OvA without two-stage" ablation).', SCHEDULES)
    stage1_rounds: int = key(
        1, "Rounds of stage 1 (positives only) under the two-stage schedule.")
    num_server_rounds: int = key(
        20, "Federated rounds; `0`: the heads' start is the whole run (FedNCM, "
        "Fed3R).")
    fraction_train: float = key(
        1.0, "The share of clients sampled per round (seeded by `seed` and the "
        "round), in (0, 1].")
    fraction_evaluate: float = key(
        0.0, "The share of clients that report local accuracy on their own data, in "
        "[0, 1].")
    aggregation_weights: str = key(
        "samples", "`samples`: FedAvg's weights, by sample count; `uniform`: each "
        "client with data counts once.", AGGREGATION_WEIGHTS)
    drift_correction: str = key(
        "scaffold", "`scaffold`: SCAFFOLD's control variates, kept where "
        '`scaffold-variates` says (needs `local-optimizer = "sgd"`); `none`: the recipe.',
        DRIFT_CORRECTIONS)
    scaffold_variates: str = key(
        "server", "Where SCAFFOLD's c_i are computed and kept: `server` (clients keep "
        "nothing; each node is sent its own c - c_i) or `clients` (the paper's protocol: each "
        "node keeps its c_i in its Context and uploads it beside its heads, doubling the "
        "upload; every node is sent the same c; the server does one pass over each c_i per "
        "round instead of four). The same global model, bit for bit.", SCAFFOLD_VARIATES)
    server_optimizer: str = key(
        "fedavg", "`fedavg`, or `fedadam`: Flower's FedAdam on the averaged update, "
        "with `server-learning-rate`; or `lbfgs`: no local steps, the clients send their "
        "full-batch gradient and the server takes L-BFGS steps on the centralised objective "
        "(the run's final loss + weight-decay/2 ‖W‖², bias unpenalised), preconditioned by the "
        "federation's Gram matrix ([The centralised optimum](server-optimizer.md)). The "
        "local-step keys, the stages and SCAFFOLD then do not apply; every round needs every "
        'client; with `statistics-aggregation = "secagg+"` the gradients are averaged under '
        "SecAgg+ too.", SERVER_OPTIMIZERS)
    server_learning_rate: float = key(
        0.1, "FedAdam's eta (Flower's default).")
    lbfgs_memory: int = key(
        10, 'With `server-optimizer = "lbfgs"`: the curvature pairs L-BFGS keeps.')
    lbfgs_patience: int = key(
        3, 'With `server-optimizer = "lbfgs"`: the rounds in a row a node may miss '
        "(timed out, failed, refused) before its rows leave the server's objective, with one "
        "warning naming it, and L-BFGS restarts from the heads it holds; until then a round "
        "without every row sends the same heads again ([The centralised optimum]"
        "(server-optimizer.md#a-node-that-does-not-answer)).")
    lbfgs_path_rounds: int = key(
        2, 'With `weight-decay = "auto"`: the L-BFGS rounds at each weight decay of '
        "the path, each warm-started from the one before; the path stops two values after "
        "the validation accuracy's best.")

    @property
    def server_steps(self) -> bool:
        """Whether the server optimises the objective itself (the clients send gradients)."""
        return self.server_optimizer == "lbfgs"

    def check(self) -> None:
        one_of("schedule", self.schedule, SCHEDULES)
        at_least("stage1-rounds", self.stage1_rounds, 0)
        at_least("num-server-rounds", self.num_server_rounds, 0)
        share("fraction-train", self.fraction_train, 0, 1, low_open=True, what="a fraction")
        share("fraction-evaluate", self.fraction_evaluate, 0, 1, what="a fraction")
        one_of("aggregation-weights", self.aggregation_weights, AGGREGATION_WEIGHTS)
        one_of("drift-correction", self.drift_correction, DRIFT_CORRECTIONS)
        one_of("scaffold-variates", self.scaffold_variates, SCAFFOLD_VARIATES)
        if self.scaffold_variates == "clients" and self.drift_correction != "scaffold":
            raise ConfigError("scaffold-variates", self.scaffold_variates,
                              "clients keep SCAFFOLD's variates only with "
                              'drift-correction="scaffold"; leave it "server"')
        one_of("server-optimizer", self.server_optimizer, SERVER_OPTIMIZERS)
        positive("server-learning-rate", self.server_learning_rate)
        at_least("lbfgs-memory", self.lbfgs_memory, 1)
        at_least("lbfgs-patience", self.lbfgs_patience, 1)
        at_least("lbfgs-path-rounds", self.lbfgs_path_rounds, 1)

    def requires(self, config: Whole) -> None:
        """SCAFFOLD's variates assume SGD steps; the server's L-BFGS needs every client's
        gradient every round (the sum is the centralised gradient only over all rows) and a
        convex objective (heads on the cached features)."""
        if self.drift_correction == "scaffold" and config.local_optimizer != "sgd":
            raise ConfigError("drift-correction", self.drift_correction,
                              "scaffold's control variates assume local SGD steps; "
                              "set local-optimizer=\"sgd\" or drift-correction=\"none\"")
        if self.server_steps:
            must_be(config, {
                "fraction-train": (1.0, "1.0: the gradient is exact only when every client "
                                   "sends its own"),
                "aggregation-weights": ("samples", '"samples": the sample-weighted mean of the '
                                        "clients' gradients is the centralised one"),
                "adapter-dim": (0, "0: the server's steps need a convex objective, the heads "
                                "alone")}, 'with server-optimizer="lbfgs"')


@dataclass(frozen=True)
class ReliabilityOptions(Options):
    """Slow or failing nodes, checkpoints and resuming."""

    TITLE = "Reliability"
    INTRO = "Slow or failing nodes, checkpoints and resuming ([Reliability](reliability.md))."

    round_timeout: float = key(
        3600.0, "Seconds a round waits for replies before it aggregates those it "
        "has and records the rest as timed out (Flower's default: 3600).")
    exclude_after_rejections: int = key(
        0, "A node whose train replies were rejected this many times is no "
        "longer sampled (`0`: never).")
    checkpoint_every: int = key(
        1, "A checkpoint in `results/<run-name>/` after every this many rounds "
        "(`0`: none), on both paths; FLoRA (`finetune = \"flora\"`) writes none and says so "
        "(its nodes hold the stacks they merged, which a checkpoint of the server cannot give "
        "back).")
    resume: bool = key(
        False, "`true`: go on from the last checkpoint of the run named by "
        "`run-name`.")

    def check(self) -> None:
        positive("round-timeout", self.round_timeout)
        at_least("exclude-after-rejections", self.exclude_after_rejections, 0)
        at_least("checkpoint-every", self.checkpoint_every, 0)

    def requires(self, config: Whole) -> None:
        if self.resume and not config.run_name:
            raise ConfigError("resume", self.resume, "a run resumes by name: set run-name to the "
                              "run to continue (results/<run-name>/ holds its checkpoint)")
