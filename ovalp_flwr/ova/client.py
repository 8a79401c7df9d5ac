"""The cached-feature path's client: what a node does with each message when `finetune = "none"`
(`client_app.py` registers these, or the encoder path's `finetune.client`).

The client's features are loaded and normalised once per process and kept on its
device; a round is then a few SGD (or AdamW) steps on a slice of memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.compat.common import recorddict_compat as compat

from ovalp_flwr.core.devices import one_cpu_thread, resolve_device
from ovalp_flwr.core.head_init.statistics import KINDS, ClassStatistics
from ovalp_flwr.core.heads import FullBatchGradient, accuracy, full_batch_gradient, loss_for
from ovalp_flwr.core.model import FeatureModel, model_from_numpy, model_to_numpy
from ovalp_flwr.core.normalize import NEEDS_STATS, FeatureMoments, NormStats, normalize, per_sample
from ovalp_flwr.core.training import shuffle_generator, train_local
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.adversary import attack
from ovalp_flwr.federation.attacks import attack_of
from ovalp_flwr.federation.privacy import clip_rows, statistics_noise, statistics_noise_share
from ovalp_flwr.federation.node import (NodeData, NodeRows, local_schedule, node_data,
                                        node_partition, node_rows, node_test_rows,
                                        node_validation_rows, run_config)
from ovalp_flwr.federation.scaffold_client import drift_offset, reply_variate
from ovalp_flwr.personalize.client import personalization_reply, score_reply
from ovalp_flwr.privacy.options import PrivacyOptions

# run -> partition id -> (features, labels). One run's rows at a time: a process that serves
# many runs (a sweep in process, a Ray worker) would otherwise keep a training split per run.
_ON_DEVICE: dict[tuple, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}


def describe(msg: Message, context: Context) -> Message:
    """Who this client is, how many samples it has, which feature space its cache is in, and
    (if the normalisation needs them) its feature moments. A node with its own data builds its
    cache here, on the run's first message. If the server asks (a start from statistics under a
    normalisation that needs no global statistics), its class statistics too."""
    config = run_config(context)
    partition_id, num_partitions = node_partition(context)
    data = node_data(config, context.node_config)
    rows = node_rows(data, partition_id, num_partitions)
    content = RecordDict({
        p.METRICS: MetricRecord({
            p.PARTITION_ID: partition_id, p.NUM_PARTITIONS: num_partitions,
            p.NUM_EXAMPLES: len(rows.labels), p.NOISY_EXAMPLES: rows.noisy,
            p.OWN_DATA: int(data.source.own_data),
        }),
        p.CONFIG: ConfigRecord({p.FEATURE_SPACE: rows.feature_space}),
    })
    if NEEDS_STATS[config.feature_norm] and len(rows.labels):
        moments = FeatureMoments.of(per_sample(config.feature_norm, rows.features))
        content[p.MOMENTS] = p.to_record({"sum": moments.total, "sum-sq": moments.total_sq})
    _add_statistics(content, config.privacy, context, msg.content[p.CONFIG], digest="")
    return Message(content=content, reply_to=msg)


def set_norm(msg: Message, context: Context) -> Message:
    """Keep the global statistics in the node's state for the rest of the run; send the class
    statistics of the normalised features if the server asks for them."""
    context.state[p.NORM_STATE] = msg.content[p.NORM]
    content = RecordDict({p.METRICS: MetricRecord({"stored": 1})})
    request = msg.content.config_records.get(p.CONFIG, ConfigRecord())
    digest = NormStats(**p.from_record(msg.content[p.NORM])).digest()
    _add_statistics(content, run_config(context).privacy, context, request, digest)
    return Message(content=content, reply_to=msg)


def _add_statistics(content: RecordDict, privacy: PrivacyOptions, context: Context,
                    request: Mapping, digest: str) -> None:
    """The class statistics, if asked for; a client without data sends none."""
    stats = client_statistics(privacy, context, request, digest)
    if stats is not None and stats.num_samples:
        content[p.STATISTICS] = p.to_record(stats.to_arrays())


def client_statistics(privacy: PrivacyOptions, context: Context, request: Mapping,
                      digest: str) -> ClassStatistics | None:
    """Per-class counts and sums of the normalised features (and their Gram matrix) the
    server's request asks for; None if it asks for none."""
    kind = str(request.get(p.STATISTICS_KIND, "none"))
    if kind not in KINDS:
        raise ValueError(f"{p.STATISTICS_KIND}={kind!r} is not allowed; the server asks for one "
                         f"of: {', '.join(KINDS)}")
    if kind == "none":
        return None
    features, labels = _device_rows(context, digest)
    if privacy.dp_statistics_epsilon > 0:  # the server's noise covers one clipped example
        features = clip_rows(features, privacy.dp_feature_clip)
    rank = int(request[p.GRAM_RANK]) if kind == "low-rank" else None
    return ClassStatistics.of(features, labels, int(request[p.NUM_CLASSES]), kind == "gram", rank)


