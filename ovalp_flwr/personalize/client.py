"""A client's side of the personalization phase (`ovalp_flwr.personalize.phase`), for both paths:
fine-tune the global model with the method the server names and reply with the model, its Local
curve and snapshots, and the right predictions of the final and the global model on this client's
own test split (Local, when the server scores Global: `pft-global = "server"`); with
`pft-global = "clients"`, also score the models the server sends on that split. A path says what
a model is (the heads on features, or an encoder: `finetune.client`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from ovalp_flwr.core.heads import accuracy, loss_for
from ovalp_flwr.core.model import FeatureModel
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.node import node_partition
from ovalp_flwr.personalize.base import LocalData, Task
from ovalp_flwr.personalize.methods import make_personalizer
from ovalp_flwr.personalize.options import PersonalizeOptions
from ovalp_flwr.personalize.store import write_model


def personalization_reply(msg: Message, context: Context, config: PersonalizeOptions,
                          head: str, seed: int, global_model,
                          train_rows: tuple[torch.Tensor, torch.Tensor],
                          test_rows: tuple[torch.Tensor, torch.Tensor],
                          arrays_of: Callable[[FeatureModel], dict[str, np.ndarray]]) -> Message:
    """Run the requested method on `global_model` (the heads on features, or an encoder:
    `finetune.client`) and build the reply; `arrays_of(model)` is what of a model travels."""
    request = msg.content[p.CONFIG]
    method = str(request[p.METHOD])
    (features, labels), (test_x, test_y) = train_rows, test_rows
    curve: list[float] = []
    snapshots: dict[int, dict[str, np.ndarray]] = {}

    def on_epoch(epoch: int, model: FeatureModel) -> None:
        curve.append(accuracy(model, test_x, test_y) if len(test_y) else 0.0)
        if epoch in config.curve_epochs:
            snapshots[epoch] = arrays_of(model)

    personalizer = make_personalizer(method, config.personalizer_options(method))
    task = Task(loss_for(head, stage=2), pft_generator(seed, context), on_epoch)
    global_correct = right_predictions(global_model, test_x, test_y)  # before it is moved
    started = time.perf_counter()
    model = (personalizer.personalize(global_model, LocalData(features, labels), task)
             if len(labels) else global_model)  # nothing to fine-tune on: the global model
    seconds = time.perf_counter() - started
    arrays = arrays_of(model)
    saved = save_personalized(context, str(request.get(p.RUN_NAME, "")), method, arrays)
    content = RecordDict({
        p.ARRAYS: p.to_record(arrays),
        p.METRICS: MetricRecord({p.LOCAL_CURVE: curve, p.TRAIN_SECONDS: seconds,
                                 p.NUM_EXAMPLES: len(labels), p.NUM_TEST: len(test_y),
                                 p.OWN_CORRECT: right_predictions(model, test_x, test_y),
                                 p.GLOBAL_OWN_CORRECT: global_correct}),
        p.CONFIG: ConfigRecord({"saved": saved}),
    })
    for epoch, snapshot in snapshots.items():
        content[f"{p.SNAPSHOT_PREFIX}{epoch}"] = p.to_record(snapshot)
    return Message(content=content, reply_to=msg)


def right_predictions(model: FeatureModel, test_x: torch.Tensor, test_y: torch.Tensor) -> int:
    """Right predictions on these rows, counted as `score_reply` counts them (features, then
    the heads), so a client's Local is the same whoever scores Global."""
    if not len(test_y):
        return 0
    with torch.inference_mode():
        logits = F.linear(model.features(test_x), model.weight, model.bias)
        return int((logits.argmax(1) == test_y).sum())


def pft_generator(seed: int, context: Context) -> torch.Generator:
    """The PFT batch order, fixed by (run seed, partition): reruns are identical, and the
    round-indexed federated streams never repeat it."""
    partition_id, _ = node_partition(context)
    entropy = np.random.SeedSequence([seed, partition_id, 0x9F7]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(entropy))


def save_personalized(context: Context, run_name: str, method: str,
                      arrays: dict[str, np.ndarray]) -> str:
    """`<model-dir>/<run-name>/<method>.safetensors`, atomically, if the node config names a
    model dir (a deployed node keeps its model); returns the path, or "" when not kept."""
    model_dir = context.node_config.get("model-dir")
    if not model_dir:
        return ""
    path = Path(str(model_dir)).expanduser().resolve() / (run_name or "run") / f"{method}.safetensors"
    write_model(path, arrays, {"method": method, "run-name": run_name,
                               "partition-id": str(node_partition(context)[0])})
    return str(path)


def score_reply(msg: Message, test_rows: tuple[torch.Tensor, torch.Tensor],
                global_model: torch.nn.Module,
                model_of: Callable[[dict[str, np.ndarray]], AbstractContextManager]) -> Message:
    """Every model the server sent (`model_of(arrays)` gives it, for the time of its scoring),
    scored on this client's own test split: right predictions, and the summed L2 distance
    between its features and `global_model`'s (the study's feature distortion), so no test row
    leaves the client. A client without test rows scores every model 0."""
    test_x, test_y = test_rows
    metrics: dict[str, int | float] = {p.NUM_TEST: len(test_y)}
    with torch.inference_mode():
        global_features = global_model.features(test_x) if len(test_y) else None
        for key, record in msg.content.array_records.items():
            if not key.startswith(p.MODEL_PREFIX):
                continue
            name = key[len(p.MODEL_PREFIX):]
            correct, distance = 0, 0.0
            if len(test_y):
                with model_of(p.from_record(record)) as model:
                    features = model.features(test_x)
                    logits = F.linear(features, model.weight, model.bias)
                    correct = int((logits.argmax(1) == test_y).sum())
                    distance = float(torch.linalg.vector_norm(features - global_features,
                                                              dim=1).sum())
            metrics[p.CORRECT_PREFIX + name], metrics[p.DISTANCE_PREFIX + name] = correct, distance
    return Message(content=RecordDict({p.METRICS: MetricRecord(metrics)}), reply_to=msg)
