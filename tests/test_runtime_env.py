"""federation/runtime_env.py: a run on packages Flower reinstalled for it says so, and the venv
`make install` builds turns that install off when activated."""

import logging
import subprocess
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]


def test_a_run_on_packages_flower_reinstalled_for_it_says_so_once(caplog):
    from ovalp_flwr.federation.runtime_env import flower_installed_env, say_if_flower_installed

    home = "/home/u/.flwr/runtime-envs/10320018436828322150"
    assert flower_installed_env({"VIRTUAL_ENV": home}) == Path(home)
    assert flower_installed_env({"VIRTUAL_ENV": "/work/main/.venv"}) is None
    assert flower_installed_env({}) is None
    say_if_flower_installed({"VIRTUAL_ENV": "/work/main/.venv"})
    say_if_flower_installed({"VIRTUAL_ENV": home})
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and home in warnings[0]
    assert "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1" in warnings[0]


def test_the_venv_make_builds_turns_off_flowers_per_run_install_when_activated():
    activate = PROJECT / ".venv" / "bin" / "activate"
    if not activate.is_file():
        pytest.skip("no .venv here: `make install` makes it")
    done = subprocess.run(["bash", "-c", f"source {activate} && "
                           "echo $FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION && command -v flwr"],
                          capture_output=True, text=True, timeout=30)
    assert done.stdout.splitlines() == ["1", str(PROJECT / ".venv" / "bin" / "flwr")]
