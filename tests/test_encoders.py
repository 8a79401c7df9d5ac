"""Encoder tests: the real EfficientNet-Lite0 from the offline checkpoint, on CPU."""

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

from ovalp_flwr.datasets import load_dataset
from ovalp_flwr.encoders import (
    TimmEncoder,
    build_lite0_model,
    encoder_identity,
    file_sha256,
    lite0_checkpoint,
    load_encoder,
    map_lukemelas_to_timm,
    resolve_device,
)

REPO = Path(__file__).resolve().parents[1]
CIFAR_ZIP = REPO.parent / "shared" / "data" / "cifar10-jpg.zip"


@pytest.fixture(scope="module")
def lite0():
    return load_encoder("efficientnet-lite0", device="cpu")


def test_import_timm_works_here() -> None:
    """In a fresh interpreter (the import order matters), import_timm() yields a working timm.
    Where torchvision's C++ ops cannot load (CPU torch beside the registry's CUDA torchvision)
    exactly one module is stubbed and a compiled op still fails loudly with torchvision's own
    error; where they load (matching CUDA builds) nothing is stubbed."""
    code = """if True:
        import json, sys
        from ovalp_flwr.timm_compat import import_timm
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


def test_lite0_checkpoint_maps_one_to_one() -> None:
    checkpoint = torch.load(lite0_checkpoint(), map_location="cpu", weights_only=True)
    model = build_lite0_model(pretrained=False)
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
    checkpoint = torch.load(lite0_checkpoint(), map_location="cpu", weights_only=True)
    target = build_lite0_model(pretrained=False).state_dict()
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
    assert identity["weights"]["sha256"] == file_sha256(lite0_checkpoint())
    prep = identity["preprocessing"]
    assert (prep["image_size"], prep["interpolation"], prep["mean"]) == (128, "bicubic", [0.5] * 3)


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


@pytest.mark.skipif(not CIFAR_ZIP.exists(), reason=f"needs the offline CIFAR-10 at {CIFAR_ZIP}")
def test_pretrained_beats_random_init_on_a_linear_probe(lite0) -> None:
    """The loaded weights are really the ImageNet network. Natural images, not digits: on
    8x8 digits upsampled to 128 px a random-init Lite0 probes as well as the pretrained one
    (full split: 95% vs 94%), so digits cannot tell them apart. Measured here on 400 CIFAR-10
    test images (240 probe-train / 160 probe-test): pretrained 0.60, random 0.21."""
    images, labels = _cifar_sample(per_class=40)
    torch.manual_seed(0)
    random_init = TimmEncoder(
        "random-init", build_lite0_model(pretrained=False), lite0.identity(), resolve_device("cpu")
    )
    pretrained = _probe_accuracy(lite0.encode(images), labels, 240)
    random = _probe_accuracy(random_init.encode(images), labels, 240)
    assert pretrained >= 0.45 and pretrained >= random + 0.2, (pretrained, random)


def test_pixels_encoder() -> None:
    encoder = load_encoder("pixels")
    images = load_dataset("digits").train.images[:10]
    features = encoder.encode(images)
    assert features.shape == (10, 64) and encoder.feature_dim == 64
    np.testing.assert_allclose(features, images[..., 0].reshape(10, 64) / 255.0, rtol=1e-6)
    assert encoder.identity()["weights"] == "none"
    assert load_encoder("pixels", image_size=4).encode(images).shape == (10, 16)


def test_unknown_encoder_and_device() -> None:
    with pytest.raises(ValueError, match=r"'nope'.*efficientnet-lite0.*pixels"):
        load_encoder("nope")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
