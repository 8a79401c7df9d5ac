"""One typed, validated view of the run config (`[tool.flwr.app.config]` + overrides).

Both apps build a `RunConfig` once from `context.run_config`; every bad value stops the
run with a single `ConfigError` line naming the key, the value and what is allowed.
Each key's description sits next to its field; `python -m ovalp_flwr.config --markdown`
turns them into docs/config.md. Validating imports no torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ovalp_flwr.data.noise import NOISE_KINDS
from ovalp_flwr.federation.adversary import ATTACKS as ADVERSARY
from ovalp_flwr.federation.adversary import UPDATES_ONLY
from ovalp_flwr.federation.aggregators import RULES
from ovalp_flwr.data.registry import dataset_modality
from ovalp_flwr.features.modalities import ENCODER_MODALITY
from ovalp_flwr.personalize.hyperparameters import (HYPERPARAMETERS, METHOD_DOCS, METHOD_NAMES,
                                                    PFT_OPTIMIZERS, FineTuning,
                                                    HyperparameterError, own_knobs,
                                                    parse_hyperparameters)

HEADS = ("ova", "softmax")
SCHEDULES = ("two-stage", "single-stage")
PARTITIONS = ("iid", "shard", "bernoulli-dirichlet", "zipf", "feature-skew", "domain")
# partition "domain": how the clients of one domain split its rows (any partition but domain)
WITHIN_DOMAIN_PARTITIONS = ("iid", "shard", "bernoulli-dirichlet", "zipf", "feature-skew")
FEATURE_NORMS = ("none", "l2", "standardize", "center-l2")
DEVICES = ("auto", "cpu", "cuda")
LOCAL_OPTIMIZERS = ("adamw", "sgd")
AGGREGATION_WEIGHTS = ("samples", "uniform")
DRIFT_CORRECTIONS = ("none", "scaffold")
SCAFFOLD_VARIATES = ("server", "clients")  # who computes and keeps c_i: federation.scaffold
EPOCH_SIZES = ("own-data", "equal-share", "own-data-equal-steps")
SERVER_OPTIMIZERS = ("fedavg", "fedadam", "lbfgs")
HEAD_INITS = ("random", "zeros", "class-means", "ridge")  # ovalp_flwr.core.head_init
STATISTICS_AGGREGATIONS = ("plain", "secagg+")  # secagg+: ovalp_flwr.federation.secure_sum
ADAPTER_ACTIVATIONS = ("relu", "gelu", "none")  # ovalp_flwr.core.model
FINETUNES = ("none", "lp", "fedavg-lora", "flora", "full")  # ovalp_flwr.finetune
PFT_GLOBALS = ("server", "clients")  # who scores Global: ovalp_flwr.personalize.phase
ROBUST_STARTS = ("none", "screen", "leave-out")  # core.head_init.screen, .leave_out
DP_UNCOVERED = ("refuse", "allow")  # a private run's releases without noise: federation.privacy
ROBUST_AGGREGATIONS = ("none", *RULES)  # federation.aggregators: one file a rule
ATTACKS = ("none", *ADVERSARY)  # federation.adversary: one file an attack
PFT_PREFIX = "pft."  # pft.<method>.<hyperparameter>: a personalization method's own knobs
# the knobs every method shares (personalize.hyperparameters.FineTuning) and their run-config keys
SHARED_PFT = {"epochs": "pft-epochs", "learning-rate": "pft-learning-rate",
              "batch-size": "pft-batch-size", "optimizer": "pft-optimizer",
              "weight-decay": "pft-weight-decay"}
# The paper's recipe, which the defaults were until SCAFFOLD ("Quantity skew") and the
# closed-form start ("Closed-form starts") replaced it: presets that reproduce the paper, and
# tests of its claims, pin it.
RECIPE: dict[str, Any] = {"local-optimizer": "adamw", "learning-rate": 0.01,
                          "drift-correction": "none", "epoch-size": "own-data",
                          "weight-decay": 1e-4, "head-init": "random"}


AUTO_VALIDATION_FRACTION = 0.1  # validation-fraction "auto" where the run makes a choice
VALIDATION_ROWS = ("server", "clients")  # who keeps them
# weight-decay "auto" (server L-BFGS): the path, strongest first, 2 a decade; it holds every
# committed dataset's tuned value (0.01 to 0.001)
WEIGHT_DECAY_PATH = (0.1, 0.03, 0.01, 0.003, 0.001, 3e-4, 1e-4)

# Where a run's files live, which device ran it, how it meets faults and whether it was resumed:
# none changes what the run computes (a fault it met is in its per-round records).
NOT_PART_OF_THE_RESULT = frozenset({"run-name", "results-dir", "feature-cache-dir", "data-dir",
                                    "device", "round-timeout", "exclude-after-rejections",
                                    "checkpoint-every", "resume", "scaffold-variates"})


class ConfigError(ValueError):
    """A run-config value that is not allowed; the message is one self-contained line."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        super().__init__(f"run config: {key}={value!r} is not allowed; {allowed}")
        self.key, self.value, self.allowed = key, value, allowed


# docs/config.md's sections, in its order: {section: (title, what it covers)}; every key
# names its section
SECTIONS: dict[str, tuple[str, str]] = {
    "data": ("Data and features", "What the clients hold and how it becomes features "
             "([Data](data.md))."),
    "partition": ("Partition", "How the training split is spread over the clients, one per "
                  "SuperNode; every scheme is seeded by `seed` ([Data](data.md))."),
    "training": ("Model and local training", "The model on the cached features and each "
                 "client's local step ([Quantity skew](quantity-skew.md))."),
    "rounds": ("Schedule and aggregation", "The rounds, who takes part in them and how the "
               "server combines the replies."),
    "start": ("Where the heads start", "Closed-form starts built from the clients' summed "
              "statistics ([Closed-form starts](closed-form-starts.md))."),
    "personalize": ("Personalization", "Fine-tuning the final global model on each client's "
                    "own data after the last round "
                    "([Personalization after federation](personalization.md))."),
    "finetune": ("Fine-tuning the encoder", "Training through the encoder on raw data instead "
                 "of heads on cached features ([Fine-tuning the encoder](finetune.md))."),
    "reliability": ("Reliability", "Slow or failing nodes, checkpoints and resuming "
                    "([Reliability](reliability.md))."),
    "run": ("Seed, device and output", "Reproducibility, where the run computes and where its "
            "results go ([What a run prints and writes](results.md))."),
}


def _dataset_choices() -> str:
    """The dataset names validation allows, as its message lists them (Markdown)."""
    try:
        dataset_modality("")
    except ValueError as err:
        listed = str(err).split("; ", 1)[-1].removeprefix("choose one of ")
        return _code([name for part in listed.split(" or ") for name in part.split(", ")])
    raise AssertionError("the dataset registry accepted an empty name")


def _encoder_choices() -> str:
    """The encoders by what they read, which must be what the dataset holds (Markdown)."""
    reads: dict[str, list[str]] = {}
    for name, modality in ENCODER_MODALITY.items():
        reads.setdefault(modality, []).append(name)
    return "; ".join(f"{modality}: {_code(names)}" for modality, names in reads.items())


# what validation allows: the tuple it checks against, or a function that renders the
# names a registry knows as Markdown
Choices = tuple[str, ...] | Callable[[], str]


