"""The image command's parts that need no docker engine (the engine part: test_compose.py)."""

import re
import urllib.request
from pathlib import Path

import yaml

from ovalp_flwr.ops import images

DOCKER = images.DOCKER


def test_the_mirror_is_read_from_deb822_and_one_line_apt_sources(tmp_path):
    deb822 = tmp_path / "debian.sources"
    deb822.write_text("Types: deb\n# a comment\nURIs: http://mirror.example/debian\n"
                      "Suites: bookworm\n\nTypes: deb\nURIs: http://mirror.example/debian-security\n")
    one_line = tmp_path / "sources.list"
    one_line.write_text("# deb http://old/debian bookworm main\n"
                        "deb https://packages.cloud.google.com/apt cloud-sdk main\n"
                        "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main\n")
    assert images.apt_mirror([tmp_path / "missing", deb822]) == "http://mirror.example/debian"
    assert images.apt_mirror([one_line]) == "http://mirror.example/debian"
    assert images.apt_mirror([tmp_path / "missing"]) == images.DEFAULT_MIRROR


def test_the_wheelhouse_holds_the_apps_pins_flower_at_the_images_version_and_the_backend():
    wanted = images.requirements(flwr_version="9.9.9")
    assert "torch==2.13.0" in wanted  # exact: a range would pull a CUDA build
    assert "flwr==9.9.9" in wanted and any(r.startswith("setuptools") for r in wanted)


def test_compose_runs_the_images_the_command_builds():
    """The tags in compose.yml are the installed Flower's (the stand-ins get them too) and
    the app runtimes share the one app image."""
    services = yaml.safe_load((DOCKER / "compose.yml").read_text())["services"]
    used = {s["image"] for s in services.values()}
    assert used == {images.flower_image("superlink"), images.flower_image("supernode"),
                    images.APP_IMAGE}
    assert f"FROM {images.flower_image('superexec')}" in (DOCKER / "Dockerfile").read_text()
    stand_ins = (DOCKER / "flower" / "Dockerfile").read_text()
    for component in images.COMPONENTS:  # a target per image, with the official entrypoint
        assert re.search(rf"FROM base AS {component}\nENTRYPOINT \[\"flower-{component}\"\]",
                         stand_ins), component
    assert f"ARG BASE_IMAGE={images.BASE_IMAGE}" in stand_ins


def test_the_build_context_is_only_what_the_app_dockerfile_copies():
    """.dockerignore lets in exactly the COPY sources (not .venv, results or caches)."""
    copied = {source for line in (DOCKER / "Dockerfile").read_text().splitlines()
              if line.startswith("COPY") for source in line.split()[1:-1]
              if not source.startswith("--")}
    allowed = {line[1:] for line in (images.PROJECT / ".dockerignore").read_text().splitlines()
               if line.startswith("!")}
    assert copied == allowed


def test_the_wheelhouse_is_served_on_loopback_only_while_needed(tmp_path):
    (tmp_path / "a-1.0-py3-none-any.whl").write_bytes(b"wheel")
    with images.served(tmp_path) as url:
        assert url.startswith("http://127.0.0.1:")
        listing = urllib.request.urlopen(url, timeout=10).read().decode()
        assert "a-1.0-py3-none-any.whl" in listing  # what pip's find-links reads
    try:
        urllib.request.urlopen(url, timeout=2)
        served_after = True
    except OSError:
        served_after = False
    assert not served_after


def test_a_missing_engine_is_one_line_not_a_traceback(monkeypatch):
    monkeypatch.setattr(images.shutil, "which", lambda name: None)
    why = images.docker_available()
    assert why is not None and "\n" not in why and "docker" in why


def test_the_main_command_says_why_without_an_engine(monkeypatch, capsys):
    monkeypatch.setattr(images, "docker_available", lambda: "no docker engine answers: x")
    assert images.main([]) == 2
    assert capsys.readouterr().err.strip() == "cannot build the images: no docker engine answers: x"


def test_paths_of_this_machine_stay_out_of_the_repo():
    """The builds get the host's pip settings at build time only (PIP_FIND_LINKS)."""
    for path in [*DOCKER.rglob("*"), images.PROJECT / ".dockerignore"]:
        if path.is_file():
            text = path.read_text()
            assert "/opt/" not in text and "/etc/ssl" not in text, path
    assert Path(images.WHEELHOUSE).is_relative_to(images.PROJECT / "build")  # git-ignored
