"""The centralised ceiling: the best a linear probe does on the runs' features, data in one place.

Every federated method here trains a linear head on frozen features, so its ceiling is a
logistic regression fitted on all training features at once. For each dataset this fits
scikit-learn's multinomial `LogisticRegression` and a one-vs-rest one
(`OneVsRestClassifier`, K binary problems: OvA-LP's model), on the features as the runs see
them (`feature-norm = standardize`: the training split's mean and std). C is tuned honestly:
fitted on a seeded stratified 90% of the training split, scored on the other 10% (a hill
climb over a log grid from λ = 0.01, until the best value has a worse neighbour on each
side), and the best C refitted on the whole training split before the test split is scored
once. The
ceiling is the test accuracy of the kind with the better validation accuracy (a tie goes to the
multinomial one): the test split chooses nothing. Reports measure "rounds to 95% of the IID
ceiling" against it. Writes `benchmarks/results/centralised_ceiling.{json,md}`:

    .venv/bin/python benchmarks/centralised_ceiling.py                 # the four report datasets
    .venv/bin/python benchmarks/centralised_ceiling.py --case digits:efficientnet-lite0

Caches come from `cache.load_or_build` (built on first use, from `../shared/data`). A case
already in the JSON with the same grid and cache is kept, so a rerun only fits what is new;
its model kind is chosen again by today's rule.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.multiclass import OneVsRestClassifier
from tqdm.auto import tqdm

from ovalp_flwr.features.cache import CachedFeatures, load_or_build
from ovalp_flwr.experiments.ceiling import (CEILING_FILE, KINDS, case_ceiling, chosen_kind,
                                           read_ceilings)
from ovalp_flwr.core.normalize import FeatureMoments, NormStats, normalize
from ovalp_flwr.core.durable import replace_durably

CASES = ("digits:efficientnet-lite0", "tinyimagenet-100:efficientnet-lite0", "cifar10:efficientnet-lite0",
         "mnist:efficientnet-lite0", "ag-news:minilm")
# L2 strength per sample (the loss is a mean; sklearn's C = 1 / (n λ)), strongest first; the
# search starts at START and climbs towards better validation accuracy
LAMBDAS = (1.0, 3e-1, 1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5)
START = LAMBDAS.index(1e-2)
VALIDATION_SHARE, SPLIT_SEED, MAX_ITER = 0.1, 0, 2000
JOBS = int(os.environ.get("CEILING_JOBS", "2"))  # one-vs-rest fits in parallel


def standardised(cache: CachedFeatures) -> tuple[np.ndarray, np.ndarray]:
    """Train and test features as a run normalises them (statistics of the training split)."""
    stats = NormStats.from_moments(FeatureMoments.of(cache.train.x))
    return (normalize("standardize", cache.train.x, stats),
            normalize("standardize", cache.test.x, stats))


def classifier(kind: str, lam: float, num_samples: int) -> Any:
    model = LogisticRegression(C=1.0 / (num_samples * lam), max_iter=MAX_ITER)
    return model if kind == "multinomial" else OneVsRestClassifier(model, n_jobs=JOBS)


def fit_score(kind: str, lam: float, x: np.ndarray, y: np.ndarray, x_eval: np.ndarray,
              y_eval: np.ndarray) -> tuple[float, bool]:
    """Accuracy on the evaluation rows, and whether lbfgs converged within MAX_ITER."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        model = classifier(kind, lam, len(y)).fit(x, y)
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    return float((model.predict(x_eval) == y_eval).mean()), converged


def tune_and_test(kind: str, train: np.ndarray, labels: np.ndarray, test: np.ndarray,
                  test_labels: np.ndarray, progress: tqdm) -> dict[str, Any]:
    """λ by validation accuracy on a held-out tenth, then one refit on all training rows."""
    fit_x, val_x, fit_y, val_y = train_test_split(
        train, labels, test_size=VALIDATION_SHARE, stratify=labels, random_state=SPLIT_SEED)
    validation: dict[float, float] = {}

    def score(index: int) -> float:
        lam = LAMBDAS[index]
        if lam not in validation:
            progress.set_postfix_str(f"{kind} λ={lam:g}")
            validation[lam], _ = fit_score(kind, lam, fit_x, fit_y, val_x, val_y)
            progress.update()
        return validation[lam]

    best = LAMBDAS[hill_climb(score, START, len(LAMBDAS))]
    progress.set_postfix_str(f"{kind} refit λ={best:g}")
    started = time.perf_counter()
    test_accuracy, converged = fit_score(kind, best, train, labels, test, test_labels)
    progress.update()
    return {"validation_accuracy": {f"{lam:g}": acc for lam, acc in validation.items()},
            "best_lambda": best, "C": 1.0 / (len(labels) * best), "test_accuracy": test_accuracy,
            "converged": converged, "refit_seconds": round(time.perf_counter() - started, 1)}