def _key(default: Any, section: str, doc: str, allowed: Choices | None = None) -> Any:
    """A run-config key's field: its default (pyproject's must equal it), its section and
    description in docs/config.md, and the values validation allows where it lists them
    (the very tuple it checks against, or a function naming them)."""
    assert section in SECTIONS, section
    return dataclasses.field(default=default,
                             metadata={"section": section, "doc": doc, "allowed": allowed})


@dataclass(frozen=True)
class RunConfig:
    """Every knob of a run. Defaults: the paper's main setting, except where the heads start
    and the local step (`RECIPE` is the paper's): the heads start from the federation's ridge
    regression (README, "Closed-form starts"), and the local step is SGD with SCAFFOLD's drift
    correction, the same number of steps for every client and weight decay 0.01, which hold
    OvA-LP's accuracy where label skew meets quantity skew (README, "Quantity skew")."""

    dataset: str = _key(
        "digits", "data", "The dataset's registry name; checked, with the encoder's modality, "
        "before anything loads. Local files are read from `data-dir`; `digits` is bundled.",
        _dataset_choices)
    encoder: str = _key(
        "efficientnet-lite0", "data", "The frozen encoder's registry name (`pixels`: raw "
        "pixels, no network); it must read what the dataset holds, image or text.",
        _encoder_choices)
    data_dir: str = _key(
        "", "data", 'Where local dataset files live; `""`: `$OVALP_DATA_DIR`, else '
        "`../shared/data`.")
    feature_cache_dir: str = _key(
        "feature_cache", "data", "Where feature caches live, relative to the directory the "
        "run starts in.")
    head: str = _key(
        "ova", "training", "`ova`: K binary logistic heads (OvA-LP); `softmax`: one softmax "
        "head (the LP-softmax baseline).", HEADS)
    schedule: str = _key(
        "two-stage", "rounds", "`two-stage`: OvA heads train on positives only for "
        "`stage1-rounds`, then all heads with BCE; `single-stage`: all heads from round 1 "
        '(the "OvA without two-stage" ablation).', SCHEDULES)
    stage1_rounds: int = _key(
        1, "rounds", "Rounds of stage 1 (positives only) under the two-stage schedule.")
    partition: str = _key(
        "shard", "partition", "`iid`: a seeded shuffle, equal split; `shard`: "
        "`classes-per-client` classes per client; `bernoulli-dirichlet`: FedCorr's "
        "construction; `zipf`: quantity skew, IID labels; `feature-skew`: k-means over the "
        "features, one cluster per client; `domain`: one domain of a multi-domain dataset per "
        "client, or a share of one ([Clients that differ in what they see](shift.md)).",
        PARTITIONS)
    within_domain: str = _key(
        "iid", "partition", 'With `partition = "domain"`: how the clients of one domain split '
        "its rows (any partition but `domain`, with that partition's own keys), e.g. `shard` "
        "for label skew inside a domain.", WITHIN_DOMAIN_PARTITIONS)
    classes_per_client: int = _key(
        1, "partition", "k of shard-k: the distinct classes each client holds.")
    dirichlet_p: float = _key(
        0.1, "partition", "Bernoulli-Dirichlet: the p of the client-class Bernoulli(p) matrix "
        "(which clients hold which classes), in (0, 1].")
    dirichlet_alpha: float = _key(
        0.001, "partition", "Bernoulli-Dirichlet: the alpha of the Dirichlet that spreads each "
        "class over the clients holding it. Clients can end up empty: they skip training and "
        "get no FedAvg weight.")
    zipf_s: float = _key(
        2.0, "partition", "The exponent of Zipf quantity skew: client sizes proportional to "
        "rank^-s, at least one sample each.")
    label_noise: str = _key(
        "none", "data", "Noisy training labels (the FedLTF / FedCorr setting), seeded by "
        "`seed`, before partitioning: `symmetric` (a uniformly drawn other class) or "
        "`asymmetric` (class c → c+1 mod K). The test split is never touched.", NOISE_KINDS)
    noise_rate: float = _key(
        0.0, "data", "The fraction of training labels `label-noise` replaces, in [0, 1): "
        "exactly round(noise-rate × n), per class for `asymmetric`.")
    validation_fraction: float | str = _key(
        "auto", "data", "The share of the training split held back as validation rows, "
        "seeded and stratified by (domain, class) before partitioning: no client trains on "
        "them, and every choice the run makes (`robust-start`'s clients left out, "
        "`ridge-lambda = \"auto\"`, the best round) is scored on them, never on the test "
        f"split. `auto`: {AUTO_VALIDATION_FRACTION} where the run chooses a key's value from "
        "data (`robust-start`, `ridge-lambda = \"auto\"`), else 0 "
        "(the run is row for row what it was). A share in [0, 0.5]; the encoder path holds "
        "none ([Results](results.md#validation-rows)).")
    validation_rows: str = _key(
        "server", "data", "Who keeps the validation rows: `server`, carved from the training "
        "split before the partition and scored by the server (its own rows, never the test "
        "split); or `clients`: each client holds back `validation-fraction` of its own "
        "partition (stratified by its (domain, class)), and every round the server asks every "
        "client for its rows' accuracy and loss on the heads it holds and sums them "
        "(federated validation; `auto` holds 0.1 back). The best round is chosen on the sums; "
        "the choices made at the start or by the server's L-BFGS need the server's rows "
        "([Results](results.md#federated-validation)).", VALIDATION_ROWS)
    num_server_rounds: int = _key(
        20, "rounds", "Federated rounds; `0`: the heads' start is the whole run (FedNCM, "
        "Fed3R).")
    local_epochs: int = _key(
        3, "training", "Local epochs per round (what one is: `epoch-size`).")
    batch_size: int = _key(
        50, "training", "The local mini-batch size (bigger on bigger clients under "
        '`epoch-size = "own-data-equal-steps"`).')
    learning_rate: float = _key(
        0.05, "training", "The local optimiser's learning rate (the recipe: 0.01 with AdamW).")
    weight_decay: float | str = _key(
        0.01, "training", "The local optimiser's weight decay: the centralised ceiling's tuned "
        'L2 (the recipe: 0.0001). With `server-optimizer = "lbfgs"`, the objective\'s λ, and '
        "`auto`: a warm-started path down a grid (0.1 to 1e-4, 2 a decade), "
        "`lbfgs-path-rounds` rounds each, scored on the validation rows; the run goes on at "
        "the best ([The centralised optimum](server-optimizer.md#choosing-the-weight-decay)).")
    local_optimizer: str = _key(
        "sgd", "training", "The local optimiser, with fresh state every round: `sgd`, or "
        "`adamw` (the paper's recipe).", LOCAL_OPTIMIZERS)
    local_steps: int = _key(
        0, "training", "`> 0`: exactly this many local steps per round instead of "
        "`local-epochs`, whatever the client's size.")
    epoch_size: str = _key(
        "own-data-equal-steps", "training", "What one local epoch is: "
        "`own-data-equal-steps`, a pass over the client's own data in ⌈(samples / clients) / "
        "batch-size⌉ steps, the same for every client (a client bigger than an equal share "
        "takes bigger batches); `equal-share`, that many steps of `batch-size` for every "
        "client; `own-data`, a pass in batches of `batch-size` (the recipe). The server "
        "computes the steps from the sample counts.", EPOCH_SIZES)
    aggregation_weights: str = _key(
        "samples", "rounds", "`samples`: FedAvg's weights, by sample count; `uniform`: each "
        "client with data counts once.", AGGREGATION_WEIGHTS)
    weight_cap: float = _key(
        0.0, "rounds", "The most weight one reply can have in the rounds' mean, as a multiple of "
        "the median sample count the clients holding data described (`0`: no cap). A client "
        "that states ten times its rows (the `stats-count` attack) buys at most this "
        "([Robustness](robustness.md#a-cap-on-what-a-count-buys)).")
    robust_aggregation: str = _key(
        "none", "rounds", "How the server combines the heads' updates: `none`, FedAvg's mean; "
        "or one of the robust rules of `federation/aggregators/` (one file each), which bound a "
        "hostile client's pull ([Robustness](robustness.md#robust-aggregation)).",
        ROBUST_AGGREGATIONS)
    robust_fraction: float = _key(
        0.1, "rounds", "The share of clients `robust-aggregation` assumes hostile: Multi-Krum "
        "leaves ⌈fraction · n⌉ out, the trimmed mean cuts that share at each end.")
    dp_rounds_epsilon: float = _key(
        0.0, "rounds", "Client-level differential privacy for the heads' rounds: the ε the whole "
        "run spends at `dp-delta` (`0`: off). Each update is clipped to `dp-clip`, the clipped "
        "updates are averaged over the clients sampled, and Gaussian noise calibrated to this ε "
        "is added (Flower's server-side fixed clipping). Needs `drift-correction = \"none\"` "
        "and a `feature-norm` that reads no client data ([Robustness](robustness.md)).")
    dp_clip: float = _key(
        0.05, "rounds", "With `dp-rounds-epsilon`: the norm each client's update is clipped to.")
    drift_correction: str = _key(
        "scaffold", "rounds", "`scaffold`: SCAFFOLD's control variates, kept where "
        '`scaffold-variates` says (needs `local-optimizer = "sgd"`); `none`: the recipe.',
        DRIFT_CORRECTIONS)
    scaffold_variates: str = _key(
        "server", "rounds", "Where SCAFFOLD's c_i are computed and kept: `server` (clients keep "
        "nothing; each node is sent its own c - c_i) or `clients` (the paper's protocol: each "
        "node keeps its c_i in its Context and uploads it beside its heads, doubling the "
        "upload; every node is sent the same c; the server does one pass over each c_i per "
        "round instead of four). The same global model, bit for bit.", SCAFFOLD_VARIATES)
    server_optimizer: str = _key(
        "fedavg", "rounds", "`fedavg`, or `fedadam`: Flower's FedAdam on the averaged update, "
        "with `server-learning-rate`; or `lbfgs`: no local steps, the clients send their "
        "full-batch gradient and the server takes L-BFGS steps on the centralised objective "
        "(the run's final loss + weight-decay/2 ‖W‖², bias unpenalised), preconditioned by the "
        "federation's Gram matrix ([The centralised optimum](server-optimizer.md)). The "
        "local-step keys, the stages and SCAFFOLD then do not apply; every round needs every "
        'client; with `statistics-aggregation = "secagg+"` the gradients are averaged under '
        "SecAgg+ too.", SERVER_OPTIMIZERS)
    server_learning_rate: float = _key(
        0.1, "rounds", "FedAdam's eta (Flower's default).")
    lbfgs_memory: int = _key(
        10, "rounds", 'With `server-optimizer = "lbfgs"`: the curvature pairs L-BFGS keeps.')
    lbfgs_patience: int = _key(
        3, "rounds", 'With `server-optimizer = "lbfgs"`: the rounds in a row a node may miss '
        "(timed out, failed, refused) before its rows leave the server's objective, with one "
        "warning naming it, and L-BFGS restarts from the heads it holds; until then a round "
        "without every row sends the same heads again ([The centralised optimum]"
        "(server-optimizer.md#a-node-that-does-not-answer)).")
    lbfgs_path_rounds: int = _key(
        2, "rounds", 'With `weight-decay = "auto"`: the L-BFGS rounds at each weight decay of '
        "the path, each warm-started from the one before; the path stops two values after "
        "the validation accuracy's best.")
    head_init: str = _key(
        "ridge", "start", "Where the heads start: `random` (torch's init: the recipe), "
        "`zeros`, `class-means` (FedNCM) or `ridge` (Fed3R); the last two are built by the "
        "server from the clients' summed statistics, and calibrated.", HEAD_INITS)
    ridge_lambda: float | str = _key(
        0.2, "start", "The ridge start's L2 penalty per training sample (the system is "
        "X̃ᵀX̃ + nλI); Fed3R's published λ = 0.01 is 0.01 / n. `auto`: the penalty of a grid "
        "(1e-6 to 1e3, 4 a decade) whose start is the most accurate on the validation rows, "
        "all scored from one eigendecomposition ([Closed-form starts]"
        "(closed-form-starts.md#choosing-the-penalty-from-the-data)).")
    dp_statistics_epsilon: float = _key(
        0.0, "start", "Example-level differential privacy for the start's statistics: the ε "
        "they spend at `dp-delta` (`0`: off). Each client clips every feature vector to "
        "`dp-feature-clip`; the server adds Gaussian noise calibrated to this ε to the summed "
        "counts, class sums, square norms and Gram matrix. Needs a `feature-norm` that reads no "
        "client data ([Robustness](robustness.md)).")
    dp_feature_clip: float = _key(
        1.0, "start", "With `dp-statistics-epsilon`: the norm every feature vector is clipped "
        "to (`feature-norm = \"l2\"` makes it 1).")
    dp_delta: float = _key(
        1e-5, "start", "The δ at which `dp-statistics-epsilon` and `dp-rounds-epsilon` are "
        "spent, in (0, 1).")
    dp_uncovered: str = _key(
        "refuse", "start", "A private run that also releases client data without noise (a "
        "start from exact statistics under DP rounds, rounds without noise after a DP start, "
        "personalized models, client-side evaluation or validation scores): `refuse` it, or "
        "`allow` it, and summary.json then gives ε = \"inf\" at every level that release "
        "breaks ([Robustness](robustness.md#differential-privacy)).", DP_UNCOVERED)
    robust_start: str = _key(
        "none", "start", "`screen`: the server keeps each client's statistics, finds those "
        "that break the consensus of the others (rows 3x off the median client's mean square "
        "norm, a class mean against the median of its holders', statistics no rows could give) "
        "and leaves them out of the sums (not of the rounds) together, if the start without "
        "them is more accurate on the validation rows (`validation-fraction`) by more than "
        "`robust-start-margin`: two solves, and it holds against forgers acting together. "
        "`leave-out`: the screen, then the start built once without each remaining client in "
        "turn; a client whose absence raises the accuracy by more than the margin is left out "
        "too ([Robustness](robustness.md)).", ROBUST_STARTS)
    robust_start_margin: float = _key(
        0.005, "start", "With `robust-start`: the accuracy gain (a fraction) that leaves a "
        "client out.")
    statistics_aggregation: str = _key(
        "plain", "start", "How the server sums the clients' statistics: `plain`, as they come, "
        "or `secagg+`, under Flower's SecAgg+, which shows it only their sum.",
        STATISTICS_AGGREGATIONS)
    secagg_dropouts: float = _key(
        0.0, "start", "With `secagg+`: the share of the clients holding data that may drop out "
        "of the secure sum, whose start is then built from the rest (`0`: any drop-out ends "
        "the run). Under distributed DP each client's share of the noise is sized for the "
        "fewest survivors this allows, so every sum accepted carries a whole release's noise "
        "([Robustness](robustness.md#distributed-dp-and-drop-outs)).")
    fraction_train: float = _key(
        1.0, "rounds", "The share of clients sampled per round (seeded by `seed` and the "
        "round), in (0, 1].")
    fraction_evaluate: float = _key(
        0.0, "rounds", "The share of clients that report local accuracy on their own data, in "
        "[0, 1].")
    round_timeout: float = _key(
        3600.0, "reliability", "Seconds a round waits for replies before it aggregates those it "
        "has and records the rest as timed out (Flower's default: 3600).")
    exclude_after_rejections: int = _key(
        0, "reliability", "A node whose train replies were rejected this many times is no "
        "longer sampled (`0`: never).")
    attack: str = _key(
        "none", "reliability", "Attack rehearsal: `attack-fraction` of the clients (chosen by "
        "`seed`) lie within the rules, as one of the attacks of `federation/adversary/` (one "
        "file each: scaled or sign-flipped updates, flipped labels, forged statistics and "
        "counts) ([Robustness](robustness.md#rehearsing-an-attack)).", ATTACKS)
    attack_fraction: float = _key(
        0.1, "reliability", "The share of clients that attack (at least one when `attack` is "
        "set).")
    checkpoint_every: int = _key(
        1, "reliability", "A checkpoint in `results/<run-name>/` after every this many rounds "
        "(`0`: none). The cached-feature path only: the encoder path (`finetune`) writes none "
        "and says so when the run starts.")
    resume: bool = _key(
        False, "reliability", "`true`: go on from the last checkpoint of the run named by "
        "`run-name`.")
    seed: int = _key(
        0, "run", "Fixes the partition, the heads' initialisation, client sampling and batch "
        "order.")
    feature_norm: str = _key(
        "standardize", "data", "How the cached features are normalised: `none`, `l2`, "
        "`standardize` or `center-l2`. The last two subtract the federation's global mean, "
        "merged from the clients' counts, sums and sums of squares.", FEATURE_NORMS)
    device: str = _key(
        "auto", "run", "`auto`: CUDA if present, else the CPU.", DEVICES)
    run_name: str = _key(
        "", "run", "The results folder's name: a plain name, without `/` or a leading `.` "
        '(`""`: a timestamp and what ran).')
    results_dir: str = _key(
        "results", "run", "Where results folders go.")
    adapter_dim: int = _key(
        0, "training", "`0`: the heads alone on the cached features; `> 0`: an adapter B "
        "(D → adapter-dim, then `adapter-activation`) under the heads, trained federatedly "
        "with them; it needs `head-init` `random` or `zeros`.")
    adapter_activation: str = _key(
        "relu", "training", "The adapter's activation.", ADAPTER_ACTIVATIONS)
    limit_per_class: int = _key(
        0, "data", "The first N samples of each class per split (`0`: all), for the cache and "
        "the encoder path alike; each value has its own cache (`@limitN`).")
    image_size: int = _key(
        0, "data", "The image side in pixels (`0`: the encoder's default, Lite0 128), for "
        "both paths; each value has its own cache (`@Npx`). Image datasets only.")
    finetune: str = _key(
        "none", "finetune", "`none`: heads on the cache (OvA-LP); `lp`: heads through the "
        "frozen encoder; `fedavg-lora`: LoRA's A and B averaged apart; `flora`: LoRA modules "
        "stacked; `full`: the whole encoder.", FINETUNES)
    lora_rank: int = _key(
        8, "finetune", "LoRA's rank, for `fedavg-lora` and `flora`.")
    lora_alpha: float = _key(
        16.0, "finetune", "LoRA's alpha (the update is B A × alpha / rank), for `fedavg-lora` "
        "and `flora`.")
    personalize: str = _key(
        "", "personalize", "The methods each client runs on the final global model, "
        'space-separated, each once (`""`: none).', METHOD_NAMES)
    personalize_curve: str = _key(
        "", "personalize", "PFT epochs (space-separated, in 1..`pft-epochs`) at which Global "
        "is also measured; Local is measured every epoch.")
    pft_global: str = _key(
        "server", "personalize", "Who scores a personalized model's Global accuracy. "
        "`server`: the server, on its own test split (the global distribution, the one every "
        "round is scored on): each model travels once, N uploads per method. `clients`: every "
        "client scores every client's model on its own test split (N² transfers), for a "
        "federation whose server holds no test data. The default is `server` because the "
        "ServerApp always holds the test split and Global is meant as accuracy on the global "
        "distribution; Local is each client's own either way.", PFT_GLOBALS)
    pft_epochs: int = _key(
        15, "personalize", "Fine-tuning epochs, shared by every method (the study: 15 epochs "
        "of Adam at 1e-3).")
    pft_learning_rate: float = _key(
        1e-3, "personalize", "The methods' learning rate.")
    pft_batch_size: int = _key(
        32, "personalize", "The methods' mini-batch size.")
    pft_optimizer: str = _key(
        "adamw", "personalize", "The methods' optimiser.", PFT_OPTIMIZERS)
    pft_weight_decay: float = _key(
        0.0, "personalize", "The methods' weight decay; `sparse` and `own-heads` need 0 (decay "
        "would move the entries they keep fixed).")
    # ("<method>.<hyperparameter>", value) pairs of `pft.*` keys: each method's own knobs,
    # described by their Hyperparameters (ovalp_flwr.personalize.hyperparameters)
    pft: tuple[tuple[str, Any], ...] = dataclasses.field(default_factory=lambda: default_pft())

    @classmethod
    def from_mapping(cls, run_config: Mapping[str, Any]) -> "RunConfig":
        """Build from Flower's run config (dash-case keys); unknown keys are errors."""
        known = {f.name.replace("_", "-"): f for f in fields(cls) if f.name != "pft"}
        values: dict[str, Any] = {}
        pft = {key: value for key, value in run_config.items() if key.startswith(PFT_PREFIX)}
        if pft:
            given = {key[len(PFT_PREFIX):]: value for key, value in pft.items()}
            values["pft"] = tuple(sorted({**dict(default_pft()), **given}.items()))
        for key, value in run_config.items():
            if key.startswith(PFT_PREFIX):
                continue
            if key not in known:
                raise ConfigError(key, value, f"known keys: {', '.join(sorted(known))}")
            values[known[key].name] = _coerce(key, value, known[key].type)
        config = cls(**values)
        config.validate()
        return config

    def to_dict(self) -> dict[str, Any]:
        """Dash-case keys, as in pyproject (`pft.*` flattened as Flower does), for results files."""
        flat = {k.replace("_", "-"): v for k, v in dataclasses.asdict(self).items() if k != "pft"}
        return {**flat, **{PFT_PREFIX + key: value for key, value in self.pft}}

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

    def cache_options(self) -> dict[str, int | None]:
        """`limit-per-class` and `image-size` as the cache and the data loaders take them."""
        return {"limit_per_class": self.limit_per_class or None,
                "image_size": self.image_size or None}

    @functools.cached_property
    def choices(self) -> tuple[str, ...]:
        """The keys whose value the run chooses from data (on validation rows). Cached, as
        `validation_share`: every client message asks for its partition spec."""
        return tuple(choices_made(self.to_dict()))

    @functools.cached_property
    def validation_share(self) -> float:
        """`validation-fraction` resolved: the share of training rows held back."""
        return validation_share(self.to_dict())

    @property
    def data_releases(self) -> tuple[str, ...]:
        """What the run sends out of the clients computed from their rows: the start's
        statistics (read by a class-means or ridge start, by L-BFGS's preconditioner, by the
        leave-out check), the rounds' updates, scores on their validation or test rows, the
        personalized models. Differential privacy covers the first two when asked."""
        releases = []
        if self.head_init in ("class-means", "ridge") or self.server_steps \
                or self.robust_start != "none":
            releases.append("statistics")
        if self.num_server_rounds > 0:
            releases.append("rounds")
        if self.validation_rows == "clients":
            releases.append("validation")
        if self.fraction_evaluate > 0:
            releases.append("evaluation")
        if self.personalization_methods:
            releases.append("personalization")
        return tuple(releases)

    @property
    def server_steps(self) -> bool:
        """Whether the server optimises the objective itself (the clients send gradients)."""
        return self.server_optimizer == "lbfgs"

    @property
    def stages(self) -> bool:
        """Whether the run uses a positives-only first stage at all (not when the server
        optimises: it descends the final loss from round 1)."""
        return (self.head == "ova" and self.schedule == "two-stage" and self.stage1_rounds > 0
                and not self.server_steps)

    def stage_for_round(self, server_round: int) -> int:
        """The server's stage decision: 1 = positives only, 2 = all heads (BCE)."""
        return 1 if self.stages and server_round <= self.stage1_rounds else 2

    def validate(self) -> None:
        _one_of("head", self.head, HEADS)
        _one_of("schedule", self.schedule, SCHEDULES)
        _one_of("partition", self.partition, PARTITIONS)
        _one_of("within-domain", self.within_domain, WITHIN_DOMAIN_PARTITIONS)
        _one_of("feature-norm", self.feature_norm, FEATURE_NORMS)
        _one_of("device", self.device, DEVICES)
        _one_of("label-noise", self.label_noise, NOISE_KINDS)
        _one_of("local-optimizer", self.local_optimizer, LOCAL_OPTIMIZERS)
        _one_of("aggregation-weights", self.aggregation_weights, AGGREGATION_WEIGHTS)
        _one_of("drift-correction", self.drift_correction, DRIFT_CORRECTIONS)
        _one_of("scaffold-variates", self.scaffold_variates, SCAFFOLD_VARIATES)
        if self.scaffold_variates == "clients" and self.drift_correction != "scaffold":
            raise ConfigError("scaffold-variates", self.scaffold_variates,
                              "clients keep SCAFFOLD's variates only with "
                              'drift-correction="scaffold"; leave it "server"')
        _one_of("epoch-size", self.epoch_size, EPOCH_SIZES)
        _one_of("server-optimizer", self.server_optimizer, SERVER_OPTIMIZERS)
        _at_least("lbfgs-patience", self.lbfgs_patience, 1)
        self._check_robustness()
        self._check_privacy()
        _one_of("head-init", self.head_init, HEAD_INITS)
        _one_of("statistics-aggregation", self.statistics_aggregation, STATISTICS_AGGREGATIONS)
        if not 0 <= self.secagg_dropouts < 1:
            raise ConfigError("secagg-dropouts", self.secagg_dropouts, "use a share in [0, 1)")
        if self.secagg_dropouts > 0 and self.statistics_aggregation != "secagg+":
            raise ConfigError("secagg-dropouts", self.secagg_dropouts, 'only the secure sum '
                              'tolerates drop-outs: use statistics-aggregation="secagg+", or 0')
        _one_of("pft-global", self.pft_global, PFT_GLOBALS)
        if self.ridge_lambda != "auto" and (isinstance(self.ridge_lambda, str)
                                            or not self.ridge_lambda > 0):
            raise ConfigError("ridge-lambda", self.ridge_lambda, 'use a value > 0 or "auto"')
        _at_least("lbfgs-memory", self.lbfgs_memory, 1)
        self._check_server_steps()
        if self.drift_correction == "scaffold" and self.local_optimizer != "sgd":
            raise ConfigError("drift-correction", self.drift_correction,
                              "scaffold's control variates assume local SGD steps; "
                              "set local-optimizer=\"sgd\" or drift-correction=\"none\"")
        if not 0 <= self.noise_rate < 1:
            raise ConfigError("noise-rate", self.noise_rate, "use a fraction in [0, 1)")
        _at_least("stage1-rounds", self.stage1_rounds, 0)
        _at_least("classes-per-client", self.classes_per_client, 1)
        _at_least("num-server-rounds", self.num_server_rounds, 0)
        _at_least("local-epochs", self.local_epochs, 1)
        _at_least("batch-size", self.batch_size, 1)
        _at_least("local-steps", self.local_steps, 0)
        _positive("server-learning-rate", self.server_learning_rate)
        _positive("round-timeout", self.round_timeout)
        _at_least("exclude-after-rejections", self.exclude_after_rejections, 0)
        _at_least("checkpoint-every", self.checkpoint_every, 0)
        if self.resume and not self.run_name:
            raise ConfigError("resume", self.resume, "a run resumes by name: set run-name to the "
                              "run to continue (results/<run-name>/ holds its checkpoint)")
        _at_least("seed", self.seed, 0)
        _positive("learning-rate", self.learning_rate)
        _positive("dirichlet-alpha", self.dirichlet_alpha)
        _positive("zipf-s", self.zipf_s)
        self._check_weight_decay()
        if not 0 < self.dirichlet_p <= 1:
            raise ConfigError("dirichlet-p", self.dirichlet_p, "use a probability in (0, 1]")
        if not 0 < self.fraction_train <= 1:
            raise ConfigError("fraction-train", self.fraction_train, "use a fraction in (0, 1]")
        if not 0 <= self.fraction_evaluate <= 1:
            raise ConfigError(
                "fraction-evaluate", self.fraction_evaluate, "use a fraction in [0, 1]"
            )
        for key, name in (("run-name", self.run_name), ("dataset", self.dataset)):
            if "/" in name or name.startswith("."):
                raise ConfigError(key, name, "use a plain name without '/' or a leading '.'")
        self._check_dataset_and_encoder()
        self._check_model_and_personalization()
        self._check_finetune()

    def _check_server_steps(self) -> None:
        """What the server's L-BFGS needs: every client's gradient every round (the sum is the
        centralised gradient only over all rows) and a convex objective (heads on the cached
        features)."""
        if not self.server_steps:
            return
        needs = {"fraction-train": (self.fraction_train, 1.0, "1.0: the gradient is exact only "
                                    "when every client sends its own"),
                 "aggregation-weights": (self.aggregation_weights, "samples", '"samples": the '
                                         "sample-weighted mean of the clients' gradients is the "
                                         "centralised one"),
                 "adapter-dim": (self.adapter_dim, 0, "0: the server's steps need a convex "
                                 "objective, the heads alone")}
        for key, (value, allowed, why) in needs.items():
            if value != allowed:
                raise ConfigError(key, value, f'with server-optimizer="lbfgs" use {why}')

    def _check_weight_decay(self) -> None:
        """A value >= 0, or "auto" where the server walks a path of them (its L-BFGS), with
        the rounds to walk it and more."""
        if self.weight_decay != "auto":
            if isinstance(self.weight_decay, str) or self.weight_decay < 0:
                raise ConfigError("weight-decay", self.weight_decay,
                                  'use a value >= 0 (or "auto" with server-optimizer="lbfgs")')
            return
        if not self.server_steps:
            raise ConfigError("weight-decay", self.weight_decay, '"auto" needs server-optimizer='
                              '"lbfgs" (the server walks the path); use a value >= 0')
        _at_least("lbfgs-path-rounds", self.lbfgs_path_rounds, 1)
        path = len(WEIGHT_DECAY_PATH) * self.lbfgs_path_rounds
        if self.num_server_rounds <= path:
            raise ConfigError("num-server-rounds", self.num_server_rounds,
                              f'weight-decay="auto" walks up to {path} rounds '
                              f"({len(WEIGHT_DECAY_PATH)} values x lbfgs-path-rounds); "
                              f"use more than {path}")

    @property
    def first_weight_decay(self) -> float:
        """The weight decay the rounds start at: the value, or the path's first under "auto"."""
        return WEIGHT_DECAY_PATH[0] if self.weight_decay == "auto" else float(self.weight_decay)

    def _check_robustness(self) -> None:
        """A defence's and an attack rehearsal's keys, and where they do not apply."""
        _one_of("robust-aggregation", self.robust_aggregation, ROBUST_AGGREGATIONS)
        _one_of("attack", self.attack, ATTACKS)
        if not 0 <= self.robust_fraction < 0.5:
            raise ConfigError("robust-fraction", self.robust_fraction, "use a share in [0, 0.5)")
        if self.robust_fraction == 0 and self.robust_aggregation in ("trimmed-mean", "multi-krum"):
            raise ConfigError("robust-fraction", self.robust_fraction, f"with robust-aggregation="
                              f'"{self.robust_aggregation}" use a share > 0: at 0 it is the mean')
        if not 0 < self.attack_fraction <= 1:
            raise ConfigError("attack-fraction", self.attack_fraction, "use a share in (0, 1]")
        if not self.weight_cap >= 0:
            raise ConfigError("weight-cap", self.weight_cap, "use a multiple >= 0 (0: no cap)")
        if self.weight_cap > 0 and (self.server_steps or self.dp_rounds_epsilon > 0):
            raise ConfigError("weight-cap", self.weight_cap, "use 0: the rounds' mean is not "
                              "weighted by counts here (server-optimizer \"lbfgs\" sums every "
                              "gradient; DP rounds average unweighted)")
        if self.robust_aggregation != "none" and self.server_steps:
            raise ConfigError("robust-aggregation", self.robust_aggregation, 'server-optimizer='
                              '"lbfgs" needs the exact sum of every gradient; use "none"')
        if self.robust_aggregation != "none" and self.finetune == "flora":
            raise ConfigError("robust-aggregation", self.robust_aggregation, "FLoRA stacks the "
                              "clients' LoRA factors instead of averaging them; use \"none\"")
        if self.attack not in ("none", *UPDATES_ONLY) and self.finetune != "none":
            raise ConfigError("attack", self.attack, f"{self.attack} rehearses on the cached-"
                              'feature path; with finetune use "scale-10", "scale-100" or '
                              '"sign-flip"')
        _one_of("robust-start", self.robust_start, ROBUST_STARTS)
        if self.robust_start != "none" and (self.statistics_aggregation == "secagg+"
                                            or self.finetune != "none"):
            raise ConfigError("robust-start", self.robust_start, "the check needs each client's "
                              'statistics: use statistics-aggregation="plain" on the cached-'
                              "feature path")
        if not 0 <= self.robust_start_margin < 1:
            raise ConfigError("robust-start-margin", self.robust_start_margin,
                              "use an accuracy gain in [0, 1)")
        self._check_validation_rows()

    def _check_validation_rows(self) -> None:
        """`validation-fraction`: "auto" or a share; a choice needs rows to be made on."""
        share = self.validation_fraction
        if share != "auto" and (isinstance(share, str) or not 0 <= share <= 0.5):
            raise ConfigError("validation-fraction", share, 'use "auto" or a share in [0, 0.5]')
        if share != "auto" and share > 0 and self.finetune != "none":
            raise ConfigError("validation-fraction", share, "the encoder path holds no "
                              'validation rows; use "auto" or 0')
        _one_of("validation-rows", self.validation_rows, VALIDATION_ROWS)
        made = self.choices
        if self.validation_rows == "clients":
            self._check_federated_validation(made)
        if made and self.validation_share == 0:
            raise ConfigError("validation-fraction", share, f"{' and '.join(made)} "
                              f"{'is' if len(made) == 1 else 'are'} chosen on validation rows "
                              '(never the test split); use "auto" or a share > 0')

    def _check_federated_validation(self, made: tuple[str, ...]) -> None:
        """Rows the clients keep are scored by an evaluate exchange each round: what needs
        the server to score many models itself (at the start, or inside a round) cannot use
        them, nor can a run whose evaluate exchange does something else."""
        if made:
            raise ConfigError("validation-rows", self.validation_rows, f"{' and '.join(made)} "
                              "scores its candidates on the server's own validation rows; use "
                              '"server"')
        needs = {"validation-fraction": (self.validation_share > 0, 'a share > 0 (or "auto")'),
                 "fraction-evaluate": (self.fraction_evaluate == 0, "0: every round's evaluate "
                                       "exchange is the federated validation"),
                 "finetune": (self.finetune == "none", '"none": the encoder path holds no '
                              "validation rows")}
        for key, (fine, allowed) in needs.items():
            if not fine:
                value = self.validation_fraction if key == "validation-fraction" \
                    else getattr(self, key.replace("-", "_"))
                raise ConfigError(key, value, f'with validation-rows="clients" use {allowed}')

    def _check_privacy(self) -> None:
        """DP's keys, and what a private run cannot use: anything that shows the server (or the
        model) client data the noise does not cover."""
        for key in ("dp-statistics-epsilon", "dp-rounds-epsilon"):
            if getattr(self, key.replace("-", "_")) < 0:
                raise ConfigError(key, getattr(self, key.replace("-", "_")), "use an ε > 0, or 0 "
                                  "for no differential privacy")
        _one_of("dp-uncovered", self.dp_uncovered, DP_UNCOVERED)
        _positive("dp-clip", self.dp_clip)
        _positive("dp-feature-clip", self.dp_feature_clip)
        if not 0 < self.dp_delta < 1:
            raise ConfigError("dp-delta", self.dp_delta, "use a δ in (0, 1)")
        private = [key for key in ("dp-statistics-epsilon", "dp-rounds-epsilon")
                   if getattr(self, key.replace("-", "_")) > 0]
        if not private:
            return
        if self.finetune != "none":
            raise ConfigError(private[0], getattr(self, private[0].replace("-", "_")),
                              'differential privacy runs on the cached-feature path (finetune="none")')
        if self.feature_norm not in ("none", "l2"):
            raise ConfigError("feature-norm", self.feature_norm, f"with {private[0]} use \"l2\" or "
                              '"none": the others normalise by the clients\' summed moments, '
                              "which no noise covers")
        if self.dp_statistics_epsilon > 0 and self.robust_start != "none":
            raise ConfigError("robust-start", self.robust_start, "with dp-statistics-epsilon use "
                              '"none": the check reads each client\'s statistics, which no '
                              "noise covers")
        if self.dp_rounds_epsilon > 0:
            for key, value, allowed in (("drift-correction", self.drift_correction, "none"),
                                        ("robust-aggregation", self.robust_aggregation, "none"),
                                        ("server-optimizer", self.server_optimizer, "fedavg")):
                if value != allowed:
                    raise ConfigError(key, value, f'with dp-rounds-epsilon use "{allowed}": DP '
                                      "rounds average clipped updates, with noise, and nothing "
                                      "else reads them")
        self._check_dp_releases()

    def _check_dp_releases(self) -> None:
        """Each ε protects a release the run makes, and (unless `dp-uncovered = "allow"`)
        nothing else leaves the clients without noise: the key that makes each release."""
        releases = self.data_releases
        for key, release in (("dp-statistics-epsilon", "statistics"),
                             ("dp-rounds-epsilon", "rounds")):
            if getattr(self, key.replace("-", "_")) > 0 and release not in releases:
                raise ConfigError(key, getattr(self, key.replace("-", "_")), f"this run sends no "
                                  f"{release} to protect (head-init, num-server-rounds); use 0")
        if self.dp_uncovered == "allow":
            return
        covered = {"statistics": self.dp_statistics_epsilon > 0,
                   "rounds": self.dp_rounds_epsilon > 0}
        makers = {"statistics": ("head-init", self.head_init, 'a start that reads none ("zeros", '
                                 '"random"), or dp-statistics-epsilon too'),
                  "rounds": ("num-server-rounds", self.num_server_rounds,
                             "0, or dp-rounds-epsilon too"),
                  "validation": ("validation-rows", self.validation_rows, '"server"'),
                  "evaluation": ("fraction-evaluate", self.fraction_evaluate, "0"),
                  "personalization": ("personalize", self.personalize, '""')}
        for release in releases:
            if not covered.get(release, False):
                key, value, allowed = makers[release]
                raise ConfigError(key, value, f"a private run sends its {release} without noise "
                                  f"here; use {allowed}, or dp-uncovered=\"allow\" (summary.json "
                                  "then says ε = inf where it breaks the guarantee)")

    def _check_finetune(self) -> None:
        """The encoder path's method and its limits: no closed-form start (no cached
        statistics), no adapter, no SCAFFOLD under FLoRA (its LoRA restarts every round)."""
        _one_of("finetune", self.finetune, FINETUNES)
        _at_least("limit-per-class", self.limit_per_class, 0)
        _at_least("image-size", self.image_size, 0)
        _at_least("lora-rank", self.lora_rank, 1)
        _positive("lora-alpha", self.lora_alpha)
        if self.finetune == "none":
            return
        if self.head_init not in ("random", "zeros"):
            raise ConfigError("head-init", self.head_init, f"finetune={self.finetune!r} trains "
                              "on raw data, without the cached statistics a closed-form start "
                              "needs; use random or zeros")
        if self.adapter_dim:
            raise ConfigError("adapter-dim", self.adapter_dim, f"finetune={self.finetune!r} "
                              "trains the encoder itself; use 0")
        if "feature-skew" in (self.partition, self.within_domain):
            raise ConfigError("partition", self.partition, "feature-skew partitions by cached "
                              "features; with finetune use another partition")
        if self.finetune == "flora" and self.drift_correction != "none":
            raise ConfigError("drift-correction", self.drift_correction, "FLoRA starts fresh "
                              "LoRA modules every round, so there is no drift to correct; use none")
        not_yet = {"server-optimizer": (self.server_optimizer, "fedavg", "fedavg"),
                   "fraction-evaluate": (self.fraction_evaluate, 0.0, "0 (the server evaluates)"),
                   "resume": (self.resume, False, "false (no checkpoints on this path yet)"),
                   "personalize": (self.personalize if self.finetune == "flora" else "", "",
                                   '"" (FLoRA\'s nodes lack the last round\'s stack; '
                                   'personalize after lp, fedavg-lora or full)')}
        for key, (value, allowed, say) in not_yet.items():
            if value != allowed:
                raise ConfigError(key, value, f"with finetune={self.finetune!r} use {say}")

    def _written_key(self, key: str) -> str:
        """The key a user wrote for a method's knob: `pft.<method>.<name>`, or the shared
        `pft-<name>` it came from."""
        own = key[len(PFT_PREFIX):] if key.startswith(PFT_PREFIX) else ""
        name = own.split(".", 1)[-1]
        return SHARED_PFT[name] if own and own not in dict(self.pft) and name in SHARED_PFT else key

    def _check_model_and_personalization(self) -> None:
        """The adapter's shape and start, the methods' names and every method's knobs."""
        _at_least("adapter-dim", self.adapter_dim, 0)
        _one_of("adapter-activation", self.adapter_activation, ADAPTER_ACTIVATIONS)
        if self.adapter_dim and self.head_init not in ("random", "zeros"):
            raise ConfigError("head-init", self.head_init,
                              "with adapter-dim > 0 the heads read the adapter's features, not "
                              "the encoder's the closed-form starts are built from; use random "
                              "or zeros")
        for key, _ in self.pft:
            method = key.split(".", 1)[0]
            if "." not in key or method not in METHOD_NAMES:
                raise ConfigError(PFT_PREFIX + key, dict(self.pft)[key],
                                  f"use pft.<method>.<hyperparameter> with a method from: "
                                  f"{', '.join(METHOD_NAMES)}")
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

    def _check_dataset_and_encoder(self) -> None:
        """Known names whose modalities match, checked before any data or network is read."""
        try:
            reads = dataset_modality(self.dataset)
        except ValueError as err:
            raise ConfigError("dataset", self.dataset, str(err).split("; ", 1)[-1]) from None
        if self.encoder not in ENCODER_MODALITY:
            raise ConfigError("encoder", self.encoder,
                              f"choose one of: {', '.join(ENCODER_MODALITY)}")
        if self.image_size and reads != "image":
            raise ConfigError("image-size", self.image_size,
                              f"dataset {self.dataset!r} is {reads}; use 0")
        if ENCODER_MODALITY[self.encoder] != reads:
            fitting = [name for name, modality in ENCODER_MODALITY.items() if modality == reads]
            raise ConfigError("encoder", self.encoder,
                              f"dataset {self.dataset!r} is {reads}; choose one of: {', '.join(fitting)}")


