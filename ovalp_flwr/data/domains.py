"""Datasets whose samples come from several domains: clients that differ in what they see.

Every sample carries its domain (`domain_names`, each split's `domains`), so a `domain`
partition (ovalp_flwr.data.partitioners.DomainPartitioner) can give each client one, and each
client's own test split can come from its own domain. Three kinds of shift:

- **Feature level, real domains** (files in the data dir):
  - `usps`, `mnist-m`, `syn-digits`: one digit style each, at its own resolution, grey made RGB.
  - `digit-domains`: MNIST, USPS, MNIST-M and the synthetic digits together, at one resolution
    (32 px RGB) and one size per domain (6,000 train / 1,500 test, seeded stratified draws).
    MNIST-M's digits are MNIST *test* digits on photo patches, so MNIST's own rows here are
    both drawn from MNIST's *train* split: no MNIST-M training digit is an MNIST test digit.
  - `office-caltech10`: amazon, caltech, dslr and webcam photos of the same 10 classes,
    squashed to 128 px (Lite0's input size; the encoder's resize is then the identity). No
    split ships with it: a seeded stratified 80/20 split per domain. Byte-identical
    duplicates inside a domain (the release has 26 extra copies) are dropped first, so no test
    image has a twin among the training images.
- **Input level, corruptions** (CIFAR-10-C style, ovalp_flwr.data.corruptions):
  - `cifar10-c:<corruption>:<severity>`: all of CIFAR-10 under one corruption.
  - `cifar10-c:<severity>`: every registered corruption at that severity, each on its own
    disjoint share of CIFAR-10's train and test images (seeded, stratified by class), so a
    client can hold one corruption type and test on the same type.
- **Concept level**, `concept:<dataset>`: P(y | x) differs by domain. The base dataset's rows
  are split into `CONCEPTS` disjoint concepts (seeded, stratified); concept 0 keeps the labels,
  concept c > 0 swaps `SWAPS` pairs of classes (its own pairs, seeded: the same image is a
  "cat" in one concept and a "dog" in another). Test rows carry their concept's labels. The
  inputs are the base's, so its feature cache is reused: nothing is encoded again
  (`relabelling`).

Every split, share, corruption and swap is fixed by the dataset's name and `SPLIT_SEED`, never
by the run seed, so one feature cache serves every run.
"""

from __future__ import annotations

import hashlib
import io
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ovalp_flwr.data import files
from ovalp_flwr.data.base import (DATA_FILES, SPLIT_SEED, TEST_FRACTION, Dataset, ImageDataset,
                                  ImageSplit, Loader, TextDataset, _first_per_class, _open_tree,
                                  _require)
from ovalp_flwr.data.corruptions import CORRUPTIONS, SEVERITIES, corrupt

logger = logging.getLogger(__name__)

BaseLoader = Callable[..., Dataset]  # (name, data_dir, *, limit_per_class) -> Dataset

DIGIT_CLASSES = tuple("0123456789")
DIGIT_SIZE = 32  # digit-domains' common resolution (MNIST-M's and the synthetic digits')
DIGIT_TRAIN, DIGIT_TEST = 6000, 1500  # rows per domain in digit-domains
OFFICE_SIZE = 128
OFFICE_DOMAINS = ("amazon", "caltech", "dslr", "webcam")
CONCEPTS, SWAPS = 4, 2  # concept:<dataset>: concepts, and class pairs each concept > 0 swaps
CORRUPTED_PREFIX, CONCEPT_PREFIX = "cifar10-c:", "concept:"


# --- shared pieces --------------------------------------------------------------------------


def _rgb(images: np.ndarray) -> np.ndarray:
    """uint8 [N, H, W] grey or [N, H, W, 3] RGB -> [N, H, W, 3]."""
    return np.repeat(images[..., None], 3, axis=-1) if images.ndim == 3 else images


