"""How much curvature a round must carry to reach the centralised optimum in five rounds.

`server-optimizer = "lbfgs"` sends one gradient per client per round and models each OvA head's
Hessian X̃ᵀ diag(h_k) X̃ / n + λ as a_k G̃ + λ (its mean curvature times the Gram matrix the set-up
summed), corrected by L-BFGS pairs. This compares, on the same start, objective and line search
(per-head Armijo, `core.quasi_newton.ServerLBFGS`), the models a client could send more for:

- `gram`: the shipped L-BFGS; a client sends K(D+1) + 3K + 1 numbers a round;
- `diagonal`: each head's exact curvature along each eigen-direction of the scaled G̃ (the
  diagonal of the Hessian in that basis), K(D+1) numbers more;
- `block-<r>`: each head's exact Hessian on the top r eigen-directions, a_k G̃ elsewhere,
  K r(r+1)/2 more;
- `newton`: each head's exact Hessian, K(D+1)(D+2)/2 more: damped Newton.

The clients' sums are the centralised ones on any partition (tests/test_heads.py), so this runs
data in one place, in float64, from the ridge start the runs use. Writes
`benchmarks/results/curvature_models.{json,md}`:

    .venv/bin/python benchmarks/curvature_models.py --case digits:efficientnet-lite0
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ovalp_flwr.core.durable import replace_durably
from ovalp_flwr.core.head_init import ClassStatistics, make_head_init
from ovalp_flwr.core.heads import full_batch_gradient
from ovalp_flwr.core.quasi_newton import BIAS_PENALTY, GramPreconditioner, ServerLBFGS
from ovalp_flwr.features.cache import load_or_build

sys.path.insert(0, str(Path(__file__).parent))
from centralised_ceiling import standardised  # noqa: E402

OUT = Path(__file__).parent / "results" / "curvature_models.json"
OPTIMUM = Path(__file__).parent / "results" / "regularised_optimum.json"
BYTES_PER_NUMBER = 4


class Problem:
    """One dataset's OvA objective at its ceiling's λ, and each head's curvature per row."""

    def __init__(self, case: str, cache_dir: Path, lam: float) -> None:
        dataset, encoder = case.split(":")
        cache = load_or_build(dataset, encoder, cache_dir)
        train, test = standardised(cache)
        self.x = torch.from_numpy(train).float()
        self.y = torch.from_numpy(cache.train.y.astype(np.int64))
        self.x_test, self.y_test = test, cache.test.y
        self.lam, self.k = lam, cache.num_classes
        self.stats = ClassStatistics.of(self.x.double(), self.y, self.k, with_gram=True)
        self.rows = torch.cat([self.x.double(), torch.ones(len(self.y), 1, dtype=torch.float64)], 1)

    def start(self) -> np.ndarray:
        weight, bias = make_head_init("ridge", 0.2).build(self.stats, self.x.shape[1], self.k, 0,
                                                          "ova", self.lam)
        return np.column_stack([weight, bias]).astype(np.float64)

    def evaluate(self, point: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """F per head, ∇F and the mean curvature, as the federation's replies give them."""
        weight = point[:, :-1].astype(np.float32)
        result = full_batch_gradient(weight, point[:, -1].astype(np.float32), self.x, self.y, "ova")
        w64 = weight.astype(np.float64)
        return (result.losses + 0.5 * self.lam * np.sum(w64 ** 2, axis=1),
                np.column_stack([result.weight + self.lam * w64, result.bias]), result.curvature)

    def curvature_rows(self, point: np.ndarray) -> torch.Tensor:
        """h_ik = σ(z_ik)(1 - σ(z_ik)), [n, K]."""
        probabilities = torch.sigmoid(self.rows @ torch.from_numpy(point).T)
        return probabilities * (1 - probabilities)

    def accuracy(self, point: np.ndarray) -> float:
        logits = self.x_test @ point[:, :-1].T + point[:, -1]
        return float((logits.argmax(1) == self.y_test).mean())


class CurvatureStep(ServerLBFGS):
    """Per-head Armijo of `ServerLBFGS`, with the step `model` gives from the Hessian data of
    the current point (set before each `next_point`); no curvature pairs; a refused step is
    halved, Newton's own backtracking (the shipped quadratic fit oscillates with exact Newton:
    5e-2 after round 5 on digits instead of 2e-5)."""

    def __init__(self, model) -> None:
        super().__init__(model.preconditioner, memory=1, separable=True)
        self.model = model

    def _remember(self, step: np.ndarray, change: np.ndarray) -> None:
        pass

    def _inverse_hessian_times(self, gradient: np.ndarray, curvature: np.ndarray) -> np.ndarray:
        return self.model.solve(gradient, curvature)

    def _shorter(self, base, objective: np.ndarray) -> np.ndarray:
        return 0.5 * base.step


class EigenModel:
    """Hessian models in the scaled eigenbasis of G̃ (`GramPreconditioner`): the top `rank`
    directions exact (a block, or only its diagonal), the rest a_k θ_j."""

    def __init__(self, problem: Problem, rank: int, diagonal: bool) -> None:
        self.preconditioner = GramPreconditioner(problem.stats, problem.lam)
        self.problem, self.rank, self.diagonal = problem, rank, diagonal
        basis = torch.from_numpy(self.preconditioner.basis[:, -rank:])
        self.projected = (problem.rows * torch.from_numpy(self.preconditioner.scale)) @ basis

    def at(self, point: np.ndarray) -> None:
        """What the clients would send at `point` (summed): per head, Z_rᵀ diag(h_k) Z_r / n."""
        h, z, n = self.problem.curvature_rows(point), self.projected, len(self.projected)
        self.blocks = ((h.T @ z ** 2) / n).numpy() if self.diagonal else \
            torch.einsum("nk,ni,nj->kij", h, z, z).numpy() / n

    def solve(self, gradient: np.ndarray, curvature: np.ndarray) -> np.ndarray:
        pre, r = self.preconditioner, self.rank
        coefficients = (gradient * pre.scale) @ pre.basis
        coefficients /= curvature[:, None] * pre.eigenvalues[None, :] + 1.0
        top = (gradient * pre.scale) @ pre.basis[:, -r:]
        if self.diagonal:
            coefficients[:, -r:] = top / (self.blocks + 1.0)
        else:
            coefficients[:, -r:] = np.linalg.solve(self.blocks + np.eye(r), top[..., None])[..., 0]
        return (coefficients @ pre.basis.T) * pre.scale


class NewtonModel:
    """Each head's exact Hessian X̃ᵀ diag(h_k) X̃ / n + diag(λ, ..., λ·BIAS_PENALTY)."""

    def __init__(self, problem: Problem) -> None:
        self.preconditioner, self.problem = GramPreconditioner(problem.stats, problem.lam), problem

    def at(self, point: np.ndarray) -> None:
        rows, h, lam = self.problem.rows, self.problem.curvature_rows(point), self.problem.lam
        penalty = torch.full((rows.shape[1],), lam, dtype=torch.float64)
        penalty[-1] = lam * BIAS_PENALTY
        self.factors = [torch.linalg.cholesky((rows * h[:, k:k + 1]).T @ rows / len(rows)
                                              + torch.diag(penalty)) for k in range(h.shape[1])]

    def solve(self, gradient: np.ndarray, curvature: np.ndarray) -> np.ndarray:
        g = torch.from_numpy(gradient)
        return np.stack([torch.cholesky_solve(g[k:k + 1].T, factor)[:, 0].numpy()
                         for k, factor in enumerate(self.factors)])


def extra_numbers(name: str, k: int, d: int) -> int:
    """What a client sends a round beyond the shipped reply."""
    if name == "gram":
        return 0
    if name == "diagonal":
        return k * (d + 1)
    if name == "newton":
        return k * (d + 1) * (d + 2) // 2
    rank = int(name.split("-")[1])
    return k * rank * (rank + 1) // 2


def run(problem: Problem, name: str, rounds: int, optimum: float) -> dict:
    """F - F*, test accuracy and the step's fate per round, from the ridge start."""
    if name == "gram":
        optimizer, model = ServerLBFGS(GramPreconditioner(problem.stats, problem.lam),
                                       separable=True), None
    else:
        model = NewtonModel(problem) if name == "newton" else \
            EigenModel(problem, problem.x.shape[1] + 1 if name == "diagonal"
                       else int(name.split("-")[1]), diagonal=name == "diagonal")
        optimizer = CurvatureStep(model)
    point, trail = problem.start(), []
    for _ in tqdm(range(rounds + 1), desc=name, leave=False):
        objective, gradient, curvature = problem.evaluate(point)
        trail.append({"gap": float(objective.sum() - optimum), "accuracy": problem.accuracy(point)})
        if model is not None:
            model.at(point)
        point, trail[-1]["step"] = optimizer.next_point(point, objective, gradient, curvature)
        point = point.astype(np.float32).astype(np.float64)  # what the clients are sent
    k, d = problem.k, problem.x.shape[1]
    base = k * (d + 1) + 3 * k + 1
    return {"rounds": trail, "numbers_per_client_round": base + extra_numbers(name, k, d)}


def markdown(report: dict) -> str:
    lines = ["# Curvature per round: what reaching the optimum in five rounds costs", "",
             f"Made by `python benchmarks/curvature_models.py --case {report['case']}` "
             f"(λ = {report['lambda']}, F* = {report['optimum']:.6f}, whose test accuracy is "
             f"{100 * report['optimum_accuracy']:.2f}%). Each model from the ridge start, "
             "per-head Armijo (the curvature models halve a refused step); "
             "MB: what one client sends per round (float32).", "",
             "| model | MB / client / round | " + " | ".join(
                 f"round {t}" for t in report["shown"]) + " |",
             "|---|---:|" + "---:|" * len(report["shown"])]
    for name, result in report["models"].items():
        cells = [f"{result['rounds'][t]['gap']:.1e} ({100 * result['rounds'][t]['accuracy']:.2f}%)"
                 for t in report["shown"]]
        megabytes = result["numbers_per_client_round"] * BYTES_PER_NUMBER / 1e6
        lines.append(f"| {name} | {megabytes:.2f} | " + " | ".join(cells) + " |")
    lines += ["", "Cells: F − F* after that round (test accuracy)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="digits:efficientnet-lite0")
    parser.add_argument("--models", nargs="+", default=["gram", "diagonal", "block-64",
                                                        "block-256", "newton"])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--cache-dir", type=Path, default=Path("feature_cache"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    known = {entry["case"]: entry for entry in json.loads(OPTIMUM.read_text())["optima"].values()
             if entry["head"] == "ova"}
    if args.case not in known:
        parser.error(f"--case {args.case!r} is not allowed; use one of {sorted(known)} "
                     "(benchmarks/regularised_optimum.py computes F* for more)")
    entry = known[args.case]
    problem = Problem(args.case, args.cache_dir, entry["lambda"])
    started = time.perf_counter()
    models = {name: run(problem, name, args.rounds, entry["objective"]) for name in args.models}
    report = {"case": args.case, "lambda": entry["lambda"], "optimum": entry["objective"],
              "optimum_accuracy": entry["test_accuracy"],
              "shown": [t for t in (1, 2, 3, 4, 5, 10) if t <= args.rounds], "models": models,
              "seconds": time.perf_counter() - started,
              "machine": platform.processor() or platform.machine()}
    replace_durably(OUT, json.dumps(report, indent=1).encode())
    replace_durably(OUT.with_suffix(".md"), markdown(report).encode())
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
