"""Encoder features cached on disk, one verified folder per (dataset, encoder).

Layout of `cache_dir/<dataset>__<encoder>/`: `train.safetensors` and `test.safetensors`
(tensors "features" float32 [N, D] and "labels" int64 [N]) and `manifest.json`, which records
what the features are (dataset, encoder identity) and what the files are (shape, size, sha256).
A folder is trusted only if all of that matches; otherwise CacheError, never a silent rebuild,
since stale features would quietly change every result built on them. Builds go to a hidden
temp folder that is renamed into place only when complete, so an interrupted build leaves
nothing that is later trusted, and concurrent builders each install a complete folder.
Replacing (build_features on an existing cache) takes two renames: a reader at that instant
may find no cache and fail; load_or_build never replaces, so runs that only use it never race.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from ovalp_flwr.devices import resolve_device
from ovalp_flwr.durable import fsync_dir, write_durably
from ovalp_flwr.encoders import Encoder, encoder_identity, load_encoder

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
SPLITS = ("train", "test")
MANIFEST = "manifest.json"


class CacheError(RuntimeError):
    """A cache folder that is missing or does not match what was asked for."""


@dataclass(frozen=True)
class FeatureSet:
    x: np.ndarray  # float32 [N, D]
    y: np.ndarray  # int64 [N]


@dataclass(frozen=True)
class CachedFeatures:
    train: FeatureSet
    test: FeatureSet
    num_classes: int
    manifest: dict[str, Any]


def cache_path(cache_dir: Path, dataset: str, encoder: str) -> Path:
    return Path(cache_dir) / f"{dataset}__{encoder}"


# --- reading --------------------------------------------------------------------------------


def load_features(
    dataset: str, encoder: str, cache_dir: Path, *, image_size: int | None = None
) -> CachedFeatures:
    """Load and verify a cache; the encoder identity is computed without building the network."""
    path = cache_path(cache_dir, dataset, encoder)
    manifest = _read_manifest(path)
    expected = {
        "format_version": FORMAT_VERSION,
        "dataset": dataset,
        "encoder": encoder,
        "encoder_identity": encoder_identity(encoder, image_size=image_size),
    }
    for key, value in expected.items():
        _expect(path, key, value, manifest.get(key))
    _expect(path, "num_classes", len(manifest.get("class_names", [])), manifest.get("num_classes"))
    splits = {name: _read_split(path, manifest, name) for name in SPLITS}
    return CachedFeatures(splits["train"], splits["test"], manifest["num_classes"], manifest)


def _read_manifest(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise CacheError(f"feature cache {path} does not exist")
    try:
        return json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as err:
        raise CacheError(
            f"feature cache {path}: unreadable {MANIFEST} ({err}); delete the folder to rebuild"
        ) from err


def _expect(path: Path, key: str, expected: Any, found: Any) -> None:
    """Name the first differing (sub)key, so the message says what changed."""
    if isinstance(expected, dict) and isinstance(found, dict):
        for sub in sorted(expected.keys() | found.keys()):
            _expect(path, f"{key}.{sub}", expected.get(sub), found.get(sub))
    elif expected != found:
        raise CacheError(
            f"feature cache {path}: {key} mismatch: expected {expected!r}, found {found!r}; "
            "delete the folder to rebuild"
        )


def _read_split(path: Path, manifest: dict[str, Any], split: str) -> FeatureSet:
    meta = manifest.get("splits", {}).get(split)
    if not isinstance(meta, dict):
        raise CacheError(f"feature cache {path}: splits.{split} missing from {MANIFEST}")
    file = path / f"{split}.safetensors"
    try:
        blob = file.read_bytes()
    except OSError as err:
        raise CacheError(f"feature cache {path}: cannot read {file.name} ({err})") from err
    key = f"splits.{split}"
    _expect(path, f"{key}.bytes", meta.get("bytes"), len(blob))
    _expect(path, f"{key}.sha256", meta.get("sha256"), hashlib.sha256(blob).hexdigest())
    tensors = st_load(blob)
    x, y = tensors.get("features"), tensors.get("labels")
    if x is None or y is None:
        raise CacheError(f"feature cache {path}: {file.name} lacks 'features' or 'labels'")
    _expect(path, f"{key}.shape", meta.get("shape"), list(x.shape))
    _expect(path, f"{key}.feature_dim", manifest["encoder_identity"]["feature_dim"], x.shape[-1])
    _expect(path, f"{key}.dtype", manifest.get("dtype"), str(x.dtype))
    _expect(path, f"{key}.labels.shape", [len(x)], list(y.shape))
    _expect(path, f"{key}.labels.dtype", "int64", str(y.dtype))
    if len(y) and not 0 <= y.min() <= y.max() < manifest["num_classes"]:
        raise CacheError(f"feature cache {path}: {key} labels outside [0, num_classes)")
    return FeatureSet(x=x, y=y)


# --- building -------------------------------------------------------------------------------


def build_features(
    dataset: str,
    encoder: str,
    cache_dir: Path,
    *,
    device: str = "auto",
    batch_size: int = 128,
    image_size: int | None = None,
    progress: bool = True,
) -> CachedFeatures:
    """Encode both splits and install the cache, replacing any existing one (last build wins)."""
    return _build(
        dataset,
        encoder,
        cache_dir,
        replace=True,
        device=device,
        batch_size=batch_size,
        image_size=image_size,
        progress=progress,
    )


def load_or_build(
    dataset: str, encoder: str, cache_dir: Path, **build_kwargs: Any
) -> CachedFeatures:
    """Build only when the folder is absent; a present-but-bad cache raises CacheError.

    Racing first builds are fine: the first complete folder to land is kept, never replaced.
    """
    if cache_path(cache_dir, dataset, encoder).exists():
        return load_features(dataset, encoder, cache_dir, image_size=build_kwargs.get("image_size"))
    return _build(dataset, encoder, cache_dir, replace=False, **build_kwargs)


def _build(
    dataset: str,
    encoder: str,
    cache_dir: Path,
    *,
    replace: bool,
    device: str = "auto",
    batch_size: int = 128,
    image_size: int | None = None,
    progress: bool = True,
) -> CachedFeatures:
    from ovalp_flwr.datasets import load_dataset

    data = load_dataset(dataset)
    enc = load_encoder(encoder, device=device, image_size=image_size)
    start = time.perf_counter()
    splits = {
        split: FeatureSet(
            x=_encode(enc, getattr(data, split).images, batch_size, progress, f"{encoder} {split}"),
            y=getattr(data, split).labels.astype(np.int64),
        )
        for split in SPLITS
    }
    seconds = time.perf_counter() - start
    count = sum(len(s.y) for s in splits.values())
    manifest = {
        "format_version": FORMAT_VERSION,
        "dataset": dataset,
        "encoder": encoder,
        "encoder_identity": enc.identity(),
        "dtype": "float32",
        "num_classes": len(data.class_names),
        "class_names": list(data.class_names),
        "splits": {},  # filled as the files are written
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "build": {
            "device": str(resolve_device(device)),
            "seconds": round(seconds, 2),
            "images_per_s": round(count / seconds, 1),
        },
    }
    target = cache_path(cache_dir, dataset, encoder)
    installed = _write_and_install(target, manifest, splits, replace)
    rate = count / seconds
    kept = "" if installed else " (kept the equal cache another builder installed first)"
    logger.info(
        f"encoded {count} images with {encoder} ({enc.feature_dim}-d features) "
        f"in {seconds:.1f} s, {rate:.1f} images/s -> {target}{kept}"
    )
    # Our own arrays even if another build landed first: same identity, and re-reading the
    # folder could race with a concurrent replacing build.
    return CachedFeatures(splits["train"], splits["test"], manifest["num_classes"], manifest)


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


def _encode(
    enc: Encoder, images: np.ndarray, batch_size: int, progress: bool, desc: str
) -> np.ndarray:
    from tqdm.auto import tqdm

    out = np.empty((len(images), enc.feature_dim), dtype=np.float32)
    with tqdm(total=len(images), desc=desc, unit="img", disable=not progress) as bar:
        for i in range(0, len(images), batch_size):
            out[i : i + batch_size] = enc.encode(images[i : i + batch_size])
            bar.update(min(batch_size, len(images) - i))
    return out


def _write_split(file: Path, split: FeatureSet) -> dict[str, Any]:
    blob = st_save({"features": split.x, "labels": split.y})
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
