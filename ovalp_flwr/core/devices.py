"""Where tensors live: CUDA when present, else CPU."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """`auto` is CUDA when present, else CPU; asking for CUDA without one is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' is not allowed here: no CUDA device; use 'auto' or 'cpu'")
    return torch.device(name)
