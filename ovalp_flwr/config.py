"""One typed, validated view of the run config (`[tool.flwr.app.config]` + overrides).

Both apps build a `RunConfig` once from `context.run_config`; every bad value stops the
run with a single `ConfigError` line naming the key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, Mapping

from ovalp_flwr.data.noise import NOISE_KINDS

HEADS = ("ova", "softmax")
SCHEDULES = ("two-stage", "single-stage")
PARTITIONS = ("iid", "shard", "bernoulli-dirichlet", "zipf", "feature-skew", "domain")
FEATURE_NORMS = ("none", "l2", "standardize", "center-l2")
DEVICES = ("auto", "cpu", "cuda")
LOCAL_OPTIMIZERS = ("adamw", "sgd")
AGGREGATION_WEIGHTS = ("samples", "uniform")
DRIFT_CORRECTIONS = ("none", "scaffold")
EPOCH_SIZES = ("own-data", "equal-share", "own-data-equal-steps")
SERVER_OPTIMIZERS = ("fedavg", "fedadam")
HEAD_INITS = ("random", "zeros", "class-means", "ridge")  # ovalp_flwr.core.head_init
STATISTICS_AGGREGATIONS = ("plain", "secagg+")  # secagg+: ovalp_flwr.federation.secure_sum
ADAPTER_ACTIVATIONS = ("relu", "gelu", "none")  # ovalp_flwr.core.model
FINETUNES = ("none", "lp", "fedavg-lora", "flora", "full")  # ovalp_flwr.finetune
PFT_PREFIX = "pft."  # pft.<method>.<hyperparameter>: a personalization method's own knobs
# the knobs every method shares (personalize.base.FineTuning) and their run-config keys
SHARED_PFT = {"epochs": "pft-epochs", "learning-rate": "pft-learning-rate",
              "batch-size": "pft-batch-size", "optimizer": "pft-optimizer",
              "weight-decay": "pft-weight-decay"}
# The paper's recipe, which the defaults were until SCAFFOLD ("Quantity skew") and the
# closed-form start ("Closed-form starts") replaced it: presets that reproduce the paper, and
# tests of its claims, pin it.
RECIPE: dict[str, Any] = {"local-optimizer": "adamw", "learning-rate": 0.01,
                          "drift-correction": "none", "epoch-size": "own-data",
                          "weight-decay": 1e-4, "head-init": "random"}


# Where a run's files live, which device ran it, how it meets faults and whether it was resumed:
# none changes what the run computes (a fault it met is in its per-round records).
NOT_PART_OF_THE_RESULT = frozenset({"run-name", "results-dir", "feature-cache-dir", "data-dir",
                                    "device", "round-timeout", "exclude-after-rejections",
                                    "checkpoint-every", "resume"})


class ConfigError(ValueError):
    """A run-config value that is not allowed; the message is one self-contained line."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        super().__init__(f"run config: {key}={value!r} is not allowed; {allowed}")
        self.key, self.value, self.allowed = key, value, allowed


