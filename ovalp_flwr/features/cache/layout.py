"""What a cache folder is, and reading one: the layout, the manifest, the identity of the
features it holds, and the checks that decide whether it can be trusted (`ovalp_flwr.features.cache`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load as st_load

from ovalp_flwr.features.encoders import (EncoderOptions, encoder_identity, encoder_modality)

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: limit_per_class, modality, encoder_options; dtype in the identity
SPLITS = ("train", "test")
MANIFEST = "manifest.json"
LIMIT_MARK = "@limit"


class CacheError(RuntimeError):
    """A cache folder that is missing, does not match what was asked for, or cannot be built."""


@dataclass(frozen=True)
class FeatureSet:
    x: np.ndarray  # float32 [N, D]
    y: np.ndarray  # int64 [N]
    domains: np.ndarray | None = None  # int64 [N] into the manifest's domain_names; None: one

    @property
    def domain(self) -> np.ndarray:
        """int64 [N]: every row's domain (all 0 for a one-domain dataset)."""
        return np.zeros(len(self.y), np.int64) if self.domains is None else self.domains


@dataclass(frozen=True)
class CachedFeatures:
    train: FeatureSet
    test: FeatureSet
    num_classes: int
    manifest: dict[str, Any]

    def feature_space(self) -> str:
        return feature_space(self.manifest)

    @property
    def domain_names(self) -> tuple[str, ...]:
        """The domains' names; a dataset without declared domains is one, named after itself."""
        return tuple(self.manifest.get("domain_names") or [self.manifest["dataset"]])


def feature_space(manifest: dict[str, Any]) -> str:
    """Digest of what makes two caches' features and labels interchangeable: the encoder
    identity (weights, preprocessing, dtype, size) and the ordered class names, not the data.
    Nodes with their own data must agree on it with the server."""
    space = {k: manifest.get(k) for k in ("encoder_identity", "class_names", "dtype")}
    return hashlib.sha256(json.dumps(space, sort_keys=True).encode()).hexdigest()[:16]


def cache_path(
    cache_dir: Path,
    dataset: str,
    encoder: str,
    limit_per_class: int | None = None,
    **encoder_options: Any,
) -> Path:
    """`<dataset>__<encoder>` for a full cache with the encoder's defaults; each departure adds
    a mark, so variants live side by side instead of refusing each other's folder:
    `@limit<N>`, `@random` (pretrained=False), `@<dtype>`, `@<size>px`, `@<pooling>`,
    `@weights-<hash of the path>`."""
    opts = _options(encoder_options)
    marks = [
        f"{LIMIT_MARK}{limit_per_class}" if limit_per_class is not None else "",
        "" if opts.pretrained else "@random",
        "" if opts.dtype == "fp32" else f"@{opts.dtype}",
        "" if opts.image_size is None else f"@{opts.image_size}px",
        "" if opts.pooling is None else f"@{opts.pooling}",
        "" if opts.weights_file is None
        else f"@weights-{hashlib.sha256(str(opts.weights_file).encode()).hexdigest()[:8]}",
    ]
    return Path(cache_dir) / f"{dataset}__{encoder}{''.join(marks)}"


def _options(encoder_options: dict[str, Any]) -> EncoderOptions:
    """EncoderOptions from keyword arguments; an unknown name is a one-line error."""
    known = [f.name for f in dataclasses.fields(EncoderOptions)]
    unknown = sorted(set(encoder_options) - set(known))
    if unknown:
        raise TypeError(f"unknown encoder option {unknown[0]!r}; choose from {', '.join(known)}")
    return EncoderOptions(**encoder_options)


def _identity(encoder: str, opts: EncoderOptions) -> dict[str, Any]:
    return encoder_identity(encoder, **dataclasses.asdict(opts))


# --- reading --------------------------------------------------------------------------------


def load_features(
    dataset: str,
    encoder: str,
    cache_dir: Path,
    *,
    limit_per_class: int | None = None,
    **encoder_options: Any,
) -> CachedFeatures:
    """Load and verify a cache; the encoder identity is computed without building the network.

    encoder_options: fields of EncoderOptions (image_size, dtype, pooling, pretrained,
    weights_file), as the cache was built with.
    """
    opts = _options(encoder_options)
    path = cache_path(cache_dir, dataset, encoder, limit_per_class, **encoder_options)
    manifest = _read_manifest(path)
    expected = {
        "format_version": FORMAT_VERSION,
        "dataset": dataset,
        "encoder": encoder,
        "limit_per_class": limit_per_class,
        "modality": encoder_modality(encoder),
        "encoder_identity": _identity(encoder, opts),
    }
    for key, value in expected.items():
        _expect(path, key, value, manifest.get(key))
    _expect(path, "num_classes", len(manifest.get("class_names", [])), manifest.get("num_classes"))
    splits = {name: _read_split(path, manifest, name) for name in SPLITS}
    return CachedFeatures(splits["train"], splits["test"], manifest["num_classes"], manifest)


def read_manifest(cache_dir: Path, dataset: str, encoder: str, **encoder_options: Any) -> dict[str, Any]:
    """A cache's manifest alone (no feature file is read): cheap facts for a fresh process."""
    return _read_manifest(cache_path(cache_dir, dataset, encoder, **encoder_options))


def _read_manifest(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise CacheError(f"feature cache {path} does not exist")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as err:
        raise CacheError(
            f"feature cache {path}: unreadable {MANIFEST} ({err}); {_remedy(path)}"
        ) from err
    if not isinstance(manifest, dict):
        raise CacheError(f"feature cache {path}: {MANIFEST} is not an object; {_remedy(path)}")
    return manifest


def _remedy(path: Path) -> str:
    """What to do about a bad cache folder: delete it (the next run rebuilds it), or rebuild it
    now; the folder name gives the command (options beyond the defaults need their flags)."""
    dataset, _, encoder = path.name.partition("__")
    encoder = encoder.split("@", 1)[0]
    command = (f"python -m ovalp_flwr.features.cache build --dataset {dataset} --encoder {encoder} "
               f"--cache-dir {path.parent} --rebuild")
    return f"delete the folder to rebuild it at the next run, or rebuild it now: {command}"


def _expect(path: Path, key: str, expected: Any, found: Any) -> None:
    """Name the first differing (sub)key, so the message says what changed."""
    if isinstance(expected, dict) and isinstance(found, dict):
        for sub in sorted(expected.keys() | found.keys()):
            _expect(path, f"{key}.{sub}", expected.get(sub), found.get(sub))
    elif expected != found:
        raise CacheError(
            f"feature cache {path}: {key} mismatch: expected {expected!r}, found {found!r}; "
            f"{_remedy(path)}"
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
    return FeatureSet(x=x, y=y, domains=_read_domains(path, manifest, key, tensors))


def _read_domains(path: Path, manifest: dict[str, Any], key: str,
                  tensors: dict[str, np.ndarray]) -> np.ndarray | None:
    """A multi-domain cache's per-row domains, checked against its `domain_names`."""
    names, domains = manifest.get("domain_names"), tensors.get("domains")
    if names is None and domains is None:
        return None
    if names is None or domains is None:
        raise CacheError(f"feature cache {path}: {key} has domains but no domain_names, or the "
                         f"reverse; {_remedy(path)}")
    _expect(path, f"{key}.domains.shape", list(tensors["labels"].shape), list(domains.shape))
    _expect(path, f"{key}.domains.dtype", "int64", str(domains.dtype))
    if len(domains) and not 0 <= domains.min() <= domains.max() < len(names):
        raise CacheError(f"feature cache {path}: {key} domains outside [0, {len(names)})")
    return domains
