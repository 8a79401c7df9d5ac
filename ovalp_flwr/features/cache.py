"""Encoder features cached on disk, one verified folder per (dataset, encoder[, limit]).

Layout of `cache_dir/<dataset>__<encoder>/` (`<dataset>__<encoder>@limit<N>/` for a cache built
from the first N items per class, so it is never taken for the full one): `train.safetensors`
and `test.safetensors` (tensors "features" float32 [N, D] and "labels" int64 [N]) and
`manifest.json`, which records what the features are (dataset, limit, encoder identity with its
preprocessing and dtype, the options that produced it) and what the files are (shape, size,
sha256). A folder is trusted only if all of that matches; otherwise CacheError, never a silent
rebuild, since stale features would quietly change every result built on them. Builds go to a
hidden temp folder that is renamed into place only when complete, so an interrupted build leaves
nothing that is later trusted, and concurrent builders each install a complete folder.
Replacing (build_features on an existing cache) takes two renames: a reader at that instant
may find no cache and fail; load_or_build never replaces, so runs that only use it never race.

Command line (`python -m ovalp_flwr.features.cache -h`): `build`, `ls`, `verify`.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import hashlib
import json
import logging
import os
import shutil
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from ovalp_flwr.core.durable import fsync_dir, write_durably
from ovalp_flwr.features.encoders import (
    DEFAULT_BATCH_SIZE,
    DTYPES,
    ENCODERS,
    EncoderOptions,
    encode_all,
    encoder_identity,
    encoder_modality,
    load_encoder,
)

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


# --- building -------------------------------------------------------------------------------


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
    from ovalp_flwr.data.registry import dataset_modality
    from ovalp_flwr.data.domains import relabelling

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
    from ovalp_flwr.data.registry import load_dataset

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
    from ovalp_flwr.data.domains import relabelling

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


# --- listing and verifying ------------------------------------------------------------------


def cache_folders(cache_dir: Path) -> list[Path]:
    """Installed cache folders (hidden temp/old folders of running builds are not caches)."""
    if not Path(cache_dir).is_dir():
        return []
    return sorted(p for p in Path(cache_dir).iterdir() if p.is_dir() and not p.name.startswith("."))


def verify_folder(path: Path) -> CachedFeatures:
    """Full check of one folder against the request its manifest records: the folder name,
    the encoder identity as this code computes it, every file's size, hash and shape."""
    manifest = _read_manifest(path)
    try:
        dataset, encoder = manifest["dataset"], manifest["encoder"]
        limit, options = manifest["limit_per_class"], manifest["encoder_options"]
    except KeyError as err:
        raise CacheError(
            f"feature cache {path}: {MANIFEST} lacks {err}; {_remedy(path)}"
        ) from err
    expected = cache_path(path.parent, dataset, encoder, limit, **options).name
    _expect(path, "folder name", expected, path.name)
    return load_features(dataset, encoder, path.parent, limit_per_class=limit, **options)


def _folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def _ls_row(path: Path) -> list[str]:
    try:
        m = _read_manifest(path)
        shapes = " ".join(f"{s}={'x'.join(map(str, m['splits'][s]['shape']))}" for s in SPLITS)
        limit = m.get("limit_per_class")
        return [
            m["dataset"],
            m["encoder"],
            "-" if limit is None else str(limit),
            shapes,
            f"{_folder_size(path) / 1e6:.1f} MB",
            str(m.get("created_at", "?")),
        ]
    except (CacheError, KeyError, TypeError) as err:
        return [path.name, "?", "?", f"unreadable: {str(err)[:60]}", "?", "?"]


def format_table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    )


# --- command line ---------------------------------------------------------------------------


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not allowed; use an integer >= 1")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ovalp_flwr.features.cache", description="Build, list and verify feature caches."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    build = sub.add_parser("build", help="encode a dataset and install its cache")
    build.add_argument("--dataset", required=True)
    build.add_argument("--encoder", required=True, choices=sorted(ENCODERS), metavar="ENCODER")
    build.add_argument("--data-dir", default=None, help="folder with the dataset files")
    build.add_argument("--batch-size", type=_positive, default=DEFAULT_BATCH_SIZE)
    build.add_argument("--image-size", type=_positive, default=None)
    build.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    build.add_argument("--pooling", default=None, help="text encoders: mean or cls")
    build.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda")
    build.add_argument("--limit-per-class", type=_positive, default=None)
    build.add_argument("--rebuild", action="store_true", help="replace an existing cache")
    build.add_argument("--quiet", action="store_true", help="no progress bar")

    ls = sub.add_parser("ls", help="table of the caches in a cache dir")

    verify = sub.add_parser("verify", help="full hash check of one cache or all")
    verify.add_argument("dataset", nargs="?")
    verify.add_argument("encoder", nargs="?")
    verify.add_argument("--limit-per-class", type=_positive, default=None)

    for command in (build, ls, verify):
        command.add_argument("--cache-dir", type=Path, default=Path("feature_cache"))
    return parser


def _cmd_build(args: argparse.Namespace) -> int:
    options = {"image_size": args.image_size, "dtype": args.dtype, "pooling": args.pooling}
    common = {
        "limit_per_class": args.limit_per_class,
        "data_dir": args.data_dir,
        "device": args.device,
        "batch_size": args.batch_size,
        "progress": not args.quiet,
        **options,
    }
    path = cache_path(args.cache_dir, args.dataset, args.encoder, args.limit_per_class, **options)
    if path.exists() and not args.rebuild:
        limit = args.limit_per_class
        load_features(args.dataset, args.encoder, args.cache_dir, limit_per_class=limit, **options)
        print(f"{path} exists and verifies; --rebuild to encode again")
        return 0
    features = build_features(args.dataset, args.encoder, args.cache_dir, **common)
    print(build_summary(features.manifest, path))
    return 0


def _cmd_ls(args: argparse.Namespace) -> int:
    folders = cache_folders(args.cache_dir)
    if not folders:
        print(f"no caches in {args.cache_dir}")
        return 0
    header = ["dataset", "encoder", "limit", "splits", "size", "created"]
    print(format_table([_ls_row(p) for p in folders], header))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    if (args.dataset is None) != (args.encoder is None):
        print("error: verify takes both DATASET and ENCODER, or neither", file=sys.stderr)
        return 2
    if args.dataset is None:
        folders = cache_folders(args.cache_dir)
        if args.limit_per_class is not None:
            print("error: --limit-per-class needs DATASET and ENCODER", file=sys.stderr)
            return 2
    else:
        folders = [cache_path(args.cache_dir, args.dataset, args.encoder, args.limit_per_class)]
    if not folders:
        print(f"no caches in {args.cache_dir}")
        return 0
    failed = 0
    for path in folders:
        try:
            verify_folder(path)
            print(f"ok    {path}")
        except Exception as err:  # one line per cache, whatever went wrong
            failed += 1
            print(f"FAIL  {err}" if str(path) in str(err) else f"FAIL  {path}: {err}")
    print(f"{len(folders) - failed} ok, {failed} failed")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: 0 ok, 1 a cache failed or could not be built, 2 bad usage."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    commands = {"build": _cmd_build, "ls": _cmd_ls, "verify": _cmd_verify}
    try:
        return commands[args.command](args)
    except (CacheError, ValueError, TypeError, OSError, RuntimeError) as err:  # one line
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
