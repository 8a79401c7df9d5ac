"""Writes that survive a crash: data reaches the disk before the rename that publishes it.

Caches and results are assembled in a hidden folder, each file written with
`write_durably`, the folder synced with `fsync_dir`, and only then renamed into place.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_durably(path: Path, data: bytes | str) -> None:
    """Write `data` to `path` and fsync it."""
    with open(path, "wb") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)
        handle.flush()
        os.fsync(handle.fileno())


def fsync_dir(path: Path) -> None:
    """Persist a folder's entries (new files, renames)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
