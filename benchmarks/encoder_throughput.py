"""Encoder throughput: the bare network vs a real cache build, same shapes, same settings.

For each case (encoder on dataset) it measures, in one process:
- bare: forward passes on random tensors of the shapes a cache build feeds the network
  (images: [B, 3, S, S] at the encoder's input size; texts: the [B, L] token batches the
  length-sorted build makes), after one warm-up batch;
- end to end: `cache.build_features` into a scratch folder, i.e. decode (load_dataset),
  preprocess and forward for both splits, with the cache's own timings;
and writes `benchmarks/results/encoder_throughput.{json,md}` with end-to-end / bare.

    .venv/bin/python benchmarks/encoder_throughput.py      # the two default cases (~3 min, 2 CPUs)
    .venv/bin/python benchmarks/encoder_throughput.py --case efficientnet-lite0@cifar10 \\
        --limit-per-class 200 --batch-size 128 --dtype bf16
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ovalp_flwr.features.cache import build_features
from ovalp_flwr.data.registry import load_dataset
from ovalp_flwr.features.encoders import DTYPES, Encoder, load_encoder

OUT = Path(__file__).resolve().parent / "results"
DEFAULT_CASES = ("efficientnet-lite0@cifar10", "minilm@ag-news")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def image_shapes(encoder: Any, n: int) -> list[tuple[int, ...]]:
    size = encoder.preprocess.image_size
    b = encoder.batch_size
    return [(min(b, n - i), 3, size, size) for i in range(0, n, b)]


def text_shapes(encoder: Any, texts: list[str]) -> list[tuple[int, ...]]:
    """The token batches encode_all forms: texts sorted by length, padded per batch."""
    ordered = sorted(texts, key=len)
    b = encoder.batch_size
    return [
        tuple(encoder.tokenize(ordered[i : i + b])["input_ids"].shape)
        for i in range(0, len(ordered), b)
    ]


def bare_forward(encoder: Any, shapes: list[tuple[int, ...]], max_batches: int) -> dict[str, Any]:
    """Random inputs of the given shapes through encoder.forward, made before the clock starts
    (one tensor per distinct shape); max_batches > 0 takes an evenly spread sample."""
    gen = torch.Generator().manual_seed(0)
    step = max(1, len(shapes) // max_batches) if max_batches > 0 else 1
    picked = shapes[::step][:max_batches] if max_batches > 0 else shapes
    inputs: dict[tuple[int, ...], tuple[torch.Tensor, ...]] = {}
    for shape in set(picked):
        if encoder.modality == "image":
            x = torch.rand(shape, generator=gen).mul_(2).sub_(1).to(encoder.device)
            inputs[shape] = (x.contiguous(memory_format=torch.channels_last),)
        else:
            ids = torch.randint(3, encoder.vocab_size, shape, generator=gen).to(encoder.device)
            inputs[shape] = (ids, torch.ones_like(ids))
    encoder.forward(*inputs[picked[0]]).cpu()  # warm-up (allocator, kernels), not timed
    _sync(encoder.device)
    start = time.perf_counter()
    for shape in picked:
        encoder.forward(*inputs[shape]).cpu()
    _sync(encoder.device)
    seconds = time.perf_counter() - start
    count = sum(s[0] for s in picked)
    return {
        "inputs": count,
        "batches": len(picked),
        "seconds": round(seconds, 3),
        "inputs_per_s": round(count / seconds, 1),
        "shapes": sorted({str(list(s)) for s in picked}),
    }


def preprocess_seconds(encoder: Any, data: Any) -> float:
    """Time of the input side alone (images: to tensor, resize, normalise; texts: tokenize),
    batched as a build batches them: what the forward pass does not account for."""
    if data.modality == "image":
        inputs: Any = np.concatenate([data.train.images, data.test.images])
    else:
        inputs = sorted([*data.train.texts, *data.test.texts], key=len)
    b = encoder.batch_size
    start = time.perf_counter()
    for i in range(0, len(inputs), b):
        encoder.prepare(inputs[i : i + b])
    _sync(encoder.device)
    return round(time.perf_counter() - start, 3)


def run_case(case: str, args: argparse.Namespace) -> dict[str, Any]:
    encoder_name, dataset = case.split("@", 1)
    options: dict[str, Any] = {"dtype": args.dtype}
    if args.image_size is not None:
        options["image_size"] = args.image_size
    data: Any = load_dataset(dataset, data_dir=args.data_dir, limit_per_class=args.limit_per_class)
    encoder: Encoder = load_encoder(
        encoder_name, device=args.device, batch_size=args.batch_size, **options
    )
    if data.modality == "text":
        inputs = [*data.train.texts, *data.test.texts]
        shapes = text_shapes(encoder, inputs)
    else:
        shapes = image_shapes(encoder, len(data.train.labels) + len(data.test.labels))
    bare = bare_forward(encoder, shapes, args.bare_batches)
    preprocess = preprocess_seconds(encoder, data)
    del encoder, data

    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        built = build_features(
            dataset,
            encoder_name,
            Path(scratch),
            limit_per_class=args.limit_per_class,
            data_dir=args.data_dir,
            device=args.device,
            batch_size=args.batch_size,
            progress=False,
            **options,
        )
        wall = time.perf_counter() - start
    build = built.manifest["build"]
    n = build["inputs"]
    decode_and_encode = build["load_seconds"] + build["encode_seconds"]
    end_to_end = n / decode_and_encode
    return {
        "case": case,
        "encoder": encoder_name,
        "dataset": dataset,
        "limit_per_class": args.limit_per_class,
        "unit": build["unit"],
        "inputs": n,
        "batch_size": args.batch_size,
        "dtype": args.dtype,
        "device": build["device"],
        "identity_preprocessing": built.manifest["encoder_identity"].get("preprocessing"),
        "bare": bare,
        "end_to_end": {
            "decode_seconds": build["load_seconds"],
            "preprocess_forward_seconds": build["encode_seconds"],
            "model_build_seconds": build["model_seconds"],
            "build_wall_seconds": round(wall, 2),
            "inputs_per_s": round(end_to_end, 1),
            "preprocess_forward_per_s": build["inputs_per_s"],
            "preprocess_only_seconds": preprocess,
        },
        "fraction_end_to_end_over_bare": round(end_to_end / bare["inputs_per_s"], 3),
        "fraction_preprocess_forward_over_bare": round(
            build["inputs_per_s"] / bare["inputs_per_s"], 3
        ),
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Encoder throughput: bare forward vs end-to-end cache build",
        "",
        f"Machine: {result['machine']}; torch {result['torch']}, {result['threads']} threads; "
        f"load average {result['load_before']} before, {result['load_after']} after.",
        f"Command: `{result['command']}`",
        "",
        "end to end = inputs / (decode + preprocess + forward), from the cache's own timings "
        "(model build and file writes excluded); bare = random tensors of the same batch shapes "
        "through the network only.",
        "",
        "| encoder | dataset | inputs | batch | dtype | device | bare /s | preprocess+forward /s "
        "| decode s | preprocess s | end to end /s | end-to-end / bare |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result["cases"]:
        e2e = c["end_to_end"]
        lines.append(
            f"| {c['encoder']} | {c['dataset']} (limit {c['limit_per_class']}) | {c['inputs']} "
            f"{c['unit']} | {c['batch_size']} | {c['dtype']} | {c['device']} | "
            f"{c['bare']['inputs_per_s']} | {e2e['preprocess_forward_per_s']} | "
            f"{e2e['decode_seconds']:.1f} | {e2e['preprocess_only_seconds']:.1f} | "
            f"{e2e['inputs_per_s']} | "
            f"{100 * c['fraction_end_to_end_over_bare']:.0f}% |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help="ENCODER@DATASET (repeatable)")
    parser.add_argument("--limit-per-class", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--bare-batches", type=int, default=0, help="timed bare batches (0: all)")
    parser.add_argument("--name", default="encoder_throughput", help="results file stem")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    load_before = [round(v, 2) for v in os.getloadavg()]
    cases = [run_case(case, args) for case in (args.case or DEFAULT_CASES)]
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs"
        + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ", no GPU"),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "load_before": load_before,
        "load_after": [round(v, 2) for v in os.getloadavg()],
        "command": " ".join([".venv/bin/python benchmarks/encoder_throughput.py", *sys.argv[1:]]),
        "cases": cases,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (OUT / f"{args.name}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
