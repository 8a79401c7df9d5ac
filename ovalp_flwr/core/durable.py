"""Writes that survive a crash: data reaches the disk before the rename that publishes it.

Caches and results are assembled in a hidden folder, each file written with
`write_durably`, the folder synced with `fsync_dir`, and only then renamed into place.
Arrays with their metadata go into one safetensors file whose sha256 is checked when read
(`write_arrays`, `read_arrays`): personalized models and run checkpoints.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save as st_save


def write_durably(path: Path, data: bytes | str) -> None:
    """Write `data` to `path` and fsync it."""
    with open(path, "wb") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)
        handle.flush()
        os.fsync(handle.fileno())


def replace_durably(path: Path, data: bytes | str) -> None:
    """Write `data` beside `path`, fsync it, then rename it into place: a reader sees the old
    file or the new one, never half of one."""
    staging = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write_durably(staging, data)
    os.replace(staging, path)


def fsync_dir(path: Path) -> None:
    """Persist a folder's entries (new files, renames)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_arrays(path: Path, arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    """Arrays and string metadata as one safetensors file with their sha256, written under a
    temp name, synced, and renamed into place: a reader sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = st_save({k: np.ascontiguousarray(v) for k, v in arrays.items()},
                   metadata={**metadata, "sha256": _digest(arrays, metadata)})
    replace_durably(path, blob)
    fsync_dir(path.parent)


def read_arrays(path: Path, what: str, remedy: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """What `write_arrays` wrote; an unreadable file, or one whose arrays and metadata do not
    match its sha256, is a ValueError naming `what` it should have been and the `remedy`."""
    try:
        with safe_open(str(path), framework="numpy") as handle:
            metadata = dict(handle.metadata() or {})
            arrays = {key: handle.get_tensor(key) for key in handle.keys()}
    except (OSError, SafetensorError) as err:
        raise ValueError(f"{path}: not a readable {what} ({err})") from None
    recorded = metadata.pop("sha256", None)
    if recorded != _digest(arrays, metadata):
        raise ValueError(f"{path}: sha256 mismatch (corrupted); {remedy}")
    return arrays, metadata


def _digest(arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> str:
    hasher = hashlib.sha256()
    for key in sorted(arrays):
        hasher.update(key.encode() + np.ascontiguousarray(arrays[key]).tobytes())
    for key in sorted(metadata):
        hasher.update(f"\0{key}\0{metadata[key]}".encode())
    return hasher.hexdigest()
