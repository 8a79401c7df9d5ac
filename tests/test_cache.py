"""Feature cache and dataset tests: real digits, the network-free `pixels` encoder, tmp dirs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from ovalp_flwr import cache
from ovalp_flwr.cache import CacheError, build_features, cache_path, load_features, load_or_build
from ovalp_flwr.datasets import load_dataset
from ovalp_flwr.encoders import load_encoder

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def built(tmp_path: Path) -> Path:
    build_features("digits", "pixels", tmp_path, progress=False)
    return cache_path(tmp_path, "digits", "pixels")


def _edit_manifest(path: Path, edit) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    edit(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


# --- datasets -------------------------------------------------------------------------------


def test_digits_split_is_stratified_80_20_and_fixed() -> None:
    ds = load_dataset("digits")
    assert (len(ds.train.labels), len(ds.test.labels)) == (1437, 360)
    assert ds.train.images.shape == (1437, 8, 8, 3) and ds.train.images.dtype == np.uint8
    assert ds.train.labels.dtype == np.int64 and ds.class_names == tuple("0123456789")
    assert (
        ds.train.images.max() == 255 and (ds.train.images[..., 0] == ds.train.images[..., 2]).all()
    )
    train_counts = np.bincount(ds.train.labels)
    test_counts = np.bincount(ds.test.labels)
    assert np.all(np.abs(test_counts - 0.2 * (train_counts + test_counts)) <= 1)
    again = load_dataset("digits")
    assert np.array_equal(again.test.images, ds.test.images)
    assert np.array_equal(again.train.labels, ds.train.labels)


def test_unknown_dataset_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"'nope'.*digits"):
        load_dataset("nope")


# --- round trip -----------------------------------------------------------------------------


def test_build_then_load_round_trips(built: Path, tmp_path: Path) -> None:
    fresh = build_features("digits", "pixels", tmp_path, progress=False)  # replaces `built`
    loaded = load_features("digits", "pixels", tmp_path)
    ds = load_dataset("digits")
    for split in ("train", "test"):
        a, b = getattr(fresh, split), getattr(loaded, split)
        assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
        assert b.x.dtype == np.float32 and b.y.dtype == np.int64
        assert np.array_equal(b.y, getattr(ds, split).labels)
    direct = load_encoder("pixels", device="cpu").encode(ds.test.images)
    assert np.array_equal(loaded.test.x, direct)
    assert loaded.train.x.shape == (1437, 64) and loaded.num_classes == 10
    assert loaded.manifest["class_names"] == list("0123456789")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["digits__pixels"]  # no temp leftovers


# --- verification ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda m: m.update(encoder="efficientnet-lite0"), "encoder"),
        (lambda m: m["splits"]["train"].update(shape=[1437, 65]), "splits.train.shape"),
        (
            lambda m: m["encoder_identity"]["preprocessing"].update(image_size=16),
            "encoder_identity.preprocessing.image_size",
        ),
        (lambda m: m.update(format_version=0), "format_version"),
    ],
)
def test_manifest_mismatch_names_the_key(built: Path, tmp_path: Path, edit, key: str) -> None:
    _edit_manifest(built, edit)
    with pytest.raises(CacheError, match=rf"{built}: {key} mismatch: expected") as err:
        load_features("digits", "pixels", tmp_path)
    assert "delete the folder" in str(err.value)


def test_corrupted_byte_fails_the_hash(built: Path, tmp_path: Path) -> None:
    file = built / "train.safetensors"
    blob = bytearray(file.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    file.write_bytes(bytes(blob))
    with pytest.raises(CacheError, match=r"splits\.train\.sha256 mismatch"):
        load_features("digits", "pixels", tmp_path)


def test_truncated_file_fails_the_size(built: Path, tmp_path: Path) -> None:
    file = built / "test.safetensors"
    file.write_bytes(file.read_bytes()[:-4])
    with pytest.raises(CacheError, match=r"splits\.test\.bytes mismatch"):
        load_features("digits", "pixels", tmp_path)


def test_other_image_size_is_a_different_identity(tmp_path: Path) -> None:
    build_features("digits", "pixels", tmp_path, image_size=4, progress=False)
    assert load_features("digits", "pixels", tmp_path, image_size=4).train.x.shape == (1437, 16)
    with pytest.raises(CacheError, match=r"encoder_identity\.feature_dim mismatch"):
        load_features("digits", "pixels", tmp_path)


def test_missing_cache_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CacheError, match="does not exist"):
        load_features("digits", "pixels", tmp_path)


# --- atomic writes --------------------------------------------------------------------------


@pytest.mark.parametrize("killed", [False, True])
def test_interrupted_build_leaves_nothing_trusted(
    tmp_path: Path, monkeypatch, killed: bool
) -> None:
    """Interrupt after the train split is written. Killed: no cleanup runs (as with kill -9),
    so the temp folder stays behind; it must never be taken for the cache."""
    real_write = cache._write_split
    calls = []

    def crash_on_second(file, split):
        calls.append(file.name)
        if len(calls) == 2:
            raise KeyboardInterrupt("simulated interruption")
        return real_write(file, split)

    monkeypatch.setattr(cache, "_write_split", crash_on_second)
    if killed:
        monkeypatch.setattr(cache.shutil, "rmtree", lambda *a, **k: None)
    with pytest.raises(KeyboardInterrupt):
        load_or_build("digits", "pixels", tmp_path, progress=False)
    monkeypatch.undo()

    leftovers = [p.name for p in tmp_path.iterdir()]
    assert len(leftovers) == int(killed)
    assert all(name.startswith(".digits__pixels.tmp-") for name in leftovers)
    with pytest.raises(CacheError, match="does not exist"):
        load_features("digits", "pixels", tmp_path)
    rebuilt = load_or_build("digits", "pixels", tmp_path, progress=False)
    assert rebuilt.train.x.shape == (1437, 64)
    assert load_features("digits", "pixels", tmp_path).manifest == rebuilt.manifest


def test_load_or_build_reuses_a_good_cache(built: Path, tmp_path: Path, monkeypatch) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in built.iterdir()}
    monkeypatch.setattr(cache, "_build", lambda *a, **k: pytest.fail("rebuilt a good cache"))
    features = load_or_build("digits", "pixels", tmp_path, progress=False)
    assert features.test.x.shape == (360, 64)
    assert {p.name: p.stat().st_mtime_ns for p in built.iterdir()} == before


def test_load_or_build_refuses_a_bad_cache(built: Path, tmp_path: Path) -> None:
    _edit_manifest(built, lambda m: m.update(dataset="mnist"))
    with pytest.raises(CacheError, match="dataset mismatch"):
        load_or_build("digits", "pixels", tmp_path, progress=False)
    assert json.loads((built / "manifest.json").read_text())["dataset"] == "mnist"  # untouched


@pytest.mark.parametrize("build", [build_features, load_or_build])
def test_concurrent_builders_each_install_a_whole_cache(tmp_path: Path, build) -> None:
    """Racing replacers (build_features: last wins) or first builders (load_or_build: first
    wins), as threads over quick rounds: every call succeeds and one whole cache remains."""
    with ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            runs = [
                pool.submit(build, "digits", "pixels", tmp_path, progress=False) for _ in range(4)
            ]
            assert all(r.result().train.x.shape == (1437, 64) for r in runs)
    assert load_features("digits", "pixels", tmp_path).train.x.shape == (1437, 64)
    assert [p.name for p in tmp_path.iterdir()] == ["digits__pixels"]


def test_concurrent_processes_share_one_first_build(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from ovalp_flwr import cache; "
        "cache.load_or_build('digits', 'pixels', Path(sys.argv[1]), progress=False)"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=REPO) for _ in range(2)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert load_features("digits", "pixels", tmp_path).train.x.shape == (1437, 64)
    assert [p.name for p in tmp_path.iterdir()] == ["digits__pixels"]


def test_loading_needs_no_timm(built: Path, tmp_path: Path) -> None:
    """A ClientApp loads features and checks the Lite0 identity without timm or torchvision."""
    code = (
        "import sys; from pathlib import Path; from ovalp_flwr import cache, encoders; "
        "cache.load_features('digits', 'pixels', Path(sys.argv[1])); "
        "encoders.encoder_identity('efficientnet-lite0'); "
        "print(sorted(m for m in ('timm', 'torchvision') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert out.stdout.strip() == "[]"
