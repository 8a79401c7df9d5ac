"""The datasets read from the data dir's files: digits (bundled), CIFAR-10, TinyImageNet-100,
MNIST, AG News, and a user's own `folder:<name>` (images) or `csv:<name>` (texts)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ovalp_flwr.data.base import (AG_NEWS_CLASSES, DATA_FILES, ImageDataset, ImageSplit,
                                  TextDataset, _files_by_class, _first_per_class, _image_dataset,
                                  _not_found, _open_tree, _read_csv, _require, _split_root,
                                  _stratified_split, _text_dataset, _Tree)


def digits(data_dir: Path, *, limit_per_class: int | None = None) -> ImageDataset:
    """scikit-learn's bundled 8x8 digits (offline): values 0..16 -> 0..255, grey -> RGB."""
    # late: scikit-learn (~1 s); the ClientApp imports this module
    from sklearn.datasets import load_digits

    bunch = load_digits()
    grey = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)
    images = np.repeat(grey[..., None], 3, axis=-1)
    labels = bunch.target.astype(np.int64)

    def split(idx: np.ndarray) -> ImageSplit:
        idx = idx[_first_per_class(labels[idx], limit_per_class)]
        return ImageSplit(np.ascontiguousarray(images[idx]), labels[idx])

    train, test = _stratified_split(labels, "digits")
    return ImageDataset(
        name="digits",
        train=split(train),
        test=split(test),
        class_names=tuple(str(c) for c in bunch.target_names),
    )


def _folder_dataset(dataset: str, tree: _Tree, limit: int | None) -> ImageDataset:
    """`train/<class>/<file>` and `test/<class>/<file>`; classes = sorted train folders."""
    tree = tree.sub(_split_root(tree))
    splits = {split: _files_by_class(tree.names, split, limit) for split in ("train", "test")}
    for split, by_class in splits.items():
        if not by_class:
            raise ValueError(
                f"dataset {dataset!r}: no images under {split}/<class>/ in {tree.where}; "
                "expected <split>/<class>/<file> with splits train and test"
            )
    classes = tuple(splits["train"])
    extra = sorted(set(splits["test"]) - set(classes))
    if extra:
        raise ValueError(f"dataset {dataset!r}: test classes {extra} have no train images")
    test = [splits["test"].get(c, []) for c in classes]
    return _image_dataset(dataset, tree, classes, list(splits["train"].values()), test)


def folder_images(dataset: str, path: Path, limit: int | None) -> ImageDataset:
    """A folder `<name>`, else a zip `<name>` or `<name>.zip` (a folder wins if both exist)."""
    zipped = path.with_name(f"{path.name}.zip")
    source = next((p for p in (path, zipped) if p.exists()), None)
    if source is None:
        raise _not_found(dataset, path, zipped)
    with _open_tree(source, dataset) as tree:
        return _folder_dataset(dataset, tree, limit)


def cifar10(data_dir: Path, *, limit_per_class: int | None = None) -> ImageDataset:
    """CIFAR-10 as JPEGs in the generic zip layout; sorted folder names are the usual order."""
    path = _require(data_dir / DATA_FILES["cifar10"][0], "cifar10")
    with _open_tree(path, "cifar10") as tree:
        return _folder_dataset("cifar10", tree, limit_per_class)


def tinyimagenet_100(data_dir: Path, *, limit_per_class: int | None = None) -> ImageDataset:
    """TinyImageNet's first 100 wnids; its labelled val set is the test split (64x64)."""
    dataset = "tinyimagenet-100"
    path = _require(data_dir / DATA_FILES[dataset][0], dataset)
    with _open_tree(path, dataset) as whole:
        markers = [n for n in whole.names if n.rsplit("/", 1)[-1] == "wnids.txt"]
        marker = min(markers, key=lambda n: n.count("/"), default=None)
        if marker is None:
            raise ValueError(f"dataset {dataset!r}: {path} has no wnids.txt")
        tree = whole.sub(marker[: -len("wnids.txt")])
        wnids = tuple(tree.read("wnids.txt").decode().split())
        train = _files_by_class(tree.names, "train", limit_per_class)
        missing = [w for w in wnids if w not in train]
        if missing:
            raise ValueError(f"dataset {dataset!r}: no train images for wnids {missing[:5]}")
        val = _tiny_val_files(tree.read("val/val_annotations.txt").decode(), wnids, dataset)
        return _image_dataset(
            dataset,
            tree,
            _wordnet_names(tree.read("words.txt").decode(), wnids),
            [train[w] for w in wnids],
            [val.get(w, [])[:limit_per_class] for w in wnids],
        )