def _resize(images: np.ndarray, size: int) -> np.ndarray:
    """uint8 RGB [N, h, w, 3] -> [N, size, size, 3] (PIL bilinear, antialiased when shrinking)."""
    from PIL import Image  # late: PIL (~15 ms); only decoding needs it, not config/launcher

    if images.shape[1:3] == (size, size):
        return images
    out = np.empty((len(images), size, size, 3), dtype=np.uint8)
    for i, image in enumerate(images):
        out[i] = np.asarray(Image.fromarray(image).resize((size, size), Image.BILINEAR))
    return out


def _read_npz(path: Path, dataset: str) -> dict[str, np.ndarray]:
    keys = ("x_train", "y_train", "x_test", "y_test")
    with np.load(path) as npz:
        if not set(keys) <= set(npz.files):
            raise ValueError(f"dataset {dataset!r}: {path} has keys {npz.files}, needs {keys}")
        return {k: npz[k] for k in keys}


def _stratified_draw(labels: np.ndarray, train_size: int, test_size: int | None, seed: int
                     ) -> list[np.ndarray]:
    """Sorted row indices of a seeded stratified draw of `train_size` rows (and, disjoint from
    it, of `test_size`), by scikit-learn's splitter."""
    # late: scikit-learn (~1 s), only a draw needs it; the ClientApp imports this module
    from sklearn.model_selection import train_test_split

    if test_size is None and train_size >= len(labels):
        return [np.arange(len(labels))]
    drawn = train_test_split(np.arange(len(labels)), train_size=train_size, test_size=test_size,
                             stratify=labels, random_state=seed)
    return [np.sort(d) for d in (drawn if test_size else drawn[:1])]


def _shares(labels: np.ndarray, parts: int, seed: int) -> np.ndarray:
    """int64 [N]: which of `parts` disjoint shares each row is in, stratified by class."""
    rng = np.random.default_rng(seed)
    share = np.empty(len(labels), dtype=np.int64)
    for c in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == c))
        for k, part in enumerate(np.array_split(rows, parts)):
            share[part] = k
    return share


def _per_class_split(labels: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded 80/20 train/test row indices per class (a class of one stays in train)."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == c))
        cut = round(len(rows) * TEST_FRACTION) if len(rows) > 1 else 0
        test.append(rows[:max(cut, 1 if len(rows) > 1 else 0)])
        train.append(rows[len(test[-1]):])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def _concat(splits: Sequence[ImageSplit]) -> ImageSplit:
    """Domains stacked in order; domain k's rows get domain label k."""
    return ImageSplit(
        np.concatenate([s.images for s in splits]),
        np.concatenate([s.labels for s in splits]).astype(np.int64),
        np.concatenate([np.full(len(s.labels), k, np.int64) for k, s in enumerate(splits)]),
    )


def _limited(split: ImageSplit, limit: int | None) -> ImageSplit:
    keep = _first_per_class(split.labels, limit)
    return ImageSplit(split.images[keep], split.labels[keep])


# --- feature level: digit styles ------------------------------------------------------------


def _one_digit_domain(name: str) -> Loader:
    """A digit style at its own resolution (grey made RGB), one domain named after it."""

    def load(data_dir: Path, *, limit_per_class: int | None = None) -> ImageDataset:
        arrays = _read_npz(_require(data_dir / DATA_FILES[name][0], name), name)
        splits = [_limited(ImageSplit(_rgb(arrays[f"x_{s}"]), arrays[f"y_{s}"].astype(np.int64)),
                           limit_per_class) for s in ("train", "test")]
        return ImageDataset(name, *splits, DIGIT_CLASSES, (name,))

    return load


def _digit_domain_splits(name: str, data_dir: Path) -> tuple[ImageSplit, ImageSplit]:
    """One domain of digit-domains: DIGIT_TRAIN / DIGIT_TEST stratified rows at DIGIT_SIZE."""
    file = data_dir / ("mnist.npz" if name == "mnist" else DATA_FILES[name][0])
    arrays = _read_npz(_require(file, "digit-domains"), "digit-domains")
    seed = SPLIT_SEED + int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)
    if name == "mnist":  # both from MNIST train: MNIST-M's digits are MNIST test digits
        x, y = arrays["x_train"], arrays["y_train"].astype(np.int64)
        train, test = _stratified_draw(y, DIGIT_TRAIN, DIGIT_TEST, seed)
        pairs = ((x, y, train), (x, y, test))
    else:
        pairs = tuple((arrays[f"x_{s}"], arrays[f"y_{s}"].astype(np.int64),
                       _stratified_draw(arrays[f"y_{s}"], size, None, seed)[0])
                      for s, size in (("train", DIGIT_TRAIN), ("test", DIGIT_TEST)))
    return tuple(ImageSplit(_resize(_rgb(x[rows]), DIGIT_SIZE), y[rows]) for x, y, rows in pairs)


