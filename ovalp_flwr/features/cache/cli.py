"""`python -m ovalp_flwr.features.cache build | ls | verify`: build, list and verify caches."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from ovalp_flwr.features.cache.build import build_features, build_summary
from ovalp_flwr.features.cache.layout import (MANIFEST, SPLITS, CachedFeatures, CacheError,
                                              _expect, _read_manifest, _remedy, cache_path,
                                              load_features)
from ovalp_flwr.features.encoders import DEFAULT_BATCH_SIZE, DTYPES, ENCODERS


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
