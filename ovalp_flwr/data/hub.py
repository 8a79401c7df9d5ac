"""Hugging Face hub datasets by name (`hub:<name>`), for runs on machines with internet.

Each registry entry fixes the repo, its input and label columns, which two splits are train and
test, and the class count; every fetched split is checked against that, so a changed repo fails
with one line instead of producing quietly different features. Class names come from the label
column's ClassLabel, and rows keep the repo's order, so one feature cache serves every run.

Entries (HUB_DATASETS): cifar100 (fine labels), cifar10, tinyimagenet (200 wnids; the labelled
`valid` split is the test split; its few greyscale images are made RGB), emnist-letters (A..Z,
28x28 grey made RGB, in the orientation the repo publishes: not transposed here), domainnet
(345 classes; its `domain` and `image_path` columns are ignored, so the six domains are mixed in
each split; sizes vary, so images are squared to 256x256 first), ag-news (4 classes, texts).

Images stay in HF's on-disk Arrow cache and are decoded per slice by `HubImages`, so DomainNet's
hundreds of thousands of images never sit in memory as one array; texts are read whole (AG News:
120k strings).
Downloads go to HF's cache ($HF_HOME, default ~/.cache/huggingface); with HF_HUB_OFFLINE=1 a copy
already there is used without the network.

HF `datasets` takes seconds to import, so it is imported only when a hub dataset is loaded
(`import datasets` here is HF's package: ovalp_flwr.data.registry is only reachable by that path).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from ovalp_flwr.data.base import (
    BUNDLED,
    DATA_FILES,
    ImageDataset,
    ImageSplit,
    Modality,
    TextDataset,
    TextSplit,
    _check_limit,
    _first_per_class,
)

if TYPE_CHECKING:
    import datasets as hf
    from PIL.Image import Image as PILImage

PREFIX = "hub:"
ITER_CHUNK = 256  # rows decoded at a time when a HubImages is iterated


@dataclass(frozen=True)
class HubSpec:
    """Where a hub dataset lives and the schema it must have (checked after every fetch)."""

    repo: str
    input_column: str
    label_column: str
    splits: tuple[str, str]  # (train, test) as the repo names them
    modality: Modality
    num_classes: int
    config: str | None = None
    # Images of varying size: shorter side to this (bicubic), then the centre square crop.
    # None: every image of a split must have the size of its first image.
    square_size: int | None = None


HUB_DATASETS: dict[str, HubSpec] = {
    # 32x32 RGB; `coarse_label` (20 superclasses) is ignored.
    "hub:cifar100": HubSpec(
        "uoft-cs/cifar100", "img", "fine_label", ("train", "test"), "image", 100
    ),
    # 32x32 RGB; airplane, automobile, bird, cat, deer, dog, frog, horse, ship, truck.
    "hub:cifar10": HubSpec("uoft-cs/cifar10", "img", "label", ("train", "test"), "image", 10),
    # 64x64, a few greyscale (made RGB); class names are wnids; the labelled `valid` is the test.
    "hub:tinyimagenet": HubSpec(
        "zh-plus/tiny-imagenet", "image", "label", ("train", "valid"), "image", 200
    ),
    # 28x28 grey (made RGB), classes A..Z, orientation as the repo publishes it (not transposed).
    "hub:emnist-letters": HubSpec(
        "tanganke/emnist_letters", "image", "label", ("train", "test"), "image", 26
    ),
    # 345 classes over 6 domains (`domain` and `image_path` columns, ignored: domains are mixed
    # in each split); images of 80-640 px, brought to 256x256 before the encoder's own resize.
    "hub:domainnet": HubSpec(
        "wltjr1007/DomainNet", "image", "label", ("train", "test"), "image", 345, square_size=256
    ),
    # World, Sports, Business, Sci/Tech; 120k train and 7.6k test texts (title + description).
    "hub:ag-news": HubSpec("fancyzhx/ag_news", "text", "label", ("train", "test"), "text", 4),
}

Fetch = Callable[[HubSpec, str], "hf.Dataset"]


def hub_spec(name: str) -> HubSpec:
    """The registry entry; an unknown name lists the known ones (names come from run configs)."""
    if name not in HUB_DATASETS:
        raise ValueError(f"unknown hub dataset {name!r}; choose one of {', '.join(HUB_DATASETS)}")
    return HUB_DATASETS[name]


def hub_modality(name: str) -> Modality:
    """'image' or 'text' from the registry alone: no HF import, no network."""
    return hub_spec(name).modality


def load_hub_dataset(
    name: str, *, limit_per_class: int | None = None, fetch: Fetch | None = None
) -> ImageDataset | TextDataset:
    """Fetch both splits, check them against the spec, keep the first N rows per class.

    `fetch(spec, split)` returns a `datasets.Dataset`; the default downloads from the hub
    (looked up at call time, so tests can replace it).
    """
    spec = hub_spec(name)
    _check_limit(limit_per_class)
    fetch = fetch or _fetch_from_hub
    (train, train_names), (test, test_names) = (
        _load_split(name, spec, split, fetch, limit_per_class) for split in spec.splits
    )
    if train_names != test_names:
        raise ValueError(
            f"dataset {name!r}: {spec.repo} splits {spec.splits[0]!r} and {spec.splits[1]!r} "
            "have different ClassLabel names; their labels would not mean the same classes"
        )
    if spec.modality == "image":
        assert isinstance(train, ImageSplit) and isinstance(test, ImageSplit)
        return ImageDataset(name, train, test, train_names)
    assert isinstance(train, TextSplit) and isinstance(test, TextSplit)
    return TextDataset(name, train, test, train_names)


def _fetch_from_hub(spec: HubSpec, split: str) -> hf.Dataset:
    """One split through HF `datasets` (downloaded once into its cache)."""
    import datasets  # late: HF datasets (~1 s); only hub datasets need it

    return datasets.load_dataset(spec.repo, spec.config, split=split)


def _load_split(
    name: str, spec: HubSpec, split: str, fetch: Fetch, limit: int | None
) -> tuple[ImageSplit | TextSplit, tuple[str, ...]]:
    ds = _fetch(name, spec, split, fetch)
    class_names = _check_schema(name, spec, split, ds)
    labels = _labels(name, spec, split, ds)
    rows = None
    if limit is not None:
        rows = _first_per_class(labels, limit)
        ds, labels = ds.select(rows), labels[rows]
    if spec.modality == "text":
        return TextSplit(_texts(name, spec, split, ds), labels), class_names
    images = HubImages(
        ds, spec.input_column, dataset=name, split=split, square_size=spec.square_size, rows=rows
    )
    return ImageSplit(images, labels), class_names


def _fetch(name: str, spec: HubSpec, split: str, fetch: Fetch) -> hf.Dataset:
    """Any failure (network, auth, a renamed repo) becomes one line saying what to do instead."""
    try:
        return fetch(spec, split)
    except Exception as err:  # HF raises many types; all mean "not fetched"
        lines = str(err).strip().splitlines()
        detail = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
        local = ", ".join([*BUNDLED, *DATA_FILES, "folder:<name>", "csv:<name>"])
        raise ValueError(
            f"dataset {name!r}: cannot fetch {_where(spec, split)} from the Hugging Face hub "
            f"({detail}); on a machine without internet use a local dataset ({local})"
        ) from err


def _where(spec: HubSpec, split: str) -> str:
    config = f" config {spec.config!r}" if spec.config else ""
    return f"{spec.repo}{config} split {split!r}"


# --- schema, labels, texts ------------------------------------------------------------------


def _check_schema(name: str, spec: HubSpec, split: str, ds: Any) -> tuple[str, ...]:
    """The split's ClassLabel names, after checking columns and types against the spec."""
    import datasets as hf  # late: HF datasets (~1 s); only hub datasets need it

    where = f"dataset {name!r}: {_where(spec, split)}"
    if not isinstance(ds, hf.Dataset):
        raise ValueError(f"{where} came back as {type(ds).__name__}, not a datasets.Dataset")
    features = ds.features
    for column in (spec.input_column, spec.label_column):
        if column not in features:
            raise ValueError(
                f"{where} has no column {column!r}; columns found: {', '.join(features)}"
            )
    label = features[spec.label_column]
    if not isinstance(label, hf.ClassLabel):
        raise ValueError(
            f"{where} column {spec.label_column!r} is {label!r}, expected a ClassLabel "
            "(the class names come from it)"
        )
    if label.num_classes != spec.num_classes:
        raise ValueError(
            f"{where} column {spec.label_column!r} has {label.num_classes} classes, "
            f"expected {spec.num_classes}"
        )
    feature = features[spec.input_column]
    if spec.modality == "image" and not isinstance(feature, hf.Image):
        raise ValueError(f"{where} column {spec.input_column!r} is {feature!r}, expected an Image")
    if spec.modality == "text" and not (
        isinstance(feature, hf.Value) and feature.dtype in ("string", "large_string")
    ):
        raise ValueError(
            f"{where} column {spec.input_column!r} is {feature!r}, expected a string Value"
        )
    return tuple(label.names)


