"""The server's steps (`federation/steps/`): found by `server-optimizer`, built from the rounds'
own knobs, FedAdam's moments kept and given back by a checkpoint."""

import numpy as np
import pytest
from flwr.clientapp import ClientApp
from flwr.app import MetricRecord

from ovalp_flwr.federation.local_grid import InProcessGrid
from ovalp_flwr.federation.options import RoundOptions
from ovalp_flwr.federation.protocol import NUM_EXAMPLES, to_record
from ovalp_flwr.federation.steps import STEPS, server_step
from ovalp_flwr.federation.steps.fedadam import FedAdamStep
from ovalp_flwr.federation.steps.fedavg import FedAvgStep

SENT = {"weight": np.zeros((2, 3), np.float32), "bias": np.zeros(2, np.float32)}
MEAN = {"weight": np.ones((2, 3), np.float32), "bias": np.full(2, 0.5, np.float32)}

@pytest.fixture(autouse=True)
def flower_task_identity():
    """Messages are built outside Flower's runtime: the in-process grid sets its identity."""
    InProcessGrid(ClientApp(), 1, run_config={})



def step_once(step, server_round: int = 1) -> dict[str, np.ndarray]:
    new = step(server_round, to_record(MEAN), MetricRecord({NUM_EXAMPLES: 10}), SENT)
    return {key: value.numpy() for key, value in new.items()}


def test_the_registry_builds_each_step_from_the_rounds_options():
    assert set(STEPS) == {"fedavg", "fedadam"}
    assert type(server_step(RoundOptions())) is FedAvgStep
    adam = server_step(RoundOptions(server_optimizer="fedadam", server_learning_rate=0.03))
    assert type(adam) is FedAdamStep and adam.flower.eta == 0.03


def test_fedavg_takes_the_mean_as_the_new_model():
    new = step_once(FedAvgStep())
    assert all(np.array_equal(new[key], MEAN[key]) for key in MEAN)
    assert FedAvgStep().state() == {}


def test_fedadam_moves_towards_the_mean_in_the_heads_dtype_and_its_moments_resume():
    step = FedAdamStep(eta=0.1)
    first = step_once(step)
    assert first["weight"].dtype == np.float32 and np.all(first["weight"] > 0)
    saved = step.state()
    assert set(saved) >= {key for key in saved if key.startswith("fedopt-m")} and saved
    again = FedAdamStep(eta=0.1)
    again.restore(saved)
    continued, resumed = step_once(step, 2), step_once(again, 2)
    assert all(np.array_equal(continued[key], resumed[key]) for key in MEAN)
    fresh = step_once(FedAdamStep(eta=0.1), 2)  # without the moments: another step
    assert not np.array_equal(fresh["weight"], continued["weight"])
