"""The run config's groups: each concern's knobs in its own options.py, checked on their own
(`check`) and against the other groups (`requires`), composed by `RunConfig`."""

import dataclasses

import pytest

from ovalp_flwr.config import GROUPS, RunConfig
from ovalp_flwr.core.options import StartOptions, TrainingOptions
from ovalp_flwr.federation.aggregators.options import RobustOptions
from ovalp_flwr.federation.options import RoundOptions
from ovalp_flwr.finetune.options import FinetuneOptions
from ovalp_flwr.options import ConfigError, Options, coerce, share
from ovalp_flwr.privacy.options import PrivacyOptions


def test_every_group_is_a_frozen_options_dataclass_with_documented_keys():
    for name, cls in GROUPS.items():
        assert issubclass(cls, Options) and dataclasses.is_dataclass(cls), name
        assert cls.TITLE and cls.INTRO, name
        group = cls()
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(group, cls.key_fields()[0].name, None)
        undocumented = [f.name for f in cls.key_fields()
                        if f.name != "pft" and not f.metadata.get("doc")]
        assert not undocumented, f"{name}: {undocumented}"


def test_a_key_lives_in_one_group_and_is_read_by_its_name_from_the_whole():
    config = RunConfig(learning_rate=0.2, dp_clip=0.5, attack="sign-flip")
    assert config.training.learning_rate == config.learning_rate == 0.2
    assert config.privacy.dp_clip == config.dp_clip == 0.5
    assert config.adversary.attack == "sign-flip"
    assert config.rounds.server_steps is config.server_steps is False  # a group's property
    with pytest.raises(AttributeError):
        config.no_such_key  # noqa: B018
    with pytest.raises(TypeError, match="no key 'no_such_key'"):
        RunConfig(no_such_key=1)


def test_replacing_keys_changes_only_their_groups():
    config = RunConfig()
    changed = dataclasses.replace(config, fraction_train=0.5, seed=3)
    assert (changed.fraction_train, changed.seed) == (0.5, 3)
    assert config.fraction_train == 1.0  # frozen: a new config
    assert changed.privacy is config.privacy  # untouched groups are shared
    assert changed.replace(seed=4).seed == 4
    # a group given whole, and a key over it
    rounds = RoundOptions(num_server_rounds=7)
    assert RunConfig(rounds=rounds).num_server_rounds == 7
    assert RunConfig(rounds=rounds, num_server_rounds=9).num_server_rounds == 9


def test_the_dict_round_trips_through_from_mapping():
    config = RunConfig.from_mapping({"dp-rounds-epsilon": 2.0, "feature-norm": "l2",
                                     "drift-correction": "none", "local-optimizer": "adamw",
                                     "head-init": "random", "pft.lss.models": 2})
    again = RunConfig.from_mapping(config.to_dict())
    assert again == config and hash(again) == hash(config)


@pytest.mark.parametrize("group, key", [
    (PrivacyOptions(dp_delta=1.5), "dp-delta"),
    (PrivacyOptions(dp_rounds_epsilon=-1.0), "dp-rounds-epsilon"),
    (RobustOptions(robust_aggregation="trimmed-mean", robust_fraction=0.0), "robust-fraction"),
    (StartOptions(secagg_dropouts=0.2), "secagg-dropouts"),
    (RoundOptions(scaffold_variates="clients", drift_correction="none"), "scaffold-variates"),
    (TrainingOptions(weight_decay="much"), "weight-decay"),
    (FinetuneOptions(lora_rank=0), "lora-rank"),
])
def test_a_group_checks_its_own_keys_alone(group, key):
    """No other group is needed to refuse a group's own bad value."""
    with pytest.raises(ConfigError) as err:
        group.check()
    assert err.value.key == key


@pytest.mark.parametrize("group, whole, key", [
    (FinetuneOptions(finetune="lp"), {"head_init": "ridge"}, "head-init"),
    (PrivacyOptions(dp_rounds_epsilon=1.0), {"feature_norm": "standardize"}, "feature-norm"),
    (RobustOptions(robust_aggregation="median"), {"server_optimizer": "lbfgs"},
     "robust-aggregation"),
    (RoundOptions(drift_correction="scaffold"), {"local_optimizer": "adamw"}, "drift-correction"),
])
def test_a_groups_rules_against_others_name_the_key_to_change(group, whole, key):
    with pytest.raises(ConfigError) as err:
        group.requires(RunConfig(**whole))
    assert err.value.key == key


def test_share_and_coerce_say_what_is_allowed():
    share("x", 0.5, 0, 1, high_open=True)
    with pytest.raises(ConfigError, match=r"use a fraction in \(0, 1\]"):
        share("x", 0.0, 0, 1, low_open=True, what="a fraction")
    assert coerce("learning-rate", 1, "float") == 1.0 and isinstance(coerce("k", 1, "float"), float)
    assert coerce("ridge-lambda", "auto", "float | str") == "auto"
    with pytest.raises(ConfigError, match="expected a value of type int"):
        coerce("seed", 1.5, "int")


def test_every_committed_runs_config_still_builds_today():
    """The keys stayed what they were (grouped in the code, not renamed): every summary.json
    under results/ (the config it ran) builds today's RunConfig, and gives back its values."""
    import json
    from pathlib import Path

    summaries = sorted((Path(__file__).resolve().parents[1] / "results").glob("*/*/summary.json"))
    assert len(summaries) > 100
    for path in summaries:
        ran = json.loads(path.read_text())["config"]
        given_back = RunConfig.from_mapping(ran).to_dict()
        assert {key: given_back[key] for key in ran} == ran, path