def default_pft() -> tuple[tuple[str, Any], ...]:
    """Every method's own knobs at the defaults its class declares, as `pft` holds them."""
    shared = {f.name for f in fields(FineTuning)}
    return tuple(sorted((f"{name}.{f.name.replace('_', '-')}", f.default)
                        for name, hyperparameters in HYPERPARAMETERS.items()
                        for f in fields(hyperparameters) if f.name not in shared))


def choices_made(values: Mapping[str, Any]) -> list[str]:
    """The keys of a run config (dash-case) whose value the run chooses from data: these read
    validation rows, never the test split."""
    if values.get("finetune", "none") != "none":
        return []
    made = ["robust-start"] if values.get("robust-start", "none") != "none" else []
    if values.get("head-init") == "ridge" and values.get("ridge-lambda") == "auto":
        made.append("ridge-lambda")
    if values.get("weight-decay") == "auto":
        made.append("weight-decay")
    return made


def validation_share(values: Mapping[str, Any]) -> float:
    """`validation-fraction` of a run config (dash-case) resolved: "auto" holds rows back only
    where the run chooses something (`choices_made`)."""
    fraction = values.get("validation-fraction", "auto")
    if fraction == "auto":
        federated = values.get("validation-rows", "server") == "clients"
        return AUTO_VALIDATION_FRACTION if choices_made(values) or federated else 0.0
    return float(fraction)