def one_thread_mod(msg: Message, context: Context, call_next) -> Message:
    """A ClientApp mod: this path's handlers on one CPU thread. Heads are tiny: with 2 intra-op
    threads a 3-step round took 15 ms, with one 2.5 ms (thread sync dominates); a Ray client
    holds one CPU anyway. Only while a message is handled, and not on the encoder path."""
    config = run_config(context)
    if config.finetune != "none" or resolve_device(config.device).type != "cpu":
        return call_next(msg, context)
    with one_cpu_thread():
        return call_next(msg, context)


def secure_statistics_mod(msg: Message, context: Context, call_next) -> Message:
    """A ClientApp mod: the `train` messages of Flower's SecAgg+ workflow (server half:
    `ovalp_flwr.federation.secure_sum`) go through Flower's `secaggplus_mod`, which masks the statistics
    `_statistics_fitres` returns; every other message goes on to the handlers untouched."""
    if msg.metadata.message_type != "train" or p.SECAGG_CONFIGS not in msg.content.config_records:
        return call_next(msg, context)
    return secaggplus_mod(msg, context, _statistics_fitres)


def _statistics_fitres(msg: Message, context: Context) -> Message:
    """The requested statistics per sample (or, for the server's L-BFGS, the full-batch gradient
    at the heads sent), as the legacy FitRes that SecAgg+ masks; a client whose vector exceeds
    the clipping range refuses instead of being clipped."""
    fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    request, config = fitins.config, run_config(context)
    digest = str(request.get(p.NORM_DIGEST, ""))
    if request.get(p.GRADIENT):
        features, labels = _device_rows(context, digest)
        weight, bias = parameters_to_ndarrays(fitins.parameters)
        vector = (full_batch_gradient(weight, bias, features, labels, config.head) if len(labels)
                  else FullBatchGradient.empty(*weight.shape)).to_vector()
        what, examples = "gradient entry", len(labels)
    else:
        stats = client_statistics(config.privacy, context, request, digest)
        examples = stats.num_samples
        if p.NOISE_SHARES in request and examples:  # distributed DP: this client's share
            stats = statistics_noise_share(stats, statistics_noise(config.privacy),
                                           config.dp_feature_clip, int(request[p.NOISE_SHARES]))
        vector, what = stats.per_sample_vector(examples), "per-sample statistic"
    limit = float(request[p.CLIPPING_RANGE])
    if np.abs(vector).max(initial=0.0) > limit:
        raise ValueError(f"a {what} of this client is {np.abs(vector).max():.4g}, outside "
                         f"SecAgg+'s clipping range ±{limit:g}; use statistics-aggregation='plain'")
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([vector]), examples, {})
    return Message(content=compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=msg)