def _tiny_val_files(annotations: str, wnids: Sequence[str], dataset: str) -> dict[str, list[str]]:
    """val_annotations.txt rows `file<TAB>wnid<TAB>box` -> {wnid: sorted `val/images/<file>`}."""
    known = set(wnids)
    found: dict[str, list[str]] = {}
    for number, line in enumerate(annotations.splitlines(), 1):
        if not line.strip():
            continue
        file, wnid, *_ = [*line.split("\t"), ""]
        if not file or not wnid:
            raise ValueError(
                f"dataset {dataset!r}: val_annotations.txt line {number} is not file<TAB>wnid"
            )
        if wnid not in known:
            raise ValueError(f"dataset {dataset!r}: val_annotations.txt names unknown wnid {wnid}")
        found.setdefault(wnid, []).append(f"val/images/{file}")
    return {w: sorted(files) for w, files in found.items()}


def _wordnet_names(words: str, wnids: Sequence[str]) -> tuple[str, ...]:
    """First synonym per wnid ('goldfish'); the full entry if first synonyms collide."""
    full = dict(line.split("\t", 1) for line in words.splitlines() if "\t" in line)
    entries = [full.get(w, w).strip() for w in wnids]
    first = tuple(e.split(",")[0].strip() for e in entries)
    return first if len(set(first)) == len(first) else tuple(entries)


def mnist(data_dir: Path, *, limit_per_class: int | None = None) -> ImageDataset:
    """MNIST from keras' mnist.npz (28x28 grey uint8), grey replicated to RGB; file order."""
    path = _require(data_dir / DATA_FILES["mnist"][0], "mnist")
    splits = {}
    with np.load(path) as npz:
        for split in ("train", "test"):
            keys = (f"x_{split}", f"y_{split}")
            if not set(keys) <= set(npz.files):
                raise ValueError(f"dataset 'mnist': {path} has keys {npz.files}, needs {keys}")
            labels = npz[keys[1]].astype(np.int64)
            idx = _first_per_class(labels, limit_per_class)
            grey = npz[keys[0]][idx]
            splits[split] = ImageSplit(np.repeat(grey[..., None], 3, axis=-1), labels[idx])
    return ImageDataset("mnist", splits["train"], splits["test"], tuple("0123456789"))


def ag_news(data_dir: Path, *, limit_per_class: int | None = None) -> TextDataset:
    """AG News test CSV (title, description, class) split 80/20 here; text = title + ". " +
    description. `class` is a name (this file) or 1..4 (the original CSVs)."""
    dataset = "ag-news"
    path = _require(data_dir / DATA_FILES[dataset][0], dataset)
    rows = _read_csv(path, ("title", "description", "class"), dataset)
    labels = np.array([_ag_news_label(value) for _, _, value in rows], dtype=np.int64)
    texts = [f"{title}. {description}" for title, description, _ in rows]
    return _text_dataset(dataset, texts, labels, AG_NEWS_CLASSES, limit_per_class)


def _ag_news_label(value: str) -> int:
    """A class name (this file) or the original CSVs' 1-based index."""
    value = value.strip()
    if value in AG_NEWS_CLASSES:
        return AG_NEWS_CLASSES.index(value)
    if value in ("1", "2", "3", "4"):
        return int(value) - 1
    raise ValueError(
        f"dataset 'ag-news': class {value!r} is not allowed; "
        f"use one of {', '.join(AG_NEWS_CLASSES)} or 1..4"
    )


def csv_texts(dataset: str, path: Path, limit: int | None) -> TextDataset:
    """`text,label` CSV; labels all ints (sorted numerically) or class names (sorted)."""
    if not path.is_file():
        raise _not_found(dataset, path)
    rows = _read_csv(path, ("text", "label"), dataset)
    if not rows:
        raise ValueError(f"dataset {dataset!r}: {path} has no rows")
    values = [label.strip() for _, label in rows]
    if "" in values:
        row = values.index("") + 1
        raise ValueError(f"dataset {dataset!r}: {path} data row {row} has no label")
    if all(re.fullmatch(r"[+-]?\d+", v) for v in values):
        values = [str(int(v)) for v in values]  # '07' and '7' are one class
        classes = sorted(set(values), key=int)
    else:
        classes = sorted(set(values))
    index = {c: i for i, c in enumerate(classes)}
    labels = np.array([index[v] for v in values], dtype=np.int64)
    return _text_dataset(dataset, [text for text, _ in rows], labels, tuple(classes), limit)
