"""What a closed-form start buys for the bytes each client sends once, on the runs' features.

The starts' statistics are sums, so the federated start is the centralised one on any
partition (`tests/test_head_init.py`): this scores each start from the whole training split
and prices it by what one client sends (`statistics.wire_bytes`, float32 on the wire):
- `class-means` (FedNCM): K (D + 2) floats, the size of one head;
- `ridge` (λ = 2e-7 a row, Fed3R's 0.01 where there are 50,000 rows, and the default's larger one): the Gram matrix besides, D (D + 1) / 2;
- ridge on a seeded Gaussian random projection to k dimensions (Fed3R-RF's cheaper cousin):
  the Gram matrix of the projected features, k (k + 1) / 2, and K (k + 2) for the sums; the
  head is then W Rᵀ in the original space.
Accuracy is of the start alone (round 0), against 95% of the dataset's centralised ceiling.
Then what summing the ridge start's statistics under SecAgg+ costs against plain sums: the
embedded default's set-up (digits, 100 clients) run both ways in process, bytes and messages
as the run records them. Writes `benchmarks/results/statistics_trade.{json,md}`:

    .venv/bin/python benchmarks/statistics_trade.py      # the four report datasets, ~2 min
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ovalp_flwr.features.cache import load_or_build
from ovalp_flwr.experiments.ceiling import CEILING_FILE, ceiling
from ovalp_flwr.ops.console import quiet_flower
from ovalp_flwr.core.head_init import ClassStatistics, make_head_init
from ovalp_flwr.core.head_init.statistics import wire_bytes
from ovalp_flwr.core.normalize import FeatureMoments, NormStats, normalize
from ovalp_flwr.core.durable import replace_durably

OUT = CEILING_FILE.parent / "statistics_trade"
CASES = ("tinyimagenet-100:efficientnet-lite0", "cifar10:efficientnet-lite0",
         "mnist:efficientnet-lite0", "ag-news:minilm")
FED3R_LAMBDA = 2e-7  # Fed3R's 0.01 over 50,000 samples, per sample as `ridge-lambda` is
PROJECTIONS = (64, 128, 256, 512)
AGGREGATIONS = ("plain", "secagg+")


def start_accuracy(name: str, features: np.ndarray, labels: np.ndarray, test: np.ndarray,
                   test_labels: np.ndarray, num_classes: int, **options: float) -> float:
    """Test accuracy of a start built from the statistics of all training rows."""
    init = make_head_init(name, **options)
    stats = ClassStatistics.of(torch.from_numpy(features), torch.from_numpy(labels), num_classes,
                               init.statistics == "gram")
    weight, bias = init.build(stats, features.shape[1], num_classes, 0, "ova")
    return float(((test @ weight.T + bias).argmax(1) == test_labels).mean())


def run_case(case: str, cache_dir: Path) -> dict[str, Any]:
    dataset, _, encoder = case.partition(":")
    cache = load_or_build(dataset, encoder, cache_dir)
    stats = NormStats.from_moments(FeatureMoments.of(cache.train.x))
    train, test = (normalize("standardize", s.x, stats) for s in (cache.train, cache.test))
    labels, test_labels = cache.train.y.astype(np.int64), cache.test.y.astype(np.int64)
    k, d = cache.num_classes, train.shape[1]
    rows = [{"start": "class-means", "dimension": d, "bytes": wire_bytes("class-sums", k, d),
             "accuracy": start_accuracy("class-means", train, labels, test, test_labels, k)}]
    for label, lam in (("ridge (λ 2e-7 a row)", FED3R_LAMBDA), ("ridge (default λ = 0.2)", 0.2)):
        rows.append({"start": label, "dimension": d, "bytes": wire_bytes("gram", k, d),
                     "accuracy": start_accuracy("ridge", train, labels, test, test_labels, k,
                                                ridge_lambda=lam)})
    for dim in (p for p in PROJECTIONS if p < d):
        projection = np.random.default_rng(0).normal(size=(d, dim)).astype(np.float32)
        projection /= np.sqrt(dim)
        rows.append({"start": f"ridge on a random projection to {dim}", "dimension": dim,
                     "bytes": wire_bytes("gram", k, dim),
                     "accuracy": start_accuracy("ridge", train @ projection, labels,
                                                test @ projection, test_labels, k,
                                                ridge_lambda=0.2)})
    return {"dataset": dataset, "encoder": encoder, "num_classes": k, "num_features": d,
            "ceiling": ceiling(dataset, encoder), "starts": rows}


def aggregation_cost(cache_dir: Path, clients: int = 100) -> list[dict[str, Any]]:
    """The ridge start's set-up, plain and under SecAgg+, on the embedded default (no rounds)."""
    import tempfile

    from ovalp_flwr.federation.local_grid import run_local
    from ovalp_flwr.federation.results import read_summary

    rows = []
    for aggregation in AGGREGATIONS:
        with tempfile.TemporaryDirectory() as out:
            config = {"head-init": "ridge", "num-server-rounds": 0,
                      "statistics-aggregation": aggregation, "feature-cache-dir": str(cache_dir),
                      "results-dir": out, "run-name": aggregation}
            summary = read_summary(run_local(config, clients))
        setup = summary["setup"]
        per_client = summary["head_init"]["statistics_bytes_per_client"]
        rows.append({"aggregation": aggregation, "clients": clients,
                     "statistics_bytes_per_client": per_client,
                     "setup_bytes_received": setup["bytes_received"],
                     "setup_bytes_sent": setup["bytes_sent"], "messages": setup["messages"],
                     "seconds": setup["seconds"], "start_accuracy": summary["initial_accuracy"]})
    return rows


