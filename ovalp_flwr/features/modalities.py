"""What each registered encoder reads, without importing it: a run config is checked before any
encoder (or torch) loads. `ovalp_flwr.features.encoders.ENCODERS` is the registry itself; a test
keeps the two in the same order with the same modalities."""

from __future__ import annotations

from typing import Literal

Modality = Literal["image", "text"]

ENCODER_MODALITY: dict[str, Modality] = {
    "efficientnet-lite0": "image",
    "efficientnet-lite1": "image",
    "efficientnet-lite2": "image",
    "pixels": "image",
    "vit-b16-in21k": "image",
    "vit-l16": "image",
    "vit-b32": "image",
    "dinov2-vitl14": "image",
    "convnext-base": "image",
    "minilm": "text",
    "roberta-base": "text",
    "tiny-cnn": "image",
    "tiny-bert": "text",
}
