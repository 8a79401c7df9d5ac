"""Two tiny random-initialised encoders for tests and quick checks of the training paths:
nothing to download, a forward and backward pass in milliseconds on a CPU. Their features
mean nothing; their structure is a real encoder's (timm's test EfficientNet: convolutions,
BatchNorm, 1x1 convolutions LoRA wraps; a 2-layer BERT: attention with query/value
projections), so every code path that trains an encoder runs on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ovalp_flwr.features.encoders._common import RANDOM_INIT, Encoder, EncoderOptions, Modality, _seeded
from ovalp_flwr.features.encoders.image import ImageEncoder, Preprocess
from ovalp_flwr.features.encoders.text import TextEncoder, _byte_tokenizer, _quiet_transformers
from ovalp_flwr.features.timm_compat import import_timm

TINY_BERT = {"vocab_size": 259, "hidden_size": 32, "num_hidden_layers": 2,
             "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64,
             "pad_token_id": 1}


@dataclass(frozen=True)
class TinyImageSpec:
    """timm's `test_efficientnet` (99 k parameters, 256-d), ImageNet normalisation, 16 px."""

    modality: Modality = "image"
    offline: bool = True
    poolings: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ("fp32",)
    default_image_size: int = 16
    feature_dim: int = 256

    def preprocess(self, opts: EncoderOptions) -> Preprocess:
        return Preprocess(opts.image_size or self.default_image_size, "bilinear",
                          (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))

    def identity(self, name: str, opts: EncoderOptions) -> dict[str, Any]:
        return {"name": name, "arch": "timm/test_efficientnet", "weights": RANDOM_INIT,
                "feature_dim": self.feature_dim, "pooling": "global average",
                "preprocessing": self.preprocess(opts).identity(), "dtype": opts.dtype}

    def build(self, name: str, opts: EncoderOptions, device: torch.device) -> Encoder:
        with _seeded(False):
            model = import_timm().create_model("test_efficientnet", pretrained=False,
                                               num_classes=0)
        return ImageEncoder(name, model.eval(), self.preprocess(opts), self.identity(name, opts),
                            device, dtype=opts.dtype)


@dataclass(frozen=True)
class TinyTextSpec:
    """A 2-layer BERT (hidden 32) on UTF-8 bytes, mean pooling; 32-d."""

    modality: Modality = "text"
    offline: bool = True
    poolings: tuple[str, ...] = ("mean",)
    dtypes: tuple[str, ...] = ("fp32",)
    feature_dim: int = 32
    max_length: int = 64

    def identity(self, name: str, opts: EncoderOptions) -> dict[str, Any]:
        return {"name": name, "arch": f"hf/BertModel {TINY_BERT}", "weights": RANDOM_INIT,
                "feature_dim": self.feature_dim, "pooling": "mean", "normalize": None,
                "tokenizer": {"name": "UTF-8 bytes", "max_length": self.max_length},
                "dtype": opts.dtype}

    def build(self, name: str, opts: EncoderOptions, device: torch.device) -> Encoder:
        with _quiet_transformers() as transformers, _seeded(False):
            model = transformers.BertModel(transformers.BertConfig(**TINY_BERT),
                                           add_pooling_layer=False)
        return TextEncoder(name, model, _byte_tokenizer(self.max_length),
                           self.identity(name, opts), device, dtype=opts.dtype)
