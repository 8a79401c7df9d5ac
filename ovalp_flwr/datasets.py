"""Image datasets by name: uint8 RGB arrays with a fixed train/test split."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# The train/test split is part of a dataset's definition, not of a run: it never follows the
# run seed, so one feature cache serves every run and every seed.
SPLIT_SEED = 0


@dataclass(frozen=True)
class ImageSplit:
    images: np.ndarray  # uint8 [N, H, W, 3] RGB
    labels: np.ndarray  # int64 [N]


@dataclass(frozen=True)
class ImageDataset:
    name: str
    train: ImageSplit
    test: ImageSplit
    class_names: tuple[str, ...]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def _digits() -> ImageDataset:
    """scikit-learn's bundled 8x8 digits (offline): values 0..16 -> 0..255, grey -> RGB."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    grey = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)
    images = np.repeat(grey[..., None], 3, axis=-1)
    labels = bunch.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        images, labels, test_size=0.2, stratify=labels, random_state=SPLIT_SEED
    )
    return ImageDataset(
        name="digits",
        train=ImageSplit(np.ascontiguousarray(x_tr), y_tr),
        test=ImageSplit(np.ascontiguousarray(x_te), y_te),
        class_names=tuple(str(c) for c in bunch.target_names),
    )


DATASETS: dict[str, Callable[[], ImageDataset]] = {
    "digits": _digits,
}


def load_dataset(name: str) -> ImageDataset:
    """Build the named dataset; the error lists what exists, since names come from run configs."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose from {sorted(DATASETS)}")
    return DATASETS[name]()