def hill_climb(score, start: int, size: int) -> int:
    """The grid index with the best score, found by stepping to the better neighbour until
    neither is better (ties go to the earlier index: the stronger penalty)."""
    best = start
    while True:
        neighbours = [i for i in (best - 1, best + 1) if 0 <= i < size]
        better = [i for i in neighbours if score(i) > score(best)]
        if not better:
            return best
        best = max(better, key=lambda i: (score(i), -i))


def run_case(case: str, args: argparse.Namespace) -> dict[str, Any]:
    dataset, _, encoder = case.partition(":")
    cache = load_or_build(dataset, encoder, args.cache_dir, data_dir=args.data_dir, progress=True)
    train, test = standardised(cache)
    labels, test_labels = cache.train.y.astype(np.int64), cache.test.y.astype(np.int64)
    fits = {}
    with tqdm(desc=case, unit="fit") as progress:
        for kind in KINDS:
            fits[kind] = tune_and_test(kind, train, labels, test, test_labels, progress)
    return chosen({"dataset": dataset, "encoder": encoder, "feature_norm": "standardize",
                   "train_shape": list(train.shape), "test_samples": len(test_labels),
                   "num_classes": cache.num_classes, "cache_sha256": cache_digest(cache), **fits})


def chosen(case: dict[str, Any]) -> dict[str, Any]:
    """The case with its model kind chosen on validation rows and that kind's test accuracy
    as the ceiling (kept cases too: the rule may be newer than their fits)."""
    return {**case, "model_kind": chosen_kind(case), "ceiling": case_ceiling(case)}


def cache_digest(cache: CachedFeatures) -> str:
    return cache.manifest["splits"]["train"]["sha256"]


def cell(fit: dict[str, Any]) -> str:
    """`test (λ; validation)` in percent, starred where lbfgs hit its iteration limit."""
    lam = f"{fit['best_lambda']:g}"
    return (f"{100 * fit['test_accuracy']:.2f} ({lam}; {100 * fit['validation_accuracy'][lam]:.2f})"
            + ("" if fit["converged"] else " *"))


def markdown(results: dict[str, Any]) -> str:
    lines = ["# Centralised ceiling: logistic regression on all training features",
             "", f"Made by `{results['command']}` ({results['machine']}).", "",
             "Features as the runs see them (`standardize`); λ (L2 per sample, C = 1/(nλ)) "
             f"chosen on a stratified {VALIDATION_SHARE:.0%} of the training split (hill climb "
             "over a log grid from 0.01), then refitted on all of it; test accuracy scored once.",
             "",
             "| dataset | encoder | classes | multinomial: test (λ; validation) "
             "| one-vs-rest: test (λ; validation) | chosen on validation | ceiling |",
             "|---|---|---:|---:|---:|---|---:|"]
    for case in results["cases"].values():
        cells = [cell(case[kind]) for kind in KINDS]
        lines.append(f"| {case['dataset']} | {case['encoder']} | {case['num_classes']} | "
                     f"{cells[0]} | {cells[1]} | {case['model_kind']} | "
                     f"**{100 * case['ceiling']:.2f}** |")
    lines += ["", "\\* lbfgs stopped at the iteration limit.", ""]
    return "\n".join(lines)


def write(made: dict[str, Any], cases: dict[str, Any]) -> None:
    """The JSON and its Markdown table; `made` names the command and machine of the fits."""
    results = {"command": made["command"], "machine": made["machine"], "lambdas": list(LAMBDAS),
               "cases": cases}
    replace_durably(CEILING_FILE, json.dumps(results, indent=2) + "\n")
    replace_durably(CEILING_FILE.with_suffix(".md"), markdown(results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", help="DATASET:ENCODER (repeatable); "
                        f"default: {' '.join(CASES)}")
    parser.add_argument("--cache-dir", type=Path, default=Path("feature_cache"))
    parser.add_argument("--data-dir", default=None, help="default: $OVALP_DATA_DIR or ../shared/data")
    parser.add_argument("--refit", action="store_true", help="fit cases already in the JSON too")
    args = parser.parse_args(argv)
    previous = read_ceilings(CEILING_FILE)
    made = json.loads(CEILING_FILE.read_text()) if previous else {}
    cases = {case: chosen(fits) for case, fits in previous.items()}
    for case in args.case or CASES:
        dataset, _, encoder = case.partition(":")
        cache = load_or_build(dataset, encoder, args.cache_dir, data_dir=args.data_dir)
        if not args.refit and previous.get(case, {}).get("cache_sha256") == cache_digest(cache):
            print(f"{case}: kept (ceiling {100 * cases[case]['ceiling']:.2f}%, "
                  f"{cases[case]['model_kind']})")
            continue
        cases[case] = run_case(case, args)
        print(f"{case}: ceiling {100 * cases[case]['ceiling']:.2f}%", flush=True)
        made = {"command": " ".join(["python benchmarks/centralised_ceiling.py", *sys.argv[1:]]),
                "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}"}
        write(made, cases)  # per case: resumable
    write(made, cases)  # kept cases under today's choice of kind
    return 0


if __name__ == "__main__":
    sys.exit(main())
