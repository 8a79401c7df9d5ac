"""A personalized model on a node's disk: safetensors, written atomically, verified on read."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ovalp_flwr.core.durable import read_arrays, write_arrays


def write_model(path: Path, arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    """The arrays and their sha256 under a temp name, renamed into place."""
    write_arrays(path, arrays, metadata)


def read_model(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The arrays and metadata of a saved model; a file whose arrays do not match its sha256
    is an error, not a model."""
    return read_arrays(path, "personalized model", "personalize again to rewrite it")