def check_num_clients(num_clients: int, num_samples: int) -> None:
    """Each client needs a chance of data: more clients than samples is a config error."""
    if num_clients < 1:
        raise ConfigError("num-supernodes", num_clients, "start at least one SuperNode")
    if num_clients > num_samples:
        raise ConfigError(
            "num-supernodes",
            num_clients,
            f"the training split has only {num_samples} samples; use at most that many clients",
        )


def _coerce(key: str, value: Any, type_name: Any) -> Any:
    """Flower's TOML values arrive typed, but `--run-config` ints may stand for floats."""
    kind = type_name if isinstance(type_name, str) else type_name.__name__
    if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "str" and isinstance(value, str):
        return value
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "float | str" and isinstance(value, str):  # a number, or a word such as "auto"
        return value
    if kind == "float | str":
        return _coerce(key, value, "float")
    raise ConfigError(key, value, f"expected a value of type {kind}")


def _one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(key, value, f"choose one of: {', '.join(allowed)}")


def _at_least(key: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise ConfigError(key, value, f"use an integer >= {minimum}")


def _positive(key: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(key, value, "use a value > 0")


# --- docs/config.md: every key, generated from the fields' descriptions ----------------------

DOCS_COMMAND = "python -m ovalp_flwr.config --markdown > docs/config.md"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


@dataclass(frozen=True)
class KeyDoc:
    """One run-config key as docs/config.md lists it."""

    key: str
    type: str
    default: Any  # the code's; the page shows pyproject's, which a run gets
    doc: str
    allowed: Choices | None = None
    section: str = "personalize"
    method: str = ""  # a `pft.<method>.<knob>`'s method


def key_docs() -> list[KeyDoc]:
    """Every run-config key: RunConfig's fields, then each method's own `pft.<method>.<knob>`
    (described by its Hyperparameters' fields)."""
    keys = [KeyDoc(f.name.replace("_", "-"), str(f.type), f.default, f.metadata.get("doc", ""),
                   f.metadata.get("allowed"), f.metadata.get("section", ""))
            for f in fields(RunConfig) if f.name != "pft"]
    shared = {f.name for f in fields(FineTuning)}
    keys += [KeyDoc(f"{PFT_PREFIX}{method}.{f.name.replace('_', '-')}", str(f.type), f.default,
                    f.metadata.get("doc", ""), method=method)
             for method, hyperparameters in HYPERPARAMETERS.items()
             for f in fields(hyperparameters) if f.name not in shared]
    return keys


def pyproject_defaults(pyproject: Path = PYPROJECT) -> dict[str, Any]:
    """`[tool.flwr.app.config]`, nested tables flattened to dotted keys as Flower does."""

    def flat(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in table.items():
            if isinstance(value, Mapping):
                out.update(flat(value, f"{prefix}{key}."))
            else:
                out[prefix + key] = value
        return out

    return flat(tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["config"])


def markdown(defaults: Mapping[str, Any] | None = None) -> str:
    """docs/config.md: every key by section, with its type, its default (pyproject's), the
    values validation allows where it lists them, and its description."""
    defaults = pyproject_defaults() if defaults is None else defaults
    keys = key_docs()
    try:
        _one_of("head", "mlp", HEADS)
    except ConfigError as err:
        example = str(err)
    recipe = ", ".join(f"`{key} = {_toml(value)}`" for key, value in RECIPE.items())
    lines = [
        f"<!-- Generated by `{DOCS_COMMAND}` from the descriptions in ovalp_flwr/config.py and "
        "ovalp_flwr/personalize/hyperparameters.py: edit those and rerun it, not this file. -->",
        "# Run config",
        "",
        "Every key of `[tool.flwr.app.config]` in pyproject.toml, whose values are the defaults "
        "below. Override any with `--run-config \"key=value ...\"` (strings in single quotes). "
        "One typed object, `ovalp_flwr.config.RunConfig`, validates them before anything runs: "
        "a bad value stops the run with one line naming the key, the value and what is "
        f"allowed, e.g. `{example}`.",
        "",
        "The defaults are the paper's main setting, except where the heads start and the local "
        f"step. The paper's recipe (`ovalp_flwr.config.RECIPE`) is {recipe}.",
        "",
        f"This page is generated from the code: `{DOCS_COMMAND}`.",
        "",
        " · ".join(f"[{title}](#{_slug(title)})" for title, _ in SECTIONS.values()),
    ]
    for section, (title, intro) in SECTIONS.items():
        lines += ["", f"## {title}", "", intro, "",
                  "| key | type | default | allowed | description |", "|---|---|---|---|---|"]
        lines += [_row(f"`{k.key}`", k.type, _default(k, defaults), _allowed(k.allowed), k.doc)
                  for k in keys if k.section == section and not k.method]
        if section != "personalize":
            continue
        lines += ["", "### The methods", "",
                  "`personalize` names them; each one's own knobs are its `pft.<method>.<knob>` "
                  "keys, listed in pyproject.toml at their defaults, and every method shares the "
                  "`pft-*` keys above."]
        for method in METHOD_NAMES:
            lines += ["", f"#### `{method}`", "", METHOD_DOCS[method], ""]
            if not own_knobs(method):
                lines.append("No knobs of its own: the shared `pft-*` keys only.")
                continue
            lines += ["| key | type | default | description |", "|---|---|---|---|"]
            lines += [_row(f"`{k.key}`", k.type, _default(k, defaults), k.doc)
                      for k in keys if k.method == method]
    return "\n".join(lines) + "\n"


def _row(*cells: str) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def _default(key: KeyDoc, defaults: Mapping[str, Any]) -> str:
    return f"`{_toml(defaults.get(key.key, key.default))}`"


def _allowed(allowed: Choices | None) -> str:
    if allowed is None:
        return ""
    return allowed() if callable(allowed) else _code(allowed)


def _code(values: Iterable[str]) -> str:
    return ", ".join(f"`{value}`" for value in values)


def _toml(value: Any) -> str:
    """A value as pyproject.toml spells it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def _slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ovalp_flwr.config",
                                     description="The run-config reference (docs/config.md).")
    parser.add_argument("--markdown", action="store_true", required=True,
                        help="print docs/config.md: every key, its default and its meaning")
    parser.parse_args(argv)
    sys.stdout.buffer.write(markdown().encode("utf-8"))


if __name__ == "__main__":
    main()
