"""Feature geometry of a pretrained vs a randomly initialised encoder (OvA-LP Sec. 3.2).

The paper argues pretrained features suit one-vs-all heads because classes are compact and
well separated. This measures that on our own encoders: the same architecture with its
pretrained weights and with a seeded random init (`pretrained=False`), on the same images,
with the metrics of `ovalp_flwr.experiments.geometry` (definitions in its docstring), both on the raw
features and after the `standardize` feature-norm the runs use by default (global mean/std of
the training split, as the federated statistics would give). Writes
`benchmarks/results/<name>.{json,md}`:

    .venv/bin/python benchmarks/feature_geometry.py      # cifar10, 100 per class (~2 min, 2 CPUs)
    .venv/bin/python benchmarks/feature_geometry.py --dataset cifar10 tinyimagenet-100@30  # +5 min
    .venv/bin/python benchmarks/feature_geometry.py --limit-per-class 0   # full datasets

Caches come from `cache.load_or_build`, so a second run encodes nothing; a random-init cache
sits beside the pretrained one under its own name (`...@random`). With a limit, the pretrained
full cache, when already present, is measured too (free), to show how far the subsample moves
the numbers.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ovalp_flwr.features.cache import CachedFeatures, cache_path, load_features, load_or_build
from ovalp_flwr.experiments.geometry import DEFAULT_PAIRS, METRICS, feature_geometry
from ovalp_flwr.core.normalize import FeatureMoments, NormStats, normalize

OUT = Path(__file__).resolve().parent / "results"
VIEWS = ("raw", "standardize")


def parse_case(text: str, default_limit: int) -> tuple[str, int | None]:
    """`DATASET` or `DATASET@N` -> (dataset, limit per class; None = full, as 0 means)."""
    name, _, limit = text.partition("@")
    n = int(limit) if limit else default_limit
    if n < 0:
        raise SystemExit(f"error: limit per class must be >= 0 (0 = full); got {text!r}")
    return name, (n or None)


def views(cache: CachedFeatures, split: str) -> dict[str, np.ndarray]:
    """The split's features raw and as the runs see them under feature-norm=standardize."""
    stats = NormStats.from_moments(FeatureMoments.of(cache.train.x))
    x = getattr(cache, split).x
    return {"raw": x, "standardize": normalize("standardize", x, stats)}


def load_one(
    dataset: str, limit: int | None, pretrained: bool, args: argparse.Namespace
) -> tuple[CachedFeatures, dict[str, Any]]:
    """load_or_build one cache; says whether it was built now and how long the build took."""
    cache_dir = args.cache_dir  # a random-init cache has its own folder (`@random`)
    existed = cache_path(cache_dir, dataset, args.encoder, limit, pretrained=pretrained).exists()
    start = time.perf_counter()
    cache = load_or_build(
        dataset,
        args.encoder,
        cache_dir,
        limit_per_class=limit,
        data_dir=args.data_dir,
        device=args.device,
        batch_size=args.batch_size,
        progress=False,
        pretrained=pretrained,
    )
    info = {
        "cache": str(cache_path(cache_dir, dataset, args.encoder, limit, pretrained=pretrained)),
        "built_now": not existed,
        "seconds": round(time.perf_counter() - start, 1),
        "encoder_weights": cache.manifest["encoder_identity"]["weights"],
    }
    return cache, info


def measure(
    cache: CachedFeatures, split: str, args: argparse.Namespace
) -> dict[str, dict[str, float | int]]:
    """Metrics per feature view."""
    return {
        view: feature_geometry(
            x, getattr(cache, split).y, num_classes=cache.num_classes, pairs=args.pairs,
            seed=args.seed,
        ).as_dict()
        for view, x in views(cache, split).items()
    }


