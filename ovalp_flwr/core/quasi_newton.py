"""The heads' centralised optimum from exact federated gradients: L-BFGS on the server, its
first guess of the curvature taken from the Gram matrix the closed-form start already summed.

With frozen features the run's objective is convex and smooth,

    F(W, b) = (1/n) Σ_i loss(W x_i + b, y_i) + (λ/2) ‖W‖²   (the bias unpenalised, as sklearn),

and the sample-weighted mean of the clients' full-batch gradients is its gradient, exactly, on
any partition. So the server can take the centralised optimiser's own steps. Each head's
Hessian is X̃ᵀ diag(h_k) X̃ / n + λ (X̃ = [X 1], h_k the loss's curvature per row): the server
holds X̃ᵀX̃ (`ClassStatistics` with a Gram matrix) and the clients send the mean of h_k, one
number per head, so the first guess of head k's inverse Hessian is (a_k G̃ + λ)⁻¹ with
a_k = mean h_k (`GramPreconditioner`). L-BFGS (`ServerLBFGS`) corrects it with the curvature
pairs the rounds measure. OvA's objective is a sum of K independent binary problems, so there
each head keeps its own pairs and scaling (the two loops' inner products are per head); the
softmax heads are coupled and share them. A step is checked by the next round's loss (Armijo):
a step that does not decrease F enough is taken back and shortened, so no round needs an extra
exchange.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ovalp_flwr.core.head_init.statistics import ClassStatistics

ARMIJO = 1e-4  # the sufficient decrease a step must show
FIRST_CURVATURE = 2.0  # the first step assumes twice the mean curvature: shorter, rarely refused
BIAS_PENALTY = 1e-4  # of λ: the bias is unpenalised; the preconditioner keeps it invertible


def augmented_gram(stats: ClassStatistics) -> np.ndarray:
    """X̃ᵀX̃ / n for X̃ = [X 1]: the Gram matrix with the feature sums and the count around it."""
    if stats.gram is None:
        raise ValueError("the server optimiser needs the clients' Gram matrix (statistics 'gram')")
    n, d = max(stats.num_samples, 1), stats.gram.shape[0]
    gram = np.empty((d + 1, d + 1))
    gram[:d, :d], gram[:d, d], gram[d, :d], gram[d, d] = stats.gram, stats.total, stats.total, n
    return gram / n


class GramPreconditioner:
    """Solves (a_k G̃ + M) d_k = g_k for every head k at once, M = diag(λ, ..., λ, λ·1e-4): one
    eigendecomposition of M^-½ G̃ M^-½, then each round a product per head."""

    def __init__(self, stats: ClassStatistics, weight_decay: float) -> None:
        gram = augmented_gram(stats)
        penalty = np.full(len(gram), weight_decay)
        penalty[-1] = weight_decay * BIAS_PENALTY
        self.scale = 1.0 / np.sqrt(penalty)
        self.eigenvalues, self.basis = np.linalg.eigh(self.scale[:, None] * gram * self.scale)

    def solve(self, gradient: np.ndarray, curvature: np.ndarray) -> np.ndarray:
        """[K, D+1] → (a_k G̃ + M)⁻¹ g_k row by row."""
        coefficients = (gradient * self.scale) @ self.basis
        coefficients /= curvature[:, None] * self.eigenvalues[None, :] + 1.0
        return (coefficients @ self.basis.T) * self.scale


@dataclass
class Trial:
    """The last accepted point, its objective and gradient, and the direction and step length
    the point the clients were last sent lies at."""

    point: np.ndarray
    objective: float
    gradient: np.ndarray
    direction: np.ndarray
    step: float = 1.0

    @property
    def slope(self) -> float:
        return float(np.sum(self.gradient * self.direction))


@dataclass
class ServerLBFGS:
    """L-BFGS on the heads [K, D+1] (weight and bias side by side), one gradient per round;
    `separable`: the heads are independent problems (OvA), each with its own curvature pairs."""

    preconditioner: GramPreconditioner
    memory: int = 10
    separable: bool = False
    pairs: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    base: Trial | None = None

    def next_point(self, point: np.ndarray, objective: float, gradient: np.ndarray,
                   curvature: np.ndarray) -> tuple[np.ndarray, str]:
        """Where the clients evaluate next, from F, ∇F and the heads' mean curvature at `point`
        (where they evaluated this round); and what became of the last step: "first",
        "accepted" or "shortened" (it did not decrease F enough: taken back, a shorter one sent)."""
        status = "first"
        if self.base is not None:
            self._remember(point - self.base.point, gradient - self.base.gradient)
            if objective > self.base.objective + ARMIJO * self.base.step * self.base.slope:
                self.base.step = self._shorter(objective)
                return self.base.point + self.base.step * self.base.direction, "shortened"
            status = "accepted"
        direction = -self._inverse_hessian_times(gradient, curvature)
        self.base = Trial(point, objective, gradient, direction)
        return point + direction, status

    def _dot(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Inner products: per head [K, 1] when the heads are separable, else one [1, 1]."""
        return np.sum(a * b, axis=1, keepdims=True) if self.separable \
            else np.sum(a * b).reshape(1, 1)

    def _remember(self, step: np.ndarray, change: np.ndarray) -> None:
        """A curvature pair (s, y), if it is one: sᵀy > 0 (always, F being convex, bar rounding)
        for some head; a head whose sᵀy is not gets no weight from it (`_inverse`)."""
        if np.any(self._inverse(step, change) > 0):
            self.pairs = [*self.pairs, (step, change)][-self.memory:]

    def _inverse(self, step: np.ndarray, change: np.ndarray) -> np.ndarray:
        """1 / sᵀy per head (or one), 0 where the pair carries no curvature."""
        product = self._dot(step, change)
        positive = product > 1e-10 * np.sqrt(self._dot(step, step) * self._dot(change, change))
        return np.where(positive, 1.0 / np.where(positive, product, 1.0), 0.0)

    def _shorter(self, objective: float) -> float:
        """The minimiser of the quadratic through F(base), its slope and F(base + step·d),
        kept within [0.1, 0.5] of the step refused."""
        step, rise = self.base.step, objective - self.base.objective - self.base.slope * self.base.step
        guess = -self.base.slope * step ** 2 / (2.0 * rise) if rise > 0 else 0.5 * step
        return float(np.clip(guess, 0.1 * step, 0.5 * step))

    def _inverse_hessian_times(self, gradient: np.ndarray, curvature: np.ndarray) -> np.ndarray:
        """L-BFGS's two loops; the initial inverse Hessian is the Gram preconditioner at the
        heads' curvature, scaled by the newest pair (Shanno-Phua) once there is one."""
        q, history = gradient.copy(), []
        for step, change in reversed(self.pairs):
            rho = self._inverse(step, change)
            alpha = rho * self._dot(step, q)
            q -= alpha * change
            history.append((rho, alpha, step, change))
        if not self.pairs:
            return self.preconditioner.solve(q, FIRST_CURVATURE * curvature)
        step, change = self.pairs[-1]
        q = self.preconditioner.solve(q, curvature)
        rho = self._inverse(step, change)
        shape = rho * self._dot(change, self.preconditioner.solve(change, curvature))  # yᵀHy / sᵀy
        q *= np.where(shape > 0, 1.0 / np.where(shape > 0, shape, 1.0), 1.0)
        for rho, alpha, step, change in reversed(history):
            q += (alpha - rho * self._dot(change, q)) * step
        return q

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        """Arrays and numbers a checkpoint keeps: the pairs and the last accepted point."""
        arrays = {f"s{i}": s for i, (s, _) in enumerate(self.pairs)}
        arrays.update({f"y{i}": y for i, (_, y) in enumerate(self.pairs)})
        numbers: dict = {"pairs": len(self.pairs)}
        if self.base is not None:
            arrays.update(point=self.base.point, gradient=self.base.gradient,
                          direction=self.base.direction)
            numbers.update(objective=self.base.objective, step=self.base.step)
        return arrays, numbers

    def restore(self, arrays: dict[str, np.ndarray], numbers: dict) -> None:
        self.pairs = [(arrays[f"s{i}"], arrays[f"y{i}"]) for i in range(int(numbers["pairs"]))]
        self.base = None if "point" not in arrays else Trial(
            arrays["point"], float(numbers["objective"]), arrays["gradient"],
            arrays["direction"], float(numbers["step"]))
