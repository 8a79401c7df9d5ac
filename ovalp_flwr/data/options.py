"""The data's and the partition's knobs (run config): what the clients hold, how it becomes
features, and how the training split is spread over the clients. Torch-free."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from typing import Any

from ovalp_flwr.data.noise import NOISE_KINDS
from ovalp_flwr.data.registry import dataset_modality
from ovalp_flwr.features.modalities import ENCODER_MODALITY
from ovalp_flwr.options import (ConfigError, Options, Whole, at_least, key, one_of, plain_name,
                                positive, share)

PARTITIONS = ("iid", "shard", "bernoulli-dirichlet", "zipf", "feature-skew", "domain")
# partition "domain": how the clients of one domain split its rows (any partition but domain)
WITHIN_DOMAIN_PARTITIONS = ("iid", "shard", "bernoulli-dirichlet", "zipf", "feature-skew")
# partition = "flwr:<Name>": a Flower Datasets partitioner by its class name (data/partitioners.py)
FLOWER_PARTITION = "flwr:"
PARTITION_CHOICES = (*PARTITIONS, f"{FLOWER_PARTITION}<Name>")
WITHIN_DOMAIN_CHOICES = (*WITHIN_DOMAIN_PARTITIONS, f"{FLOWER_PARTITION}<Name>")
# what the run sets on a Flower Datasets partitioner itself: not given in `partition-args`
SET_BY_THE_RUN = {"num_partitions": "the number of SuperNodes", "seed": "the run's `seed`"}
# Flower's own `--run-config` syntax (flwr/common/config.py, parse_config_args): name=value pairs
# apart by spaces, each value TOML (strings quoted)
_PAIR = re.compile(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)")
FEATURE_NORMS = ("none", "l2", "standardize", "center-l2")
AUTO_VALIDATION_FRACTION = 0.1  # validation-fraction "auto" where the run makes a choice
VALIDATION_ROWS = ("server", "clients")  # who keeps them


def _code(values: list[str]) -> str:
    return ", ".join(f"`{value}`" for value in values)


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


@dataclass(frozen=True)
class DataOptions(Options):
    """What the clients hold and how it becomes features."""

    TITLE = "Data and features"
    INTRO = "What the clients hold and how it becomes features ([Data](data.md))."

    dataset: str = key(
        "digits", "The dataset's registry name; checked, with the encoder's modality, "
        "before anything loads. Local files are read from `data-dir`; `digits` is bundled.",
        _dataset_choices)
    encoder: str = key(
        "efficientnet-lite0", "The frozen encoder's registry name (`pixels`: raw "
        "pixels, no network); it must read what the dataset holds, image or text.",
        _encoder_choices)
    data_dir: str = key(
        "", 'Where local dataset files live; `""`: `$OVALP_DATA_DIR`, else '
        "`../shared/data`.")
    feature_cache_dir: str = key(
        "feature_cache", "Where feature caches live, relative to the directory the "
        "run starts in.")
    label_noise: str = key(
        "none", "Noisy training labels (the FedLTF / FedCorr setting), seeded by "
        "`seed`, before partitioning: `symmetric` (a uniformly drawn other class) or "
        "`asymmetric` (class c → c+1 mod K). The test split is never touched.", NOISE_KINDS)
    noise_rate: float = key(
        0.0, "The fraction of training labels `label-noise` replaces, in [0, 1): "
        "exactly round(noise-rate × n), per class for `asymmetric`.")
    validation_fraction: float | str = key(
        "auto", "The share of the training split held back as validation rows, "
        "seeded and stratified by (domain, class) before partitioning: no client trains on "
        "them, and every choice the run makes (`robust-start`'s clients left out, "
        "`ridge-lambda = \"auto\"`, the best round) is scored on them, never on the test "
        f"split. `auto`: {AUTO_VALIDATION_FRACTION} where the run chooses a key's value from "
        "data (`robust-start`, `ridge-lambda = \"auto\"`), else 0 "
        "(the run is row for row what it was). A share in [0, 0.5]; the encoder path holds "
        "none ([Results](results.md#validation-rows)).")
    validation_rows: str = key(
        "server", "Who keeps the validation rows: `server`, carved from the training "
        "split before the partition and scored by the server (its own rows, never the test "
        "split); or `clients`: each client holds back `validation-fraction` of its own "
        "partition (stratified by its (domain, class)), and every round the server asks every "
        "client for its rows' accuracy and loss on the heads it holds and sums them "
        "(federated validation; `auto` holds 0.1 back). The best round is chosen on the sums; "
        "the choices made at the start or by the server's L-BFGS need the server's rows "
        "([Results](results.md#federated-validation)).", VALIDATION_ROWS)
    feature_norm: str = key(
        "standardize", "How the cached features are normalised: `none`, `l2`, "
        "`standardize` or `center-l2`. The last two subtract the federation's global mean, "
        "merged from the clients' counts, sums and sums of squares.", FEATURE_NORMS)
    limit_per_class: int = key(
        0, "The first N samples of each class per split (`0`: all), for the cache and "
        "the encoder path alike; each value has its own cache (`@limitN`).")
    image_size: int = key(
        0, "The image side in pixels (`0`: the encoder's default, Lite0 128), for "
        "both paths; each value has its own cache (`@Npx`). Image datasets only.")

    def cache_options(self) -> dict[str, int | None]:
        """`limit-per-class` and `image-size` as the cache and the data loaders take them."""
        return {"limit_per_class": self.limit_per_class or None,
                "image_size": self.image_size or None}

    def check(self) -> None:
        one_of("label-noise", self.label_noise, NOISE_KINDS)
        share("noise-rate", self.noise_rate, 0, 1, high_open=True, what="a fraction")
        one_of("feature-norm", self.feature_norm, FEATURE_NORMS)
        fraction = self.validation_fraction
        if fraction != "auto" and (isinstance(fraction, str) or not 0 <= fraction <= 0.5):
            raise ConfigError("validation-fraction", fraction, 'use "auto" or a share in [0, 0.5]')
        one_of("validation-rows", self.validation_rows, VALIDATION_ROWS)
        at_least("limit-per-class", self.limit_per_class, 0)
        at_least("image-size", self.image_size, 0)
        plain_name("dataset", self.dataset)
        self._check_dataset_and_encoder()

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
            raise ConfigError("encoder", self.encoder, f"dataset {self.dataset!r} is {reads}; "
                              f"choose one of: {', '.join(fitting)}")

    def requires(self, config: Whole) -> None:
        """Validation rows where a choice is made, and where they can be held."""
        fraction = self.validation_fraction
        if fraction != "auto" and fraction > 0 and config.finetune != "none":
            raise ConfigError("validation-fraction", fraction, "the encoder path holds no "
                              'validation rows; use "auto" or 0')
        made = config.choices
        if self.validation_rows == "clients":
            self._check_federated_validation(config, made)
        if made and config.validation_share == 0:
            raise ConfigError("validation-fraction", fraction, f"{' and '.join(made)} "
                              f"{'is' if len(made) == 1 else 'are'} chosen on validation rows "
                              '(never the test split); use "auto" or a share > 0')

    def _check_federated_validation(self, config: Whole, made: tuple[str, ...]) -> None:
        """Rows the clients keep are scored by an evaluate exchange each round: what needs
        the server to score many models itself (at the start, or inside a round) cannot use
        them, nor can a run whose evaluate exchange does something else."""
        if made:
            raise ConfigError("validation-rows", self.validation_rows, f"{' and '.join(made)} "
                              "scores its candidates on the server's own validation rows; use "
                              '"server"')
        needs = {"validation-fraction": (config.validation_share > 0, 'a share > 0 (or "auto")'),
                 "fraction-evaluate": (config.fraction_evaluate == 0, "0: every round's evaluate "
                                       "exchange is the federated validation"),
                 "finetune": (config.finetune == "none", '"none": the encoder path holds no '
                              "validation rows")}
        for name, (fine, allowed) in needs.items():
            if not fine:
                value = getattr(config, name.replace("-", "_"))
                raise ConfigError(name, value, f'with validation-rows="clients" use {allowed}')


@dataclass(frozen=True)
class PartitionOptions(Options):
    """How the training split is spread over the clients."""

    TITLE = "Partition"
    INTRO = ("How the training split is spread over the clients, one per SuperNode; every "
             "scheme is seeded by `seed` ([Data](data.md)).")

    partition: str = key(
        "shard", "`iid`: a seeded shuffle, equal split; `shard`: "
        "`classes-per-client` classes per client; `bernoulli-dirichlet`: FedCorr's "
        "construction; `zipf`: quantity skew, IID labels; `feature-skew`: k-means over the "
        "features, one cluster per client; `domain`: one domain of a multi-domain dataset per "
        "client, or a share of one ([Clients that differ in what they see](shift.md)); "
        "`flwr:<Name>`: Flower Datasets' partitioner `<Name>` (e.g. `flwr:DirichletPartitioner`)"
        " with `partition-args` ([Data](data.md#flower-datasets-partitioners)).",
        PARTITION_CHOICES)
    within_domain: str = key(
        "iid", 'With `partition = "domain"`: how the clients of one domain split '
        "its rows (any partition but `domain`, with that partition's own keys), e.g. `shard` "
        "for label skew inside a domain.", WITHIN_DOMAIN_CHOICES)
    classes_per_client: int = key(
        1, "k of shard-k: the distinct classes each client holds.")
    dirichlet_p: float = key(
        0.1, "Bernoulli-Dirichlet: the p of the client-class Bernoulli(p) matrix "
        "(which clients hold which classes), in (0, 1].")
    dirichlet_alpha: float = key(
        0.001, "Bernoulli-Dirichlet: the alpha of the Dirichlet that spreads each "
        "class over the clients holding it. Clients can end up empty: they skip training and "
        "get no FedAvg weight.")
    zipf_s: float = key(
        2.0, "The exponent of Zipf quantity skew: client sizes proportional to "
        "rank^-s, at least one sample each.")

    partition_args: str = key(
        "", 'With `partition = "flwr:<Name>"` (a [Flower Datasets partitioner](data.md#flower-'
        'datasets-partitioners)): its keyword arguments as `name=value` pairs apart by spaces, '
        "values in TOML as `--run-config` takes them (strings in double quotes inside the "
        "key's single quotes), e.g. `alpha=0.3 min_partition_size=0`. `num_partitions` is the "
        "number of SuperNodes and `seed` the run's `seed`; `partition_by` is `\"label\"` unless "
        "given.")

    def check(self) -> None:
        check_partition("partition", self.partition, PARTITION_CHOICES)
        check_partition("within-domain", self.within_domain, WITHIN_DOMAIN_CHOICES)
        args = partition_args(self.partition_args)
        if args and FLOWER_PARTITION not in self.partition + self.within_domain:
            raise ConfigError("partition-args", self.partition_args, "it is read only with "
                              'partition = "flwr:<Name>" (or within-domain); use ""')
        at_least("classes-per-client", self.classes_per_client, 1)
        positive("dirichlet-alpha", self.dirichlet_alpha)
        positive("zipf-s", self.zipf_s)
        share("dirichlet-p", self.dirichlet_p, 0, 1, low_open=True, what="a probability")


def flower_partitioner(partition: str) -> str | None:
    """The Flower Datasets partitioner's class name a partition names ("flwr:<Name>"), or None
    for one of ours."""
    return partition[len(FLOWER_PARTITION):] if partition.startswith(FLOWER_PARTITION) else None


def check_partition(key_name: str, value: str, allowed: tuple[str, ...]) -> None:
    """One of our partitions, or "flwr:<Name>" with a class name (which one exists is known only
    once Flower Datasets is imported: `partitioners.flower_partitioner_class`)."""
    name = flower_partitioner(value)
    if name is None:
        one_of(key_name, value, allowed)
    elif not name.isidentifier():
        raise ConfigError(key_name, value, "name a Flower Datasets partitioner by its class, "
                          'e.g. "flwr:DirichletPartitioner"')


def partition_args(text: str) -> dict[str, Any]:
    """`partition-args` as the partitioner's keyword arguments (see the key): one ConfigError
    naming the pair where one is not TOML, or a key the run sets itself."""
    if not isinstance(text, str):
        raise ConfigError("partition-args", text, 'use a string of name=value pairs, e.g. '
                          '"alpha=0.3 min_partition_size=0"')
    pairs = _PAIR.findall(text)
    if _PAIR.sub("", text).strip():  # something besides the pairs
        raise ConfigError("partition-args", text, "use name=value pairs apart by spaces, "
                          'strings in double quotes, e.g. alpha=0.3 partition_by="label"')
    args: dict[str, Any] = {}
    for name, value in pairs:
        try:
            args[name] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            raise ConfigError("partition-args", text, f"{name}={value} is not a TOML value "
                              "(a number, true/false, a \"string\" or a [list])") from None
        if name in SET_BY_THE_RUN:
            raise ConfigError("partition-args", text, f"{name} is {SET_BY_THE_RUN[name]}; "
                              "leave it out")
    return args