def train(msg: Message, context: Context) -> Message:
    """One local round at the stage the server sent."""
    config = run_config(context)
    round_config = msg.content[p.CONFIG]
    server_round = int(round_config["server-round"])
    partition_id, _ = node_partition(context)
    features, labels = _device_rows(context, str(round_config.get(p.NORM_DIGEST, "")))
    if (kind := attack_of(context)) is not None:  # an attack rehearsal (`federation.adversary`)
        labels = attack(kind).labels(labels, _num_heads(msg))
    if round_config.get(p.GRADIENT):
        return _gradient_reply(msg, config.head, features, labels)
    offset = drift_offset(msg, context)
    result = train_local(
        p.from_record(msg.content[p.ARRAYS]), features, labels,
        head_type=config.head,
        stage=int(round_config[p.STAGE]),
        schedule=local_schedule(config.training, round_config, len(labels)),
        generator=shuffle_generator(config.seed, server_round, partition_id),
        gradient_offset=offset,
        activation=config.adapter_activation,
    )
    metrics = MetricRecord({
        p.NUM_EXAMPLES: result.num_examples,
        p.TRAIN_LOSS: 0.0 if result.num_examples == 0 else result.mean_loss,
        p.TRAIN_SECONDS: result.seconds,
        p.LOCAL_STEPS: result.steps,
    })
    content = RecordDict({p.ARRAYS: p.to_record(result.arrays), p.METRICS: metrics})
    variate = reply_variate(config.rounds, config.learning_rate, context, msg, result.arrays,
                            result.steps, offset)
    if variate is not None:
        content[p.VARIATE] = variate
    return Message(content=content, reply_to=msg)


def _num_heads(msg: Message) -> int:
    """K, from the heads the server sent (their bias)."""
    return len(msg.content[p.ARRAYS]["bias"].numpy())


def _gradient_reply(msg: Message, head: str, features: torch.Tensor,
                    labels: torch.Tensor) -> Message:
    """For a server-side optimiser (`server-optimizer = "lbfgs"`): the loss, its gradient and the
    heads' mean curvature on all this client's rows at the heads sent, as means (the server
    weights them by sample count: their mean is the centralised gradient, exactly)."""
    started = time.perf_counter()
    arrays = p.from_record(msg.content[p.ARRAYS])
    result = (full_batch_gradient(arrays["weight"], arrays["bias"], features, labels, head)
              if len(labels) else FullBatchGradient.empty(*arrays["weight"].shape))
    metrics = MetricRecord({p.NUM_EXAMPLES: len(labels), p.TRAIN_LOSS: result.loss,
                            p.TRAIN_SECONDS: time.perf_counter() - started, p.LOCAL_STEPS: 0,
                            p.CURVATURE: [float(h) for h in result.curvature],
                            p.LOSSES: [float(loss) for loss in result.losses]})
    gradient = {"weight": result.weight, "bias": result.bias}
    return Message(content=RecordDict({p.ARRAYS: p.to_record(gradient), p.METRICS: metrics}),
                   reply_to=msg)


def evaluate(msg: Message, context: Context) -> Message:
    """Local accuracy of the global head on this client's own training rows, or (`validation`
    in the config: federated validation) its accuracy and mean loss on the validation rows
    the client keeps; the server's weighted mean of the replies is the federation's."""
    config = run_config(context)
    request = msg.content[p.CONFIG]
    on_validation = int(request.get(p.VALIDATION, 0)) == 1
    features, labels = _device_rows(context, str(request.get(p.NORM_DIGEST, "")),
                                    "validation" if on_validation else "train")
    head = model_from_numpy(p.from_record(msg.content[p.ARRAYS]), features.device,
                            config.adapter_activation)
    metrics = MetricRecord({p.ACCURACY: accuracy(head, features, labels) if len(labels) else 0.0,
                            p.NUM_EXAMPLES: len(labels)})
    if on_validation:
        with torch.inference_mode():
            loss = loss_for(config.head, 2)(head(features), labels) if len(labels) else 0.0
        metrics[p.VALIDATION_LOSS] = float(loss)
    return Message(content=RecordDict({p.METRICS: metrics}), reply_to=msg)


