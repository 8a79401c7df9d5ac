"""Encoder tests, on CPU: the real offline checkpoints (EfficientNet-Lite0/1/2, MiniLM), and
the hub encoders as seeded random-init models of the same architecture (no network here)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from ovalp_flwr.data.registry import load_dataset
from ovalp_flwr.features.encoders import (
    ENCODERS,
    EncoderError,
    EncoderOptions,
    TimmHubSpec,
    WeightsUnavailable,
    encoder_identity,
    file_sha256,
    load_encoder,
    map_lukemelas_to_timm,
    offline_encoders,
    resolve_device,
    timm_data_config,
)
from ovalp_flwr.features.timm_compat import import_timm

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
CIFAR_ZIP = DATA / "cifar10-jpg.zip"
TINY_ZIP = DATA / "tinyimagenet-100.zip"
HUB_IMAGE = {  # name: (timm tag, feature dim)
    "vit-b16-in21k": ("vit_base_patch16_224.augreg_in21k", 768),
    "vit-l16": ("vit_large_patch16_224.augreg_in21k", 1024),
    "vit-b32": ("vit_base_patch32_224.augreg_in21k", 768),
    "dinov2-vitl14": ("vit_large_patch14_dinov2.lvd142m", 1024),
    "convnext-base": ("convnext_base.fb_in22k", 1024),
}
LITES = ("efficientnet-lite0", "efficientnet-lite1", "efficientnet-lite2")


@pytest.fixture(scope="module")
def lite0():
    return load_encoder("efficientnet-lite0", device="cpu")


@pytest.fixture(scope="module")
def minilm():
    return load_encoder("minilm", device="cpu")


@pytest.fixture
def no_hub(monkeypatch, tmp_path):
    """The hub unreachable and its local cache empty, whatever machine runs the test."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))


@pytest.mark.slow
def test_import_timm_works_here() -> None:
    """In a fresh interpreter (the import order matters), import_timm() yields a working timm.
    Where torchvision's C++ ops cannot load (CPU torch beside the registry's CUDA torchvision)
    exactly one module is stubbed and a compiled op still fails loudly with torchvision's own
    error; where they load (matching CUDA builds) nothing is stubbed."""
    code = """if True:
        import json, sys
        from ovalp_flwr.features.timm_compat import import_timm
        timm = import_timm()
        import torch, torchvision
        model = timm.create_model("tf_efficientnet_lite0", pretrained=False, num_classes=0)
        has_ops = torchvision.extension._has_ops()
        stub = sys.modules["torchvision._meta_registrations"]
        error = ""
        if not has_ops:
            try:
                torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)
            except RuntimeError as err:
                error = str(err)
        print(json.dumps({"has_ops": has_ops, "stubbed": not hasattr(stub, "__file__"),
                          "error": error, "dim": model.num_features}))
    """
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["dim"] == 1280
    assert result["stubbed"] == (not result["has_ops"])
    if not result["has_ops"]:
        assert "Couldn't load custom C++ ops" in result["error"]


# --- EfficientNet-Lite0/1/2 (offline checkpoints) -------------------------------------------


