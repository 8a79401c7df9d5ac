"""The model's, the local step's and the heads' start's knobs (run config). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from ovalp_flwr.options import (ConfigError, Options, Whole, at_least, key, one_of, positive,
                                share)

HEADS = ("ova", "softmax")
LOCAL_OPTIMIZERS = ("adamw", "sgd")
EPOCH_SIZES = ("own-data", "equal-share", "own-data-equal-steps")
ADAPTER_ACTIVATIONS = ("relu", "gelu", "none")  # ovalp_flwr.core.model
HEAD_INITS = ("random", "zeros", "class-means", "fedcof", "fed3r", "lda", "ridge",
              "low-rank", "auto")  # core.head_init
RIDGE_STARTS = ("ridge", "low-rank")  # the starts `ridge-lambda` (and its "auto") applies to
# what each start that reads every client's own statistics cannot run under, and why
PER_CLIENT_STARTS = {"fedcof": "FedCOF reads each client's class means",
                     "low-rank": "low-rank estimates each client's Gram matrix from its own "
                                 "statistics"}
STATISTICS_AGGREGATIONS = ("plain", "secagg+")  # secagg+: ovalp_flwr.federation.secure_sum
# weight-decay "auto" (server L-BFGS): the path, strongest first, 2 a decade; it holds every
# committed dataset's tuned value (0.01 to 0.001)
WEIGHT_DECAY_PATH = (0.1, 0.03, 0.01, 0.003, 0.001, 3e-4, 1e-4)


@dataclass(frozen=True)
class TrainingOptions(Options):
    """The model on the cached features and each client's local step."""

    TITLE = "Model and local training"
    INTRO = ("The model on the cached features and each client's local step "
             "([Quantity skew](quantity-skew.md)).")

    head: str = key(
        "ova", "`ova`: K binary logistic heads (OvA-LP); `softmax`: one softmax "
        "head (the LP-softmax baseline).", HEADS)
    local_epochs: int = key(
        3, "Local epochs per round (what one is: `epoch-size`).")
    batch_size: int = key(
        50, "The local mini-batch size (bigger on bigger clients under "
        '`epoch-size = "own-data-equal-steps"`).')
    learning_rate: float = key(
        0.05, "The local optimiser's learning rate (the recipe: 0.01 with AdamW).")
    weight_decay: float | str = key(
        0.01, "The local optimiser's weight decay: the centralised ceiling's tuned "
        'L2 (the recipe: 0.0001). With `server-optimizer = "lbfgs"`, the objective\'s λ, and '
        "`auto`: a warm-started path down a grid (0.1 to 1e-4, 2 a decade), "
        "`lbfgs-path-rounds` rounds each, scored on the validation rows; the run goes on at "
        "the best ([The centralised optimum](server-optimizer.md#choosing-the-weight-decay)).")
    local_optimizer: str = key(
        "sgd", "The local optimiser, with fresh state every round: `sgd`, or "
        "`adamw` (the paper's recipe).", LOCAL_OPTIMIZERS)
    local_steps: int = key(
        0, "`> 0`: exactly this many local steps per round instead of "
        "`local-epochs`, whatever the client's size.")
    epoch_size: str = key(
        "own-data-equal-steps", "What one local epoch is: "
        "`own-data-equal-steps`, a pass over the client's own data in ⌈(samples / clients) / "
        "batch-size⌉ steps, the same for every client (a client bigger than an equal share "
        "takes bigger batches); `equal-share`, that many steps of `batch-size` for every "
        "client; `own-data`, a pass in batches of `batch-size` (the recipe). The server "
        "computes the steps from the sample counts.", EPOCH_SIZES)
    adapter_dim: int = key(
        0, "`0`: the heads alone on the cached features; `> 0`: an adapter B "
        "(D → adapter-dim, then `adapter-activation`) under the heads, trained federatedly "
        "with them; it needs `head-init` `random` or `zeros`.")
    adapter_activation: str = key(
        "relu", "The adapter's activation.", ADAPTER_ACTIVATIONS)

    @property
    def first_weight_decay(self) -> float:
        """The weight decay the rounds start at: the value, or the path's first under "auto"."""
        return WEIGHT_DECAY_PATH[0] if self.weight_decay == "auto" else float(self.weight_decay)

    def check(self) -> None:
        one_of("head", self.head, HEADS)
        one_of("local-optimizer", self.local_optimizer, LOCAL_OPTIMIZERS)
        one_of("epoch-size", self.epoch_size, EPOCH_SIZES)
        at_least("local-epochs", self.local_epochs, 1)
        at_least("batch-size", self.batch_size, 1)
        at_least("local-steps", self.local_steps, 0)
        positive("learning-rate", self.learning_rate)
        if self.weight_decay != "auto" and (isinstance(self.weight_decay, str)
                                            or self.weight_decay < 0):
            raise ConfigError("weight-decay", self.weight_decay,
                              'use a value >= 0 (or "auto" with server-optimizer="lbfgs")')
        at_least("adapter-dim", self.adapter_dim, 0)
        one_of("adapter-activation", self.adapter_activation, ADAPTER_ACTIVATIONS)

    def requires(self, config: Whole) -> None:
        """weight-decay "auto" is a path the server's L-BFGS walks, in rounds it has; the
        adapter's features are not those a closed-form start is built from."""
        if self.adapter_dim and config.head_init not in ("random", "zeros"):
            raise ConfigError("head-init", config.head_init,
                              "with adapter-dim > 0 the heads read the adapter's features, not "
                              "the encoder's the closed-form starts are built from; use random "
                              "or zeros")
        if self.weight_decay != "auto":
            return
        if not config.server_steps:
            raise ConfigError("weight-decay", self.weight_decay, '"auto" needs server-optimizer='
                              '"lbfgs" (the server walks the path); use a value >= 0')
        path = len(WEIGHT_DECAY_PATH) * config.lbfgs_path_rounds
        if config.num_server_rounds <= path:
            raise ConfigError("num-server-rounds", config.num_server_rounds,
                              f'weight-decay="auto" walks up to {path} rounds '
                              f"({len(WEIGHT_DECAY_PATH)} values x lbfgs-path-rounds); "
                              f"use more than {path}")


