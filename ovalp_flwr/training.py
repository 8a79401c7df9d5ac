"""One client's local round: a few epochs of AdamW on its cached (normalised) features."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from ovalp_flwr.heads import head_from_numpy, head_to_numpy, loss_for


@dataclass(frozen=True)
class LocalSchedule:
    """The optimiser settings of a local round (the paper's main setting by default)."""

    epochs: int = 3
    batch_size: int = 50
    learning_rate: float = 0.01
    weight_decay: float = 1e-4


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
) -> LocalResult:
    """Train the global head on local data; optimiser state is fresh every round.

    A client without data returns the weights unchanged with zero examples, so FedAvg
    gives it no weight.
    """
    start = time.perf_counter()
    num_examples = len(labels)
    if num_examples == 0:
        return LocalResult(arrays, 0, float("nan"), 0, time.perf_counter() - start)
    head = head_from_numpy(arrays, features.device)
    loss_fn = loss_for(head_type, stage)
    # fused: one kernel per step instead of a dozen small ops; on 2 CPU threads a 550-sample
    # TinyImageNet client round took 28 ms instead of 52 ms (CUDA has the same kernel)
    optimizer = torch.optim.AdamW(
        head.parameters(), lr=schedule.learning_rate, weight_decay=schedule.weight_decay,
        fused=True,
    )
    loss_sum, steps = torch.zeros((), device=features.device), 0
    for _ in range(schedule.epochs):
        order = torch.randperm(num_examples, generator=generator).to(features.device)
        for batch in order.split(schedule.batch_size):
            loss = loss_fn(head(features[batch]), labels[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach() * len(batch)
            steps += 1
    mean_loss = float(loss_sum) / (num_examples * schedule.epochs)
    return LocalResult(head_to_numpy(head), num_examples, mean_loss, steps, time.perf_counter() - start)
