"""Building a cache folder: the encoder over a dataset's splits, written to a hidden temp folder
and renamed into place only when complete (`ovalp_flwr.features.cache`)."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save as st_save

from ovalp_flwr.core.durable import fsync_dir, write_durably
from ovalp_flwr.data.domains import relabelling
from ovalp_flwr.data.registry import dataset_modality, load_dataset
from ovalp_flwr.features.cache.layout import (cache_path, CachedFeatures, CacheError, FeatureSet,
                                              FORMAT_VERSION, load_features, logger, MANIFEST,
                                              SPLITS, _identity, _options)
from ovalp_flwr.features.encoders import (DEFAULT_BATCH_SIZE, EncoderOptions, encode_all,
                                          encoder_modality, load_encoder)




@dataclass(frozen=True)
class BuildSettings:
    """How to build (none of it changes the features, so none of it is identity)."""

    device: str = "auto"
    batch_size: int = DEFAULT_BATCH_SIZE
    data_dir: str | Path | None = None
    progress: bool = True


def build_features(
    dataset: str,
    encoder: str,
    cache_dir: Path,
    *,
    limit_per_class: int | None = None,
    data_dir: str | Path | None = None,
    device: str = "auto",
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = True,
    **encoder_options: Any,
) -> CachedFeatures:
    """Encode both splits and install the cache, replacing any existing one (last build wins).

    data_dir and limit_per_class go to `load_dataset`; encoder_options are EncoderOptions fields.
    """
    settings = BuildSettings(device, batch_size, data_dir, progress)
    opts = _options(encoder_options)
    return _build(dataset, encoder, cache_dir, limit_per_class, opts, settings, replace=True)


def load_or_build(
    dataset: str,
    encoder: str,
    cache_dir: Path,
    *,
    limit_per_class: int | None = None,
    data_dir: str | Path | None = None,
    device: str = "auto",
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = True,
    **encoder_options: Any,
) -> CachedFeatures:
    """Build only when the folder is absent; a present-but-bad cache raises CacheError.

    Racing first builds are fine: the first complete folder to land is kept, never replaced.
    """
    if cache_path(cache_dir, dataset, encoder, limit_per_class, **encoder_options).exists():
        return load_features(
            dataset, encoder, cache_dir, limit_per_class=limit_per_class, **encoder_options
        )
    settings = BuildSettings(device, batch_size, data_dir, progress)
    opts = _options(encoder_options)
    return _build(dataset, encoder, cache_dir, limit_per_class, opts, settings, replace=False)


def _inputs(data: Any, split: str) -> Sequence[Any]:
    """What the encoder reads from a split: its images or its texts."""
    part = getattr(data, split)
    return part.texts if data.modality == "text" else part.images


def _build(
    dataset: str,
    encoder: str,
    cache_dir: Path,
    limit_per_class: int | None,
    opts: EncoderOptions,
    settings: BuildSettings,
    *,
    replace: bool,
) -> CachedFeatures:
    _identity(encoder, opts)  # unknown names and bad options fail before any data is read
    if dataset_modality(dataset) != encoder_modality(encoder):  # ... and so does a mismatch
        raise CacheError(
            f"encoder {encoder!r} reads {encoder_modality(encoder)}; "
            f"dataset {dataset!r} is {dataset_modality(dataset)}"
        )
    if relabelling(dataset) is not None:
        splits, manifest = _relabelled(dataset, encoder, cache_dir, limit_per_class, opts,
                                       settings)
    else:
        splits, manifest = _encoded(dataset, encoder, limit_per_class, opts, settings)
    target = cache_path(cache_dir, dataset, encoder, limit_per_class, **dataclasses.asdict(opts))
    installed = _write_and_install(target, manifest, splits, replace)
    kept = "" if installed else " (kept the equal cache another builder installed first)"
    logger.info(f"{build_summary(manifest, target)}{kept}")
    # Our own arrays even if another build landed first: same identity, and re-reading the
    # folder could race with a concurrent replacing build.
    return CachedFeatures(splits["train"], splits["test"], manifest["num_classes"], manifest)


def _encoded(dataset: str, encoder: str, limit_per_class: int | None, opts: EncoderOptions,
             settings: BuildSettings) -> tuple[dict[str, FeatureSet], dict[str, Any]]:
    """Load the dataset and encode both splits: the features and the manifest to be."""
    clock = time.perf_counter()
    data = load_dataset(dataset, data_dir=settings.data_dir, limit_per_class=limit_per_class)
    load_seconds = time.perf_counter() - clock
    clock = time.perf_counter()
    enc = load_encoder(
        encoder, device=settings.device, batch_size=settings.batch_size, **dataclasses.asdict(opts)
    )
    model_seconds = time.perf_counter() - clock
    clock = time.perf_counter()
    splits = {
        split: FeatureSet(
            x=encode_all(
                enc, _inputs(data, split), progress=settings.progress, desc=f"{encoder} {split}"
            ),
            y=np.asarray(getattr(data, split).labels, dtype=np.int64),
            domains=data.split_domains(split) if data.domain_names else None,
        )
        for split in SPLITS
    }
    encode_seconds = time.perf_counter() - clock
    count = sum(len(s.y) for s in splits.values())
    manifest = _manifest(dataset, encoder, limit_per_class, opts, enc.identity(), data.modality,
                         data.class_names, data.domain_names)
    manifest["build"] = {
        "device": str(enc.device),
        "batch_size": settings.batch_size,
        "data_dir": None if settings.data_dir is None else str(settings.data_dir),
        "inputs": count,
        "unit": "texts" if data.modality == "text" else "images",
        "load_seconds": round(load_seconds, 3),
        "model_seconds": round(model_seconds, 3),
        "encode_seconds": round(encode_seconds, 3),
        "inputs_per_s": round(count / max(encode_seconds, 1e-9), 1),
    }
    return splits, manifest


def _relabelled(dataset: str, encoder: str, cache_dir: Path, limit_per_class: int | None,
                opts: EncoderOptions, settings: BuildSettings
                ) -> tuple[dict[str, FeatureSet], dict[str, Any]]:
    """A concept shift's cache from its base's (built first if absent): the same features,
    each concept's labels. Nothing is encoded twice; the manifest names the base's files."""
    spec = relabelling(dataset)
    base = load_or_build(spec.base, encoder, cache_dir, limit_per_class=limit_per_class,
                         data_dir=settings.data_dir, device=settings.device,
                         batch_size=settings.batch_size, progress=settings.progress,
                         **dataclasses.asdict(opts))
    splits = {}
    for split in SPLITS:
        labels, concept = spec.apply(getattr(base, split).y, base.num_classes, split)
        splits[split] = FeatureSet(getattr(base, split).x, labels, concept)
    names = base.manifest["class_names"]
    manifest = _manifest(dataset, encoder, limit_per_class, opts,
                         base.manifest["encoder_identity"], base.manifest["modality"], names,
                         spec.domain_names(names))
    manifest["derived_from"] = {"dataset": spec.base, **{
        f"{split}_sha256": base.manifest["splits"][split]["sha256"] for split in SPLITS}}
    count = sum(len(s.y) for s in splits.values())
    manifest["build"] = {**base.manifest["build"], "inputs": count, "encode_seconds": 0.0,
                         "load_seconds": 0.0, "model_seconds": 0.0,
                         "note": f"features of {spec.base}'s cache, relabelled"}
    return splits, manifest


def _manifest(dataset: str, encoder: str, limit_per_class: int | None, opts: EncoderOptions,
              identity: dict[str, Any], modality: str, class_names: Sequence[str],
              domain_names: Sequence[str]) -> dict[str, Any]:
    """What the features are; `splits` is filled as the files are written."""
    manifest: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "dataset": dataset,
        "encoder": encoder,
        "limit_per_class": limit_per_class,
        "modality": modality,
        "encoder_options": dataclasses.asdict(opts),
        "encoder_identity": identity,
        "dtype": "float32",
        "num_classes": len(class_names),
        "class_names": list(class_names),
        "splits": {},
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if domain_names:  # a dataset without declared domains is one, named after itself
        manifest["domain_names"] = list(domain_names)
    return manifest


def build_summary(manifest: dict[str, Any], path: Path) -> str:
    """One line: encoder, feature size, speed (preprocess + forward), seconds, where."""
    build = manifest["build"]
    if "derived_from" in manifest:  # nothing was encoded
        return (f"{manifest['dataset']}: {manifest['encoder']}'s features of the "
                f"{manifest['derived_from']['dataset']} cache, relabelled ({build['inputs']} "
                f"{build['unit']}) -> {path}")
    unit = build["unit"]
    return (
        f"{manifest['encoder']}: {manifest['encoder_identity']['feature_dim']}-d features, "
        f"{build['inputs']} {unit} in {build['encode_seconds']:.1f} s, "
        f"{build['inputs_per_s']:.1f} {unit}/s (data {build['load_seconds']:.1f} s, "
        f"model {build['model_seconds']:.1f} s) -> {path}"
    )


def _write_and_install(
    target: Path, manifest: dict[str, Any], splits: dict[str, FeatureSet], replace: bool
) -> bool:
    """Write everything into a hidden temp folder beside `target`, then rename it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        for split, features in splits.items():
            manifest["splits"][split] = _write_split(tmp / f"{split}.safetensors", features)
        write_durably(tmp / MANIFEST, json.dumps(manifest, indent=2).encode())
        fsync_dir(tmp)
        return _install(tmp, target, replace)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # still there only if not installed


def _write_split(file: Path, split: FeatureSet) -> dict[str, Any]:
    tensors = {"features": split.x, "labels": split.y}
    if split.domains is not None:
        tensors["domains"] = np.ascontiguousarray(split.domains, dtype=np.int64)
    blob = st_save(tensors)
    write_durably(file, blob)
    return {
        "shape": list(split.x.shape),
        "bytes": len(blob),
        "sha256": hashlib.sha256(blob).hexdigest(),
    }


def _install(tmp: Path, target: Path, replace: bool) -> bool:
    """Atomically put the complete folder `tmp` at `target`; False if one was there and kept.

    rename() onto a non-empty folder fails, so to replace, the old one is first renamed aside;
    racing replacers loop until their own rename lands (last wins, each folder whole).
    """
    while True:
        try:
            os.rename(tmp, target)
            break
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        if not replace:
            return False
        old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(target, old)
        except FileNotFoundError:
            continue
        shutil.rmtree(old, ignore_errors=True)
    fsync_dir(target.parent)
    return True