def test_lite0_checkpoint_maps_one_to_one() -> None:
    spec = ENCODERS["efficientnet-lite0"]
    checkpoint = torch.load(spec.checkpoint(), map_location="cpu", weights_only=True)
    model = spec.model(pretrained=False)
    mapped = map_lukemelas_to_timm(checkpoint, model.state_dict())
    used = {id(t) for t in mapped.values()}
    assert sorted(k for k, t in checkpoint.items() if id(t) not in used) == [
        "_fc.bias",
        "_fc.weight",
    ]
    assert mapped.keys() == model.state_dict().keys()
    result = model.load_state_dict(mapped, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    state = model.state_dict()
    for ours, theirs in [
        ("conv_stem.weight", "_conv_stem.weight"),
        ("blocks.1.0.conv_pwl.weight", "_blocks.1._project_conv.weight"),
        ("blocks.6.0.bn3.running_var", "_blocks.15._bn2.running_var"),
        ("bn2.bias", "_bn1.bias"),
    ]:
        assert torch.equal(state[ours], checkpoint[theirs])


def test_lite0_mapping_rejects_misalignment() -> None:
    spec = ENCODERS["efficientnet-lite0"]
    checkpoint = torch.load(spec.checkpoint(), map_location="cpu", weights_only=True)
    target = spec.model(pretrained=False).state_dict()
    items = list(checkpoint.items())
    swapped = dict(items[:7] + [items[8], items[7]] + items[9:])  # bn1.weight <-> bn1.bias
    with pytest.raises(ValueError, match="does not fit"):
        map_lukemelas_to_timm(swapped, target)
    with pytest.raises(ValueError, match="backbone tensors"):
        map_lukemelas_to_timm(dict(items[1:]), target)


def test_lite0_features(lite0) -> None:
    images = load_dataset("digits").test.images[:24]
    features = lite0.encode(images)
    assert features.shape == (24, 1280) and features.dtype == np.float32
    assert np.isfinite(features).all() and features.std(axis=0).mean() > 0.05
    # eval mode: a sample's features do not depend on the rest of its batch
    np.testing.assert_allclose(lite0.encode(images[:5]), features[:5], rtol=1e-4, atol=1e-4)
    identity = lite0.identity()
    assert identity == encoder_identity("efficientnet-lite0")  # the cheap path agrees
    assert identity["weights"]["sha256"] == file_sha256(ENCODERS["efficientnet-lite0"].checkpoint())
    prep = identity["preprocessing"]
    assert (prep["image_size"], prep["interpolation"], prep["mean"]) == (128, "bicubic", [0.5] * 3)
    assert identity["dtype"] == "fp32" and lite0.modality == "image"


@pytest.mark.parametrize("name", LITES)
def test_lite_recipe_is_timms(name: str) -> None:
    """The restated Lite preprocessing is timm's pretrained_cfg; Lite1/2 default to timm's native
    input size (Lite0 to 128 px on purpose, see the registry)."""
    spec = ENCODERS[name]
    timm = import_timm()
    cfg = timm.models.get_pretrained_cfg(f"{spec.arch}.in1k").to_dict()
    prep = encoder_identity(name)["preprocessing"]
    assert (prep["mean"], prep["std"]) == (list(cfg["mean"]), list(cfg["std"]))
    assert prep["interpolation"] == cfg["interpolation"]
    native = {"efficientnet-lite0": 128, "efficientnet-lite1": 240, "efficientnet-lite2": 260}
    assert prep["image_size"] == native[name]
    if name != "efficientnet-lite0":
        assert prep["image_size"] == cfg["input_size"][-1]


@pytest.mark.slow
@pytest.mark.skipif(not TINY_ZIP.exists(), reason=f"needs the offline TinyImageNet at {TINY_ZIP}")
@pytest.mark.parametrize("name", ["efficientnet-lite1", "efficientnet-lite2"])
def test_lite12_checkpoints_are_the_imagenet_networks(name: str) -> None:
    """Strict load through load_encoder, then the checkpoint's own ImageNet classifier on the
    pooled features: TinyImageNet val images are ImageNet classes, so top-1 is far above chance
    (0.1%). Measured here on 50 images at 128 px: Lite1 0.40, Lite2 0.46."""
    data = load_dataset("tinyimagenet-100", DATA, limit_per_class=1)
    images, labels = data.test.images[:50], data.test.labels[:50]
    with zipfile.ZipFile(TINY_ZIP) as zf:
        wnids = zf.read(next(n for n in zf.namelist() if n.endswith("wnids.txt"))).decode().split()
    imagenet = import_timm().data.ImageNetInfo().label_names()
    target = np.array([imagenet.index(wnids[y]) for y in labels])

    encoder = load_encoder(name, device="cpu", image_size=128)
    checkpoint = torch.load(ENCODERS[name].checkpoint(), map_location="cpu", weights_only=True)
    logits = (
        encoder.encode(images) @ checkpoint["_fc.weight"].numpy().T + checkpoint["_fc.bias"].numpy()
    )
    top1 = (logits.argmax(1) == target).mean()
    assert top1 >= 0.25, top1
    assert encoder.identity()["arch"] == f"timm/tf_{name.replace('-', '_')}"


def _cifar_sample(per_class: int) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image

    with zipfile.ZipFile(CIFAR_ZIP) as zf:
        names = sorted(n for n in zf.namelist() if n.startswith("test/") and n.endswith(".jpg"))
        classes = sorted({n.split("/")[1] for n in names})
        picked = [
            n for c in classes for n in [m for m in names if m.split("/")[1] == c][:per_class]
        ]
        images = np.stack(
            [np.asarray(Image.open(io.BytesIO(zf.read(n))).convert("RGB")) for n in picked]
        )
    labels = np.array([classes.index(n.split("/")[1]) for n in picked])
    order = np.random.default_rng(0).permutation(len(labels))
    return images[order], labels[order]


def _probe_accuracy(features: np.ndarray, labels: np.ndarray, n_train: int) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    probe = make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=2000))
    probe.fit(features[:n_train], labels[:n_train])
    return probe.score(features[n_train:], labels[n_train:])


