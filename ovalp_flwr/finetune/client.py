"""The encoder path's client side: what a node does with each message when `finetune` is set
(`ovalp_flwr.client` hands these messages over). The model, the method and the raw data are
built once per process; a node's rows go to its device once."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from ovalp_flwr import protocol as p
from ovalp_flwr.config import RunConfig
from ovalp_flwr.devices import resolve_device
from ovalp_flwr.encoders import load_encoder
from ovalp_flwr.finetune import make_method
from ovalp_flwr.finetune.base import FinetuneMethod
from ovalp_flwr.finetune.data import RawData, partitions, run_data
from ovalp_flwr.finetune.flora import FLoRA
from ovalp_flwr.finetune.model import EncoderClassifier, build_classifier
from ovalp_flwr.heads import loss_for
from ovalp_flwr.training import fit, gradient_offsets, shuffle_generator


@dataclass
class Setup:
    """One process's model (prepared by its method), the method and the raw data."""

    model: EncoderClassifier
    method: FinetuneMethod
    data: RawData
    rows: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


_SETUP: dict[tuple, Setup] = {}

# what a Setup is built from (the rest of the config only steers training)
SETUP_KEYS = ("dataset", "data-dir", "limit-per-class", "image-size", "encoder", "finetune",
              "lora-rank", "lora-alpha", "label-noise", "noise-rate", "seed", "device")


def setup(config: RunConfig) -> Setup:
    """Built once per process and run: a seeded model (heads and LoRA's A from `seed`), so the
    server's start is the same wherever it is built."""
    values = config.to_dict()
    key = tuple(values[k] for k in SETUP_KEYS)
    if key not in _SETUP:
        _SETUP.clear()
        device = resolve_device(config.device)
        encoder = load_encoder(config.encoder, device="cpu",
                               image_size=config.cache_options()["image_size"])
        data = run_data(config, getattr(encoder, "tokenize", None))
        method = make_method(config)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            model = method.prepare(build_classifier(encoder, data.num_classes, config.seed, device))
        _SETUP[key] = Setup(model, method, data)
    return _SETUP[key]


def node_partition(context: Context) -> tuple[int, int]:
    from ovalp_flwr.client import node_partition as of_node

    return of_node(context)


def node_rows(config: RunConfig, context: Context) -> tuple[torch.Tensor, torch.Tensor]:
    """This node's raw training rows on the model's device (the cached path's partition)."""
    built = setup(config)
    partition_id, num_partitions = node_partition(context)
    if (partition_id, num_partitions) not in built.rows:
        if not 0 <= partition_id < num_partitions:
            raise ValueError(f"partition-id={partition_id} is not allowed; use "
                             f"0..{num_partitions - 1}")
        rows = partitions(config, built.data, num_partitions)[partition_id]
        device = built.model.weight.device
        built.rows[partition_id, num_partitions] = (
            built.data.train.inputs[torch.from_numpy(rows)].to(device),
            torch.from_numpy(built.data.train.labels[rows]).to(device))
    return built.rows[partition_id, num_partitions]


def feature_space(config: RunConfig) -> str:
    """What every node must agree on: the raw data and the model it trains."""
    values = config.to_dict()
    return "raw|" + "|".join(str(values[k]) for k in SETUP_KEYS if k not in ("device", "data-dir"))


def describe(msg: Message, context: Context) -> Message:
    config = RunConfig.from_mapping(context.run_config)
    partition_id, num_partitions = node_partition(context)
    _, labels = node_rows(config, context)
    built = setup(config)
    rows = partitions(config, built.data, num_partitions)[partition_id]
    noisy = int(np.sum(built.data.train.labels[rows] != built.data.clean_train_labels[rows]))
    content = RecordDict({
        p.METRICS: MetricRecord({p.PARTITION_ID: partition_id, p.NUM_PARTITIONS: num_partitions,
                                 p.NUM_EXAMPLES: len(labels), p.NOISY_EXAMPLES: noisy,
                                 p.OWN_DATA: 0}),
        p.CONFIG: ConfigRecord({p.FEATURE_SPACE: feature_space(config)}),
    })
    return Message(content=content, reply_to=msg)


def train(msg: Message, context: Context) -> Message:
    """One local round through the encoder: the method's trainable tensors from the message
    (FLoRA: the stacks this node has not merged yet first), the run's local schedule, and only
    those tensors back."""
    from ovalp_flwr.client import local_schedule

    config = RunConfig.from_mapping(context.run_config)
    built = setup(config)
    model, method = built.model, built.method
    round_config = msg.content[p.CONFIG]
    partition_id, _ = node_partition(context)
    inputs, labels = node_rows(config, context)
    started = time.perf_counter()
    if isinstance(method, FLoRA):
        method.merge_pending(model, msg.content, context.state)
    arrays = p.from_record(msg.content[p.ARRAYS])
    method.load_trainable(model, arrays)
    loss, steps = float("nan"), 0
    if len(labels):
        correction = msg.content.array_records.get(p.CORRECTION)
        loss, steps = fit(
            model, [param for param in model.parameters() if param.requires_grad], inputs, labels,
            loss_for(config.head, int(round_config[p.STAGE])),
            local_schedule(config, round_config, len(labels)),
            shuffle_generator(config.seed, int(round_config["server-round"]), partition_id),
            gradient_offsets(model, None if correction is None else p.from_record(correction)))
        arrays = method.trainable_arrays(model)
    metrics = MetricRecord({p.NUM_EXAMPLES: len(labels), p.TRAIN_LOSS: 0.0 if not steps else loss,
                            p.TRAIN_SECONDS: time.perf_counter() - started, p.LOCAL_STEPS: steps})
    return Message(content=RecordDict({p.ARRAYS: p.to_record(arrays), p.METRICS: metrics}),
                   reply_to=msg)
