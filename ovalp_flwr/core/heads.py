"""Linear heads on frozen features and their losses.

OvA-LP and the LP-softmax baseline share one parameterisation, a `Linear(D, K)`: row k
with bias k is class k's head. What makes the OvA heads independent binary classifiers
is the loss — per-head logistic losses never mix logits of different classes, while the
softmax cross-entropy couples every head to every other through the partition function.
Prediction is the argmax of the K logits for both.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

HEAD_KEYS = ("weight", "bias")


def build_head(num_features: int, num_classes: int, seed: int) -> nn.Linear:
    """A seeded `Linear(D, K)`; torch's default init, so the seed fixes it."""
    generator = torch.Generator().manual_seed(seed)
    head = nn.Linear(num_features, num_classes)
    bound = 1.0 / np.sqrt(num_features)
    with torch.no_grad():
        head.weight.uniform_(-bound, bound, generator=generator)
        head.bias.uniform_(-bound, bound, generator=generator)
    return head


def ova_positive_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Stage 1: each sample trains only its own class's head, towards 1.

    -log sigmoid(z_y), averaged over the batch; every other logit is left out, so no
    other head receives gradient.
    """
    own_logit = logits.gather(1, labels[:, None]).squeeze(1)
    return F.softplus(-own_logit).mean()


def ova_bce_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Stage 2: binary cross-entropy of every head against its one-vs-all target.

    Summed over the K heads and averaged over the batch, so each head's gradient has
    the same scale as in stage 1 (a per-head mean over samples).
    """
    targets = F.one_hot(labels, logits.shape[1]).to(logits.dtype)
    return F.binary_cross_entropy_with_logits(logits, targets, reduction="none").sum(1).mean()


def softmax_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """LP-softmax baseline: multinomial cross-entropy (heads coupled)."""
    return F.cross_entropy(logits, labels)


def loss_for(head: str, stage: int):
    """The local objective for a head type and the stage the server sent."""
    if head == "softmax":
        return softmax_loss  # no staging for softmax: positives-only CE is still CE
    if stage == 1:
        return ova_positive_loss
    if stage == 2:
        return ova_bce_loss
    raise ValueError(f"stage={stage!r} is not allowed; the server sends 1 or 2")


@torch.inference_mode()
def accuracy(head: nn.Linear, features: torch.Tensor, labels: torch.Tensor) -> float:
    """Top-1 accuracy of argmax over the K logits."""
    if len(labels) == 0:
        return float("nan")
    predictions = head(features).argmax(dim=1)
    return float((predictions == labels).float().mean())
