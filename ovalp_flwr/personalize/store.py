"""A personalized model on a node's disk: safetensors, written atomically, verified on read."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save as st_save

from ovalp_flwr.durable import write_durably


def _digest(arrays: dict[str, np.ndarray]) -> str:
    hasher = hashlib.sha256()
    for key in sorted(arrays):
        hasher.update(key.encode() + np.ascontiguousarray(arrays[key]).tobytes())
    return hasher.hexdigest()


def write_model(path: Path, arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    """The arrays and their sha256 under a temp name, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = st_save({k: np.ascontiguousarray(v) for k, v in arrays.items()},
                   metadata={**metadata, "sha256": _digest(arrays)})
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write_durably(tmp, blob)
    os.replace(tmp, path)


def read_model(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The arrays and metadata of a saved model; a file whose arrays do not match its sha256
    is an error, not a model."""
    try:
        with safe_open(str(path), framework="numpy") as handle:
            metadata = dict(handle.metadata() or {})
            arrays = {key: handle.get_tensor(key) for key in handle.keys()}
    except (OSError, SafetensorError) as err:
        raise ValueError(f"{path}: not a readable personalized model ({err})") from None
    if metadata.get("sha256") != _digest(arrays):
        raise ValueError(f"{path}: sha256 mismatch (corrupted); personalize again to rewrite it")
    return arrays, metadata
