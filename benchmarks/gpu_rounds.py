"""Seconds per round on the device at hand (CUDA if present, else CPU): OvA-LP's client round
and server aggregation at the paper's size, and a LoRA client round through an encoder.

The paper reports 14 ms per client round and 1.9 ms of server aggregation for OvA-LP with
d = 1024 features, K = 100 classes and 500 samples per client. Here, on synthetic features
(a GPU machine gets the repository, not the datasets):
- client: `training.train_local`, the product's local round, at the paper's recipe (AdamW,
  3 epochs, batch 50) and at our default (SGD, the same steps);
- server: FedAvg of `--clients` such replies (the staged strategy's own aggregation);
- encoder rounds: one FedAvg-LoRA and one full fine-tuning client round (`finetune`) of 500
  synthetic images through EfficientNet-Lite0 (random init: the speed does not depend on the
  weights) at 128 px, one epoch, batch 50.
Each is timed `--repeats` times after a warm-up, with the device synchronised; the medians
go to benchmarks/results/gpu_rounds_<device>.{json,md}.

    python benchmarks/gpu_rounds.py                 # ~1 min on a GPU, a few on 2 CPU cores
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from ovalp_flwr.core.training import LocalSchedule, shuffle_generator, train_local

OUT = Path(__file__).resolve().parent / "results"


def timed(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of `fn()` after one warm-up call."""
    fn()
    seconds = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def client_round(device: torch.device, dim: int, classes: int, samples: int, repeats: int,
                 schedule: LocalSchedule) -> float:
    rng = np.random.default_rng(0)
    features = torch.from_numpy(rng.standard_normal((samples, dim), dtype=np.float32)).to(device)
    labels = torch.from_numpy(rng.integers(0, classes, samples)).to(device)
    arrays = {"weight": np.zeros((classes, dim), np.float32), "bias": np.zeros(classes, np.float32)}
    return timed(lambda: train_local(arrays, features, labels, head_type="ova", stage=2,
                                     schedule=schedule, generator=shuffle_generator(0, 1, 0)),
                 device, repeats)


def server_aggregation(dim: int, classes: int, clients: int, repeats: int) -> float:
    """The staged FedAvg over `clients` replies (on the server's CPU, as Flower aggregates)."""
    from flwr.app import Message, MetricRecord, RecordDict

    from client_app import app as client_app
    from ovalp_flwr.federation import protocol as p
    from ovalp_flwr.federation.local_grid import InProcessGrid, app_config
    from ovalp_flwr.federation.strategy import StagedFedAvg

    InProcessGrid(client_app, 1, app_config())  # sets the task identity messages need
    rng = np.random.default_rng(0)
    replies = []
    for node in range(clients):
        arrays = {"weight": rng.standard_normal((classes, dim), dtype=np.float32),
                  "bias": rng.standard_normal(classes, dtype=np.float32)}
        content = RecordDict({p.ARRAYS: p.to_record(arrays), p.METRICS: MetricRecord({
            p.NUM_EXAMPLES: 500, p.TRAIN_LOSS: 0.1, p.TRAIN_SECONDS: 0.01, p.LOCAL_STEPS: 30})})
        sent = Message(content=content, message_type="train", dst_node_id=node + 1)
        replies.append(Message(content=content, reply_to=sent))
    strategy = StagedFedAvg(stage_for_round=lambda r: 2, seed=0)
    return timed(lambda: strategy.aggregate_train(1, replies), torch.device("cpu"), repeats)


def weighted_mean(dim: int, classes: int, clients: int, repeats: int) -> float:
    """The arithmetic alone: a sample-weighted mean of `clients` float32 heads in NumPy (what
    the staged FedAvg adds to it is Flower's record handling: each reply's arrays are
    deserialized from bytes, once for the screen and once for the average)."""
    rng = np.random.default_rng(0)
    heads = rng.standard_normal((clients, classes * dim + classes), dtype=np.float32)
    weights = np.full(clients, 1.0 / clients, np.float32)  # float32, as the heads
    return timed(lambda: weights @ heads, torch.device("cpu"), repeats)


