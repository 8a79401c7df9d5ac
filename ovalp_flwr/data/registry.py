"""Datasets by name: images as uint8 RGB arrays or texts as strings, with a fixed train/test split.

Local files live in a data dir: `load_dataset(..., data_dir)` (the run config's `data-dir`), else
the env var OVALP_DATA_DIR, else `../shared/data` relative to the current directory. Besides the
registered names, `folder:<name>` (image folder or zip, `<split>/<class>/<file>`) and
`csv:<name>` (`text,label`) load a user's own data from that dir without registering anything,
and `hub:<name>` loads a registered Hugging Face hub dataset (ovalp_flwr.data.hub; the data
dir plays no part, and those images stay lazy: decoded per slice, not held in memory).
Order is deterministic everywhere, so one feature cache serves every run: image folders and
zips come class-major (classes sorted, files sorted within a class), mnist in file order, digits
and texts in scikit-learn's seeded split order.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import re
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import ClassVar, Literal, Protocol

import numpy as np

logger = logging.getLogger(__name__)

# The train/test split is part of a dataset's definition, not of a run: it never follows the
# run seed, so one feature cache serves every run and every seed.
SPLIT_SEED = 0
TEST_FRACTION = 0.2

DATA_DIR_ENV = "OVALP_DATA_DIR"
DEFAULT_DATA_DIR = Path("../shared/data")
PREFIXES = ("folder:", "csv:", "hub:")
# parametrised names built from registered datasets (ovalp_flwr.data.domains)
DERIVED_PREFIXES = ("cifar10-c:", "concept:")
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
AG_NEWS_CLASSES = ("World", "Sports", "Business", "Sci/Tech")  # the dataset's own 1..4 order

Modality = Literal["image", "text"]

# uint8 [N, H, W, 3] RGB: an array, or a lazy sequence (hub datasets) whose slices are such
# arrays, so consumers must take slices (`images[i:j]`), never the whole thing at once.
Images = np.ndarray | Sequence[np.ndarray]


@dataclass(frozen=True)
class ImageSplit:
    images: Images  # uint8 [N, H, W, 3] RGB, or lazy: see Images
    labels: np.ndarray  # int64 [N]
    domains: np.ndarray | None = None  # int64 [N] into domain_names; None: one domain


@dataclass(frozen=True)
class TextSplit:
    texts: tuple[str, ...]
    labels: np.ndarray  # int64 [N]
    domains: np.ndarray | None = None  # int64 [N] into domain_names; None: one domain


@dataclass(frozen=True)
class LabelledDataset:
    """A named train/test pair with its class names; the subclasses fix the modality.

    Every sample has a domain (where it comes from: a digit style, a camera, a corruption, a
    concept): `domain_names` and each split's `domains`; a dataset that sets neither is one
    domain named after itself (ovalp_flwr.data.domains builds the multi-domain ones)."""

    name: str
    train: ImageSplit | TextSplit
    test: ImageSplit | TextSplit
    class_names: tuple[str, ...]
    domain_names: tuple[str, ...] = ()

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def domains(self) -> tuple[str, ...]:
        """The domains' names: the declared ones, else the dataset's own name."""
        return self.domain_names or (self.name,)

    def split_domains(self, split: str) -> np.ndarray:
        """int64 [N] domain of every sample of `split` ('train' or 'test')."""
        part = getattr(self, split)
        if part.domains is None:
            return np.zeros(len(part.labels), dtype=np.int64)
        return np.asarray(part.domains, dtype=np.int64)


@dataclass(frozen=True)
class ImageDataset(LabelledDataset):
    train: ImageSplit
    test: ImageSplit
    modality: ClassVar[Modality] = "image"


@dataclass(frozen=True)
class TextDataset(LabelledDataset):
    train: TextSplit
    test: TextSplit
    modality: ClassVar[Modality] = "text"


Dataset = ImageDataset | TextDataset


class Loader(Protocol):
    def __call__(self, data_dir: Path, *, limit_per_class: int | None = None) -> Dataset: ...


def resolve_data_dir(data_dir: Path | str | None, cwd: Path | None = None) -> Path:
    """Absolute data dir: the argument, else $OVALP_DATA_DIR, else ../shared/data ('' = unset);
    a relative one is taken from `cwd` (default: the current directory)."""
    chosen = Path(data_dir or os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR).expanduser()
    return Path(os.path.abspath(chosen if cwd is None else cwd / chosen))


def load_dataset(
    name: str, data_dir: Path | str | None = None, *, limit_per_class: int | None = None
) -> Dataset:
    """Build the named dataset; errors list what exists, since names come from run configs.

    `limit_per_class` keeps the first N items of each class per split (files in sorted order,
    CSV rows in file order, hub rows in split order, before a text split), so quick runs decode
    only what they use. `data_dir` is ignored for `hub:` names.
    """
    _check_limit(limit_per_class)
    if name.startswith("hub:"):
        from ovalp_flwr.data.hub import load_hub_dataset  # it imports this module

        return load_hub_dataset(name, limit_per_class=limit_per_class)
    root = resolve_data_dir(data_dir)
    if name.startswith(DERIVED_PREFIXES):
        from ovalp_flwr.data.domains import load_derived  # it imports this module

        return load_derived(name, root, limit_per_class=limit_per_class)
    if name in DATASETS:
        return DATASETS[name](root, limit_per_class=limit_per_class)
    if name.startswith("folder:"):
        return _folder(name, root / _plain_name(name), limit_per_class)
    if name.startswith("csv:"):
        return _csv(name, root / f"{_plain_name(name)}.csv", limit_per_class)
    raise _unknown(name)


def missing_data(name: str, data_dir: Path | str | None = None, cwd: Path | None = None
                 ) -> str | None:
    """Why `load_dataset(name, data_dir)` would fail for want of a file, or None; reads
    nothing, so a launcher can refuse a run before starting it."""
    dataset_modality(name)  # unknown names fail here, as in load_dataset
    root = resolve_data_dir(data_dir, cwd)
    if name.startswith(DERIVED_PREFIXES):
        from ovalp_flwr.data.domains import base_dataset

        return missing_data(base_dataset(name), data_dir, cwd)
    if name.startswith("folder:"):
        candidates = [root / _plain_name(name), root / f"{_plain_name(name)}.zip"]
    elif name.startswith("csv:"):
        candidates = [root / f"{_plain_name(name)}.csv"]
    elif name in DATA_FILES:  # every file it reads must be there
        missing = [root / f for f in DATA_FILES[name] if not (root / f).exists()]
        return str(_not_found(name, *missing)) if missing else None
    else:
        return None  # bundled (digits) or fetched (hub:)
    if any(path.exists() for path in candidates):
        return None
    return str(_not_found(name, *candidates))


def dataset_modality(name: str) -> Modality:
    """'image' or 'text' without reading any data, so a config can be checked before a load."""
    if name.startswith("hub:"):
        from ovalp_flwr.data.hub import hub_modality

        return hub_modality(name)
    if name in LOCAL_MODALITY:
        return LOCAL_MODALITY[name]
    if name.startswith(DERIVED_PREFIXES):
        from ovalp_flwr.data.domains import base_dataset

        return dataset_modality(base_dataset(name))
    if name.startswith("folder:"):
        _plain_name(name)
        return "image"
    if name.startswith("csv:"):
        _plain_name(name)
        return "text"
    raise _unknown(name)


def _check_limit(limit_per_class: int | None) -> None:
    """None or an int >= 1 (not a bool): the one rule for every loader."""
    if limit_per_class is not None and (
        isinstance(limit_per_class, bool)
        or not isinstance(limit_per_class, int | np.integer)
        or limit_per_class < 1
    ):
        raise ValueError(f"limit_per_class={limit_per_class!r} is not allowed; use an int >= 1")


def _unknown(name: str) -> ValueError:
    prefixed = ", ".join([*(f"{p}<name>" for p in PREFIXES), "cifar10-c:[<corruption>:]<severity>",
                          "concept:<dataset>"])
    local = ", ".join(DATASETS)
    return ValueError(f"unknown dataset {name!r}; choose one of {local} or {prefixed}")


def _plain_name(name: str) -> str:
    """The part after the prefix; a bare file name, since it also names the cache folder."""
    plain = name.split(":", 1)[1]
    if not plain or plain in (".", "..") or "/" in plain or "\\" in plain:
        raise ValueError(
            f"dataset {name!r}: {plain!r} is not allowed after the prefix; "
            "use a bare file or folder name inside the data dir"
        )
    return plain


def _not_found(dataset: str, *paths: Path) -> FileNotFoundError:
    where = " or ".join(str(p) for p in paths)
    return FileNotFoundError(
        f"dataset {dataset!r}: {where} not found; set the run config key data-dir "
        f"(or the env var {DATA_DIR_ENV}) to the folder that holds it"
    )


def _require(path: Path, dataset: str) -> Path:
    if not path.is_file():
        raise _not_found(dataset, path)
    return path


# --- splits and slices ----------------------------------------------------------------------


def _first_per_class(labels: np.ndarray, limit: int | None) -> np.ndarray:
    """Indices of the first `limit` items of each class, in their original order."""
    if limit is None:
        return np.arange(len(labels))
    keep = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):
        keep[np.flatnonzero(labels == c)[:limit]] = True
    return np.flatnonzero(keep)


def _stratified_split(labels: np.ndarray, dataset: str) -> tuple[np.ndarray, np.ndarray]:
    """Seeded stratified 80/20 train/test indices (scikit-learn's, as digits always used)."""
    from sklearn.model_selection import train_test_split

    try:
        return train_test_split(
            np.arange(len(labels)),
            test_size=TEST_FRACTION,
            stratify=labels,
            random_state=SPLIT_SEED,
        )
    except ValueError as err:
        raise ValueError(
            f"dataset {dataset!r}: cannot split {len(labels)} items stratified 80/20 ({err})"
        ) from err


# --- digits (bundled with scikit-learn) -----------------------------------------------------


def _digits(data_dir: Path, *, limit_per_class: int | None = None) -> ImageDataset:
    """scikit-learn's bundled 8x8 digits (offline): values 0..16 -> 0..255, grey -> RGB."""
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


# --- file trees: a folder or a zip, read one member at a time -------------------------------


@dataclass(frozen=True)
class _Tree:
    """Sorted relative POSIX paths of a folder's or zip's files, read straight from the source."""

    where: str
    names: tuple[str, ...]
    read: Callable[[str], bytes]

    def sub(self, prefix: str) -> _Tree:
        """The same tree seen from inside `prefix` ('a/b/')."""
        if not prefix:
            return self
        names = tuple(n[len(prefix) :] for n in self.names if n.startswith(prefix))
        return _Tree(f"{self.where}/{prefix.rstrip('/')}", names, lambda n: self.read(prefix + n))


def _visible(name: str) -> bool:
    """Skip hidden files and macOS zip litter (.DS_Store, __MACOSX/)."""
    return not any(p.startswith(".") or p == "__MACOSX" for p in name.split("/"))


@contextmanager
def _open_tree(path: Path, dataset: str) -> Iterator[_Tree]:
    if path.is_dir():
        names = sorted(
            str(PurePosixPath(Path(d, f).relative_to(path)))
            for d, _, files in os.walk(path)
            for f in files
        )
        yield _Tree(str(path), tuple(n for n in names if _visible(n)), _folder_reader(path))
        return
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as err:
        raise ValueError(f"dataset {dataset!r}: {path} is not a readable zip ({err})") from err
    with zf:
        names = sorted(i.filename for i in zf.infolist() if not i.is_dir())
        yield _Tree(str(path), tuple(n for n in names if _visible(n)), _zip_reader(zf, path))


def _folder_reader(root: Path) -> Callable[[str], bytes]:
    return lambda name: (root / name).read_bytes()


def _zip_reader(zf: zipfile.ZipFile, path: Path) -> Callable[[str], bytes]:
    def read(name: str) -> bytes:
        try:
            return zf.read(name)
        except KeyError:
            raise FileNotFoundError(f"{path} has no member {name!r}") from None

    return read


def _split_root(tree: _Tree) -> str:
    """'' if `train/` is at the top; 'x/' if everything sits in one folder x (a zipped folder)."""
    if any(n.startswith("train/") for n in tree.names):
        return ""
    tops = {n.split("/", 1)[0] for n in tree.names}
    if len(tops) == 1 and "/" in tree.names[0]:
        top = f"{tops.pop()}/"
        if any(n.startswith(f"{top}train/") for n in tree.names):
            return top
    return ""


# --- images ---------------------------------------------------------------------------------


def _is_image(name: str) -> bool:
    return PurePosixPath(name).suffix.lower() in IMAGE_SUFFIXES


def _files_by_class(names: Sequence[str], split: str, limit: int | None) -> dict[str, list[str]]:
    """`<split>/<class>/.../<file>` -> {class: sorted files}; class = first folder under split."""
    found: dict[str, list[str]] = {}
    for name in names:
        parts = name.split("/")
        if len(parts) >= 3 and parts[0] == split and _is_image(name):
            found.setdefault(parts[1], []).append(name)
    return {c: sorted(files)[:limit] for c, files in sorted(found.items())}


def _decode_images(tree: _Tree, paths: Sequence[str], dataset: str) -> np.ndarray:
    """Decode into one preallocated uint8 [N, H, W, 3]; the first image fixes the size for all.

    Sequential on purpose: for small JPEGs the cost is mostly PIL's Python-side work under the
    GIL, and 2-4 threads measured slower than this loop (cifar10, 2 cores: 10-13 s vs 8-11 s).
    """
    from PIL import Image

    out = np.empty((len(paths), 0, 0, 3), dtype=np.uint8)
    for i, path in enumerate(paths):
        try:
            with Image.open(io.BytesIO(tree.read(path))) as image:
                if i == 0:
                    out = np.empty((len(paths), image.height, image.width, 3), dtype=np.uint8)
                size = (out.shape[2], out.shape[1])
                if image.size != size:
                    raise ValueError(
                        f"dataset {dataset!r}: {tree.where}/{path} is {_wxh(image.size)} but "
                        f"{paths[0]} is {_wxh(size)}; all images of a dataset must share one "
                        "size (resize the files: the loader does not resize, the encoder does)"
                    )
                out[i] = np.asarray(image if image.mode == "RGB" else image.convert("RGB"))
        except OSError as err:  # includes PIL's UnidentifiedImageError and truncated files
            raise ValueError(
                f"dataset {dataset!r}: cannot decode {tree.where}/{path} ({err})"
            ) from err
    return out


def _wxh(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"


def _image_dataset(
    dataset: str,
    tree: _Tree,
    class_names: tuple[str, ...],
    train: Sequence[Sequence[str]],
    test: Sequence[Sequence[str]],
) -> ImageDataset:
    """Decode per-class file lists (train and test in one array) into a class-major dataset."""
    start = time.perf_counter()
    paths = [p for files in (*train, *test) for p in files]
    images = _decode_images(tree, paths, dataset)
    n_train = sum(len(files) for files in train)
    logger.info(f"{dataset}: decoded {len(paths)} images in {time.perf_counter() - start:.1f} s")

    def labels(per_class: Sequence[Sequence[str]]) -> np.ndarray:
        return np.repeat(np.arange(len(per_class), dtype=np.int64), [len(f) for f in per_class])

    return ImageDataset(
        name=dataset,
        train=ImageSplit(images[:n_train], labels(train)),
        test=ImageSplit(images[n_train:], labels(test)),
        class_names=class_names,
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


def _folder(dataset: str, path: Path, limit: int | None) -> ImageDataset:
    """A folder `<name>`, else a zip `<name>` or `<name>.zip` (a folder wins if both exist)."""
    zipped = path.with_name(f"{path.name}.zip")
    source = next((p for p in (path, zipped) if p.exists()), None)
    if source is None:
        raise _not_found(dataset, path, zipped)
    with _open_tree(source, dataset) as tree:
        return _folder_dataset(dataset, tree, limit)


def _cifar10(data_dir: Path, *, limit_per_class: int | None = None) -> ImageDataset:
    """CIFAR-10 as JPEGs in the generic zip layout; sorted folder names are the usual order."""
    path = _require(data_dir / DATA_FILES["cifar10"][0], "cifar10")
    with _open_tree(path, "cifar10") as tree:
        return _folder_dataset("cifar10", tree, limit_per_class)


def _tinyimagenet_100(data_dir: Path, *, limit_per_class: int | None = None) -> ImageDataset:
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


def _mnist(data_dir: Path, *, limit_per_class: int | None = None) -> ImageDataset:
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


# --- texts ----------------------------------------------------------------------------------


def _read_csv(path: Path, columns: tuple[str, ...], dataset: str) -> list[tuple[str, ...]]:
    """Rows of the named columns (others ignored); a short row is an error naming its line."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            if not set(columns) <= set(reader.fieldnames or ()):
                raise ValueError(
                    f"dataset {dataset!r}: {path} has columns {reader.fieldnames}, "
                    f"needs {', '.join(columns)}"
                )
            rows = []
            for row in reader:
                values = tuple(row[c] for c in columns)
                if None in values:
                    raise ValueError(f"dataset {dataset!r}: {path} line {reader.line_num} is short")
                rows.append(values)
    except (UnicodeDecodeError, csv.Error) as err:
        raise ValueError(f"dataset {dataset!r}: cannot read {path} as UTF-8 CSV ({err})") from err
    return rows


def _text_dataset(
    dataset: str,
    texts: Sequence[str],
    labels: np.ndarray,
    class_names: tuple[str, ...],
    limit: int | None,
) -> TextDataset:
    """First `limit` rows per class, then the seeded stratified 80/20 split."""
    keep = _first_per_class(labels, limit)
    texts, labels = [texts[i] for i in keep], labels[keep]
    train, test = _stratified_split(labels, dataset)

    def split(idx: np.ndarray) -> TextSplit:
        return TextSplit(tuple(texts[i] for i in idx), labels[idx])

    return TextDataset(dataset, split(train), split(test), class_names)


def _ag_news(data_dir: Path, *, limit_per_class: int | None = None) -> TextDataset:
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


def _csv(dataset: str, path: Path, limit: int | None) -> TextDataset:
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


def _domain_loader(name: str) -> Loader:
    """A loader of ovalp_flwr.data.domains, imported on first use (it imports this module)."""

    def load(data_dir: Path, *, limit_per_class: int | None = None) -> Dataset:
        from ovalp_flwr.data.domains import LOADERS

        return LOADERS[name](data_dir, limit_per_class=limit_per_class)

    return load


DATASETS: dict[str, Loader] = {
    "digits": _digits,
    "cifar10": _cifar10,
    "tinyimagenet-100": _tinyimagenet_100,
    "mnist": _mnist,
    "ag-news": _ag_news,
    # domains (ovalp_flwr.data.domains): one digit style each, then all four, and four cameras
    "usps": _domain_loader("usps"),
    "mnist-m": _domain_loader("mnist-m"),
    "syn-digits": _domain_loader("syn-digits"),
    "digit-domains": _domain_loader("digit-domains"),
    "office-caltech10": _domain_loader("office-caltech10"),
}
# The files each registered loader reads from the data dir (digits ships with scikit-learn).
DATA_FILES: dict[str, tuple[str, ...]] = {
    "cifar10": ("cifar10-jpg.zip",),
    "tinyimagenet-100": ("tinyimagenet-100.zip",),
    "mnist": ("mnist.npz",),
    "ag-news": ("ag_news_test.csv",),
    "usps": ("digit-domains/usps.npz",),
    "mnist-m": ("digit-domains/mnistm.npz",),
    "syn-digits": ("digit-domains/syn_roy.npz",),
    "digit-domains": ("mnist.npz", "digit-domains/usps.npz", "digit-domains/mnistm.npz",
                      "digit-domains/syn_roy.npz"),
    "office-caltech10": ("office_caltech10.zip",),
}
# What each registered loader returns; a test loads every name against it, so it cannot drift.
LOCAL_MODALITY: dict[str, Modality] = {
    "digits": "image",
    "cifar10": "image",
    "tinyimagenet-100": "image",
    "mnist": "image",
    "ag-news": "text",
    "usps": "image",
    "mnist-m": "image",
    "syn-digits": "image",
    "digit-domains": "image",
    "office-caltech10": "image",
}
