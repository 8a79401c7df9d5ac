"""Linear heads on frozen features and their losses.

OvA-LP and the LP-softmax baseline share one parameterisation, a `Linear(D, K)`: row k
with bias k is class k's head. What makes the OvA heads independent binary classifiers
is the loss — per-head logistic losses never mix logits of different classes, while the
softmax cross-entropy couples every head to every other through the partition function.
Prediction is the argmax of the K logits for both.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class FullBatchGradient:
    """What one client sends a server-side optimiser: the run's loss on all its rows, its
    gradient, each head's mean curvature (the loss's second derivative in that head's logit:
    σ(1-σ) for OvA, p(1-p) for softmax), and the loss split K ways (OvA: per head, the K binary
    problems, each with its own line search on the server; softmax: the rows of each label), all
    as means over the rows."""

    loss: float
    weight: np.ndarray  # [K, D] float32
    bias: np.ndarray  # [K] float32
    curvature: np.ndarray  # [K] float64
    losses: np.ndarray  # [K] float64, summing to `loss`

    def to_vector(self) -> np.ndarray:
        """One flat float64 vector (what SecAgg+ averages): weight, bias, curvature, losses, loss."""
        return np.concatenate([self.weight.ravel(), self.bias, self.curvature, self.losses,
                               [self.loss]]).astype(np.float64)

    @classmethod
    def from_vector(cls, vector: np.ndarray, num_classes: int, num_features: int
                    ) -> "FullBatchGradient":
        k, d = num_classes, num_features
        if vector.shape != (k * d + 3 * k + 1,):
            raise ValueError(f"a gradient vector of {k} heads on {d} features has "
                             f"{k * d + 3 * k + 1} entries; got shape {vector.shape}")
        weight, bias, curvature, losses, loss = np.split(vector, np.cumsum([k * d, k, k, k]))
        return cls(float(loss[0]), weight.reshape(k, d), bias, curvature, losses)

    @classmethod
    def empty(cls, num_classes: int, num_features: int) -> "FullBatchGradient":
        """A client with no rows: zeros everywhere (it has no weight in the mean)."""
        return cls(0.0, np.zeros((num_classes, num_features), np.float32),
                   np.zeros(num_classes, np.float32), np.zeros(num_classes), np.zeros(num_classes))


@torch.inference_mode()
def full_batch_gradient(weight: np.ndarray, bias: np.ndarray, features: torch.Tensor,
                        labels: torch.Tensor, head: str) -> FullBatchGradient:
    """The gradient of the run's final loss (OvA: `ova_bce_loss`; softmax: `softmax_loss`) at
    (weight, bias), in closed form: the residual (σ(z) - target, or softmax(z) - target) times the
    features. No weight decay: the server adds it, once, to the federation's mean."""
    w = torch.as_tensor(weight, device=features.device)
    b = torch.as_tensor(bias, device=features.device)
    logits = torch.addmm(b, features, w.T).double()
    targets = F.one_hot(labels, w.shape[0]).double()
    if head == "ova":
        losses = F.binary_cross_entropy_with_logits(logits, targets, reduction="none").sum(0)
        probabilities = torch.sigmoid(logits)
    else:
        per_row = F.cross_entropy(logits, labels, reduction="none")
        losses = torch.zeros(w.shape[0], dtype=per_row.dtype, device=per_row.device)
        losses.index_add_(0, labels, per_row)
        probabilities = torch.softmax(logits, dim=1)
    losses = losses / len(labels)
    residual = (probabilities - targets) / len(labels)
    return FullBatchGradient(
        float(losses.sum()), (residual.to(features.dtype).T @ features).cpu().numpy(),
        residual.sum(0).float().cpu().numpy(),
        (probabilities * (1 - probabilities)).mean(0).cpu().numpy(), losses.cpu().numpy())
