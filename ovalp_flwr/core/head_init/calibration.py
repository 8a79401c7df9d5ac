"""Scale and bias for heads built from statistics, so that the loss the rounds descend starts low.

A closed-form head (class means, ridge) gets its argmax right but not its scale: ridge scores
sit near 0 and 1, unit class means give cosines. Gradient rounds from there would first
spend their steps on the scale. The server fits it from the same sums: under a Gaussian
model of each class's scores (means exact from the class sums; the within-class covariance
exact from a Gram matrix, isotropic from the square norms without one) it chooses one scale
a and one bias b for all heads, z = a·s + b, that minimise the expected loss of the run's
head (OvA: the K binary cross-entropies; softmax: the cross-entropy). One scale and one
bias for all heads keep the argmax, so the calibrated start scores exactly what the
published classifier (FedNCM, Fed3R) scores.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ovalp_flwr.core.head_init.statistics import ClassStatistics

QUADRATURE_NODES = 32  # Gauss-Hermite nodes per (class, head) score distribution
SOFTMAX_DRAWS = 64  # seeded score vectors per class for the softmax loss


@dataclass(frozen=True)
class ScoreModel:
    """The K heads' scores, class by class: s | class j ~ N(means[j], covariance)."""

    means: np.ndarray  # [K classes, K heads]
    covariance: np.ndarray  # [K heads, K heads], pooled within-class
    counts: np.ndarray  # [K] samples per class

    @classmethod
    def of(cls, weight: np.ndarray, bias: np.ndarray, stats: ClassStatistics) -> "ScoreModel":
        means = stats.class_means @ weight.T + bias
        return cls(means, _score_covariance(weight, stats), stats.counts)


def _score_covariance(weight: np.ndarray, stats: ClassStatistics) -> np.ndarray:
    """W Σ_w Wᵀ with Σ_w = (G - Σ_j n_j μ_j μ_jᵀ) / n; σ²·I in place of Σ_w without G."""
    n = max(stats.num_samples, 1)
    projected = stats.sums @ weight.T  # [classes, heads]: Σ over class j of the scores
    between = projected.T @ (projected / np.maximum(stats.counts, 1.0)[:, None])
    if stats.gram is not None:
        return (weight @ stats.gram @ weight.T - between) / n
    spread = stats.square_norms.sum() - np.sum(stats.sums * stats.class_means)
    variance = max(spread, 0.0) / (n * weight.shape[1])
    return variance * weight @ weight.T