def encoder_round(method_name: str, device: torch.device, samples: int, repeats: int,
                  image_size: int) -> float | str:
    """One client round of a fine-tuning baseline (`fedavg-lora` or `full`) through Lite0 on
    synthetic images: softmax loss, AdamW, one epoch in batches of 50."""
    try:
        from ovalp_flwr.config import RunConfig
        from ovalp_flwr.features.encoders import load_encoder
        from ovalp_flwr.finetune.methods import make_method
        from ovalp_flwr.finetune.model import build_classifier
        from ovalp_flwr.core.heads import loss_for
        from ovalp_flwr.core.training import fit
    except ImportError as err:  # a machine without timm/peft still times the heads
        return f"skipped: {err}"
    encoder = load_encoder("efficientnet-lite0", device="cpu", image_size=image_size,
                           pretrained=False)
    method = make_method(RunConfig(finetune=method_name).finetuning)
    model = method.prepare(build_classifier(encoder, 10, 0, device))
    rng = np.random.default_rng(0)
    images = torch.from_numpy(rng.integers(0, 256, (samples, 32, 32, 3), dtype=np.uint8)).to(device)
    labels = torch.from_numpy(rng.integers(0, 10, samples)).to(device)
    params = [q for q in model.parameters() if q.requires_grad]
    schedule = LocalSchedule(epochs=1, batch_size=50, learning_rate=1e-3, optimizer="adamw")
    return timed(lambda: fit(model, params, images, labels, loss_for("softmax", 2), schedule,
                             shuffle_generator(0, 1, 0)), device, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--image-size", type=int, default=128)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    recipe = LocalSchedule(epochs=3, batch_size=50, learning_rate=0.01, optimizer="adamw")
    ours = LocalSchedule(epochs=3, batch_size=50, learning_rate=0.05, weight_decay=0.01,
                         optimizer="sgd")
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor()
        or "cpu",
        "torch": torch.__version__, "threads": torch.get_num_threads(), **vars(args),
        "client_round_seconds_adamw": client_round(device, args.dim, args.classes, args.samples,
                                                   args.repeats, recipe),
        "client_round_seconds_sgd": client_round(device, args.dim, args.classes, args.samples,
                                                 args.repeats, ours),
        "server_aggregation_seconds": server_aggregation(args.dim, args.classes, args.clients,
                                                         max(3, args.repeats // 4)),
        "server_weighted_mean_seconds": weighted_mean(args.dim, args.classes, args.clients,
                                                      args.repeats),
        "lora_client_round_seconds": encoder_round("fedavg-lora", device, args.samples,
                                                   max(2, args.repeats // 10), args.image_size),
        "full_client_round_seconds": encoder_round("full", device, args.samples,
                                                   max(2, args.repeats // 10), args.image_size),
        "paper": {"client_round_seconds": 0.014, "server_aggregation_seconds": 0.0019},
    }
    OUT.mkdir(exist_ok=True)
    stem = OUT / f"gpu_rounds_{device.type}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    fmt = lambda v: f"{1e3 * v:.1f} ms" if isinstance(v, float) else v  # noqa: E731
    lines = [f"# Seconds per round on {result['device']} (torch {result['torch']})", "",
             "From `python benchmarks/gpu_rounds.py`; medians after a warm-up.", "",
             "| what | here | paper |", "|---|---|---|",
             f"| OvA-LP client round, AdamW 3 epochs (d={args.dim}, K={args.classes}, "
             f"{args.samples} samples) | {fmt(result['client_round_seconds_adamw'])} | 14 ms |",
             f"| OvA-LP client round, SGD 3 epochs (ours) | "
             f"{fmt(result['client_round_seconds_sgd'])} | - |",
             f"| server FedAvg of {args.clients} replies | "
             f"{fmt(result['server_aggregation_seconds'])} | 1.9 ms |",
             f"| of which the weighted mean alone (NumPy, {args.clients} heads) | "
             f"{fmt(result['server_weighted_mean_seconds'])} | - |",
             f"| FedAvg-LoRA client round, Lite0 at {args.image_size} px, {args.samples} images, "
             f"1 epoch | {fmt(result['lora_client_round_seconds'])} | - |",
             f"| full fine-tuning client round, the same | "
             f"{fmt(result['full_client_round_seconds'])} | - |", ""]
    stem.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
