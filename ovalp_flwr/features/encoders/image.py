"""Image encoders: uint8 RGB batches -> float32 features.

Preprocess (resize or timm's resize-and-crop, normalisation) and ImageEncoder (a frozen
backbone behind it) serve every network; PixelEncoder/PixelSpec are the no-network baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ovalp_flwr.features.encoders._common import (
    DEFAULT_BATCH_SIZE,
    Encoder,
    EncoderOptions,
    Modality,
    NetworkEncoder,
    _autocast,
)

# --- preprocessing --------------------------------------------------------------------------


def _as_tensor(images: np.ndarray, device: torch.device) -> torch.Tensor:
    """uint8 [B, H, W, 3] -> float [B, 3, H, W] in [0, 1]; uint8 is what crosses to the device."""
    if (
        not isinstance(images, np.ndarray)
        or images.dtype != np.uint8
        or images.ndim != 4
        or images.shape[-1] != 3
    ):
        got = (
            f"{images.dtype} {images.shape}"
            if isinstance(images, np.ndarray)
            else type(images).__name__
        )
        raise ValueError(f"expected uint8 [B, H, W, 3] images, got {got}")
    x = torch.from_numpy(np.ascontiguousarray(images)).to(device)
    return x.permute(0, 3, 1, 2).float().div_(255.0)


def _resize(x: torch.Tensor, size: tuple[int, int], mode: str) -> torch.Tensor:
    """Resize to (h, w), PIL-like: antialiased, and clamped since bicubic overshoots [0, 1]."""
    if tuple(x.shape[-2:]) == size:
        return x
    if mode == "area":
        return F.adaptive_avg_pool2d(x, size)
    if mode not in ("bilinear", "bicubic"):
        raise ValueError(
            f"interpolation={mode!r} is not supported; choose one of: area, bicubic, bilinear"
        )
    x = F.interpolate(x, size=size, mode=mode, align_corners=False, antialias=True)
    return x.clamp_(0.0, 1.0)


@dataclass(frozen=True)
class Preprocess:
    """uint8 RGB -> the network's normalised input.

    crop_pct None: straight to a square (the Lite recipe: small dataset images keep their
    borders). Otherwise timm's eval transform: shorter side to floor(size / crop_pct), then a
    center crop of size x size.
    """

    image_size: int
    interpolation: str
    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_pct: float | None = None

    @property
    def scale_size(self) -> int:
        return (
            self.image_size
            if self.crop_pct is None
            else math.floor(self.image_size / self.crop_pct)
        )

    def identity(self) -> dict[str, Any]:
        if self.crop_pct is None:
            resize: dict[str, Any] = {"resize": "direct to square, no crop"}
        else:
            resize = {
                "resize": f"shorter side to {self.scale_size}, center crop {self.image_size}",
                "crop_pct": self.crop_pct,
            }
        return {
            "scale": "1/255",
            "image_size": self.image_size,
            **resize,
            "interpolation": self.interpolation,
            "antialias": True,
            "mean": list(self.mean),
            "std": list(self.std),
        }

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.crop_pct is None:
            x = _resize(x, (self.image_size, self.image_size), self.interpolation)
        else:
            x = _center_crop(self._resize_shorter(x), self.image_size)
        mean = torch.tensor(self.mean, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=x.device).view(1, 3, 1, 1)
        return (x - mean) / std

    def _resize_shorter(self, x: torch.Tensor) -> torch.Tensor:
        """torchvision's Resize(int): shorter side to scale_size, longer side truncated."""
        h, w = x.shape[-2:]
        s = self.scale_size
        size = (s, int(s * w / h)) if h <= w else (int(s * h / w), s)
        return _resize(x, size, self.interpolation)


def _center_crop(x: torch.Tensor, size: int) -> torch.Tensor:
    """torchvision's center_crop offsets (round half to even, as it does)."""
    h, w = x.shape[-2:]
    top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    return x[..., top : top + size, left : left + size]


# --- encoders -------------------------------------------------------------------------------


class ImageEncoder(NetworkEncoder):
    """A frozen backbone plus its preprocessing, run on one device in inference mode."""

    modality: Modality = "image"

    def __init__(
        self,
        name: str,
        model: torch.nn.Module,
        preprocess: Preprocess,
        identity: dict[str, Any],
        device: torch.device,
        *,
        dtype: str = "fp32",
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        super().__init__(name, model, identity, device, dtype=dtype, batch_size=batch_size)
        self.preprocess = preprocess

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Preprocessed float [B, 3, S, S] on the device -> float32 features: the bare network.

        Channels-last input: oneDNN's fast path for ConvNets on CPU (Lite0 at 128 px on 2 cores:
        ~120 vs ~70 images/s in NCHW); a no-op for the permuted uint8 images `encode` makes.
        """
        x = x.contiguous(memory_format=torch.channels_last)
        with _autocast(self.device, self.dtype):
            return self.model(x).float()

    def prepare(self, batch: np.ndarray) -> tuple[torch.Tensor]:
        """uint8 images -> the network's input on the device (what `forward` takes)."""
        return (self.preprocess(_as_tensor(batch, self.device)),)


class PixelEncoder:
    """Grey pixels, area-resized to image_size^2 and flattened: what a head gets with no encoder."""

    modality: Modality = "image"

    def __init__(
        self, device: torch.device, image_size: int, batch_size: int = DEFAULT_BATCH_SIZE
    ) -> None:
        self.name = "pixels"
        self.device = device
        self.image_size = image_size
        self.feature_dim = image_size * image_size
        self.batch_size = batch_size

    def identity(self) -> dict[str, Any]:
        return _pixels_identity(self.image_size)

    @torch.inference_mode()
    def encode(self, batch: np.ndarray) -> np.ndarray:
        x = _as_tensor(batch, self.device).mean(dim=1, keepdim=True)
        x = _resize(x, (self.image_size, self.image_size), "area")
        return x.flatten(1).cpu().numpy()


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
        "dtype": "fp32",
    }


@dataclass(frozen=True)
class PixelSpec:
    """No network: a fast baseline and test encoder."""

    modality: Modality = "image"
    offline: bool = True
    poolings: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ("fp32",)  # nothing to autocast
    default_image_size: int = 8

    def identity(self, name: str, opts: EncoderOptions) -> dict[str, Any]:
        return _pixels_identity(opts.image_size or self.default_image_size)

    def build(self, name: str, opts: EncoderOptions, device: torch.device) -> Encoder:
        return PixelEncoder(device, opts.image_size or self.default_image_size)
