"""Bad config values stop the run with one line naming the key, the value and what is allowed."""

import pytest

from ovalp_flwr.config import RECIPE, ConfigError, RunConfig, check_num_clients
from ovalp_flwr.federation.local_grid import app_config


def test_pyproject_defaults_parse_and_match_the_dataclass():
    assert RunConfig.from_mapping(app_config()) == RunConfig()


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("head", "mlp", "choose one of: ova, softmax"),
        ("partition", "dirichlet", "choose one of: iid, shard"),
        ("schedule", "three-stage", "choose one of: two-stage, single-stage"),
        ("feature-norm", "pca", "choose one of: none, l2"),
        ("fraction-train", 0.0, "(0, 1]"),
        ("fraction-train", 1.5, "(0, 1]"),
        ("learning-rate", -0.1, "> 0"),
        ("batch-size", 0, ">= 1"),
        ("dirichlet-p", 0.0, "(0, 1]"),
        ("local-epochs", "3", "type int"),
        ("run-name", "../escape", "without '/'"),
        ("learnin-rate", 0.1, "known keys"),
        ("label-noise", "pair", "choose one of: none, symmetric, asymmetric"),
        ("noise-rate", 1.0, "[0, 1)"),
        ("dataset", "cifar1000", "choose one of digits, cifar10"),
        ("dataset", "hub:imagenet", "choose one of hub:cifar100"),
        ("encoder", "resnet50", "choose one of: efficientnet-lite0"),
        ("encoder", "minilm", "dataset 'digits' is image; choose one of: efficientnet-lite0"),
        ("local-optimizer", "lbfgs", "choose one of: adamw, sgd"),
        ("local-steps", -1, ">= 0"),
        ("aggregation-weights", "classes", "choose one of: samples, uniform"),
        ("drift-correction", "feddyn", "choose one of: none, scaffold"),
        ("epoch-size", "half", "choose one of: own-data, equal-share, own-data-equal-steps"),
        ("server-optimizer", "fedyogi", "choose one of: fedavg, fedadam"),
        ("server-learning-rate", 0.0, "> 0"),
        ("adapter-dim", -1, ">= 0"),
        ("adapter-activation", "tanh", "choose one of: relu, gelu, none"),
        ("personalize", "nope", "choose methods from: ft, lp, lp-ft, proximal, soup, sparse, lss, own-heads"),
        ("personalize", "ft ft", "name each method once"),
        ("personalize-curve", "0", "epochs in 1..pft-epochs=15"),
        ("pft-epochs", 0, ">= 1"),
        ("pft-optimizer", "lbfgs", "choose one of: adamw, sgd"),
        ("pft-learning-rate", 0.0, "> 0"),
        ("pft.proximal.mu", -1.0, ">= 0"),
        ("pft.proximal.nu", 1.0, "proximal's hyperparameters: epochs, learning-rate"),
        ("pft.lp-ft.lp-epochs", 99, "[0, epochs=15]"),
        ("pft.nope.x", 1, "pft.<method>.<hyperparameter> with a method from: ft, lp"),
    ],
)
def test_bad_values_name_key_value_and_allowed(key, value, fragment):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_mapping({**app_config(), key: value})
    message = str(err.value)
    assert "\n" not in message
    assert f"{key}={value!r}" in message and fragment in message


def test_adamw_under_the_default_scaffold_says_how_to_get_the_recipe():
    with pytest.raises(ConfigError) as err:
        RunConfig.from_mapping({**app_config(), "local-optimizer": "adamw"})
    assert str(err.value) == (
        "run config: drift-correction='scaffold' is not allowed; scaffold's control variates "
        'assume local SGD steps; set local-optimizer="sgd" or drift-correction="none"')
    assert RunConfig.from_mapping({**app_config(), **RECIPE}).local_optimizer == "adamw"


def test_ints_are_accepted_for_floats():
    assert RunConfig.from_mapping({"learning-rate": 1}).learning_rate == 1.0


def test_more_clients_than_samples_is_an_error():
    check_num_clients(10, 10)
    with pytest.raises(ConfigError, match="num-supernodes=11.*only 10 samples"):
        check_num_clients(11, 10)


def test_stage_schedule():
    config = RunConfig(stage1_rounds=2)
    assert [config.stage_for_round(r) for r in (1, 2, 3)] == [1, 1, 2]
    assert RunConfig(stage1_rounds=0).stage_for_round(1) == 2


def test_an_adapter_refuses_a_closed_form_start_in_one_line():
    with pytest.raises(ConfigError, match="head-init='ridge' is not allowed; with adapter-dim > 0"):
        RunConfig.from_mapping({**app_config(), "adapter-dim": 8})


def test_every_method_knob_is_in_the_app_config_at_its_declared_default():
    """pyproject lists each method's own hyperparameters (Flower refuses keys it lacks) at the
    defaults the method's class declares."""
    declared = {f"pft.{key}": value for key, value in RunConfig().pft}
    listed = {key: value for key, value in app_config().items() if key.startswith("pft.")}
    assert listed == declared