def calibrate(weight: np.ndarray, bias: np.ndarray, stats: ClassStatistics,
              head: str, seed: int = 0, weight_decay: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(a·W, a·b + β) with the scale a and bias β that minimise the head's expected loss, plus
    weight_decay/2 ‖a·W‖² when the rounds minimise that (`server-optimizer = "lbfgs"`)."""
    model = ScoreModel.of(weight, bias, stats)
    penalty = 0.5 * weight_decay * float(np.sum(np.square(weight, dtype=np.float64)))
    scale, shift = (_fit_ova(model, penalty) if head == "ova"
                    else (_fit_softmax(model, seed, penalty), 0.0))
    if not np.isfinite(scale) or scale <= 0:  # scores that carry no class information
        scale, shift = 1.0, 0.0
    return (scale * weight).astype(np.float32), (scale * bias + shift).astype(np.float32)


def _fit_ova(model: ScoreModel, penalty: float = 0.0) -> tuple[float, float]:
    """Expected OvA loss by Gauss-Hermite quadrature over every (class, head) pair."""
    nodes, weights = np.polynomial.hermite.hermgauss(QUADRATURE_NODES)
    spread = np.sqrt(2.0 * np.maximum(np.diag(model.covariance), 0.0))  # per head
    scores = torch.from_numpy(model.means[:, :, None] + spread[None, :, None] * nodes)
    targets = torch.eye(len(model.counts), dtype=torch.float64)[:, :, None].expand_as(scores)
    mass = torch.from_numpy(model.counts / max(model.counts.sum(), 1.0))[:, None, None] \
        * torch.from_numpy(weights / np.sqrt(np.pi))[None, None, :]

    def loss(scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        logits = scale * scores + shift
        expected = (F.binary_cross_entropy_with_logits(logits, targets, reduction="none") * mass)
        return expected.sum() + penalty * scale ** 2

    return _minimise(loss, _initial_scale(model), fit_shift=True)


def _fit_softmax(model: ScoreModel, seed: int, penalty: float = 0.0) -> float:
    """Expected cross-entropy over seeded draws of each class's score vector."""
    generator = torch.Generator().manual_seed(seed)
    k = len(model.counts)
    factor = torch.from_numpy(np.linalg.cholesky(model.covariance + 1e-9 * np.eye(k)))
    noise = torch.randn(k, SOFTMAX_DRAWS, k, generator=generator, dtype=torch.float64)
    scores = torch.from_numpy(model.means)[:, None, :] + noise @ factor.T  # [class, draw, head]
    labels = torch.arange(k)[:, None].expand(k, SOFTMAX_DRAWS)
    mass = torch.from_numpy(model.counts / max(model.counts.sum(), 1.0))[:, None] / SOFTMAX_DRAWS

    def loss(scale: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
        ce = F.cross_entropy((scale * scores).reshape(-1, k), labels.reshape(-1), reduction="none")
        return (ce.reshape(k, SOFTMAX_DRAWS) * mass).sum() + penalty * scale ** 2

    return _minimise(loss, _initial_scale(model), fit_shift=False)[0]


def _initial_scale(model: ScoreModel) -> float:
    """Scores of unit within-class spread: a start the optimiser refines."""
    return 1.0 / float(np.sqrt(max(np.mean(np.diag(model.covariance)), 1e-12)))


def _minimise(loss, scale0: float, fit_shift: bool) -> tuple[float, float]:
    """L-BFGS over (log scale, shift): the loss is convex in (scale, shift); the log keeps the
    scale positive."""
    log_scale = torch.tensor(np.log(scale0), dtype=torch.float64, requires_grad=True)
    shift = torch.zeros((), dtype=torch.float64, requires_grad=fit_shift)
    params = [log_scale, shift] if fit_shift else [log_scale]
    optimiser = StepOnlyLBFGS(params, max_iter=200, tolerance_grad=1e-10,
                              tolerance_change=1e-14, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        for param in params:  # torch.optim's zero_grad(set_to_none=True)
            param.grad = None
        value = loss(log_scale.exp(), shift)
        value.backward()
        return value

    optimiser.step(closure)
    return float(log_scale.detach().exp()), float(shift.detach())


class StepOnlyLBFGS(torch.optim.LBFGS):
    """torch.optim.LBFGS with its own `step`, bit for bit, but not `Optimizer.__init__`: that
    registers hooks and checks param groups through methods guarded by `torch._disable_dynamo`,
    whose first call imports torch._dynamo (2.3 CPU-s here) in every ServerApp process that
    calibrates a start. One group, no hooks, no state dict: all this module asks of it."""

    def __init__(self, params: list[torch.Tensor], lr: float = 1.0, max_iter: int = 20,
                 max_eval: int | None = None, tolerance_grad: float = 1e-7,
                 tolerance_change: float = 1e-9, history_size: int = 100,
                 line_search_fn: str | None = None) -> None:  # noqa: super().__init__ left out
        self.defaults = {"lr": lr, "max_iter": max_iter,
                         "max_eval": max_iter * 5 // 4 if max_eval is None else max_eval,
                         "tolerance_grad": tolerance_grad, "tolerance_change": tolerance_change,
                         "history_size": history_size, "line_search_fn": line_search_fn}
        self.param_groups = [{"params": list(params), **self.defaults}]
        self.state = defaultdict(dict)
        self._params = self.param_groups[0]["params"]
        self._numel_cache = None
        # what `step` reads once torch has wrapped it in its profiler hook (the first real
        # optimiser of the process does that to the class, and so to this subclass)
        self._optimizer_step_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_step_post_hooks: OrderedDict = OrderedDict()
