"""Whether Flower installed the app's packages into a fresh environment for this run.

Flower's SuperLink (and SuperNode) install an app's `[project].dependencies` with `uv sync`
into an environment of its own for each run, unless `FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`
(or `--disable-runtime-dependency-installation`). For this app that environment is 5.8 GB
and takes PyPI's torch, a CUDA build, in place of the CPU one the venv pins
(`flwr/supercore/superexec/dependency_installer.py`, flwr 1.42): the run still works, but not
on the packages `make install` put in `.venv`. `.venv/bin/activate` sets the variable (the
Makefile); a run started otherwise says so in one warning.
"""

from __future__ import annotations

import os
from logging import WARNING
from pathlib import Path

RUNTIME_ENVS = "runtime-envs"  # flwr/supercore/superexec/dependency_installer.py: under FLWR_HOME


def flower_installed_env(environ: dict[str, str] | None = None) -> Path | None:
    """The environment Flower built and activated for this run (its VIRTUAL_ENV under
    `<FLWR_HOME>/runtime-envs/`), or None when the app runs on the interpreter's own packages."""
    venv = (os.environ if environ is None else environ).get("VIRTUAL_ENV", "")
    return Path(venv) if venv and Path(venv).parent.name == RUNTIME_ENVS else None


def say_if_flower_installed(environ: dict[str, str] | None = None) -> None:
    """One warning for the run's user where Flower reinstalled the app's packages for it."""
    from ovalp_flwr.ops.console import say  # late: the console imports Flower's logger

    env = flower_installed_env(environ)
    if env is not None:
        say(WARNING, "Flower installed this app's packages into %s for this run (PyPI's torch, "
            "gigabytes); set FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 before the SuperLink "
            "starts to run on the venv's (`source .venv/bin/activate` sets it)", env)