def _digit_domains(data_dir: Path, *, limit_per_class: int | None = None) -> ImageDataset:
    """The four digit styles at one resolution and size; `limit_per_class`: per domain."""
    names = ("mnist", "usps", "mnist-m", "syn-digits")
    parts = [_digit_domain_splits(n, data_dir) for n in names]
    train = _concat([_limited(tr, limit_per_class) for tr, _ in parts])
    test = _concat([_limited(te, limit_per_class) for _, te in parts])
    return ImageDataset("digit-domains", train, test, DIGIT_CLASSES, names)


# --- feature level: Office-Caltech-10 -------------------------------------------------------


def _office_caltech10(data_dir: Path, *, limit_per_class: int | None = None) -> ImageDataset:
    """Four cameras, ten classes; a seeded 80/20 split per domain (and class); duplicates out."""
    dataset = "office-caltech10"
    path = _require(data_dir / DATA_FILES[dataset][0], dataset)
    with _open_tree(path, dataset) as tree:
        files = [n.split("/") for n in tree.names if n.count("/") == 2]
        classes = tuple(sorted({c for _, c, _ in files}))
        domains = tuple(d for d in OFFICE_DOMAINS if any(f[0] == d for f in files))
        if not classes or len(domains) != len(OFFICE_DOMAINS):
            raise ValueError(f"dataset {dataset!r}: {path} needs <domain>/<class>/<file> for "
                             f"domains {', '.join(OFFICE_DOMAINS)}")
        train, test = [], []
        for k, domain in enumerate(domains):
            paths, labels = _office_domain_files(tree, domain, classes, limit_per_class)
            images = _decode_squares(tree, paths, dataset)
            tr, te = _per_class_split(labels, SPLIT_SEED + k)
            train.append(ImageSplit(images[tr], labels[tr]))
            test.append(ImageSplit(images[te], labels[te]))
    return ImageDataset(dataset, _concat(train), _concat(test), classes, domains)


def _office_domain_files(tree, domain: str, classes: tuple[str, ...], limit: int | None
                         ) -> tuple[list[str], np.ndarray]:
    """A domain's files in sorted order, byte-identical duplicates dropped (the first kept)."""
    seen: set[str] = set()
    paths, labels = [], []
    for c, name in enumerate(classes):
        kept = 0
        for path in sorted(n for n in tree.names if n.startswith(f"{domain}/{name}/")):
            digest = hashlib.sha256(tree.read(path)).hexdigest()
            if digest in seen or (limit is not None and kept >= limit):
                continue
            seen.add(digest)
            paths.append(path)
            labels.append(c)
            kept += 1
    return paths, np.asarray(labels, dtype=np.int64)


def _decode_squares(tree, paths: Sequence[str], dataset: str) -> np.ndarray:
    """Decode and squash every photo to OFFICE_SIZE x OFFICE_SIZE RGB."""
    from PIL import Image  # late: PIL (~15 ms); only decoding needs it, not config/launcher

    out = np.empty((len(paths), OFFICE_SIZE, OFFICE_SIZE, 3), dtype=np.uint8)
    for i, path in enumerate(paths):
        try:
            with Image.open(io.BytesIO(tree.read(path))) as image:
                square = image.convert("RGB").resize((OFFICE_SIZE, OFFICE_SIZE), Image.BILINEAR)
                out[i] = np.asarray(square)
        except OSError as err:
            raise ValueError(f"dataset {dataset!r}: cannot decode {tree.where}/{path} ({err})"
                             ) from err
    return out


