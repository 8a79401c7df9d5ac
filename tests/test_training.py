"""A local round: epochs or a fixed number of steps, AdamW or SGD, and SCAFFOLD's offset."""

import copy
import subprocess
import sys

import numpy as np
import pytest
import torch

from ovalp_flwr.core.heads import build_head, loss_for
from ovalp_flwr.core.model import model_to_numpy
from ovalp_flwr.core.training import LocalSchedule, optimizer_step, train_local


def data(n=30, d=4, k=3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=generator), torch.randint(0, k, (n,), generator=generator)


def local(schedule, offset=None, n=30):
    features, labels = data(n)
    arrays = model_to_numpy(build_head(4, 3, seed=0))
    return arrays, train_local(arrays, features, labels, head_type="ova", stage=2, schedule=schedule,
                               generator=torch.Generator().manual_seed(1), gradient_offset=offset)


def test_epochs_or_a_fixed_number_of_steps():
    assert local(LocalSchedule(epochs=3, batch_size=10))[1].steps == 9
    assert local(LocalSchedule(epochs=3, batch_size=10, steps=7))[1].steps == 7
    assert local(LocalSchedule(epochs=1, batch_size=10, steps=25))[1].steps == 25  # past one epoch
    assert local(LocalSchedule(batch_size=100, steps=1), n=30)[1].steps == 1  # one full batch


def test_one_full_batch_sgd_step_with_an_offset_is_x_minus_lr_times_gradient_plus_offset():
    features, labels = data()
    head = build_head(4, 3, seed=0)
    loss_for("ova", 2)(head(features), labels).backward()
    offset = {"weight": np.full((3, 4), 0.25, np.float32), "bias": np.full(3, -0.5, np.float32)}
    arrays, result = local(LocalSchedule(batch_size=100, steps=1, optimizer="sgd", learning_rate=0.1,
                                         weight_decay=0.0), offset)
    for key, param in (("weight", head.weight), ("bias", head.bias)):
        expected = arrays[key] - 0.1 * (param.grad.numpy() + offset[key])
        assert np.allclose(result.arrays[key], expected, atol=1e-6)


def test_an_offset_of_the_wrong_shape_is_one_clear_error():
    with pytest.raises(ValueError, match=r"gradient offset 'weight' has shape \(2, 2\); the head's is \(3, 4\)"):
        local(LocalSchedule(optimizer="sgd"), {"weight": np.zeros((2, 2), np.float32),
                                               "bias": np.zeros(3, np.float32)})


class WithUnusedPart(torch.nn.Module):
    """A network part that the loss never reads gets no gradient (grad None)."""

    def __init__(self):
        super().__init__()
        self.used, self.unused = torch.nn.Linear(8, 5), torch.nn.Linear(8, 5)

    def forward(self, x):
        return self.used(x)


@pytest.mark.parametrize("name", ["adamw", "sgd"])
@pytest.mark.parametrize("build", [lambda: torch.nn.Linear(8, 5), WithUnusedPart],
                         ids=["linear", "with-unused-part"])
def test_the_local_step_is_torch_optim_bit_for_bit(name, build):
    """`optimizer_step` calls torch.optim's kernels without torch.optim (see its docstring);
    like torch.optim it leaves a parameter without a gradient alone."""
    torch.manual_seed(0)
    ours = build()
    theirs, initial = copy.deepcopy(ours), copy.deepcopy(ours)
    schedule = LocalSchedule(optimizer=name, learning_rate=0.05, weight_decay=1e-2)
    step = optimizer_step(list(ours.parameters()), schedule)
    reference = (torch.optim.AdamW(theirs.parameters(), lr=0.05, weight_decay=1e-2, fused=True)
                 if name == "adamw" else
                 torch.optim.SGD(theirs.parameters(), lr=0.05, weight_decay=1e-2))
    for _ in range(25):
        x, y = torch.randn(16, 8), torch.randint(0, 5, (16,))
        for model in (ours, theirs):
            model.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
        step()
        reference.step()
    for mine, reference_param in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(mine, reference_param)
    moved = {n for n, q in ours.named_parameters() if not torch.equal(q, initial.get_parameter(n))}
    assert moved == {n for n in dict(ours.named_parameters()) if not n.startswith("unused")}


@pytest.mark.slow
def test_a_fresh_process_trains_and_calibrates_without_importing_torch_dynamo():
    """Flower's deployment runtime starts a process per message, and one per run for the
    ServerApp, which calibrates the start (core/head_init/calibration.py): 2.3 CPU-s of
    torch._dynamo each. (One process for both: each costs seconds of imports.)"""
    code = ("import sys, numpy as np, torch\n"
            "from ovalp_flwr.core.head_init.calibration import calibrate\n"
            "from ovalp_flwr.core.head_init.statistics import ClassStatistics\n"
            "x, y = torch.randn(40, 4, dtype=torch.float64), torch.arange(40) % 3\n"
            "stats = ClassStatistics.of(x, y, 3, True)\n"
            "for head in ('ova', 'softmax'):\n"
            "    calibrate(np.ones((3, 4)), np.zeros(3), stats, head)\n"
            "from ovalp_flwr.core.heads import build_head\n"
            "from ovalp_flwr.core.model import model_to_numpy\n"
            "from ovalp_flwr.core.training import LocalSchedule, shuffle_generator, train_local\n"
            "for optimizer in ('adamw', 'sgd'):\n"
            "    train_local(model_to_numpy(build_head(4, 3, 0)), torch.randn(20, 4),\n"
            "                torch.randint(0, 3, (20,)), head_type='ova', stage=2,\n"
            "                schedule=LocalSchedule(optimizer=optimizer), generator=shuffle_generator(0, 1, 0))\n"
            "print('torch._dynamo' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
