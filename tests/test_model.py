"""The model on the cached features: the heads alone, or an adapter B under them."""


import numpy as np
import pytest
import torch

from ovalp_flwr.federation.local_grid import run_local
from ovalp_flwr.core.model import (AdapterHead, LinearProbe, initial_adapter, model_from_numpy,
                              model_to_numpy)
from ovalp_flwr.federation.results import read_summary



def test_arrays_say_which_model_they_are_and_round_trip():
    head = {"weight": np.ones((3, 8), np.float32), "bias": np.zeros(3, np.float32)}
    probe = model_from_numpy(head, torch.device("cpu"))
    assert isinstance(probe, LinearProbe) and probe.feature_parameters() == []
    x = torch.randn(5, 8)
    assert torch.equal(probe.features(x), x)
    adapter = {**initial_adapter(8, 4, seed=0), "weight": np.ones((3, 4), np.float32),
               "bias": np.zeros(3, np.float32)}
    model = model_from_numpy(adapter, torch.device("cpu"), "relu")
    assert isinstance(model, AdapterHead) and len(model.feature_parameters()) == 2
    assert (model.features(x) >= 0).all()  # ReLU features
    assert torch.allclose(model(x), model.features(x) @ model.weight.T + model.bias)
    assert all(np.array_equal(adapter[k], v) for k, v in model_to_numpy(model).items())
    assert not np.array_equal(initial_adapter(8, 4, 0)["adapter.weight"],
                              initial_adapter(8, 4, 1)["adapter.weight"])
    with pytest.raises(ValueError, match="adapter gives 4 features, the head reads 5"):
        model_from_numpy({**adapter, "weight": np.ones((3, 5), np.float32)}, torch.device("cpu"))


def test_snapshots_do_not_change_when_the_model_trains_on():
    model = LinearProbe(4, 2)
    snapshot = model_to_numpy(model)
    with torch.no_grad():
        model.weight.add_(1.0)
    assert not np.array_equal(snapshot["weight"], model_to_numpy(model)["weight"])


@pytest.mark.parametrize("head", ["ova", "softmax"])
def test_an_adapter_trains_federatedly_under_either_head(cache_dir, tmp_path, head):
    summary = read_summary(run_local({
        "encoder": "pixels", "feature-cache-dir": str(cache_dir), "results-dir": str(tmp_path),
        "run-name": head, "head": head, "adapter-dim": 32, "head-init": "random",
        "partition": "iid", "num-server-rounds": 5}, 5))
    assert summary["final_accuracy"] > 0.7  # digits: 10 classes, chance 0.1
    assert summary["initial_accuracy"] < 0.3  # from a random start
