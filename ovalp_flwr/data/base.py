"""What every dataset module shares: the split and dataset types, the data dir, the rules for
a limit and a split, and reading a folder or zip of files (`ovalp_flwr.data.registry` names
the datasets; `files`, `domains` and `hub` build them)."""

from __future__ import annotations

import csv
import io
import logging
import os
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


def _check_limit(limit_per_class: int | None) -> None:
    """None or an int >= 1 (not a bool): the one rule for every loader."""
    if limit_per_class is not None and (
        isinstance(limit_per_class, bool)
        or not isinstance(limit_per_class, int | np.integer)
        or limit_per_class < 1
    ):
        raise ValueError(f"limit_per_class={limit_per_class!r} is not allowed; use an int >= 1")


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
    # late: scikit-learn (~1 s), only a split needs it; the ClientApp imports this module
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
    from PIL import Image  # late: PIL (~15 ms); only decoding needs it, not config/launcher

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


# The files each registered loader reads from the data dir (digits ships with scikit-learn).
# The datasets that ship with a library (no file in the data dir): scikit-learn's digits.
BUNDLED = ("digits",)
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
