"""Raw data for the encoder path: the dataset the cache would be built from, as model inputs.

The partition is the cached path's: the same loader, `limit-per-class`, label noise and
partitioner over the same labels, so a fine-tuning run and an OvA-LP run with one seed give
every client the same samples. Inputs are one tensor per split (see `model.py`): uint8
images [N, H, W, 3], or token ids and attention masks [N, 2, L] from the encoder's own
tokenizer. No Flower here.
"""

from __future__ import annotations

from dataclasses import dataclass
import numpy as np
import torch

from ovalp_flwr.data.registry import load_dataset
from ovalp_flwr.data.noise import NoiseSpec, noisy_labels
from ovalp_flwr.data.options import DataOptions
from ovalp_flwr.data.partition import PartitionSpec, partition_indices


@dataclass(frozen=True)
class RawSplit:
    inputs: torch.Tensor  # uint8 [N, H, W, 3] or int64 [N, 2, L] (CPU)
    labels: np.ndarray  # int64 [N]
    domains: np.ndarray  # int64 [N]


@dataclass(frozen=True)
class RawData:
    train: RawSplit  # labels with the run's label noise
    test: RawSplit
    clean_train_labels: np.ndarray
    num_classes: int
    domain_names: tuple[str, ...]


def image_tensor(images, dataset: str) -> torch.Tensor:
    """uint8 [N, H, W, 3]; the images of a split must share one size (the model resizes)."""
    shapes = {tuple(np.shape(image)) for image in images}
    if len(shapes) > 1:
        raise ValueError(f"dataset {dataset!r}: images of {len(shapes)} sizes (e.g. "
                         f"{sorted(shapes)[:2]}); the encoder path needs one size per split")
    return torch.from_numpy(np.ascontiguousarray(np.stack([np.asarray(i) for i in images])))


def text_tensor(texts, tokenize) -> torch.Tensor:
    """int64 [N, 2, L]: token ids over the attention mask, padded to the longest text."""
    tokens = tokenize(list(texts))
    return torch.stack([tokens["input_ids"], tokens["attention_mask"]], dim=1).long()


def raw_data(dataset: str, data_dir: str, limit_per_class: int | None,
             tokenize=None) -> RawData:
    """Both splits as model inputs (texts through `tokenize`, the encoder's tokenizer)."""
    data = load_dataset(dataset, data_dir or None, limit_per_class=limit_per_class)

    def inputs(split) -> torch.Tensor:
        if data.modality == "image":
            return image_tensor(split.images, dataset)
        return text_tensor(split.texts, tokenize)

    train, test = data.train, data.test
    return RawData(
        RawSplit(inputs(train), np.asarray(train.labels, np.int64), data.split_domains("train")),
        RawSplit(inputs(test), np.asarray(test.labels, np.int64), data.split_domains("test")),
        np.asarray(train.labels, np.int64), data.num_classes, data.domains)


def run_data(config: DataOptions, noise: NoiseSpec, tokenize=None) -> RawData:
    """The run's raw data with its label `noise` applied to the training labels."""
    base = raw_data(config.dataset, config.data_dir, config.cache_options()["limit_per_class"],
                    tokenize)
    labels = noisy_labels(base.clean_train_labels, base.num_classes, noise)
    return RawData(RawSplit(base.train.inputs, labels, base.train.domains), base.test,
                   base.clean_train_labels, base.num_classes, base.domain_names)


def partitions(spec: PartitionSpec, data: RawData, num_partitions: int) -> list[np.ndarray]:
    """Every client's training rows: the cached path's partition of the same labels."""
    return partition_indices(spec, data.train.labels, num_partitions, None,
                             data.train.domains)
