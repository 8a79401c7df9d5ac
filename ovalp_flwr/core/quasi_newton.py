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
exchange. Under OvA that check is per head too (the clients send each head's loss, K numbers):
one head's overshoot no longer holds the other K - 1 back.
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
        self.weight_decay = weight_decay
        self.scale = 1.0 / np.sqrt(penalty)
        self.eigenvalues, self.basis = np.linalg.eigh(self.scale[:, None] * gram * self.scale)

    def at(self, weight_decay: float) -> GramPreconditioner:
        """The same Gram matrix at another λ, without a new eigendecomposition: M scales with λ,
        so M^-½ G̃ M^-½ keeps its eigenvectors and its eigenvalues scale by λ_old / λ_new."""
        other = object.__new__(GramPreconditioner)
        ratio = self.weight_decay / weight_decay
        other.weight_decay, other.basis = weight_decay, self.basis
        other.scale, other.eigenvalues = self.scale * np.sqrt(ratio), self.eigenvalues * ratio
        return other

    def solve(self, gradient: np.ndarray, curvature: np.ndarray) -> np.ndarray:
        """[K, D+1] → (a_k G̃ + M)⁻¹ g_k row by row."""
        coefficients = (gradient * self.scale) @ self.basis
        coefficients /= curvature[:, None] * self.eigenvalues[None, :] + 1.0
        return (coefficients @ self.basis.T) * self.scale


@dataclass
class Trial:
    """Per part (each head when separable, else the whole): the last accepted point, its
    objective and gradient, and the direction and step length the point the clients were last
    sent lies at."""

    point: np.ndarray  # [K, D+1]
    objective: np.ndarray  # [P]
    gradient: np.ndarray  # [K, D+1]
    direction: np.ndarray  # [K, D+1]
    step: np.ndarray  # [P]


@dataclass
class ServerLBFGS:
    """L-BFGS on the heads [K, D+1] (weight and bias side by side), one gradient per round;
    `separable`: the heads are independent problems (OvA), each with its own curvature pairs
    and its own line search (the clients send the loss per head)."""

    preconditioner: GramPreconditioner
    memory: int = 10
    separable: bool = False
    pairs: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    base: Trial | None = None
    shortened: int = 0  # the parts whose last step was refused

    def next_point(self, point: np.ndarray, objective: float | np.ndarray, gradient: np.ndarray,
                   curvature: np.ndarray) -> tuple[np.ndarray, str]:
        """Where the clients evaluate next, from F (per head when separable: [K]), ∇F and the
        heads' mean curvature at `point` (where they evaluated this round); and what became of
        the last step: "first", "accepted" or "shortened" (some part did not decrease F enough:
        that part is taken back and a shorter step sent; the others go on from here)."""
        objective = np.atleast_1d(np.asarray(objective, np.float64))
        parts = len(gradient) if self.separable else 1
        if objective.shape != (parts,):
            raise ValueError(f"the objective has shape {objective.shape}; this optimiser needs "
                             f"({parts},): {'one per head' if self.separable else 'one number'}")
        base = self.base
        if base is not None:
            self._remember(point - base.point, gradient - base.gradient)
        direction = -self._inverse_hessian_times(gradient, curvature)
        if base is None:
            self.base, self.shortened = Trial(point, objective, gradient, direction,
                                              np.ones(parts)), 0
            return point + direction, "first"
        refused = objective > base.objective + ARMIJO * base.step * self._slope(base)
        rows = self._rows(refused)  # refused parts go back to where they were accepted
        self.base = Trial(np.where(rows, base.point, point),
                          np.where(refused, base.objective, objective),
                          np.where(rows, base.gradient, gradient),
                          np.where(rows, base.direction, direction),
                          np.where(refused, self._shorter(base, objective), 1.0))
        self.shortened = int(refused.sum())
        following = self.base.point + self._rows(self.base.step) * self.base.direction
        return following, "shortened" if self.shortened else "accepted"

    def repenalise(self, change: float) -> None:
        """The weight decay moved by `change` (new λ − old): the data term is unchanged, so each
        curvature pair's y, and the accepted point's objective and gradient, move by the
        penalty's exact difference, and L-BFGS goes on with what it learnt."""
        self.pairs = [(step, difference + change * _weights(step))
                      for step, difference in self.pairs]
        if self.base is not None:
            extra = 0.5 * change * np.sum(self.base.point[:, :-1] ** 2, axis=1)  # per head
            self.base.objective = self.base.objective + (extra if self.separable
                                                         else np.array([extra.sum()]))
            self.base.gradient = self.base.gradient + change * _weights(self.base.point)

    def redirect(self, curvature: np.ndarray) -> np.ndarray:
        """A fresh direction at the accepted point (after `repenalise`), a full step on it:
        where the clients evaluate next."""
        assert self.base is not None, "redirect needs an accepted point"
        direction = -self._inverse_hessian_times(self.base.gradient, curvature)
        parts = len(self.base.objective)
        self.base = Trial(self.base.point, self.base.objective, self.base.gradient, direction,
                          np.ones(parts))
        return self.base.point + direction

    def restart(self) -> None:
        """Forget the pairs and the accepted point: the objective changed (rows left it), and
        the next gradient starts L-BFGS again as its first did."""
        self.pairs, self.base, self.shortened = [], None, 0

    def _rows(self, per_part: np.ndarray) -> np.ndarray:
        """A per-part value as a column that broadcasts over the heads' rows."""
        return per_part[:, None]

    def _slope(self, trial: Trial) -> np.ndarray:
        return self._dot(trial.gradient, trial.direction)[:, 0]

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

    def _shorter(self, base: Trial, objective: np.ndarray) -> np.ndarray:
        """Per part, the minimiser of the quadratic through F(base), its slope and
        F(base + step·d), kept within [0.1, 0.5] of the step refused."""
        slope, step = self._slope(base), base.step
        rise = objective - base.objective - slope * step
        safe = np.where(rise > 0, rise, 1.0)
        guess = np.where(rise > 0, -slope * step ** 2 / (2.0 * safe), 0.5 * step)
        return np.clip(guess, 0.1 * step, 0.5 * step)

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
        if self.base is not None:
            arrays.update(point=self.base.point, objective=self.base.objective,
                          gradient=self.base.gradient, direction=self.base.direction,
                          step=self.base.step)
        return arrays, {"pairs": len(self.pairs), "shortened": self.shortened}

    def restore(self, arrays: dict[str, np.ndarray], numbers: dict) -> None:
        self.pairs = [(arrays[f"s{i}"], arrays[f"y{i}"]) for i in range(int(numbers["pairs"]))]
        self.shortened = int(numbers["shortened"])
        self.base = None if "point" not in arrays else Trial(
            arrays["point"], arrays["objective"], arrays["gradient"], arrays["direction"],
            arrays["step"])


def _weights(heads: np.ndarray) -> np.ndarray:
    """[K, D+1] with the bias column zeroed: what the weight decay acts on."""
    out = heads.copy()
    out[:, -1] = 0.0
    return out
