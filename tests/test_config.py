"""Bad config values stop the run with one line naming the key, the value and what is allowed."""

import subprocess
import sys
from pathlib import Path

import re

import pytest

from ovalp_flwr.config import RECIPE, ConfigError, RunConfig, check_num_clients
from ovalp_flwr.data.options import PARTITIONS, WITHIN_DOMAIN_PARTITIONS
from ovalp_flwr.federation.local_grid import app_config

REPO = Path(__file__).resolve().parents[1]


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
        ("pft-global", "both", "choose one of: server, clients"),
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


def test_within_domain_allows_every_partition_but_domain():
    assert WITHIN_DOMAIN_PARTITIONS == tuple(p for p in PARTITIONS if p != "domain")
    for within in WITHIN_DOMAIN_PARTITIONS:
        RunConfig.from_mapping({**app_config(), "partition": "domain", "within-domain": within})
    RunConfig.from_mapping({**app_config(), "partition": "domain",
                            "within-domain": "flwr:DirichletPartitioner",
                            "partition-args": "alpha=0.5"})
    with pytest.raises(ConfigError, match="within-domain='domain' is not allowed; choose one of: "
                                          "iid, shard, bernoulli-dirichlet, zipf, feature-skew, "
                                          "flwr:<Name>$"):
        RunConfig.from_mapping({**app_config(), "within-domain": "domain"})


@pytest.mark.parametrize("values, says", [
    ({"partition": "flwr:Dirichlet Partitioner"}, "partition='flwr:Dirichlet Partitioner' is not "
     'allowed; name a Flower Datasets partitioner by its class, e.g. "flwr:DirichletPartitioner"'),
    ({"partition": "shard", "partition-args": "alpha=0.5"}, "partition-args='alpha=0.5' is not "
     'allowed; it is read only with partition = "flwr:<Name>" (or within-domain); use ""'),
    ({"partition": "flwr:DirichletPartitioner", "partition-args": "num_partitions=4"},
     "num_partitions is the number of SuperNodes; leave it out"),
    ({"partition": "flwr:DirichletPartitioner", "partition-args": "alpha"},
     "use name=value pairs apart by spaces"),
])
def test_a_flower_partitioner_is_named_by_its_class_and_its_arguments_checked(values, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        RunConfig.from_mapping({**app_config(), **values})
    ok = RunConfig.from_mapping({**app_config(), "partition": "flwr:DirichletPartitioner",
                                 "partition-args": 'alpha=0.3 partition_by="label"'})
    assert ok.partition == "flwr:DirichletPartitioner"


# --- validating imports no torch ------------------------------------------------------------

# in a fresh interpreter: which of our modules first imported torch, if any
TORCH_WATCH = """
import sys, traceback
class Watch:
    first = None
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and Watch.first is None:
            Watch.first = [f"{f.filename.rsplit('ovalp_flwr', 1)[-1]}:{f.lineno}"
                           for f in traceback.extract_stack() if "ovalp_flwr" in f.filename]
sys.meta_path.insert(0, Watch())
"""
ALL_METHODS = {"personalize": "ft lp lp-ft proximal soup sparse lss own-heads",
               "pft-epochs": 6, "pft.lss.models": 2, "pft.lp-ft.lp-epochs": 2,
               "personalize-curve": "1 6"}


def first_torch_import(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", TORCH_WATCH + code + """
print("torch" in sys.modules, Watch.first)
"""], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_validating_anything_but_the_encoder_imports_no_torch():
    """Every check but the encoder's (ovalp_flwr.features.encoders, below) runs without torch:
    the defaults, every method with its knobs, and a bad knob's error."""
    said = first_torch_import(f"""
from ovalp_flwr.config import ConfigError, RunConfig
from ovalp_flwr.config_docs import pyproject_defaults
from ovalp_flwr.data.options import DataOptions
DataOptions._check_dataset_and_encoder = lambda self: None  # imports torch (test below)
defaults = pyproject_defaults()
assert RunConfig.from_mapping(defaults) == RunConfig()
RunConfig.from_mapping({{**defaults, **{ALL_METHODS!r}}})
try:
    RunConfig.from_mapping({{**defaults, "pft.lss.models": 99}})
except ConfigError as err:
    assert "pft.lss.models=99 is not allowed" in str(err), err
else:
    raise AssertionError("pft.lss.models=99 passed")
""")
    assert said == "False None", f"torch imported by validation, first from: {said}"


def test_building_a_run_config_imports_no_torch():
    said = first_torch_import(f"""
from ovalp_flwr.config import RunConfig
from ovalp_flwr.config_docs import pyproject_defaults
defaults = pyproject_defaults()
assert RunConfig.from_mapping(defaults) == RunConfig()
RunConfig.from_mapping({{**defaults, **{ALL_METHODS!r}}})
""")
    assert said == "False None", f"torch imported by validation, first from: {said}"


def test_the_torch_free_encoder_table_is_the_registry():
    from ovalp_flwr.features.encoders import ENCODERS, encoder_modality
    from ovalp_flwr.features.modalities import ENCODER_MODALITY

    assert list(ENCODER_MODALITY) == list(ENCODERS)
    assert ENCODER_MODALITY == {name: encoder_modality(name) for name in ENCODERS}
