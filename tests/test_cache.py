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

from ovalp_flwr.features.cache import build as cache_build
from ovalp_flwr.features.cache import (
    CacheError,
    build_features,
    cache_path,
    load_features,
    load_or_build,
    verify_folder,
)
from ovalp_flwr.features.cache import main as cache_main
from ovalp_flwr.data.registry import load_dataset
from ovalp_flwr.features.encoders import encoder_identity, load_encoder

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
        (lambda m: m["encoder_identity"].update(dtype="bf16"), "encoder_identity.dtype"),
        (lambda m: m.update(limit_per_class=5), "limit_per_class"),
        (lambda m: m.update(modality="text"), "modality"),
    ],
)
def test_manifest_mismatch_names_the_key(built: Path, tmp_path: Path, edit, key: str) -> None:
    _edit_manifest(built, edit)
    with pytest.raises(CacheError, match=rf"{built}: {key} mismatch: expected") as err:
        load_features("digits", "pixels", tmp_path)
    assert str(err.value).endswith(
        "delete the folder to rebuild it at the next run, or rebuild it now: python -m "
        f"ovalp_flwr.features.cache build --dataset digits --encoder pixels --cache-dir {tmp_path} --rebuild")


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
    # a variant's folder moved under the default name is caught by its manifest
    cache_path(tmp_path, "digits", "pixels", image_size=4).rename(cache_path(tmp_path, "digits", "pixels"))
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
    real_write = cache_build._write_split
    calls = []

    def crash_on_second(file, split):
        calls.append(file.name)
        if len(calls) == 2:
            raise KeyboardInterrupt("simulated interruption")
        return real_write(file, split)

    monkeypatch.setattr(cache_build, "_write_split", crash_on_second)
    if killed:
        monkeypatch.setattr(cache_build.shutil, "rmtree", lambda *a, **k: None)
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
    monkeypatch.setattr(cache_build, "_build", lambda *a, **k: pytest.fail("rebuilt a good cache"))
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


@pytest.mark.slow
def test_concurrent_processes_share_one_first_build(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from ovalp_flwr.features import cache; "
        "cache.load_or_build('digits', 'pixels', Path(sys.argv[1]), progress=False)"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=REPO) for _ in range(2)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert load_features("digits", "pixels", tmp_path).train.x.shape == (1437, 64)
    assert [p.name for p in tmp_path.iterdir()] == ["digits__pixels"]