@pytest.mark.slow
@pytest.mark.skipif(not CIFAR_ZIP.exists(), reason=f"needs the offline CIFAR-10 at {CIFAR_ZIP}")
def test_pretrained_beats_random_init_on_a_linear_probe(lite0) -> None:
    """The loaded weights are really the ImageNet network. Natural images, not digits: on
    8x8 digits upsampled to 128 px a random-init Lite0 probes as well as the pretrained one
    (full split: 95% vs 94%), so digits cannot tell them apart. Measured here on 250 CIFAR-10
    test images (150 probe-train / 100 probe-test): pretrained 0.55, random 0.12 (on 400,
    240 / 160: 0.60 and 0.21). Encoding is the cost: ~25 ms of CPU per image per network."""
    images, labels = _cifar_sample(per_class=25)
    random_init = load_encoder("efficientnet-lite0", device="cpu", pretrained=False)
    assert random_init.identity()["weights"].startswith("random-init")
    pretrained = _probe_accuracy(lite0.encode(images), labels, 150)
    random = _probe_accuracy(random_init.encode(images), labels, 150)
    assert pretrained >= 0.45 and pretrained >= random + 0.2, (pretrained, random)


# --- hub image encoders (timm) --------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(HUB_IMAGE))
def test_hub_preprocessing_comes_from_timms_pretrained_cfg(name: str) -> None:
    tag, dim = HUB_IMAGE[name]
    timm = import_timm()
    assert timm.list_pretrained(tag) == [tag]  # the tag exists in the installed timm
    cfg = timm.data.resolve_data_config(
        pretrained_cfg=timm.models.get_pretrained_cfg(tag).to_dict()
    )
    identity = encoder_identity(name)
    prep = identity["preprocessing"]
    assert prep["image_size"] == cfg["input_size"][-1]
    assert (prep["mean"], prep["std"]) == (list(cfg["mean"]), list(cfg["std"]))
    assert (prep["interpolation"], prep["crop_pct"]) == (cfg["interpolation"], cfg["crop_pct"])
    assert identity["weights"] == {"timm_tag": tag, "hub": f"timm/{tag}"}
    assert identity["feature_dim"] == dim and identity["dtype"] == "fp32"