def _labels(name: str, spec: HubSpec, split: str, ds: hf.Dataset) -> np.ndarray:
    """int64 labels via Arrow (a Python-level column read takes seconds per 500k rows)."""
    column = ds.with_format("arrow")[spec.label_column]
    where = f"dataset {name!r}: {_where(spec, split)} column {spec.label_column!r}"
    if column.null_count:
        raise ValueError(f"{where} has {column.null_count} rows without a label")
    labels = np.asarray(column.to_numpy(), dtype=np.int64)
    bad = np.flatnonzero((labels < 0) | (labels >= spec.num_classes))
    if len(bad):
        row = int(bad[0])
        raise ValueError(
            f"{where} row {row} has label {labels[row]}, outside 0..{spec.num_classes - 1} "
            "(an unlabelled split?)"
        )
    return labels


def _texts(name: str, spec: HubSpec, split: str, ds: hf.Dataset) -> tuple[str, ...]:
    texts = ds.with_format("arrow")[spec.input_column].to_pylist()
    if None in texts:
        raise ValueError(
            f"dataset {name!r}: {_where(spec, split)} column {spec.input_column!r} "
            f"row {texts.index(None)} has no text"
        )
    return tuple(texts)


# --- images, decoded per slice --------------------------------------------------------------


class HubImages(Sequence[np.ndarray]):
    """A split's images, decoded only when asked: a slice gives uint8 [B, H, W, 3] RGB (what
    the encoders take, one size per batch), an int index one [H, W, 3] image."""

    def __init__(
        self,
        ds: hf.Dataset,
        column: str,
        *,
        dataset: str,
        split: str,
        square_size: int | None = None,
        rows: np.ndarray | None = None,
    ) -> None:
        self._ds = ds.select_columns([column])  # decode nothing but the image
        self._column = column
        self._dataset = dataset
        self._split = split
        self._square_size = square_size
        self._rows = rows  # repo row of each item (after limit_per_class), for messages
        self._first_size: tuple[int, int] | None = None  # (w, h) of item 0

    def __len__(self) -> int:
        return len(self._ds)

    def __repr__(self) -> str:
        return f"HubImages({self._dataset!r}, split={self._split!r}, n={len(self)})"

    @overload
    def __getitem__(self, index: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, index: slice) -> np.ndarray: ...

    def __getitem__(self, index: int | slice) -> np.ndarray:
        if isinstance(index, slice):
            return self._decode(range(len(self))[index])
        if isinstance(index, bool) or not isinstance(index, int | np.integer):
            raise TypeError(f"HubImages index {index!r} is not allowed; use an int or a slice")
        position = operator.index(index)
        if not -len(self) <= position < len(self):
            raise IndexError(f"HubImages index {position} is out of range for {len(self)} images")
        position %= len(self)
        return self._decode(range(position, position + 1))[0]

    def __iter__(self) -> Iterator[np.ndarray]:
        for start in range(0, len(self), ITER_CHUNK):
            yield from self[start : start + ITER_CHUNK]

    def _decode(self, positions: range) -> np.ndarray:
        if not positions:
            return np.empty((0, *self._empty_shape(), 3), dtype=np.uint8)
        try:
            pil = self._pil(positions)
            return np.stack(
                [self._array(image, pos) for image, pos in zip(pil, positions, strict=True)]
            )
        except OSError as err:  # PIL: unreadable or truncated image
            raise ValueError(
                f"dataset {self._dataset!r}: cannot decode split {self._split!r} rows "
                f"{self._row(positions[0])}..{self._row(positions[-1])} ({err})"
            ) from err

    def _pil(self, positions: range) -> list[PILImage]:
        """One Arrow read for the rows (a contiguous slice when possible)."""
        if positions.step == 1:
            return self._ds[positions.start : positions.stop][self._column]
        return self._ds[list(positions)][self._column]

    def _array(self, image: PILImage, position: int) -> np.ndarray:
        rgb = image if image.mode == "RGB" else image.convert("RGB")
        if self._square_size is not None:
            return np.asarray(square_crop(rgb, self._square_size))
        if position == 0:
            self._first_size = rgb.size
        first = self._size_of_first()
        if rgb.size != first:
            raise ValueError(
                f"dataset {self._dataset!r}: split {self._split!r} row {self._row(position)} "
                f"is {_wxh(rgb.size)} but row {self._row(0)} is {_wxh(first)}; all its images "
                "must share one size (only hub datasets with a square_size are resized)"
            )
        return np.asarray(rgb)

    def _size_of_first(self) -> tuple[int, int]:
        if self._first_size is None:
            self._first_size = self._pil(range(0, 1))[0].size
        return self._first_size

    def _empty_shape(self) -> tuple[int, int]:
        if self._square_size is not None:
            return self._square_size, self._square_size
        if not len(self):
            return 0, 0
        w, h = self._size_of_first()
        return h, w

    def _row(self, position: int) -> int:
        """The row in the repo's split (positions differ from it after limit_per_class)."""
        return position if self._rows is None else int(self._rows[position])


def square_crop(image: PILImage, size: int) -> PILImage:
    """Shorter side to `size` (bicubic), then the centre `size` x `size` crop (offsets rounded
    down), so images of any size batch together; the encoder then applies its own resize."""
    from PIL import Image  # late: PIL (~15 ms); only hub images need it, not config/launcher

    w, h = image.size
    scale = size / min(w, h)
    new = (max(size, round(w * scale)), max(size, round(h * scale)))
    if new != (w, h):
        image = image.resize(new, Image.Resampling.BICUBIC)
    left, top = (new[0] - size) // 2, (new[1] - size) // 2
    return image.crop((left, top, left + size, top + size))


def _wxh(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"