@dataclass(frozen=True)
class RunConfig:
    """Every knob of a run. Defaults: the paper's main setting, except where the heads start
    and the local step (`RECIPE` is the paper's): the heads start from the federation's ridge
    regression (README, "Closed-form starts"), and the local step is SGD with SCAFFOLD's drift
    correction, the same number of steps for every client and weight decay 0.01, which hold
    OvA-LP's accuracy where label skew meets quantity skew (README, "Quantity skew")."""

    dataset: str = "digits"
    encoder: str = "efficientnet-lite0"
    data_dir: str = ""  # local dataset files; "" = $OVALP_DATA_DIR, else ../shared/data
    feature_cache_dir: str = "feature_cache"
    head: str = "ova"
    schedule: str = "two-stage"
    stage1_rounds: int = 1
    partition: str = "shard"
    # partition "domain" (each client one domain of a multi-domain dataset, or a share of one):
    # how the clients of one domain split its rows, with the keys of that partition
    within_domain: str = "iid"
    classes_per_client: int = 1
    dirichlet_p: float = 0.1
    dirichlet_alpha: float = 0.001
    zipf_s: float = 2.0
    label_noise: str = "none"
    noise_rate: float = 0.0
    num_server_rounds: int = 20  # 0: the start is the result (FedNCM, Fed3R)
    local_epochs: int = 3
    batch_size: int = 50
    learning_rate: float = 0.05
    weight_decay: float = 0.01  # the centralised ceiling's tuned L2 (the recipe: 1e-4)
    # variants for quantity-skewed label partitions (README, "Quantity skew")
    local_optimizer: str = "sgd"
    local_steps: int = 0  # > 0: exactly this many local steps per round instead of epochs
    # one local epoch: a pass over the client's own data (the paper: own-data); as many batches
    # as an equal share of the federation's data holds, the same for every client and
    # server-computed (equal-share); or both: a pass over the client's own data in an equal
    # share's steps, in bigger batches on bigger clients (own-data-equal-steps)
    epoch_size: str = "own-data-equal-steps"
    aggregation_weights: str = "samples"
    drift_correction: str = "scaffold"
    server_optimizer: str = "fedavg"
    server_learning_rate: float = 0.1  # FedAdam's eta (Flower's default)
    # where the heads start: random (torch's init), zeros, or built by the server from the
    # clients' summed statistics (class means: FedNCM; ridge: Fed3R), README "Closed-form starts"
    head_init: str = "ridge"
    ridge_lambda: float = 0.2  # per training sample; Fed3R's published 0.01 is 0.01 / n
    # how the server sums the clients' statistics: as they come (plain), or under Flower's
    # SecAgg+, which shows it only their sum
    statistics_aggregation: str = "plain"
    fraction_train: float = 1.0
    fraction_evaluate: float = 0.0
    # faults (README, "Reliability"): a round aggregates the replies it has after this many
    # seconds; a node whose replies were refused this many times is no longer sampled (0: never)
    round_timeout: float = 3600.0
    exclude_after_rejections: int = 0
    # a checkpoint in results/<run-name>/ after every this many rounds (0: none); resume: go on
    # from it (ovalp_flwr.federation.checkpoint)
    checkpoint_every: int = 1
    resume: bool = False
    seed: int = 0
    feature_norm: str = "standardize"
    device: str = "auto"
    run_name: str = ""
    results_dir: str = "results"
    # the model on the cached features: the heads alone (0), or an adapter B (D -> adapter-dim,
    # then adapter-activation) under the heads, trained federatedly with them (ovalp_flwr.core.model)
    adapter_dim: int = 0
    adapter_activation: str = "relu"
    # what the data is: the first N samples of each class per split (0: all) and the image
    # side in pixels (0: the encoder's default); both paths read the same (cache marks @limitN, @Npx)
    limit_per_class: int = 0
    image_size: int = 0
    # train through the encoder on raw data instead of heads on cached features (README,
    # "Fine-tuning the encoder", ovalp_flwr.finetune): none (the cache: OvA-LP), lp (heads
    # only, through the frozen encoder), fedavg-lora, flora, full; LoRA's rank and alpha
    finetune: str = "none"
    lora_rank: int = 8
    lora_alpha: float = 16.0
    # personalization after the last round (README, "Personalization"): the methods each
    # client runs on the final global model (ovalp_flwr.personalize), space-separated; "" = none
    personalize: str = ""
    personalize_curve: str = ""  # PFT epochs at which Global is measured too (Local: every one)
    pft_epochs: int = 15  # what every method shares (the study: 15 epochs of Adam at 1e-3)
    pft_learning_rate: float = 1e-3
    pft_batch_size: int = 32
    pft_optimizer: str = "adamw"
    pft_weight_decay: float = 0.0
    # ("<method>.<hyperparameter>", value) pairs of `pft.*` keys: each method's own knobs
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

    @property
    def stages(self) -> bool:
        """Whether the run uses a positives-only first stage at all."""
        return self.head == "ova" and self.schedule == "two-stage" and self.stage1_rounds > 0

    def stage_for_round(self, server_round: int) -> int:
        """The server's stage decision: 1 = positives only, 2 = all heads (BCE)."""
        return 1 if self.stages and server_round <= self.stage1_rounds else 2

    def validate(self) -> None:
        _one_of("head", self.head, HEADS)
        _one_of("schedule", self.schedule, SCHEDULES)
        _one_of("partition", self.partition, PARTITIONS)
        _one_of("within-domain", self.within_domain, PARTITIONS[:-1])
        _one_of("feature-norm", self.feature_norm, FEATURE_NORMS)
        _one_of("device", self.device, DEVICES)
        _one_of("label-noise", self.label_noise, NOISE_KINDS)
        _one_of("local-optimizer", self.local_optimizer, LOCAL_OPTIMIZERS)
        _one_of("aggregation-weights", self.aggregation_weights, AGGREGATION_WEIGHTS)
        _one_of("drift-correction", self.drift_correction, DRIFT_CORRECTIONS)
        _one_of("epoch-size", self.epoch_size, EPOCH_SIZES)
        _one_of("server-optimizer", self.server_optimizer, SERVER_OPTIMIZERS)
        _one_of("head-init", self.head_init, HEAD_INITS)
        _one_of("statistics-aggregation", self.statistics_aggregation, STATISTICS_AGGREGATIONS)
        _positive("ridge-lambda", self.ridge_lambda)
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
        if self.weight_decay < 0:
            raise ConfigError("weight-decay", self.weight_decay, "use a value >= 0")
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
        from ovalp_flwr.personalize import METHODS, HyperparameterError, make_personalizer

        _at_least("adapter-dim", self.adapter_dim, 0)
        _one_of("adapter-activation", self.adapter_activation, ADAPTER_ACTIVATIONS)
        if self.adapter_dim and self.head_init not in ("random", "zeros"):
            raise ConfigError("head-init", self.head_init,
                              "with adapter-dim > 0 the heads read the adapter's features, not "
                              "the encoder's the closed-form starts are built from; use random "
                              "or zeros")
        for key, _ in self.pft:
            method = key.split(".", 1)[0]
            if "." not in key or method not in METHODS:
                raise ConfigError(PFT_PREFIX + key, dict(self.pft)[key],
                                  f"use pft.<method>.<hyperparameter> with a method from: "
                                  f"{', '.join(METHODS)}")
        for method in self.personalization_methods:
            if method not in METHODS:
                raise ConfigError("personalize", method,
                                  f"choose methods from: {', '.join(METHODS)}")
        if len(set(self.personalization_methods)) != len(self.personalization_methods):
            raise ConfigError("personalize", self.personalize, "name each method once")
        try:  # the shared knobs; a method this run uses with all it gets; the others' own knobs
            make_personalizer("ft", self.personalizer_options("ft"))
            for method in METHODS:
                options = self.personalizer_options(method)
                if method not in self.personalization_methods:
                    options = {k: v for k, v in options.items() if k not in SHARED_PFT}
                make_personalizer(method, options)
        except HyperparameterError as err:
            raise ConfigError(self._written_key(err.key), err.value, err.allowed) from None
        for epoch in self.personalize_curve.split():
            if not epoch.isdigit() or not 1 <= int(epoch) <= self.pft_epochs:
                raise ConfigError("personalize-curve", self.personalize_curve,
                                  f"use space-separated epochs in 1..pft-epochs={self.pft_epochs}")

    def _check_dataset_and_encoder(self) -> None:
        """Known names whose modalities match, checked before any data or network is read."""
        from ovalp_flwr.data.registry import dataset_modality
        from ovalp_flwr.features.encoders import ENCODERS, encoder_modality

        try:
            reads = dataset_modality(self.dataset)
        except ValueError as err:
            raise ConfigError("dataset", self.dataset, str(err).split("; ", 1)[-1]) from None
        if self.encoder not in ENCODERS:
            raise ConfigError("encoder", self.encoder, f"choose one of: {', '.join(ENCODERS)}")
        if self.image_size and reads != "image":
            raise ConfigError("image-size", self.image_size,
                              f"dataset {self.dataset!r} is {reads}; use 0")
        if encoder_modality(self.encoder) != reads:
            fitting = [name for name in ENCODERS if encoder_modality(name) == reads]
            raise ConfigError("encoder", self.encoder,
                              f"dataset {self.dataset!r} is {reads}; choose one of: {', '.join(fitting)}")


def default_pft() -> tuple[tuple[str, Any], ...]:
    """Every method's own knobs at the defaults its class declares, as `pft` holds them."""
    from ovalp_flwr.personalize import METHODS, FineTuning  # late: torch

    shared = {f.name for f in fields(FineTuning)}
    return tuple(sorted((f"{name}.{f.name.replace('_', '-')}", f.default)
                        for name, cls in METHODS.items()
                        for f in fields(cls.Hyperparameters) if f.name not in shared))


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
