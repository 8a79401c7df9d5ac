"""One client's local round: a few epochs of SGD (or AdamW) on its cached (normalised) features."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ovalp_flwr.core.heads import loss_for
from ovalp_flwr.core.model import model_from_numpy, model_to_numpy


@dataclass(frozen=True)
class LocalSchedule:
    """The optimiser settings of a local round (the paper's recipe by default; the run config's
    defaults are SGD + SCAFFOLD: core/options.TrainingOptions)."""

    epochs: int = 3
    batch_size: int = 50
    learning_rate: float = 0.01
    weight_decay: float = 1e-4
    optimizer: str = "adamw"  # or "sgd"
    steps: int = 0  # > 0: exactly this many steps (reshuffling as needed) instead of epochs

    def num_steps(self, num_examples: int) -> int:
        """The optimiser steps this schedule takes on `num_examples` rows (what `_batches`
        yields): the server checks a reply's step count against it."""
        if num_examples == 0:
            return 0
        return self.steps or self.epochs * math.ceil(num_examples / self.batch_size)


@dataclass(frozen=True)
class LocalResult:
    arrays: dict[str, np.ndarray]
    num_examples: int
    mean_loss: float  # sample-weighted over every step of the round; nan if no data
    steps: int
    seconds: float


def shuffle_generator(seed: int, server_round: int, partition_id: int) -> torch.Generator:
    """Batch order fixed by (run seed, round, client): reruns are identical."""
    entropy = np.random.SeedSequence([seed, server_round, partition_id]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(entropy))


def train_local(
    arrays: dict[str, np.ndarray],
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    head_type: str,
    stage: int,
    schedule: LocalSchedule,
    generator: torch.Generator,
    gradient_offset: dict[str, np.ndarray] | None = None,
    activation: str = "relu",
) -> LocalResult:
    """Train the global head on local data; optimiser state is fresh every round.

    `gradient_offset` is added to every step's gradient: SCAFFOLD's c - c_i, which turns
    the local gradient into an estimate of the global one (see `strategy`). A client
    without data returns the weights unchanged with zero examples, so FedAvg gives it no
    weight.
    """
    start = time.perf_counter()
    num_examples = len(labels)
    if num_examples == 0:
        return LocalResult(arrays, 0, float("nan"), 0, time.perf_counter() - start)
    head = model_from_numpy(arrays, features.device, activation)  # the head, or adapter + head
    mean_loss, steps = fit(head, list(head.parameters()), features, labels,
                           loss_for(head_type, stage), schedule, generator,
                           gradient_offsets(head, gradient_offset))
    return LocalResult(model_to_numpy(head), num_examples, mean_loss, steps, time.perf_counter() - start)


def fit(model: torch.nn.Module, params: list[torch.nn.Parameter], inputs: torch.Tensor,
        labels: torch.Tensor, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        schedule: LocalSchedule, generator: torch.Generator,
        offsets: list[tuple[torch.nn.Parameter, torch.Tensor]] = ()) -> tuple[float, int]:
    """The local steps on `params` of `model` (a head on features, or an encoder on raw inputs:
    `ovalp_flwr.finetune`); returns the sample-weighted mean loss and the steps taken."""
    step = optimizer_step(params, schedule)
    loss_sum, seen, steps = torch.zeros((), device=labels.device), 0, 0
    for batch in _batches(len(labels), schedule, generator, labels.device):
        loss = loss_fn(model(inputs[batch]), labels[batch])
        for param in params:
            param.grad = None
        loss.backward()
        for param, offset in offsets:
            param.grad += offset
        step()
        loss_sum += loss.detach() * len(batch)
        seen += len(batch)
        steps += 1
    return float(loss_sum) / seen, steps


def optimizer_step(params: list[torch.nn.Parameter], schedule: LocalSchedule) -> Callable[[], None]:
    """One update of `params` from their gradients: AdamW (the recipe) or plain SGD (what
    SCAFFOLD's variates assume).

    These are the kernels torch.optim.AdamW(fused=True) and torch.optim.SGD run, bit for bit
    (tests/test_training.py), called directly: the first torch.optim optimiser of a process
    imports torch._dynamo (1.9 s here), and Flower's deployment runtime starts a fresh
    ClientApp process for every message. Fused AdamW is one kernel per step instead of a
    dozen small ops (a 550-sample TinyImageNet client round: 28 ms instead of 52 ms).
    """
    if schedule.optimizer == "sgd":
        return _sgd_step(params, schedule.learning_rate, schedule.weight_decay)
    if schedule.optimizer == "adamw":
        return _adamw_step(params, schedule.learning_rate, schedule.weight_decay)
    raise ValueError(f"local-optimizer={schedule.optimizer!r} is not allowed; choose adamw or sgd")


def _sgd_step(params: list[torch.nn.Parameter], lr: float, weight_decay: float
              ) -> Callable[[], None]:
    """torch.optim.SGD without momentum: p -= lr * (grad + weight_decay * p)."""

    @torch.no_grad()
    def step() -> None:
        for param in params:
            if param.grad is not None:  # as torch.optim: a parameter the loss missed stays
                param.add_(param.grad.add(param, alpha=weight_decay), alpha=-lr)

    return step


def _adamw_step(params: list[torch.nn.Parameter], lr: float, weight_decay: float,
                betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8
                ) -> Callable[[], None]:
    """torch.optim.AdamW(fused=True) with its defaults; the moments start at zero each round."""
    exp_avgs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in params]
    exp_avg_sqs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in params]
    steps = [torch.zeros((), dtype=torch.float32, device=p.device) for p in params]

    @torch.no_grad()
    def step() -> None:
        # as torch.optim: a parameter the loss missed (grad None) neither moves nor counts a step
        live = [i for i, p in enumerate(params) if p.grad is not None]
        pick = lambda tensors: [tensors[i] for i in live]  # noqa: E731
        torch._foreach_add_(pick(steps), 1)
        torch._fused_adamw_(pick(params), [params[i].grad for i in live], pick(exp_avgs),
                            pick(exp_avg_sqs), [], pick(steps), amsgrad=False, lr=lr,
                            beta1=betas[0], beta2=betas[1], weight_decay=weight_decay, eps=eps,
                            maximize=False, grad_scale=None, found_inf=None)

    return step


def gradient_offsets(model: torch.nn.Module, gradient_offset: dict[str, np.ndarray] | None
                     ) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """(parameter, offset) pairs for the parameters that train; the offset's shapes must be theirs."""
    if gradient_offset is None:
        return []
    pairs = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if name not in gradient_offset or gradient_offset[name].shape != tuple(param.shape):
            found = None if name not in gradient_offset else gradient_offset[name].shape
            raise ValueError(f"gradient offset {name!r} has shape {found}; the head's is "
                             f"{tuple(param.shape)}")
        pairs.append((param, torch.as_tensor(gradient_offset[name], device=param.device)))
    return pairs


def _batches(num_examples: int, schedule: LocalSchedule, generator: torch.Generator,
             device: torch.device):
    """Shuffled mini-batches: `epochs` passes, or exactly `steps` batches if steps > 0."""
    passes = itertools.count() if schedule.steps else range(schedule.epochs)
    emitted = 0
    for _ in passes:
        order = torch.randperm(num_examples, generator=generator).to(device)
        for batch in order.split(schedule.batch_size):
            if schedule.steps and emitted == schedule.steps:
                return
            yield batch
            emitted += 1