@pytest.mark.slow
def test_loading_needs_no_timm(built: Path, tmp_path: Path) -> None:
    """A ClientApp loads features and checks the Lite0 or MiniLM identity without timm,
    torchvision or transformers (hub encoders' identities read timm's pretrained config)."""
    code = (
        "import sys; from pathlib import Path; from ovalp_flwr.features import cache, encoders; "
        "cache.load_features('digits', 'pixels', Path(sys.argv[1])); "
        "encoders.encoder_identity('efficientnet-lite0'); encoders.encoder_identity('minilm'); "
        "print(sorted(m for m in ('timm', 'torchvision', 'transformers') if m in sys.modules))"
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


# --- text caches, modality, limits ----------------------------------------------------------


@pytest.fixture
def tiny_texts(tmp_path: Path) -> Path:
    """A data dir with `tiny.csv` (3 classes x 5 rows), loaded as dataset 'csv:tiny'."""
    rows = {
        "sport": [
            "The team won the final.",
            "A late goal decided the match.",
            "She ran a record marathon.",
            "The coach was sacked.",
            "Fans filled the stadium.",
        ],
        "money": [
            "Shares fell sharply.",
            "The bank raised rates.",
            "Oil prices climbed.",
            "The company posted a loss.",
            "Investors sold bonds.",
        ],
        "space": [
            "The rocket reached orbit.",
            "A new exoplanet was found.",
            "Astronauts docked with the station.",
            "The telescope imaged a galaxy.",
            "A comet passed Earth.",
        ],
    }
    data = tmp_path / "data"
    data.mkdir()
    lines = ["text,label"] + [f'"{t}",{label}' for label, texts in rows.items() for t in texts]
    (data / "tiny.csv").write_text("\n".join(lines) + "\n")
    return data


@pytest.mark.slow
def test_text_cache_builds_and_verifies(tmp_path: Path, tiny_texts: Path) -> None:
    built = build_features(
        "csv:tiny", "minilm", tmp_path / "c", data_dir=tiny_texts, progress=False
    )
    loaded = load_features("csv:tiny", "minilm", tmp_path / "c")
    assert (loaded.train.x.shape, loaded.test.x.shape) == ((12, 384), (3, 384))
    assert np.array_equal(loaded.train.x, built.train.x) and loaded.num_classes == 3
    manifest = loaded.manifest
    assert (manifest["modality"], manifest["build"]["unit"], manifest["limit_per_class"]) == (
        "text",
        "texts",
        None,
    )
    assert manifest["encoder_identity"] == encoder_identity("minilm")
    ds = load_dataset("csv:tiny", tiny_texts)
    direct = load_encoder("minilm", device="cpu").encode(list(ds.test.texts))
    np.testing.assert_allclose(loaded.test.x, direct, atol=1e-5)  # length-sorted batches, same rows
    assert np.array_equal(loaded.test.y, ds.test.labels)


def test_modality_mismatch_is_one_line(tmp_path: Path, tiny_texts: Path) -> None:
    with pytest.raises(
        CacheError, match=r"^encoder 'minilm' reads text; dataset 'digits' is image$"
    ):
        build_features("digits", "minilm", tmp_path, progress=False)
    with pytest.raises(
        CacheError, match=r"^encoder 'pixels' reads image; dataset 'csv:tiny' is text$"
    ):
        load_or_build("csv:tiny", "pixels", tmp_path, data_dir=tiny_texts, progress=False)
    assert not any(tmp_path.glob("*__*"))


def test_modality_mismatch_fails_before_any_data_is_read(tmp_path: Path) -> None:
    # no such folder or hub access: only a check that reads nothing can give this error
    with pytest.raises(CacheError, match=r"^encoder 'minilm' reads text; dataset 'folder:none'"):
        build_features("folder:none", "minilm", tmp_path, data_dir=tmp_path, progress=False)
    with pytest.raises(CacheError, match=r"^encoder 'pixels' reads image; dataset 'hub:ag-news'"):
        build_features("hub:ag-news", "pixels", tmp_path, progress=False)


def test_a_limited_cache_is_never_the_full_one(tmp_path: Path) -> None:
    limited = build_features("digits", "pixels", tmp_path, limit_per_class=5, progress=False)
    assert np.bincount(limited.train.y).tolist() == [5] * 10
    assert limited.manifest["limit_per_class"] == 5
    path = cache_path(tmp_path, "digits", "pixels", 5)
    assert (
        path.name == "digits__pixels@limit5"
        and cache_path(tmp_path, "digits", "pixels").name == "digits__pixels"
    )
    with pytest.raises(CacheError, match="digits__pixels does not exist"):
        load_features("digits", "pixels", tmp_path)
    assert load_features("digits", "pixels", tmp_path, limit_per_class=5).train.x.shape == (50, 64)
    path.rename(cache_path(tmp_path, "digits", "pixels"))  # passed off as the full cache
    with pytest.raises(CacheError, match=r"limit_per_class mismatch: expected None, found 5"):
        load_or_build("digits", "pixels", tmp_path, progress=False)


def test_unknown_encoder_option_is_named(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"unknown encoder option 'colour'; choose from image_size"):
        load_features("digits", "pixels", tmp_path, colour="red")


def test_encoder_variants_get_their_own_folders_side_by_side(tmp_path: Path) -> None:
    assert cache_path(tmp_path, "d", "e").name == "d__e"
    assert cache_path(tmp_path, "d", "e", 5, pretrained=False, dtype="bf16", image_size=224,
                      pooling="cls").name == "d__e@limit5@random@bf16@224px@cls"
    build_features("digits", "pixels", tmp_path, progress=False)
    small = build_features("digits", "pixels", tmp_path, image_size=4, progress=False)
    assert small.train.x.shape[1] == 16
    assert load_features("digits", "pixels", tmp_path).train.x.shape[1] == 64  # untouched
    assert load_features("digits", "pixels", tmp_path, image_size=4).train.x.shape[1] == 16
    assert verify_folder(cache_path(tmp_path, "digits", "pixels", image_size=4)).train.x.shape[1] == 16


# --- the command line: `python -m ovalp_flwr.features.cache build | ls | verify`, in process through
# `main`, plus one real subprocess for the module entry point and its progress bar. Small
# limited digits caches.


def run_cli(capsys, command: str) -> tuple[int, str, str]:
    """main() on a command line (pytest's tmp paths have no spaces); (exit code, stdout, stderr)."""
    code = cache_main(command.split())
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def cli_built(tmp_path: Path, capsys) -> Path:
    build = f"build --dataset digits --encoder pixels --cache-dir {tmp_path} --limit-per-class 3"
    code, out, _ = run_cli(capsys, f"{build} --quiet")
    assert code == 0
    path = cache_path(tmp_path, "digits", "pixels", 3)
    line = out.strip()  # one final line: encoder, dim, count, seconds, rate, where
    assert line.startswith("pixels: 64-d features, 60 images in ") and " images/s (data " in line
    assert "\n" not in line and line.endswith(f" -> {path}")
    return path


def test_build_then_build_again_reuses(cli_built: Path, capsys) -> None:
    folder = cli_built.parent
    build = f"build --dataset digits --encoder pixels --cache-dir {folder} --limit-per-class 3"
    code, out, _ = run_cli(capsys, build)
    assert code == 0
    assert out.strip() == f"{cli_built} exists and verifies; --rebuild to encode again"


def test_ls_is_a_table(cli_built: Path, capsys) -> None:
    code, out, _ = run_cli(capsys, f"ls --cache-dir {cli_built.parent}")
    header, row = out.strip().splitlines()
    assert code == 0 and header.split() == [
        "dataset",
        "encoder",
        "limit",
        "splits",
        "size",
        "created",
    ]
    assert row.split()[:5] == ["digits", "pixels", "3", "train=30x64", "test=30x64"]
    assert row.split()[5:7] == ["0.0", "MB"] and row.split()[7].startswith("20")


def test_verify_all_then_detect_a_flipped_byte(cli_built: Path, capsys) -> None:
    code, out, _ = run_cli(capsys, f"verify --cache-dir {cli_built.parent}")
    assert code == 0 and out.splitlines() == [f"ok    {cli_built}", "1 ok, 0 failed"]

    file = cli_built / "train.safetensors"
    blob = bytearray(file.read_bytes())
    blob[-1] ^= 0x01
    file.write_bytes(bytes(blob))
    code, out, _ = run_cli(
        capsys, f"verify digits pixels --limit-per-class 3 --cache-dir {cli_built.parent}"
    )
    fail, summary = out.splitlines()
    assert code == 1 and summary == "0 ok, 1 failed"
    assert fail.startswith(f"FAIL  feature cache {cli_built}: splits.train.sha256 mismatch")


def test_verify_names_a_missing_cache(tmp_path: Path, capsys) -> None:
    code, out, _ = run_cli(capsys, f"verify digits pixels --cache-dir {tmp_path}")
    assert code == 1 and f"FAIL  feature cache {tmp_path}/digits__pixels does not exist" in out


def test_build_errors_are_one_line(tmp_path: Path, capsys) -> None:
    code, out, err = run_cli(capsys,
                             f"build --dataset digits --encoder minilm --cache-dir {tmp_path}")
    assert code == 1 and out == ""
    assert err == "error: encoder 'minilm' reads text; dataset 'digits' is image\n"
    code, _, err = run_cli(
        capsys, f"build --dataset digits --encoder pixels --dtype bf16 --cache-dir {tmp_path}"
    )
    assert code == 1 and err.startswith("error: encoder 'pixels': dtype='bf16' is not allowed")
    with pytest.raises(SystemExit) as usage:
        cache_main(["build", "--dataset", "digits", "--encoder", "nope"])
    assert usage.value.code == 2


@pytest.mark.slow
def test_module_entry_point_shows_progress(tmp_path: Path) -> None:
    command = f"build --dataset digits --encoder pixels --cache-dir {tmp_path} --limit-per-class 2"
    result = subprocess.run(
        [sys.executable, "-m", "ovalp_flwr.features.cache", *command.split()],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "pixels train: 100%" in result.stderr and "20/20" in result.stderr  # the tqdm bars
    assert result.stdout.strip().endswith(f"-> {cache_path(tmp_path, 'digits', 'pixels', 2)}")