def _stored_stats(context: Context, digest: str) -> NormStats | None:
    """The statistics set-norm stored, checked against the digest the server sent."""
    if not digest:
        return None
    record = context.state.get(p.NORM_STATE)
    stats = None if record is None else NormStats(**p.from_record(record))
    if stats is None or stats.digest() != digest:
        found = "none" if stats is None else stats.digest()
        raise RuntimeError(
            f"feature statistics on this node ({found}) do not match the server's ({digest}); "
            "the node missed the run's set_norm message"
        )
    return stats


def _device_rows(context: Context, digest: str,
                 split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """This client's normalised features and labels on its device, built once per process:
    its training partition, its own test split (split="test": `node_test_rows`) or the
    validation rows it keeps (split="validation": `node_validation_rows`)."""
    config = run_config(context)
    partition_id, num_partitions = node_partition(context)
    data, norm = node_data(config, context.node_config), config.feature_norm
    run = (data, norm, num_partitions, digest)
    if run not in _ON_DEVICE:
        _ON_DEVICE.clear()
        _ON_DEVICE[run] = {}
    on_device = _ON_DEVICE[run]
    if (split, partition_id) not in on_device:
        stats = _stored_stats(context, digest)
        rows = _ROWS_OF[split](data, partition_id, num_partitions)
        features = normalize(norm, rows.features, stats) if len(rows.labels) else rows.features
        device = resolve_device(data.source.device)
        on_device[split, partition_id] = (
            torch.from_numpy(np.ascontiguousarray(features)).to(device),
            torch.from_numpy(rows.labels.astype(np.int64)).to(device))
    return on_device[split, partition_id]


def _scored_rows(rows_of: Callable[[NodeData, int, int], tuple[np.ndarray, np.ndarray]]
                 ) -> Callable[[NodeData, int, int], NodeRows]:
    """This client's rows that only score (its own test split, the validation rows it keeps),
    from `rows_of(data, partition_id, num_partitions)`; clean labels."""
    def rows(data: NodeData, partition_id: int, num_partitions: int) -> NodeRows:
        features, labels = rows_of(data, partition_id, num_partitions)
        return NodeRows(features, labels, 0, "")
    return rows


_ROWS_OF: dict[str, Callable[[NodeData, int, int], NodeRows]] = {
    "train": node_rows, "test": _scored_rows(node_test_rows),
    "validation": _scored_rows(node_validation_rows)}


# ------------------------------------------------------------------ personalization (PFT)


def personalize(msg: Message, context: Context) -> Message:
    """Fine-tune the global model with the method the server names, on this client's own
    training rows, once. The reply carries the personalized model (the other clients score
    it: `score_personalized`), its Local accuracy after every epoch on this client's own test
    split, and snapshots at the run's curve epochs. A node with a `model-dir` keeps the model."""
    config = run_config(context)
    digest = str(msg.content[p.CONFIG].get(p.NORM_DIGEST, ""))
    features, labels = _device_rows(context, digest)
    test_rows = _device_rows(context, digest, split="test")
    global_model = model_from_numpy(p.from_record(msg.content[p.ARRAYS]), features.device,
                                    config.adapter_activation)
    return personalization_reply(msg, context, config.personalization, config.head, config.seed,
                                 global_model, (features, labels),
                                 test_rows, model_to_numpy)


def score_personalized(msg: Message, context: Context) -> Message:
    """Score every model the server sent on this client's own test split
    (`personalize.client.score_reply`): each is a head (and adapter) on the cached features."""
    config = run_config(context)
    digest = str(msg.content[p.CONFIG].get(p.NORM_DIGEST, ""))
    test_rows = _device_rows(context, digest, split="test")
    device, activation = test_rows[0].device, config.adapter_activation
    global_model = model_from_numpy(p.from_record(msg.content[p.ARRAYS]), device, activation)

    @contextmanager
    def model_of(arrays: dict[str, np.ndarray]) -> Iterator[FeatureModel]:
        yield model_from_numpy(arrays, device, activation)

    return score_reply(msg, test_rows, global_model, model_of)


