"""`ridge-lambda = "auto"` against the fixed penalties, on every dataset the reports use.

The ridge start is the centralised ridge solution on any partition (its statistics are sums:
`tests/test_head_init.py`), so this scores it from the rows the clients would hold: the
training split less its validation rows (`data.holdout`, 10% as "auto" holds back, seeded),
normalised by those rows' moments as a run's `standardize` is. Per dataset and seed:
- `auto`: the penalty `core.head_init.ridge.lambda_path` picks on the validation rows;
- the default 0.2 and Fed3R's published 0.01 (2e-7 per sample on 50,000 rows), on the same rows;
- the default 0.2 on every training row (a run that holds nothing back: what the default gives
  today), to show what holding 10% back costs;
- for reference only, the best penalty of the grid read off the test split (a figure, not a
  choice any run makes).
Accuracy is the start's on the test split (calibration keeps the argmax). Writes
`benchmarks/results/ridge_lambda_auto.{json,md}`:

    .venv/bin/python benchmarks/ridge_lambda_auto.py --cache-dir feature_cache   # ~2 min
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ovalp_flwr.data.options import AUTO_VALIDATION_FRACTION
from ovalp_flwr.core.durable import replace_durably
from ovalp_flwr.core.head_init import ClassStatistics
from ovalp_flwr.core.head_init.ridge import LAMBDA_GRID, RidgeInit, lambda_path
from ovalp_flwr.core.normalize import FeatureMoments, NormStats, normalize
from ovalp_flwr.data.holdout import training_rows, validation_rows
from ovalp_flwr.features.cache import load_or_build

OUT = Path(__file__).resolve().parent / "results" / "ridge_lambda_auto"
CASES = ("digits:efficientnet-lite0", "tinyimagenet-100:efficientnet-lite0",
         "cifar10:efficientnet-lite0", "mnist:efficientnet-lite0", "ag-news:minilm")
SEEDS = (0, 42, 777)
DEFAULT_LAMBDA, FED3R_LAMBDA = 0.2, 2e-7


def test_accuracy(stats: ClassStatistics, lam: float, test: np.ndarray, labels: np.ndarray) -> float:
    weight, bias = RidgeInit(lam).linear_head(stats, test.shape[1], stats.num_classes, 0)
    return float(np.mean(np.argmax(test @ weight.T + bias, axis=1) == labels))


def statistics(features: np.ndarray, labels: np.ndarray, num_classes: int) -> ClassStatistics:
    return ClassStatistics.of(torch.from_numpy(features), torch.from_numpy(labels), num_classes,
                              True)


def run_seed(cache: Any, seed: int) -> dict[str, Any]:
    """One seed's holdout: every penalty's start on the test split."""
    y, k = cache.train.y.astype(np.int64), cache.num_classes
    held = validation_rows(y, cache.train.domain, AUTO_VALIDATION_FRACTION, seed)
    kept = training_rows(len(y), held)
    norm = NormStats.from_moments(FeatureMoments.of(cache.train.x[kept]))
    train, test = (normalize("standardize", x, norm) for x in (cache.train.x, cache.test.x))
    test_labels = cache.test.y.astype(np.int64)
    stats = statistics(train[kept], y[kept], k)
    path = lambda_path(stats, train[held], y[held])
    on_test = lambda_path(stats, test, test_labels)  # reference only: no run reads it
    everything = NormStats.from_moments(FeatureMoments.of(cache.train.x))
    all_train = normalize("standardize", cache.train.x, everything)
    all_test = normalize("standardize", cache.test.x, everything)
    return {"seed": seed, "validation_rows": int(len(held)), "chosen_lambda": path.chosen,
            "auto": test_accuracy(stats, path.chosen, test, test_labels),
            "default": test_accuracy(stats, DEFAULT_LAMBDA, test, test_labels),
            "fed3r": test_accuracy(stats, FED3R_LAMBDA, test, test_labels),
            "default_all_rows": test_accuracy(statistics(all_train, y, k), DEFAULT_LAMBDA,
                                              all_test, test_labels),
            "best_on_test": max(on_test.accuracy),
            "best_on_test_lambda": on_test.chosen,
            "validation_path": list(path.accuracy)}


def run_case(case: str, cache_dir: Path, seeds: tuple[int, ...]) -> dict[str, Any]:
    dataset, _, encoder = case.partition(":")
    cache = load_or_build(dataset, encoder, cache_dir)
    return {"dataset": dataset, "encoder": encoder, "num_train": int(len(cache.train.y)),
            "seeds": [run_seed(cache, seed) for seed in seeds]}


COLUMNS = (("auto", "auto"), ("default", "0.2"), ("fed3r", "2e-7 (Fed3R's 0.01 at 50,000 rows)"),
           ("default_all_rows", "0.2, no rows held back"),
           ("best_on_test", "best of the grid on test (reference)"))


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    def mean_std(values: list[float]) -> str:
        return f"{100 * np.mean(values):.2f} ± {100 * np.std(values):.2f}"

    lines = ["# `ridge-lambda = \"auto\"` against the fixed penalties", "",
             f"Made by `{command}`. The ridge start's test accuracy (%), mean ± std over seeds "
             f"{', '.join(str(s['seed']) for s in cases[0]['seeds'])} (each seed its own "
             f"validation rows: {AUTO_VALIDATION_FRACTION:.0%} of the training split). `auto` "
             "picks among "
             f"{len(LAMBDA_GRID)} penalties ({LAMBDA_GRID[0]:g} to {LAMBDA_GRID[-1]:g}) on the "
             "validation rows; the last column reads the test split and is no run's choice.", "",
             "| dataset | λ chosen (per seed) | " + " | ".join(t for _, t in COLUMNS) + " |",
             "|---|---|" + "---:|" * len(COLUMNS)]
    for case in cases:
        seeds = case["seeds"]
        chosen = ", ".join(f"{s['chosen_lambda']:.2g}" for s in seeds)
        cells = [mean_std([s[key] for s in seeds]) for key, _ in COLUMNS]
        lines.append(f"| {case['dataset']} ({case['encoder']}) | {chosen} | " + " | ".join(cells)
                     + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", type=Path, default=Path("feature_cache"))
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    parser.add_argument("--seeds", nargs="*", type=int, default=list(SEEDS))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    cases = [run_case(case, args.cache_dir, tuple(args.seeds))
             for case in tqdm(args.cases, desc="datasets")]
    command = "python benchmarks/ridge_lambda_auto.py " + " ".join(argv or sys.argv[1:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    replace_durably(args.out.with_suffix(".json"),
                    json.dumps({"command": command.strip(), "cases": cases}, indent=2).encode())
    replace_durably(args.out.with_suffix(".md"), markdown(cases, command.strip()).encode())
    print(markdown(cases, command.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
