"""`python -m ovalp_flwr.cache build | ls | verify`: in process through `main`, plus one real
subprocess for the module entry point and its progress bar. Small limited digits caches."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ovalp_flwr.cache import cache_path, main

REPO = Path(__file__).resolve().parents[1]


def run(capsys, command: str) -> tuple[int, str, str]:
    """main() on a command line (pytest's tmp paths have no spaces); (exit code, stdout, stderr)."""
    code = main(command.split())
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def built(tmp_path: Path, capsys) -> Path:
    build = f"build --dataset digits --encoder pixels --cache-dir {tmp_path} --limit-per-class 3"
    code, out, _ = run(capsys, f"{build} --quiet")
    assert code == 0
    path = cache_path(tmp_path, "digits", "pixels", 3)
    line = out.strip()  # one final line: encoder, dim, count, seconds, rate, where
    assert line.startswith("pixels: 64-d features, 60 images in ") and " images/s (data " in line
    assert "\n" not in line and line.endswith(f" -> {path}")
    return path


def test_build_then_build_again_reuses(built: Path, capsys) -> None:
    build = (
        f"build --dataset digits --encoder pixels --cache-dir {built.parent} --limit-per-class 3"
    )
    code, out, _ = run(capsys, build)
    assert code == 0 and out.strip() == f"{built} exists and verifies; --rebuild to encode again"


def test_ls_is_a_table(built: Path, capsys) -> None:
    code, out, _ = run(capsys, f"ls --cache-dir {built.parent}")
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


def test_verify_all_then_detect_a_flipped_byte(built: Path, capsys) -> None:
    code, out, _ = run(capsys, f"verify --cache-dir {built.parent}")
    assert code == 0 and out.splitlines() == [f"ok    {built}", "1 ok, 0 failed"]

    file = built / "train.safetensors"
    blob = bytearray(file.read_bytes())
    blob[-1] ^= 0x01
    file.write_bytes(bytes(blob))
    code, out, _ = run(
        capsys, f"verify digits pixels --limit-per-class 3 --cache-dir {built.parent}"
    )
    fail, summary = out.splitlines()
    assert code == 1 and summary == "0 ok, 1 failed"
    assert fail.startswith(f"FAIL  feature cache {built}: splits.train.sha256 mismatch")


def test_verify_names_a_missing_cache(tmp_path: Path, capsys) -> None:
    code, out, _ = run(capsys, f"verify digits pixels --cache-dir {tmp_path}")
    assert code == 1 and f"FAIL  feature cache {tmp_path}/digits__pixels does not exist" in out


def test_build_errors_are_one_line(tmp_path: Path, capsys) -> None:
    code, out, err = run(capsys, f"build --dataset digits --encoder minilm --cache-dir {tmp_path}")
    assert code == 1 and out == ""
    assert err == "error: encoder 'minilm' reads text; dataset 'digits' is image\n"
    code, _, err = run(
        capsys, f"build --dataset digits --encoder pixels --dtype bf16 --cache-dir {tmp_path}"
    )
    assert code == 1 and err.startswith("error: encoder 'pixels': dtype='bf16' is not allowed")
    with pytest.raises(SystemExit) as usage:
        main(["build", "--dataset", "digits", "--encoder", "nope"])
    assert usage.value.code == 2


def test_module_entry_point_shows_progress(tmp_path: Path) -> None:
    command = f"build --dataset digits --encoder pixels --cache-dir {tmp_path} --limit-per-class 2"
    result = subprocess.run(
        [sys.executable, "-m", "ovalp_flwr.cache", *command.split()],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "pixels train: 100%" in result.stderr and "20/20" in result.stderr  # the tqdm bars
    assert result.stdout.strip().endswith(f"-> {cache_path(tmp_path, 'digits', 'pixels', 2)}")
