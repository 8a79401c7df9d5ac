"""One typed, validated view of the run config (`[tool.flwr.app.config]` + overrides).

`RunConfig` is a composition of groups, one a concern, each a frozen dataclass of its knobs in
that concern's `options.py` (beside the code that reads them), with its own checks and its
rules against other groups (`ovalp_flwr.options`). Both apps build a `RunConfig` once from
`context.run_config`; every bad value stops the run with a single `ConfigError` line naming the
key, the value and what is allowed. A part of the run receives only its own group
(`config.privacy`, `config.robustness`, ...); the apps and the run pipeline read any key by its
name (`config.learning_rate`). The keys stay flat (`dp-rounds-epsilon`): Flower refuses an
override whose key pyproject lacks, so a renamed key would break every saved command, preset and
checkpoint. docs/config.md is generated from the groups (`config_docs`). Validating imports no
torch.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import FunctionType
from typing import Any

from ovalp_flwr.core.options import RIDGE_STARTS, StartOptions, TrainingOptions
from ovalp_flwr.data.options import AUTO_VALIDATION_FRACTION, DataOptions, PartitionOptions
from ovalp_flwr.federation.adversary.options import AttackOptions
from ovalp_flwr.federation.aggregators.options import RobustOptions
from ovalp_flwr.federation.options import ReliabilityOptions, RoundOptions
from ovalp_flwr.finetune.options import FinetuneOptions
from ovalp_flwr.options import ConfigError, Options, coerce, dash, key, one_of, plain_name
from ovalp_flwr.personalize.options import PFT_PREFIX, PersonalizeOptions, default_pft
from ovalp_flwr.privacy.options import PrivacyOptions
from ovalp_flwr.tracking.options import TrackingOptions

__all__ = ["ConfigError", "RunConfig", "RunOptions", "GROUPS", "RECIPE", "check_num_clients",
           "choices_made", "validation_share", "NOT_PART_OF_THE_RESULT"]

DEVICES = ("auto", "cpu", "cuda")
# The paper's recipe, which the defaults were until SCAFFOLD ("Quantity skew") and the
# closed-form start ("Closed-form starts") replaced it: presets that reproduce the paper, and
# tests of its claims, pin it.
RECIPE: dict[str, Any] = {"local-optimizer": "adamw", "learning-rate": 0.01,
                          "drift-correction": "none", "epoch-size": "own-data",
                          "weight-decay": 1e-4, "head-init": "random"}
# Where a run's files live, which device ran it, how it meets faults, whether it was resumed and
# where it is tracked:
# none changes what the run computes (a fault it met is in its per-round records).
NOT_PART_OF_THE_RESULT = frozenset({"run-name", "results-dir", "feature-cache-dir", "data-dir",
                                    "device", "round-timeout", "exclude-after-rejections",
                                    "checkpoint-every", "resume", "scaffold-variates",
                                    "tracking", "tracking-uri", "tracking-experiment",
                                    "tracking-parent", "tracking-tags"})


@dataclass(frozen=True)
class RunOptions(Options):
    """The run's seed, device and where its results go."""

    TITLE = "Seed, device and output"
    INTRO = ("Reproducibility, where the run computes and where its results go "
             "([What a run prints and writes](results.md)).")

    seed: int = key(
        0, "Fixes the partition, the heads' initialisation, client sampling and batch order.")
    device: str = key(
        "auto", "`auto`: CUDA if present, else the CPU.", DEVICES)
    run_name: str = key(
        "", "The results folder's name: a plain name, without `/` or a leading `.` "
        '(`""`: a timestamp and what ran).')
    results_dir: str = key(
        "results", "Where results folders go.")

    def check(self) -> None:
        if self.seed < 0:
            raise ConfigError("seed", self.seed, "use an integer >= 0")
        one_of("device", self.device, DEVICES)
        plain_name("run-name", self.run_name)


# RunConfig's groups, in docs/config.md's order: attribute -> the group's class
GROUPS: dict[str, type[Options]] = {
    "data": DataOptions, "partitioning": PartitionOptions, "training": TrainingOptions,
    "rounds": RoundOptions, "start": StartOptions, "robustness": RobustOptions,
    "privacy": PrivacyOptions, "adversary": AttackOptions, "reliability": ReliabilityOptions,
    "finetuning": FinetuneOptions, "personalization": PersonalizeOptions, "run": RunOptions,
    "tracker": TrackingOptions}


def _owners() -> dict[str, str]:
    """Each key's and each group's public property or method -> the group that holds it (the
    names are unique across groups, and none is a group's)."""
    owners: dict[str, str] = {}
    for group, cls in GROUPS.items():
        public = {name for name, value in vars(cls).items() if not name.startswith("_")
                  and isinstance(value, (property, FunctionType)) and name not in vars(Options)}
        for name in {f.name for f in cls.key_fields()} | public:
            assert name not in owners and name not in GROUPS, f"{name}: in {owners.get(name)}"
            owners[name] = group
    return owners


OWNER = _owners()
FIELD_GROUP = {f.name: group for group, cls in GROUPS.items() for f in cls.key_fields()}