def run_dataset(dataset: str, limit: int | None, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Rows for one dataset: pretrained, random init and, if free, the full pretrained cache."""
    rows = []
    for weights, pretrained in (("pretrained", True), ("random-init", False)):
        cache, info = load_one(dataset, limit, pretrained, args)
        rows.append(_row(dataset, limit, weights, cache, info, args))
    full = cache_path(args.cache_dir, dataset, args.encoder)
    if limit is not None and full.exists():
        cache = load_features(dataset, args.encoder, args.cache_dir)
        info = {"cache": str(full), "built_now": False, "seconds": 0.0,
                "encoder_weights": cache.manifest["encoder_identity"]["weights"]}
        rows.append(_row(dataset, None, "pretrained (full cache)", cache, info, args))
    return rows


def _row(
    dataset: str,
    limit: int | None,
    weights: str,
    cache: CachedFeatures,
    info: dict[str, Any],
    args: argparse.Namespace,
) -> dict[str, Any]:
    return {"dataset": dataset, "limit_per_class": limit, "weights": weights,
            "split": args.split, **info, "metrics": measure(cache, args.split, args)}


def _fmt(value: float) -> str:
    return "inf" if value == float("inf") else f"{value:.3f}"


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# Feature geometry: pretrained vs random-init {result['encoder']}",
        "",
        f"Machine: {result['machine']}; load average {result['load_before']} before, "
        f"{result['load_after']} after.",
        f"Command: `{result['command']}`",
        "",
        f"Split: {result['split']}. Definitions: `ovalp_flwr/experiments/geometry.py` (all on L2-normalised "
        "rows, classes weighted equally). alignment: mean ||z - z'||^2 over same-class pairs "
        "(lower = tighter); intra: leave-one-out cosine to the own class-mean direction "
        "(higher = tighter); inter: mean cosine between class-mean directions (lower = more "
        "separated; after centring it sits near -1/(K-1) whatever the encoder); "
        "ratio = (1 - inter) / (1 - intra) (1 = isotropic random directions, higher = better); "
        "uniformity: log E exp(-2 ||z - z'||^2) over "
        f"{result['pairs']} sampled pairs, seed {result['seed']} (lower = more spread out). "
        "features: raw = the encoder output; standardize = after feature-norm=standardize "
        "(training-split mean/std, the runs' default), then L2-normalised by the metrics.",
        "",
        "| dataset | per class | features | weights | N | " + " | ".join(METRICS) + " |",
        "|---|---|---|---|---|" + "---|" * len(METRICS),
    ]
    for view in VIEWS:
        for r in result["rows"]:
            m = r["metrics"][view]
            per_class = "full" if r["limit_per_class"] is None else r["limit_per_class"]
            values = " | ".join(_fmt(m[k]) for k in METRICS)
            lines.append(f"| {r['dataset']} | {per_class} | {view} | {r['weights']} | "
                         f"{m['num_samples']} | {values} |")
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", nargs="+", default=["cifar10"],
                        help="DATASET or DATASET@N (N per class overrides --limit-per-class)")
    parser.add_argument("--encoder", default="efficientnet-lite0")
    parser.add_argument("--limit-per-class", type=int, default=100, help="0: the full dataset")
    parser.add_argument("--split", choices=["train", "test"], default="train")
    parser.add_argument("--pairs", type=int, default=DEFAULT_PAIRS, help="uniformity pairs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", type=Path, default=Path("feature_cache"))
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--name", default="feature_geometry", help="results file stem")
    return parser


def main() -> None:
    args = _parser().parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    load_before = [round(v, 2) for v in os.getloadavg()]
    cases = [parse_case(text, args.limit_per_class) for text in args.dataset]
    rows = [row for dataset, limit in cases for row in run_dataset(dataset, limit, args)]
    result = {
        "encoder": args.encoder,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "load_before": load_before,
        "load_after": [round(v, 2) for v in os.getloadavg()],
        "command": " ".join([".venv/bin/python benchmarks/feature_geometry.py", *sys.argv[1:]]),
        "split": args.split,
        "pairs": args.pairs,
        "seed": args.seed,
        "rows": rows,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (OUT / f"{args.name}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
