"""Where tensors live: CUDA when present, else CPU."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def resolve_device(name: str) -> torch.device:
    """`auto` is CUDA when present, else CPU; asking for CUDA without one is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' is not allowed here: no CUDA device; use 'auto' or 'cpu'")
    return torch.device(name)


@contextmanager
def one_cpu_thread() -> Iterator[None]:
    """torch's CPU ops on one intra-op thread for the time of the block, then the process's own
    setting back (a server in the same process keeps its threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