# --- input level: CIFAR-10-C ----------------------------------------------------------------


@dataclass(frozen=True)
class CorruptedName:
    """`cifar10-c:<severity>` (every corruption, one share each) or `cifar10-c:<name>:<severity>`."""

    corruptions: tuple[str, ...]
    severity: int

    @classmethod
    def parse(cls, name: str) -> CorruptedName:
        parts = name[len(CORRUPTED_PREFIX):].split(":")
        usage = (f"dataset {name!r} is not allowed; use cifar10-c:<severity> (every corruption, "
                 f"one share each) or cifar10-c:<corruption>:<severity>, severity in "
                 f"{SEVERITIES[0]}..{SEVERITIES[-1]}")
        if len(parts) not in (1, 2) or not parts[-1].isdigit() or int(parts[-1]) not in SEVERITIES:
            raise ValueError(usage)
        if len(parts) == 2 and parts[0] not in CORRUPTIONS:
            raise ValueError(f"dataset {name!r} is not allowed; corruption {parts[0]!r} is not "
                             f"one of: {', '.join(CORRUPTIONS)}")
        return cls(tuple(CORRUPTIONS) if len(parts) == 1 else (parts[0],), int(parts[-1]))


def _cifar10_c(name: str, data_dir: Path, limit_per_class: int | None) -> ImageDataset:
    """CIFAR-10 with each share of its rows under one corruption (train and test alike)."""
    from tqdm.auto import tqdm  # late: tqdm.auto (~50 ms with asyncio); config imports this module

    spec = CorruptedName.parse(name)
    clean = files.cifar10(data_dir, limit_per_class=limit_per_class)
    started = time.perf_counter()
    splits = {}
    bar = tqdm(total=len(clean.train.labels) + len(clean.test.labels), unit="img",
               desc=f"{name} corrupting")
    for k, split in enumerate(("train", "test")):
        part = getattr(clean, split)
        share = _shares(part.labels, len(spec.corruptions), SPLIT_SEED + k)
        images = np.empty_like(part.images)
        for d, corruption in enumerate(spec.corruptions):
            rows = np.flatnonzero(share == d)
            # train and test draw different noise: the seed names the split
            images[rows] = corrupt(part.images[rows], corruption, spec.severity, seed=k)
            bar.update(len(rows))
        splits[split] = ImageSplit(images, part.labels, share)
    bar.close()
    logger.info(f"{name}: corrupted {bar.n} images in {time.perf_counter() - started:.1f} s")
    return ImageDataset(name, splits["train"], splits["test"], clean.class_names,
                        tuple(f"{c}-{spec.severity}" for c in spec.corruptions))


# --- concept level: label swaps -------------------------------------------------------------