@dataclass(frozen=True, init=False)
class RunConfig:
    """Every knob of a run, by concern. Defaults: the paper's main setting, except where the
    heads start and the local step (`RECIPE` is the paper's): the heads start from the
    federation's ridge regression (README, "Closed-form starts"), and the local step is SGD
    with SCAFFOLD's drift correction, the same number of steps for every client and weight
    decay 0.01, which hold OvA-LP's accuracy where label skew meets quantity skew (README,
    "Quantity skew")."""

    data: DataOptions
    partitioning: PartitionOptions
    training: TrainingOptions
    rounds: RoundOptions
    start: StartOptions
    robustness: RobustOptions
    privacy: PrivacyOptions
    adversary: AttackOptions
    reliability: ReliabilityOptions
    finetuning: FinetuneOptions
    personalization: PersonalizeOptions
    run: RunOptions
    tracker: TrackingOptions

    def __init__(self, **values: Any) -> None:
        """Groups by attribute (`training=TrainingOptions(...)`) or keys by field name
        (`learning_rate=0.1`), or both (a key wins over its group's): unvalidated, as
        `dataclasses.replace` calls it; `from_mapping` validates."""
        given = {name: values.pop(name) for name in list(values) if name in GROUPS}
        for name in values:
            if name not in FIELD_GROUP:
                raise TypeError(f"RunConfig has no key {name!r}")
        for group, cls in GROUPS.items():
            own = {name: value for name, value in values.items() if FIELD_GROUP[name] == group}
            base = given.get(group)
            if base is None:
                made = cls(**own)
            else:  # a group without changes is kept, not copied
                made = dataclasses.replace(base, **own) if own else base
            object.__setattr__(self, group, made)

    def __getattr__(self, name: str) -> Any:
        """A key or a group's property by its name, from the group that holds it."""
        group = OWNER.get(name)
        if group is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")
        return getattr(object.__getattribute__(self, group), name)

    @classmethod
    def from_mapping(cls, run_config: Mapping[str, Any]) -> "RunConfig":
        """Build from Flower's run config (dash-case keys); unknown keys are errors."""
        known = {dash(name): cls_field for name, cls_field in _fields().items() if name != "pft"}
        values: dict[str, Any] = {}
        pft = {name: value for name, value in run_config.items() if name.startswith(PFT_PREFIX)}
        if pft:
            given = {name[len(PFT_PREFIX):]: value for name, value in pft.items()}
            values["pft"] = tuple(sorted({**dict(default_pft()), **given}.items()))
        for name, value in run_config.items():
            if name.startswith(PFT_PREFIX):
                continue
            if name not in known:
                raise ConfigError(name, value, f"known keys: {', '.join(sorted(known))}")
            values[known[name].name] = coerce(name, value, known[name].type)
        config = cls(**values)
        config.validate()
        return config

    def to_dict(self) -> dict[str, Any]:
        """Dash-case keys, as in pyproject (`pft.*` flattened as Flower does), for results files."""
        flat = {dash(name): getattr(self, name) for name in _fields() if name != "pft"}
        return {**flat, **{PFT_PREFIX + name: value for name, value in self.pft}}

    def replace(self, **values: Any) -> "RunConfig":
        """This config with some keys changed (by field name), unvalidated."""
        return dataclasses.replace(self, **values)

    def validate(self) -> None:
        """Every group's own rules, then each group's rules against the others."""
        groups = [getattr(self, name) for name in GROUPS]
        for group in groups:
            group.check()
        for group in groups:
            group.requires(self)

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
        made = {"statistics": self.head_init not in ("random", "zeros") or self.server_steps
                or self.robust_start != "none",
                "rounds": self.num_server_rounds > 0,
                "validation": self.validation_rows == "clients",
                "evaluation": self.fraction_evaluate > 0,
                "personalization": bool(self.personalization_methods)}
        return tuple(release for release, sent in made.items() if sent)

    @property
    def stages(self) -> bool:
        """Whether the run uses a positives-only first stage at all (not when the server
        optimises: it descends the final loss from round 1)."""
        return (self.head == "ova" and self.schedule == "two-stage" and self.stage1_rounds > 0
                and not self.server_steps)

    def stage_for_round(self, server_round: int) -> int:
        """The server's stage decision: 1 = positives only, 2 = all heads (BCE)."""
        return 1 if self.stages and server_round <= self.stage1_rounds else 2


@functools.cache
def _fields() -> dict[str, dataclasses.Field]:
    """Every key's field by name, in the groups' order."""
    return {f.name: f for cls in GROUPS.values() for f in cls.key_fields()}


def choices_made(values: Mapping[str, Any]) -> list[str]:
    """The keys of a run config (dash-case) whose value the run chooses from data: these read
    validation rows, never the test split."""
    if values.get("finetune", "none") != "none":
        return []
    made = ["robust-start"] if values.get("robust-start", "none") != "none" else []
    if values.get("head-init") in RIDGE_STARTS and values.get("ridge-lambda") == "auto":
        made.append("ridge-lambda")
    if values.get("head-init") == "auto":
        made.append("head-init")
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