@dataclass(frozen=True)
class StartOptions(Options):
    """Where the heads start: closed-form starts from the clients' summed statistics."""

    TITLE = "Where the heads start"
    INTRO = ("Closed-form starts built from the clients' summed statistics "
             "([Closed-form starts](closed-form-starts.md)).")

    head_init: str = key(
        "ridge", "Where the heads start: `random` (torch's init: the recipe), "
        "`zeros`, `class-means` (FedNCM), `fedcof` (FedCOF: class covariances from how the "
        "clients' class means spread, at FedNCM's bytes), `fed3r` (Fed3R as its code applies "
        "it), `lda` (GH-OFL's LDA head: a pooled covariance, shrunk), `ridge` (ours: Fed3R's regression "
        "with a bias and λ per sample) or `low-rank` (ours at a fraction of the Gram's bytes: "
        "the ridge start on a Gram matrix estimated from each client's top `gram-rank` "
        "scatter directions) or `auto` (ours at the Gram's bytes: the ridge or LDA head most "
        "accurate on the validation rows, each along its penalty's path); those from "
        "statistics are built by the server from what the clients send once, and calibrated.",
        HEAD_INITS)
    ridge_lambda: float | str = key(
        0.2, "The ridge (and low-rank) start's L2 penalty per training sample (the system is "
        "X̃ᵀX̃ + nλI); Fed3R's published λ = 0.01 is 0.01 / n. `auto`: the penalty of a grid "
        "(1e-6 to 1e3, 4 a decade) whose start is the most accurate on the validation rows, "
        "all scored from one eigendecomposition ([Closed-form starts]"
        "(closed-form-starts.md#choosing-the-penalty-from-the-data)).")
    fed3r_lambda: float = key(
        0.01, "`fed3r`'s L2 penalty as Fed3R's code adds it, G + λI: absolute, whatever the "
        "number of rows (its published 0.01).")
    fedcof_shrinkage: float = key(
        1.0, "`fedcof`'s γ: added to each class's estimated covariance, Σ̂_c + γI (FedCOF's "
        "code's default 1).")
    gram_rank: int = key(
        50, "`low-rank`'s r: the directions of its within-class scatter each client sends "
        "besides its class sums, r·D floats (the Gram's D(D+1)/2 at r = (D+1)/2); the rest of "
        "its Gram matrix is estimated from its square norms "
        "([Closed-form starts](closed-form-starts.md#between-the-budgets-low-rank)).")
    lda_shrinkage: float = key(
        0.05, "`lda`'s α: the pooled covariance shrunk toward its mean variance, "
        "(1 − α)Σ + α(tr Σ / D)I (GH-OFL's `lda_shrink`, 0.05).")
    statistics_aggregation: str = key(
        "plain", "How the server sums the clients' statistics: `plain`, as they come, "
        "or `secagg+`, under Flower's SecAgg+, which shows it only their sum (a server that "
        "follows the protocol, colluding with fewer than half of a client's share holders; "
        "[trust model](robustness.md#what-secagg-protects-and-what-it-does-not)).",
        STATISTICS_AGGREGATIONS)
    secagg_dropouts: float = key(
        0.0, "With `secagg+`: the share of the clients holding data that may drop out "
        "of the secure sum (below a half), whose start is then built from the rest (`0`: any "
        "drop-out ends the run). Under distributed DP each client's share of the noise is sized for the "
        "fewest survivors this allows, so every sum accepted carries a whole release's noise "
        "([Robustness](robustness.md#distributed-dp-and-drop-outs)).")

    def check(self) -> None:
        one_of("head-init", self.head_init, HEAD_INITS)
        if self.ridge_lambda != "auto" and (isinstance(self.ridge_lambda, str)
                                            or not self.ridge_lambda > 0):
            raise ConfigError("ridge-lambda", self.ridge_lambda, 'use a value > 0 or "auto"')
        positive("fed3r-lambda", self.fed3r_lambda)
        if not self.fedcof_shrinkage >= 0:
            raise ConfigError("fedcof-shrinkage", self.fedcof_shrinkage, "use a value >= 0")
        share("lda-shrinkage", self.lda_shrinkage, 0, 1)
        if self.gram_rank < 0:
            raise ConfigError("gram-rank", self.gram_rank, "use a whole number >= 0")
        one_of("statistics-aggregation", self.statistics_aggregation, STATISTICS_AGGREGATIONS)
        # a dropped client is unmasked from a majority of its share holders (`secagg_sizing`)
        share("secagg-dropouts", self.secagg_dropouts, 0, 0.5, high_open=True,
              what="a share (SecAgg+ rebuilds a dropped client's masks from a "
                   "majority of its neighbours)")
        if self.secagg_dropouts > 0 and self.statistics_aggregation != "secagg+":
            raise ConfigError("secagg-dropouts", self.secagg_dropouts, 'only the secure sum '
                              'tolerates drop-outs: use statistics-aggregation="secagg+", or 0')

    def requires(self, config: Whole) -> None:
        """FedCOF and low-rank read each client's own statistics: a server that sees only their
        sum (SecAgg+), noises only the sum (DP) or mends and drops clients' sums (a robust
        start) cannot build them."""
        if self.head_init not in PER_CLIENT_STARTS:
            return
        reads, instead = PER_CLIENT_STARTS[self.head_init], "or class-means or ridge"
        if self.statistics_aggregation == "secagg+":
            raise ConfigError("head-init", self.head_init, f"{reads}, and under "
                              "statistics-aggregation='secagg+' the server sees only their "
                              f"sum; use statistics-aggregation='plain', {instead}")
        if config.dp_statistics_epsilon > 0:
            raise ConfigError("head-init", self.head_init, f"{reads}, and "
                              "dp-statistics-epsilon noises only their sum; use "
                              f"dp-statistics-epsilon=0, {instead}")
        if config.robust_start != "none":
            raise ConfigError("head-init", self.head_init, "the robust starts check and mend "
                              f"the summed statistics, and {reads}; use "
                              f"robust-start='none', {instead}")
