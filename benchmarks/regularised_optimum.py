"""The centralised optimum of the objective `server-optimizer = "lbfgs"` minimises, data in one
place: F(W, b) = mean loss + λ/2 ‖W‖² (bias unpenalised) on all training features, normalised
as the runs normalise them (`standardize`), for the OvA head (the K binary losses summed) and
the softmax head. λ is the centralised ceiling's tuned one-vs-rest λ
(`benchmarks/results/centralised_ceiling.json`), unless `--lambda` says otherwise.

Solved by SciPy's L-BFGS-B in float64 to a gradient norm of 1e-7 (an independent solver, not
the project's), from zero, or from a run's final heads (`--start-from results/<...>/<run>`: its
checkpoint), which only saves SciPy's iterations: the stop is SciPy's own gradient test. Writes `benchmarks/results/regularised_optimum.{json,md}`, read by
the server-optimizer report to show F - F* per round:

    .venv/bin/python benchmarks/regularised_optimum.py                # every ceiling case
    .venv/bin/python benchmarks/regularised_optimum.py --case digits:efficientnet-lite0
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import minimize

from ovalp_flwr.core.durable import replace_durably
from ovalp_flwr.experiments.ceiling import read_ceilings
from ovalp_flwr.features.cache import load_or_build

sys.path.insert(0, str(Path(__file__).parent))
from centralised_ceiling import CASES, cache_digest, standardised  # noqa: E402

OUT = Path(__file__).parent / "results" / "regularised_optimum.json"
HEADS = ("ova", "softmax")
GRADIENT_TOLERANCE, MAX_ITER = 1e-7, 20000


def objective(x: torch.Tensor, y: torch.Tensor, lam: float, head: str, k: int):
    """F(W, b) and its gradient as a function of the flat parameters (W row-major, then b)."""
    d = x.shape[1]

    def value_and_gradient(flat: np.ndarray) -> tuple[float, np.ndarray]:
        params = torch.from_numpy(flat)
        weight, bias = params[:k * d].reshape(k, d), params[k * d:]
        logits = x @ weight.T + bias
        targets = F.one_hot(y, k).double()
        if head == "ova":
            loss = F.binary_cross_entropy_with_logits(logits, targets, reduction="sum") / len(y)
            residual = torch.sigmoid(logits) - targets
        else:
            loss = F.cross_entropy(logits, y)
            residual = torch.softmax(logits, 1) - targets
        residual /= len(y)
        value = float(loss) + 0.5 * lam * float((weight * weight).sum())
        grad_w = residual.T @ x + lam * weight
        return value, torch.cat([grad_w.ravel(), residual.sum(0)]).numpy()

    return value_and_gradient


def start_point(run_dir: Path | None, k: int, d: int) -> np.ndarray:
    """Zeros, or the global heads of a run's last checkpoint, flat."""
    if run_dir is None:
        return np.zeros(k * (d + 1))
    from ovalp_flwr.federation.checkpoint import read_checkpoint, unpack

    arrays = unpack("global", read_checkpoint(run_dir).arrays)
    return np.concatenate([arrays["weight"].astype(np.float64).ravel(),
                           arrays["bias"].astype(np.float64)])


def solve(case: str, lam: float, head: str, cache_dir: Path, data_dir: str | None,
          start_from: Path | None = None) -> dict[str, Any]:
    dataset, _, encoder = case.partition(":")
    cache = load_or_build(dataset, encoder, cache_dir, data_dir=data_dir)
    train, test = (torch.from_numpy(a).double() for a in standardised(cache))
    labels = torch.from_numpy(cache.train.y.astype(np.int64))
    test_labels = torch.from_numpy(cache.test.y.astype(np.int64))
    k, d = cache.num_classes, train.shape[1]
    started = time.perf_counter()
    result = minimize(objective(train, labels, lam, head, k), start_point(start_from, k, d), jac=True,
                      method="L-BFGS-B", options={"maxiter": MAX_ITER, "maxcor": 30,
                                                  "gtol": GRADIENT_TOLERANCE, "ftol": 0.0})
    params = torch.from_numpy(result.x)
    weight, bias = params[:k * d].reshape(k, d), params[k * d:]
    accuracy = float(((test @ weight.T + bias).argmax(1) == test_labels).double().mean())
    return {"case": case, "head": head, "lambda": lam, "objective": float(result.fun),
            "gradient_norm": float(np.linalg.norm(result.jac)), "iterations": int(result.nit),
            "converged": bool(result.success), "message": str(result.message),
            "test_accuracy": accuracy, "seconds": round(time.perf_counter() - started, 1),
            "cache_sha256": cache_digest(cache),
            "started_from": start_from.name if start_from else "zeros"}


def read_optima(path: Path = OUT) -> dict[str, Any]:
    """`{"<case>|<head>|<λ>": {...}}` as written; {} if it never ran."""
    return json.loads(path.read_text())["optima"] if path.exists() else {}


def key(case: str, head: str, lam: float) -> str:
    return f"{case}|{head}|{lam:g}"


def markdown(optima: dict[str, Any]) -> str:
    lines = ["# The regularised centralised optimum (what `server-optimizer = \"lbfgs\"` targets)",
             "", "Made by `python benchmarks/regularised_optimum.py` (SciPy L-BFGS-B, float64, "
             f"until every partial derivative is within {GRADIENT_TOLERANCE:g}; ‖∇F‖ below is "
             "the 2-norm, and F - F* ≤ ‖∇F‖² / 2λ in the penalised weights).", "",
             "| case | head | λ | F* | ‖∇F‖ | iterations | from | test accuracy |",
             "|---|---|---:|---:|---:|---:|---|---:|"]
    for entry in optima.values():
        lines.append(f"| {entry['case']} | {entry['head']} | {entry['lambda']:g} | "
                     f"{entry['objective']:.6f} | {entry['gradient_norm']:.1e} | "
                     f"{entry['iterations']} | {entry.get('started_from', 'zeros')} | "
                     f"{100 * entry['test_accuracy']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", help=f"default: {' '.join(CASES)}")
    parser.add_argument("--head", action="append", choices=HEADS, help="default: both")
    parser.add_argument("--markdown-only", action="store_true", help="rewrite the .md from the JSON")
    parser.add_argument("--lambda", dest="lam", type=float, help="default: the ceiling's OvR λ")
    parser.add_argument("--start-from", type=Path, help="a run folder whose checkpoint's heads "
                        "SciPy starts from (one --case and --head)")
    parser.add_argument("--cache-dir", type=Path, default=Path("feature_cache"))
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    ceilings, optima = read_ceilings(), read_optima()
    if args.markdown_only:
        replace_durably(OUT.with_suffix(".md"), markdown(optima))
        return 0
    for case in args.case or CASES:
        lam = args.lam or ceilings[case]["one-vs-rest"]["best_lambda"]
        for head in args.head or HEADS:
            entry = solve(case, lam, head, args.cache_dir, args.data_dir, args.start_from)
            optima[key(case, head, lam)] = entry
            print(f"{case} {head} λ={lam:g}: F* = {entry['objective']:.6f}, "
                  f"accuracy {100 * entry['test_accuracy']:.2f}% ({entry['seconds']} s)", flush=True)
            results = {"machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
                       "optima": optima}
            replace_durably(OUT, json.dumps(results, indent=2) + "\n")
            replace_durably(OUT.with_suffix(".md"), markdown(optima))
    return 0


if __name__ == "__main__":
    sys.exit(main())
