"""What every encoder module shares: the option and error types, the Encoder and EncoderSpec
protocols, and small helpers (weight-file hashing, autocast, seeded random init, the feature
size check, the one-request hub probe). Imports nothing heavier than torch at load time: the
hub client is imported when a probe runs.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch

Modality = Literal["image", "text"]
DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
DEFAULT_BATCH_SIZE = 128
# Random-init (pretrained=False) models are seeded, so their features are reproducible.
RANDOM_INIT_SEED = 0
RANDOM_INIT = f"random-init (seed {RANDOM_INIT_SEED})"


class EncoderError(ValueError):
    """A bad encoder name or option; the message is one line naming key, value and choices."""


class WeightsUnavailable(RuntimeError):
    """Hub weights could not be fetched (no network, no local copy).

    `reason` is what failed, `hint` what else the caller can do; `load_encoder` (the registry,
    which this module cannot import) adds the offline encoders between the two.
    """

    def __init__(self, reason: str, hint: str = "") -> None:
        super().__init__(reason + hint)
        self.reason, self.hint = reason, hint


@dataclass(frozen=True)
class EncoderOptions:
    """What, besides the name, decides the features (and so the cache identity).

    None means the encoder's own default (timm's input size, the default pooling).
    """

    image_size: int | None = None  # images only: square input size
    dtype: str = "fp32"  # autocast dtype of the forward pass: fp32, bf16, fp16 (CUDA only)
    pooling: str | None = None  # text only: "mean" or "cls" where the encoder offers both
    pretrained: bool = True  # False: same architecture, seeded random init, no download
    weights_file: str | None = None  # hub encoders: a local checkpoint instead of the hub


class Encoder(Protocol):
    name: str
    modality: Modality
    feature_dim: int
    batch_size: int
    device: torch.device

    def identity(self) -> dict[str, Any]:
        """JSON-able description of everything that determines the features."""
        ...

    def encode(self, batch: Any) -> np.ndarray:
        """One batch (uint8 [B, H, W, 3] RGB images, or B strings) -> float32 [B, D]."""
        ...


class EncoderSpec(Protocol):
    """Registry entry: a cheap identity (for cache checks) and a costly build."""

    @property
    def modality(self) -> Modality: ...

    @property
    def offline(self) -> bool:
        """Weights ship in a pip package (or there are none)."""
        ...

    @property
    def poolings(self) -> tuple[str, ...]:
        """Text: allowed poolings, default first; images: ()."""
        ...

    @property
    def dtypes(self) -> tuple[str, ...]: ...

    def identity(self, name: str, opts: EncoderOptions) -> dict[str, Any]: ...

    def build(self, name: str, opts: EncoderOptions, device: torch.device) -> Encoder: ...


# --- shared helpers -------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _sha256(path: Path, size: int, mtime_ns: int) -> str:
    """Keyed on size and mtime too, so a replaced file is hashed again."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    stat = path.stat()
    return _sha256(path, stat.st_size, stat.st_mtime_ns)


def _file_weights(path: Path) -> dict[str, str]:
    return {"file": path.name, "sha256": file_sha256(path)}


def _autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager[Any]:
    """fp32 runs as is; bf16/fp16 run under autocast (weights stay fp32, matmuls go low)."""
    if dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[dtype])


@contextlib.contextmanager
def _seeded(pretrained: bool) -> Iterator[None]:
    """Random init from a fixed seed without touching the caller's RNG state."""
    if pretrained:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(RANDOM_INIT_SEED)
        yield


def _check_dim(name: str, model_dim: int, declared: int) -> None:
    if model_dim != declared:
        raise RuntimeError(
            f"encoder {name!r}: model gives {model_dim}-d features, registry says {declared}"
        )


# --- hub ------------------------------------------------------------------------------------


def _hub_local_copy(name: str, repo_id: str, filename: str, hint: str = "") -> str | None:
    """A cached copy's path, or None when the hub answers; else WeightsUnavailable, one line
    (to which `load_encoder` adds what exists offline).

    One metadata request without retries decides, so a machine without the hub fails in
    well under a second instead of huggingface_hub's retry loop (~50 s).
    """
    # late: huggingface_hub (~60 ms); only hub encoders need it, and every ClientApp loads this
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url, try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, filename)
    if isinstance(cached, str):
        return cached
    try:
        if constants.HF_HUB_OFFLINE:
            raise ConnectionError("HF_HUB_OFFLINE is set")
        get_hf_file_metadata(hf_hub_url(repo_id, filename), timeout=10)
    except Exception as err:  # any failure means the same thing to the caller
        reason = (str(err).splitlines() or [type(err).__name__])[0][:160]
        raise WeightsUnavailable(
            f"encoder {name!r}: could not fetch its weights from the Hugging Face hub "
            f"({repo_id}/{filename}: {type(err).__name__}: {reason})", hint
        ) from err
    return None


class NetworkEncoder:
    """What every frozen-network encoder shares: its device, options, identity and `encode`.

    Subclasses say how a batch becomes the network's input (`prepare`) and how the
    network's output becomes features (`features`, differentiable: a trainable encoder
    calls it, `ovalp_flwr.finetune`); `forward` is it without autograd, `encode` the two in a row.
    """

    modality: Modality

    def __init__(
        self,
        name: str,
        model: torch.nn.Module,
        identity: dict[str, Any],
        device: torch.device,
        *,
        dtype: str = "fp32",
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        self.name = name
        self.feature_dim = int(identity["feature_dim"])
        self.device = device
        self.batch_size = batch_size
        self.dtype = dtype
        self.model = model.to(device).eval()
        self._identity = identity

    def identity(self) -> dict[str, Any]:
        return self._identity

    def prepare(self, batch: Any) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def features(self, *inputs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @torch.inference_mode()
    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.features(*inputs)

    @torch.inference_mode()
    def encode(self, batch: Any) -> np.ndarray:
        return self.forward(*self.prepare(batch)).cpu().numpy()
