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

from pathlib import Path

from ovalp_flwr.data import domains, files, hub
from ovalp_flwr.data.base import (AG_NEWS_CLASSES, DATA_DIR_ENV, DATA_FILES, DERIVED_PREFIXES,
                                  PREFIXES, Dataset, ImageDataset, ImageSplit, Loader, Modality,
                                  TextDataset, TextSplit, _check_limit, _not_found, _plain_name,
                                  resolve_data_dir)

__all__ = ["AG_NEWS_CLASSES", "DATA_DIR_ENV", "DATA_FILES", "DATASETS", "LOCAL_MODALITY", "Dataset",
           "ImageDataset", "ImageSplit", "TextDataset", "TextSplit", "dataset_modality",
           "load_dataset", "missing_data", "resolve_data_dir"]


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
        return hub.load_hub_dataset(name, limit_per_class=limit_per_class)
    root = resolve_data_dir(data_dir)
    if name.startswith(DERIVED_PREFIXES):
        return domains.load_derived(name, root, limit_per_class=limit_per_class, load=load_dataset)
    if name in DATASETS:
        return DATASETS[name](root, limit_per_class=limit_per_class)
    if name.startswith("folder:"):
        return files.folder_images(name, root / _plain_name(name), limit_per_class)
    if name.startswith("csv:"):
        return files.csv_texts(name, root / f"{_plain_name(name)}.csv", limit_per_class)
    raise _unknown(name)


def missing_data(name: str, data_dir: Path | str | None = None, cwd: Path | None = None
                 ) -> str | None:
    """Why `load_dataset(name, data_dir)` would fail for want of a file, or None; reads
    nothing, so a launcher can refuse a run before starting it."""
    dataset_modality(name)  # unknown names fail here, as in load_dataset
    root = resolve_data_dir(data_dir, cwd)
    if name.startswith(DERIVED_PREFIXES):
        return missing_data(domains.base_dataset(name), data_dir, cwd)
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
        return hub.hub_modality(name)
    if name in LOCAL_MODALITY:
        return LOCAL_MODALITY[name]
    if name.startswith(DERIVED_PREFIXES):
        return dataset_modality(domains.base_dataset(name))
    if name.startswith("folder:"):
        _plain_name(name)
        return "image"
    if name.startswith("csv:"):
        _plain_name(name)
        return "text"
    raise _unknown(name)


def _unknown(name: str) -> ValueError:
    prefixed = ", ".join([*(f"{p}<name>" for p in PREFIXES), "cifar10-c:[<corruption>:]<severity>",
                          "concept:<dataset>"])
    local = ", ".join(DATASETS)
    return ValueError(f"unknown dataset {name!r}; choose one of {local} or {prefixed}")


DATASETS: dict[str, Loader] = {
    "digits": files.digits,
    "cifar10": files.cifar10,
    "tinyimagenet-100": files.tinyimagenet_100,
    "mnist": files.mnist,
    "ag-news": files.ag_news,
    # domains (ovalp_flwr.data.domains): one digit style each, then all four, and four cameras
    "usps": domains.LOADERS["usps"],
    "mnist-m": domains.LOADERS["mnist-m"],
    "syn-digits": domains.LOADERS["syn-digits"],
    "digit-domains": domains.LOADERS["digit-domains"],
    "office-caltech10": domains.LOADERS["office-caltech10"],
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
