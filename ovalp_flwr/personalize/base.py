"""What every personalization method shares: its hyperparameters, the local data, and the
epochs of mini-batch steps on a chosen set of parameters.

A method is a small `Personalizer` subclass (FL-bench's shape): a `name`, a frozen dataclass
of hyperparameters with their defaults (`Hyperparameters`, declared without torch in
`ovalp_flwr.personalize.hyperparameters`), and `personalize`, which turns
the global model into this client's model. Each runs once per client, after the last
federated round, on the client's own training rows; nothing it does is communicated but the
model it returns (scored by the other clients, `ovalp_flwr.personalize.phase`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from ovalp_flwr.core.model import FeatureModel, clone
from ovalp_flwr.core.training import LocalSchedule, optimizer_step
from ovalp_flwr.personalize.hyperparameters import FineTuning  # torch-free: config reads it

OnEpoch = Callable[[int, FeatureModel], None]
ExtraLoss = Callable[[FeatureModel], torch.Tensor]


@dataclass(frozen=True)
class LocalData:
    """A client's normalised training features and labels, on its device."""

    features: torch.Tensor
    labels: torch.Tensor


@dataclass(frozen=True)
class Task:
    """How a method trains: the run's loss (OvA BCE or softmax CE), a seeded batch order, and
    who watches each epoch (the client's Local-accuracy curve and snapshots)."""

    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    generator: torch.Generator
    on_epoch: OnEpoch = lambda epoch, model: None


class Personalizer:
    """One personalization method; `Hyperparameters` lists what a run config may set."""

    name: ClassVar[str]
    Hyperparameters: ClassVar[type[FineTuning]] = FineTuning

    def __init__(self, hp: FineTuning | None = None) -> None:
        self.hp = hp if hp is not None else self.Hyperparameters()

    def personalize(self, global_model: FeatureModel, data: LocalData, task: Task) -> FeatureModel:
        raise NotImplementedError

    @classmethod
    def hyperparameter_names(cls) -> list[str]:
        return [f.name.replace("_", "-") for f in dataclasses.fields(cls.Hyperparameters)]


def fit(model: FeatureModel, params: Iterable[nn.Parameter], data: LocalData, hp: FineTuning,
        task: Task, *, epochs: int | None = None, first_epoch: int = 1,
        extra_loss: ExtraLoss | None = None,
        gradient_mask: dict[nn.Parameter, torch.Tensor] | None = None) -> FeatureModel:
    """`epochs` passes of shuffled mini-batches that move only `params` (in place).

    `extra_loss(model)` is added to every batch's loss (a regulariser); `gradient_mask` zeroes
    the gradient of the entries a method keeps fixed. Epochs are numbered from `first_epoch`
    for `task.on_epoch`, so a two-phase method reports one continuous curve.
    """
    params = list(params)
    moving = {id(p) for p in params}
    trainable = {id(p): p.requires_grad for p in model.parameters()}  # put back at the end
    for param in model.parameters():
        param.requires_grad_(id(param) in moving)
    step = optimizer_step(params, LocalSchedule(optimizer=hp.optimizer,
                                                learning_rate=hp.learning_rate,
                                                weight_decay=hp.weight_decay))
    num_examples = len(data.labels)
    for epoch in range(first_epoch, first_epoch + (hp.epochs if epochs is None else epochs)):
        order = torch.randperm(num_examples, generator=task.generator).to(data.labels.device)
        for batch in order.split(hp.batch_size):
            loss = task.loss(model(data.features[batch]), data.labels[batch])
            if extra_loss is not None:
                loss = loss + extra_loss(model)
            for param in params:
                param.grad = None
            loss.backward()
            if gradient_mask is not None:
                for param in params:
                    param.grad.mul_(gradient_mask[param])
            step()
        task.on_epoch(epoch, model)
    for param in model.parameters():  # an encoder's frozen tensors stay frozen
        param.requires_grad_(trainable[id(param)])
    return model


def squared_distance(model: FeatureModel, anchor: FeatureModel) -> torch.Tensor:
    """‖θ − θ_anchor‖² over every parameter (the anchor is a constant)."""
    return sum(((p - q.detach()) ** 2).sum()
               for p, q in zip(model.parameters(), anchor.parameters()))


def average(models: list[FeatureModel], weights: list[float] | None = None) -> FeatureModel:
    """A model whose every parameter is the (weighted) mean of the models': a soup."""
    weights = weights or [1.0 / len(models)] * len(models)
    soup = clone(models[0])
    with torch.no_grad():
        for name, param in soup.named_parameters():
            param.copy_(sum(w * dict(m.named_parameters())[name] for w, m in zip(weights, models)))
    return soup