@dataclass(frozen=True)
class Relabelling:
    """concept:<base>: the base's rows in CONCEPTS concepts, concept c > 0 with SWAPS class
    pairs swapped. Only labels and domains change, so a cache of the base serves as inputs."""

    base: str

    def swaps(self, num_classes: int) -> list[list[tuple[int, int]]]:
        """Per concept, its swapped class pairs (disjoint within a concept; concept 0: none)."""
        if num_classes < 2 * SWAPS:
            raise ValueError(f"dataset {CONCEPT_PREFIX}{self.base!r}: {num_classes} classes "
                             f"cannot make {SWAPS} disjoint swapped pairs")
        rng = np.random.default_rng(SPLIT_SEED)
        out: list[list[tuple[int, int]]] = [[]]
        for _ in range(1, CONCEPTS):
            picked = rng.permutation(num_classes)[:2 * SWAPS].reshape(SWAPS, 2)
            out.append([tuple(sorted(map(int, pair))) for pair in picked])
        return out

    def domain_names(self, class_names: Sequence[str]) -> tuple[str, ...]:
        """'original', then each concept by its swaps: 'cat<->dog,bird<->ship'."""
        return ("original", *(",".join(f"{class_names[a]}<->{class_names[b]}" for a, b in pairs)
                              for pairs in self.swaps(len(class_names))[1:]))

    def apply(self, labels: np.ndarray, num_classes: int, split: str
              ) -> tuple[np.ndarray, np.ndarray]:
        """(new labels, concept of every row) for a split of the base ('train' or 'test')."""
        concept = _shares(labels, CONCEPTS, SPLIT_SEED + ("train", "test").index(split))
        out = np.asarray(labels, dtype=np.int64).copy()
        for c, pairs in enumerate(self.swaps(num_classes)):
            mapping = np.arange(num_classes)
            for a, b in pairs:
                mapping[a], mapping[b] = b, a
            rows = concept == c
            out[rows] = mapping[out[rows]]
        return out, concept


def relabelling(name: str) -> Relabelling | None:
    """What `concept:<base>` does to its base's labels; None for any other dataset."""
    if not name.startswith(CONCEPT_PREFIX):
        return None
    base = name[len(CONCEPT_PREFIX):]
    if not base or base.startswith(CONCEPT_PREFIX):
        raise ValueError(f"dataset {name!r} is not allowed; use concept:<dataset> with a dataset "
                         "that is not itself a concept shift")
    return Relabelling(base)


def _concept(name: str, data_dir: Path, limit_per_class: int | None, load: BaseLoader) -> Dataset:
    """The base dataset with each concept's labels (its inputs unchanged)."""
    spec = relabelling(name)
    base = load(spec.base, data_dir, limit_per_class=limit_per_class)
    splits = {}
    for split in ("train", "test"):
        part = getattr(base, split)
        labels, concept = spec.apply(part.labels, base.num_classes, split)
        splits[split] = replace(part, labels=labels, domains=concept)
    kind = TextDataset if isinstance(base, TextDataset) else ImageDataset
    return kind(name, splits["train"], splits["test"], base.class_names,
                spec.domain_names(base.class_names))


# --- registry -------------------------------------------------------------------------------


def base_dataset(name: str) -> str:
    """The registered dataset a `cifar10-c:` or `concept:` name is built from."""
    if name.startswith(CORRUPTED_PREFIX):
        CorruptedName.parse(name)
        return "cifar10"
    spec = relabelling(name)
    if spec is None:
        raise ValueError(f"dataset {name!r} is not a derived dataset")
    return spec.base


def num_domains(name: str) -> int:
    """How many domains a dataset has, without reading it (1 for a one-domain dataset)."""
    if name.startswith(CORRUPTED_PREFIX):
        return len(CorruptedName.parse(name).corruptions)
    if name.startswith(CONCEPT_PREFIX):
        return CONCEPTS
    return {"digit-domains": 4, "office-caltech10": len(OFFICE_DOMAINS)}.get(name, 1)


def load_derived(name: str, data_dir: Path, *, limit_per_class: int | None = None,
                 load: BaseLoader) -> Dataset:
    """`cifar10-c:...` or `concept:...` from the data dir; `load` builds a concept's base dataset
    by name (the registry's `load_dataset`: any registered dataset can carry concepts)."""
    if name.startswith(CORRUPTED_PREFIX):
        return _cifar10_c(name, data_dir, limit_per_class)
    return _concept(name, data_dir, limit_per_class, load)


LOADERS: dict[str, Callable[..., Dataset]] = {
    "usps": _one_digit_domain("usps"),
    "mnist-m": _one_digit_domain("mnist-m"),
    "syn-digits": _one_digit_domain("syn-digits"),
    "digit-domains": _digit_domains,
    "office-caltech10": _office_caltech10,
}