def test_hub_preprocessing_values() -> None:
    """What timm's configs say, spelled out: in21k ViTs use mean = std = 0.5 and crop 0.9;
    DINOv2 ImageNet statistics at 518 px, no crop; ConvNeXt crop 0.875."""
    vit = encoder_identity("vit-b16-in21k")["preprocessing"]
    assert (vit["image_size"], vit["mean"], vit["std"], vit["crop_pct"]) == (
        224,
        [0.5] * 3,
        [0.5] * 3,
        0.9,
    )
    assert vit["resize"] == "shorter side to 248, center crop 224"
    dino = encoder_identity("dinov2-vitl14")["preprocessing"]
    assert (dino["image_size"], dino["crop_pct"]) == (518, 1.0)
    assert dino["mean"] == [0.485, 0.456, 0.406] and dino["std"] == [0.229, 0.224, 0.225]
    convnext = encoder_identity("convnext-base")["preprocessing"]
    assert (convnext["crop_pct"], convnext["resize"]) == (
        0.875,
        "shorter side to 256, center crop 224",
    )
    assert encoder_identity("vit-b32", image_size=64)["preprocessing"]["image_size"] == 64


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(HUB_IMAGE))
def test_hub_random_init_encodes(name: str) -> None:
    """pretrained=False: the same architecture, seeded, no network; 2 images at the native size
    (timed here on 2 CPUs: build 1-4 s, forward 0.2-1 s). DINOv2 at 518 px takes ~9 s per image,
    so it runs at 224 px (an image_size override: 16x16 patches of 14 px), and its native
    architecture is checked on the meta device (shapes only, no compute)."""
    dim = HUB_IMAGE[name][1]
    image_size = 224 if name == "dinov2-vitl14" else None
    encoder = load_encoder(name, device="cpu", pretrained=False, image_size=image_size)
    features = encoder.encode(load_dataset("digits").test.images[:2])
    assert features.shape == (2, dim) and np.isfinite(features).all()
    assert features.std() > 0 and not np.allclose(features[0], features[1])
    assert encoder.identity() == encoder_identity(name, pretrained=False, image_size=image_size)
    if image_size is not None:
        native = timm_data_config(ENCODERS[name].tag)["input_size"][-1]
        with torch.device("meta"):
            model = ENCODERS[name].model(name, EncoderOptions(pretrained=False))
            assert tuple(model(torch.empty(2, 3, native, native)).shape) == (2, dim)


def test_hub_weights_from_a_local_file(tmp_path) -> None:
    """weights_file: timm loads the checkpoint (its classifier dropped) and the identity
    records its sha256; a checkpoint that lacks a backbone tensor is refused, not half-loaded.
    A ViT-Ti registry entry keeps this fast; the code path is every hub encoder's."""
    from safetensors.torch import save_file

    name = "vit-ti16-test"
    spec = TimmHubSpec("vit_tiny_patch16_224.augreg_in21k", 192, fixed_size=True)
    ENCODERS[name] = spec
    try:
        source = load_encoder(name, device="cpu", pretrained=False, image_size=64)
        state = {k: v.contiguous() for k, v in source.model.state_dict().items()}
        state["head.weight"] = torch.zeros(21843, 192)  # a hub checkpoint keeps its classifier
        save_file(state, tmp_path / "good.safetensors")
        encoder = load_encoder(
            name, device="cpu", image_size=64, weights_file=tmp_path / "good.safetensors"
        )
        images = load_dataset("digits").test.images[:3]
        np.testing.assert_allclose(
            encoder.encode(images), source.encode(images), rtol=1e-5, atol=1e-5
        )
        weights = encoder.identity()["weights"]
        assert weights["sha256"] == file_sha256(tmp_path / "good.safetensors")
        del state["blocks.0.attn.qkv.weight"]
        save_file(state, tmp_path / "bad.safetensors")
        with pytest.raises(
            RuntimeError, match=r"do not fit: Missing keys \(blocks\.0\.attn\.qkv\.weight\)"
        ):
            load_encoder(
                name, device="cpu", image_size=64, weights_file=tmp_path / "bad.safetensors"
            )
    finally:
        del ENCODERS[name]


def test_hub_weights_unreachable_fail_in_one_line(no_hub) -> None:
    for name in ("vit-b32", "roberta-base"):
        with pytest.raises(WeightsUnavailable) as err:
            load_encoder(name, device="cpu")
        message = str(err.value)
        assert "\n" not in message and f"encoder {name!r}: could not fetch its weights" in message
        assert f"offline encoders: {', '.join(offline_encoders())}" in message
    assert offline_encoders() == [*LITES, "minilm", "pixels", "tiny-bert", "tiny-cnn"]


# --- text encoders --------------------------------------------------------------------------


