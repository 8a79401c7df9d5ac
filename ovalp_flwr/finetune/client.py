"""The encoder path's client side: what a node does with each message when `finetune` is set
(`client_app.py` chooses these handlers). The model, the method and the raw data are
built once per process; a node's rows go to its device once."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from ovalp_flwr.core.devices import resolve_device
from ovalp_flwr.core.heads import loss_for
from ovalp_flwr.core.training import fit, gradient_offsets, shuffle_generator
from ovalp_flwr.features.encoders import load_encoder
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.data.options import DataOptions
from ovalp_flwr.data.partition import PartitionSpec
from ovalp_flwr.federation.node import (local_schedule, local_test_split, node_data,
                                        node_partition, noise_spec, run_config)
from ovalp_flwr.federation.scaffold_client import drift_offset, reply_variate
from ovalp_flwr.finetune.methods import make_method
from ovalp_flwr.finetune.base import FinetuneMethod
from ovalp_flwr.finetune.data import RawData, partitions, run_data
from ovalp_flwr.finetune.flora import FLoRA
from ovalp_flwr.finetune.model import EncoderClassifier, build_classifier
from ovalp_flwr.finetune.options import FinetuneOptions
from ovalp_flwr.personalize.client import personalization_reply, score_reply


@dataclass
class Setup:
    """One process's model (prepared by its method), the method, the raw data, and the model's
    seeded trainable tensors: the model itself is trained and scored in place by in-process
    clients, so a second run in the same process must start from these, not from it."""

    model: EncoderClassifier
    method: FinetuneMethod
    data: RawData
    initial: dict[str, np.ndarray]
    rows: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    parts: dict[tuple, list[np.ndarray]] = field(default_factory=dict)

    def partitions(self, spec: PartitionSpec, num_partitions: int) -> list[np.ndarray]:
        """Every client's training rows (`finetune.data.partitions`), drawn once per partition
        scheme and client count: describe, the rows and the test split all need them."""
        if (spec, num_partitions) not in self.parts:
            self.parts[spec, num_partitions] = partitions(spec, self.data, num_partitions)
        return self.parts[spec, num_partitions]


_SETUP: dict[tuple, Setup] = {}


def _identity(data: DataOptions, finetuning: FinetuneOptions, seed: int) -> tuple:
    """What every node's Setup must agree on: the raw data and the model it trains (where the
    data lies and which device trains it may differ; the rest of the config steers training)."""
    return (data.dataset, data.limit_per_class, data.image_size, data.encoder,
            finetuning.finetune, finetuning.lora_rank, finetuning.lora_alpha, data.label_noise,
            data.noise_rate, seed)


def setup(data: DataOptions, finetuning: FinetuneOptions, seed: int,
          device: str = "auto") -> Setup:
    """Built once per process and run: a seeded model (heads and LoRA's A from `seed`), so the
    server's start is the same wherever it is built. `data.data_dir`: a node's own (its node
    config's `data-dir`, `node_setup`), else the run's."""
    key = (_identity(data, finetuning, seed), data.data_dir, device)
    if key not in _SETUP:
        _SETUP.clear()
        encoder = load_encoder(data.encoder, device="cpu",
                               image_size=data.cache_options()["image_size"])
        raw = run_data(data, noise_spec(data, seed), getattr(encoder, "tokenize", None))
        method = make_method(finetuning)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = method.prepare(build_classifier(encoder, raw.num_classes, seed,
                                                    resolve_device(device)))
        _SETUP[key] = Setup(model, method, raw, method.trainable_arrays(model))
    return _SETUP[key]


def node_setup(context: Context) -> Setup:
    """The node's setup: on its own data if its node config names a `data-dir`."""
    config = run_config(context)
    own = context.node_config.get("data-dir")
    data = config.data if own is None else dataclasses.replace(config.data, data_dir=str(own))
    return setup(data, config.finetuning, config.seed, config.device)


def _node_partition(context: Context) -> tuple[Setup, np.ndarray]:
    """The node's setup and its training rows, indices of the raw training split."""
    built = node_setup(context)
    partition_id, num_partitions = node_partition(context)
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id={partition_id} is not allowed; use 0..{num_partitions - 1}")
    spec = node_data(run_config(context)).spec
    return built, built.partitions(spec, num_partitions)[partition_id]


def node_rows(context: Context) -> tuple[torch.Tensor, torch.Tensor]:
    """This node's raw training rows on the model's device (the cached path's partition)."""
    built, rows = _node_partition(context)
    key = node_partition(context)
    if key not in built.rows:
        device = built.model.weight.device
        built.rows[key] = (built.data.train.inputs[torch.from_numpy(rows)].to(device),
                           torch.from_numpy(built.data.train.labels[rows]).to(device))
    return built.rows[key]


def feature_space(data: DataOptions, finetuning: FinetuneOptions, seed: int) -> str:
    """What every node must agree on (`_identity`), as the run's features are named."""
    return "raw|" + "|".join(map(str, _identity(data, finetuning, seed)))


def describe(msg: Message, context: Context) -> Message:
    config = run_config(context)
    partition_id, num_partitions = node_partition(context)
    _, labels = node_rows(context)
    built, rows = _node_partition(context)
    noisy = int(np.sum(built.data.train.labels[rows] != built.data.clean_train_labels[rows]))
    content = RecordDict({
        p.METRICS: MetricRecord({p.PARTITION_ID: partition_id, p.NUM_PARTITIONS: num_partitions,
                                 p.NUM_EXAMPLES: len(labels), p.NOISY_EXAMPLES: noisy,
                                 p.OWN_DATA: int("data-dir" in context.node_config)}),
        p.CONFIG: ConfigRecord({p.FEATURE_SPACE: feature_space(config.data, config.finetuning,
                                                               config.seed)}),
    })
    return Message(content=content, reply_to=msg)


def train(msg: Message, context: Context) -> Message:
    """One local round through the encoder: the method's trainable tensors from the message
    (FLoRA: the stacks this node has not merged yet first), the run's local schedule, and only
    those tensors back."""
    config = run_config(context)
    built = node_setup(context)
    model, method = built.model, built.method
    round_config = msg.content[p.CONFIG]
    partition_id, _ = node_partition(context)
    inputs, labels = node_rows(context)
    started = time.perf_counter()
    state_updates = (method.merge_pending(model, msg.content, context.state)
                     if isinstance(method, FLoRA) else {})
    arrays = p.from_record(msg.content[p.ARRAYS])
    method.load_trainable(model, arrays)
    loss, steps, variate = float("nan"), 0, None
    if len(labels):
        offset = drift_offset(msg, context)
        loss, steps = fit(
            model, [param for param in model.parameters() if param.requires_grad], inputs, labels,
            loss_for(config.head, int(round_config[p.STAGE])),
            local_schedule(config.training, round_config, len(labels)),
            shuffle_generator(config.seed, int(round_config["server-round"]), partition_id),
            gradient_offsets(model, offset))
        arrays = method.trainable_arrays(model)
        variate = reply_variate(config.rounds, config.learning_rate, context, msg, arrays, steps,
                                offset)
    for key, record in state_updates.items():  # the round went through: keep what it merged
        context.state[key] = record
    metrics = MetricRecord({p.NUM_EXAMPLES: len(labels), p.TRAIN_LOSS: 0.0 if not steps else loss,
                            p.TRAIN_SECONDS: time.perf_counter() - started, p.LOCAL_STEPS: steps})
    content = RecordDict({p.ARRAYS: p.to_record(arrays), p.METRICS: metrics})
    if variate is not None:
        content[p.VARIATE] = variate
    return Message(content=content, reply_to=msg)


# ------------------------------------------------------------------ personalization (PFT)
# The phase is the cached path's (`ovalp_flwr.personalize.phase`); what differs is what a model
# is: the global trainable tensors, plus whatever a method moved (FT moves the whole encoder
# even after LoRA or linear probing), and nothing else travels.


def node_test_rows(context: Context) -> tuple[torch.Tensor, torch.Tensor]:
    """This client's own test split, drawn as on the cached path (`node.local_test_split`)."""
    built, rows = _node_partition(context)
    partition_id, num_partitions = node_partition(context)
    key = (-1 - partition_id, num_partitions)  # beside the training rows in `rows`
    if key not in built.rows:
        data = built.data
        order = np.arange(len(data.test.labels))
        picked, labels = local_test_split(
            data.train.labels[rows], data.test.labels, np.bincount(data.train.domains),
            np.random.default_rng([run_config(context).seed, partition_id, 0x7E57]), order,
            data.train.domains[rows], data.test.domains)
        device = built.model.weight.device
        built.rows[key] = (data.test.inputs[torch.from_numpy(picked)].to(device),
                           torch.from_numpy(labels).to(device))
    return built.rows[key]


def moved_arrays(model: EncoderClassifier, reference: dict[str, torch.Tensor],
                 method: FinetuneMethod) -> dict[str, np.ndarray]:
    """The method's trainable tensors and every other parameter that differs from `reference`."""
    trainable = set(method.trainable_arrays(model))
    return {name: param.detach().cpu().numpy().copy() for name, param in model.named_parameters()
            if name in trainable or not torch.equal(param, reference[name])}


def load_parameters(model: EncoderClassifier, arrays: dict[str, np.ndarray]) -> None:
    params = dict(model.named_parameters())
    unknown = sorted(set(arrays) - set(params))
    if unknown:
        raise ValueError(f"a model's arrays name {unknown[:3]}, not parameters of this model")
    with torch.no_grad():
        for name, value in arrays.items():
            params[name].copy_(torch.as_tensor(value))


def personalize(msg: Message, context: Context) -> Message:
    """The cached path's `personalize`, through the encoder: what travels of a personalized
    model is `moved_arrays`."""
    config = run_config(context)
    built = node_setup(context)
    built.method.load_trainable(built.model, p.from_record(msg.content[p.ARRAYS]))
    reference = {n: q.detach().clone() for n, q in built.model.named_parameters()}
    return personalization_reply(
        msg, context, config.personalization, config.head, config.seed, built.model,
        node_rows(context),
        node_test_rows(context),
        lambda model: moved_arrays(model, reference, built.method))


def score_personalized(msg: Message, context: Context) -> Message:
    """Score every model the server sent on this client's test split
    (`personalize.client.score_reply`): each is the global model with its own tensors loaded
    over it, and back after its scoring."""
    built = node_setup(context)
    model = built.model
    built.method.load_trainable(model, p.from_record(msg.content[p.ARRAYS]))
    reference = {n: q.detach().clone() for n, q in model.named_parameters()}

    @contextmanager
    def model_of(arrays: dict[str, np.ndarray]) -> Iterator[EncoderClassifier]:
        load_parameters(model, arrays)
        try:
            yield model
        finally:
            load_parameters(model, {n: reference[n] for n in arrays})

    return score_reply(msg, node_test_rows(context), model, model_of)