def aggregation_markdown(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["## Plain sums against SecAgg+ (digits / efficientnet-lite0, ridge start, "
             f"{rows[0]['clients']} clients in process)", "",
             "Set-up = describe, set_norm and, under SecAgg+, its four exchanges; bytes over all "
             "clients; seconds of this machine, all clients in one process.", "",
             "| aggregation | statistics kB per client | set-up MB up | set-up MB down | "
             "messages | set-up s | start accuracy (%) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['aggregation']} | {row['statistics_bytes_per_client'] / 1e3:.0f} | "
                     f"{row['setup_bytes_received'] / 1e6:.1f} | "
                     f"{row['setup_bytes_sent'] / 1e6:.2f} | {row['messages']} | "
                     f"{row['seconds']:.1f} | "
                     f"{100 * row['start_accuracy']:.2f} |")
    return [*lines, ""]


def markdown(cases: dict[str, Any], aggregation: list[dict[str, Any]], command: str) -> str:
    lines = ["# What a closed-form start buys for the bytes a client sends once", "",
             f"Made by `{command}`. Accuracy of the start alone (round 0) on the test split; "
             "bytes: one client's statistics, float32 on the wire; **bold**: at or above 95% of "
             "the dataset's centralised ceiling.", ""]
    for case in cases.values():
        bar = 0.95 * case["ceiling"]
        lines += [f"## {case['dataset']} / {case['encoder']} (K = {case['num_classes']}, "
                  f"D = {case['num_features']}; 95% of the ceiling: {100 * bar:.2f}%)", "",
                  "| start | kB per client | accuracy (%) |", "|---|---:|---:|"]
        for row in case["starts"]:
            accuracy = f"{100 * row['accuracy']:.2f}"
            lines.append(f"| {row['start']} | {row['bytes'] / 1e3:.0f} | "
                         f"{f'**{accuracy}**' if row['accuracy'] >= bar else accuracy} |")
        lines.append("")
    return "\n".join(lines + aggregation_markdown(aggregation))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", help=f"DATASET:ENCODER; default: {CASES}")
    parser.add_argument("--cache-dir", type=Path, default=Path("feature_cache"))
    args = parser.parse_args(argv)
    quiet_flower()
    torch.set_num_threads(2)
    cases = {case: run_case(case, args.cache_dir) for case in args.case or CASES}
    aggregation = aggregation_cost(args.cache_dir)
    command = " ".join(["python benchmarks/statistics_trade.py", *sys.argv[1:]])
    replace_durably(OUT.with_suffix(".json"), json.dumps(
        {"command": command, "cases": cases, "aggregation": aggregation}, indent=2) + "\n")
    replace_durably(OUT.with_suffix(".md"), markdown(cases, aggregation, command))
    print(OUT.with_suffix(".md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