@pytest.mark.slow
def test_minilm_offline_mean_pooled_and_paraphrase_aware(minilm) -> None:
    texts = [
        "A man is eating a piece of bread.",
        "A guy eats some bread.",
        "The central bank raised interest rates again.",
    ]
    features = minilm.encode(texts)
    assert features.shape == (3, 384) and features.dtype == np.float32 and minilm.modality == "text"
    np.testing.assert_allclose(np.linalg.norm(features, axis=1), 1.0, atol=1e-4)
    sim = features @ features.T
    assert sim[0, 1] > 0.6 > 0.2 > max(sim[0, 2], sim[1, 2]), sim
    identity = minilm.identity()
    assert identity == encoder_identity("minilm")
    assert (identity["pooling"], identity["normalize"], identity["tokenizer"]["max_length"]) == (
        "mean",
        "l2",
        256,
    )
    # batch-independent: padding in a longer batch changes nothing
    np.testing.assert_allclose(minilm.encode(texts[:1]), features[:1], atol=1e-5)


def test_bf16_on_cpu_works_and_fp16_is_refused(minilm) -> None:
    texts = ["A man is eating a piece of bread.", "Stocks fell."]
    bf16 = load_encoder("minilm", device="cpu", dtype="bf16")
    assert (
        bf16.identity()["dtype"] == "bf16"
        and encoder_identity("minilm", dtype="bf16") == bf16.identity()
    )
    cosine = (bf16.encode(texts) * minilm.encode(texts)).sum(axis=1)
    assert (cosine > 0.99).all(), cosine
    with pytest.raises(
        EncoderError, match=r"^encoder 'minilm': dtype='fp16' is not allowed on cpu .*bf16$"
    ):
        load_encoder("minilm", device="cpu", dtype="fp16")
    assert (
        encoder_identity("minilm", dtype="fp16")["dtype"] == "fp16"
    )  # a CUDA-built cache checks here


@pytest.mark.slow
def test_roberta_random_init_and_pooling() -> None:
    encoder = load_encoder("roberta-base", device="cpu", pretrained=False)
    features = encoder.encode(["short", "a somewhat longer sentence, with punctuation."])
    assert features.shape == (2, 768) and np.isfinite(features).all()
    identity = encoder.identity()
    assert identity["pooling"] == "mean" and identity["weights"].startswith("random-init")
    assert encoder_identity("roberta-base")["weights"] == {"hub": "FacebookAI/roberta-base"}
    assert encoder_identity("roberta-base", pooling="cls")["pooling"] == "cls"
    with pytest.raises(
        EncoderError, match=r"pooling='max' is not allowed; choose one of: mean, cls"
    ):
        encoder_identity("roberta-base", pooling="max")


# --- options and names ----------------------------------------------------------------------


def test_pixels_encoder() -> None:
    encoder = load_encoder("pixels")
    images = load_dataset("digits").train.images[:10]
    features = encoder.encode(images)
    assert features.shape == (10, 64) and encoder.feature_dim == 64
    np.testing.assert_allclose(features, images[..., 0].reshape(10, 64) / 255.0, rtol=1e-6)
    assert encoder.identity()["weights"] == "none"
    assert load_encoder("pixels", image_size=4).encode(images).shape == (10, 16)


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("nope", {}, r"^encoder='nope' is not allowed; choose one of: convnext-base, .*vit-l16$"),
        ("minilm", {"image_size": 64}, r"image_size=64 is not allowed; it reads text"),
        ("pixels", {"pooling": "cls"}, r"pooling='cls' is not allowed; it has no pooling option"),
        ("pixels", {"dtype": "bf16"}, r"dtype='bf16' is not allowed; choose one of: fp32$"),
        (
            "vit-b32",
            {"dtype": "fp8"},
            r"dtype='fp8' is not allowed; choose one of: fp32, bf16, fp16",
        ),
        ("efficientnet-lite0", {"image_size": 0}, r"image_size=0 is not allowed; use a positive"),
        ("minilm", {"weights_file": "x.pt"}, r"weights_file=.* only hub image encoders take"),
        (
            "vit-b32",
            {"weights_file": "missing.pt"},
            r"weights_file=.*missing\.pt' is not allowed; no such",
        ),
    ],
)
def test_bad_options_are_one_line_errors(name: str, options: dict, message: str) -> None:
    with pytest.raises(EncoderError, match=message):
        encoder_identity(name, **options)


def test_auto_device() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert load_encoder("pixels").device.type == expected
