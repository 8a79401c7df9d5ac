"""timm models with Hugging Face hub weights (ViT, DINOv2, ConvNeXt): preprocessing from
timm's pretrained config, features from the pooled pre-logits. Weights come from the hub (or
a cached copy, or a local weights_file); loading is strict about backbone keys.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ovalp_flwr.features.encoders._common import (
    DTYPES,
    RANDOM_INIT,
    Encoder,
    EncoderError,
    EncoderOptions,
    Modality,
    _check_dim,
    _file_weights,
    _hub_local_copy,
    _seeded,
)
from ovalp_flwr.features.encoders.image import ImageEncoder, Preprocess
from ovalp_flwr.features.timm_compat import import_timm


@functools.lru_cache(maxsize=32)
def timm_pretrained_cfg(tag: str) -> dict[str, Any]:
    """timm's pretrained config of a tag (weights source, eval preprocessing); no build."""
    cfg = import_timm().models.get_pretrained_cfg(tag)
    if cfg is None:
        raise EncoderError(f"timm has no pretrained config {tag!r}")
    return cfg.to_dict()


def timm_data_config(tag: str) -> dict[str, Any]:
    """timm's eval preprocessing of a tag, as timm.data.resolve_data_config resolves it."""
    return dict(import_timm().data.resolve_data_config(pretrained_cfg=timm_pretrained_cfg(tag)))


@dataclass(frozen=True)
class TimmHubSpec:
    """A timm model with hub weights; preprocessing from timm's pretrained config, features
    from its pooled pre-logits (num_classes=0)."""

    tag: str  # timm "arch.pretrained_tag"
    feature_dim: int  # declared so the identity needs no build; checked at build
    fixed_size: bool  # ViTs: the input size is built into the position embeddings
    modality: Modality = "image"
    offline: bool = False
    poolings: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = tuple(DTYPES)

    def preprocess(self, opts: EncoderOptions) -> Preprocess:
        cfg = timm_data_config(self.tag)
        if cfg["crop_mode"] != "center":
            raise EncoderError(
                f"{self.tag}: timm crop_mode={cfg['crop_mode']!r} is not supported; allowed: center"
            )
        return Preprocess(
            image_size=opts.image_size or int(cfg["input_size"][-1]),
            interpolation=str(cfg["interpolation"]),
            mean=tuple(float(v) for v in cfg["mean"]),
            std=tuple(float(v) for v in cfg["std"]),
            crop_pct=float(cfg["crop_pct"]),
        )

    def weights(self, opts: EncoderOptions) -> dict[str, Any] | str:
        if not opts.pretrained:
            return RANDOM_INIT
        if opts.weights_file:
            return {"timm_tag": self.tag, **_file_weights(Path(opts.weights_file))}
        return {"timm_tag": self.tag, "hub": timm_hub_id(self.tag)}

    def identity(self, name: str, opts: EncoderOptions) -> dict[str, Any]:
        return {
            "name": name,
            "arch": f"timm/{self.tag.split('.')[0]}",
            "weights": self.weights(opts),
            "feature_dim": self.feature_dim,
            "pooling": "timm pre-logits (num_classes=0)",
            "preprocessing": {
                **self.preprocess(opts).identity(),
                "source": f"timm pretrained_cfg {self.tag}",
            },
            "dtype": opts.dtype,
        }

    def model(self, name: str, opts: EncoderOptions) -> torch.nn.Module:
        timm = import_timm()
        kwargs: dict[str, Any] = {"num_classes": 0}
        if self.fixed_size and opts.image_size:
            kwargs["img_size"] = opts.image_size  # timm resamples the position embeddings
        if not opts.pretrained:
            with _seeded(False):
                return timm.create_model(self.tag, pretrained=False, **kwargs)
        hub_id = timm_hub_id(self.tag)
        hint = "; or pass weights_file=<local checkpoint>"
        file = opts.weights_file or _hub_local_copy(name, hub_id, "model.safetensors", hint)
        if file is None:  # the hub answered: download (with huggingface_hub's retries)
            from huggingface_hub import hf_hub_download  # late: ~60 ms, as in _hub_local_copy

            file = hf_hub_download(hub_id, "model.safetensors")
        with _complete_timm_load(name, str(file)):
            overlay = {"file": str(file)}
            return timm.create_model(
                self.tag, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs
            )

    def build(self, name: str, opts: EncoderOptions, device: torch.device) -> Encoder:
        identity = self.identity(name, opts)  # before the build: a missing weights_file fails fast
        model: Any = self.model(name, opts).eval()  # timm models: num_features is an int
        _check_dim(name, model.num_features, self.feature_dim)
        return ImageEncoder(name, model, self.preprocess(opts), identity, device, dtype=opts.dtype)


@contextlib.contextmanager
def _complete_timm_load(name: str, file: str) -> Iterator[None]:
    """timm loads non-strictly once the classifier is dropped and only logs what did not fit;
    here any missing or unexpected backbone key is an error."""
    class Catch(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.INFO)
            self.problems: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage()
            if text.startswith(("Missing keys", "Unexpected keys")):
                self.problems.append(text.split(" discovered")[0].split(" found")[0])

    logger = logging.getLogger("timm")  # timm.models._builder logs what did not fit
    catch, level = Catch(), logger.level
    logger.addHandler(catch)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(catch)
        logger.setLevel(level)
    if catch.problems:
        raise RuntimeError(
            f"encoder {name!r}: weights {file} do not fit: {'; '.join(catch.problems)[:300]}"
        )


def timm_hub_id(tag: str) -> str:
    """The hub repository timm's pretrained config names for a tag."""
    hub_id = timm_pretrained_cfg(tag).get("hf_hub_id")
    if not hub_id:
        raise EncoderError(f"timm's pretrained config {tag!r} names no hub repository")
    return str(hub_id)
