"""The images `docker/compose.yml` runs, built on any machine with a docker engine.

    python -m ovalp_flwr.ops.images              # make docker-images
    python -m ovalp_flwr.ops.images --stand-ins  # never pull: build flwr/* from Debian

Flower's official `flwr/superlink`, `flwr/supernode` and `flwr/superexec` at the installed
flwr version are used where present or pullable. Where Docker Hub is out of reach, stand-ins
with the same names, tags, user and entrypoints are built (`docker/flower/Dockerfile`) on a
Debian base that `debootstrap` makes from the mirror in this machine's apt sources. Then the
app image (`docker/Dockerfile`) on top of `flwr/superexec`.

pip inside the builds: this machine's pip, with its own configuration (`pip config list`:
index, extra indexes, find-links with the CPU torch wheel, certificate bundle), downloads a
wheelhouse for the image's Python, which is served to the builds on 127.0.0.1 (`docker build
--network host`, PIP_FIND_LINKS, PIP_NO_INDEX). The builds need no registry of their own, and
no path of this machine enters an image or the repo.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterator, Sequence
from importlib.metadata import version
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
DOCKER = PROJECT / "docker"
FLWR_VERSION = version("flwr")
COMPONENTS = ("superlink", "supernode", "superexec")  # flwr/<component>, entrypoint flower-<...>
APP_IMAGE = "ovalp-flwr/app:0.1.0"  # docker/compose.yml's `image:` of the app runtimes
BASE_IMAGE = "ovalp-flwr/debian-python:bookworm"  # the stand-ins' base (docker/flower/Dockerfile)
DEBIAN_SUITE = "bookworm"
DEBIAN_PACKAGES = "python3,python3-venv,ca-certificates"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
WHEELHOUSE = PROJECT / "build" / "docker-wheelhouse"  # git-ignored


class ImageError(RuntimeError):
    """A build step failed; the message names the step and the tool's last output."""


def flower_image(component: str, flwr_version: str = FLWR_VERSION) -> str:
    return f"flwr/{component}:{flwr_version}"


def _run(command: Sequence[str], step: str, timeout: float = 1800, **kwargs) -> str:
    done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout,
                          **kwargs)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise ImageError(f"{step} failed ({done.returncode}): {' '.join(command[:4])} ...\n{tail}")
    return done.stdout


def docker_available() -> str | None:
    """None if a docker engine answers; else why not, in one line."""
    if shutil.which("docker") is None:
        return "no docker command (apt-get install docker.io docker-compose)"
    done = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return f"no docker engine answers: {(done.stderr or done.stdout).strip().splitlines()[-1]}"
    return None


def image_exists(image: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", image], capture_output=True,
                          timeout=60).returncode == 0


def pulled(image: str) -> bool:
    """True if `image` is here or could be pulled (fails fast without Docker Hub)."""
    if image_exists(image):
        return True
    return subprocess.run(["docker", "pull", "-q", image], capture_output=True,
                          timeout=600).returncode == 0


def apt_sources() -> list[Path]:
    listed = Path("/etc/apt/sources.list.d")
    return [Path("/etc/apt/sources.list"), *sorted(listed.glob("*.list")),
            *sorted(listed.glob("*.sources"))]


def apt_mirror(sources: Sequence[Path] | None = None) -> str:
    """The Debian mirror this machine's apt uses (deb822 `URIs:` or one-line `deb URL suite`),
    the one a machine without internet can reach; Debian's own redirector otherwise. Only a
    Debian archive will do (its URL names debian; not the security one)."""
    for path in apt_sources() if sources is None else sources:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in (entry.strip() for entry in lines):
            deb822 = re.match(r"URIs:\s*(\S+)", line)
            one_line = re.match(r"deb\s+(?:\[[^\]]*\]\s+)?(\S+)", line)  # deb [opts] URL suite
            url = (deb822 or one_line)[1] if (deb822 or one_line) else ""
            if url.rstrip("/").endswith("/debian"):
                return url
    return DEFAULT_MIRROR


def build_base(image: str = BASE_IMAGE, mirror: str | None = None) -> None:
    """Debian with Python 3, made with debootstrap (a minute or a few) and `docker import`ed."""
    if shutil.which("debootstrap") is None:
        raise ImageError("debootstrap is missing (apt-get install debootstrap): it makes the "
                         "Debian base of the stand-in Flower images")
    with tempfile.TemporaryDirectory(prefix="ovalp-rootfs-") as rootfs:
        _run(["debootstrap", "--variant=minbase", f"--include={DEBIAN_PACKAGES}", DEBIAN_SUITE,
              rootfs, mirror or apt_mirror()], "debootstrap")
        tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
        try:
            _run(["docker", "import", "-", image], "docker import", stdin=tar.stdout)
        finally:
            tar.wait()


def image_python(image: str) -> str:
    """The `major.minor` of the Python an image runs (for the wheelhouse's wheels)."""
    out = _run(["docker", "run", "--rm", "--entrypoint", "python3", image, "-c",
                "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
               f"reading {image}'s Python version", timeout=120)
    return out.strip()


def requirements(pyproject: Path = PROJECT / "pyproject.toml",
                 flwr_version: str = FLWR_VERSION) -> list[str]:
    """What the images install: the app's dependencies, Flower at the images' version, and
    the build backend `pip install .` needs."""
    project = tomllib.loads(pyproject.read_text())
    backend = project["build-system"]["requires"]
    return [*project["project"]["dependencies"], f"flwr=={flwr_version}", *backend]


def download_wheelhouse(python_version: str, folder: Path = WHEELHOUSE) -> Path:
    """Wheels for every requirement, for `python_version`, fetched by this machine's pip with
    this machine's pip configuration. Files already there are checked and kept by pip."""
    target = folder / f"py{python_version}"
    target.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "-q", "--dest", str(target),
          "--python-version", python_version, "--only-binary=:all:", *requirements()],
         f"pip download (wheelhouse for Python {python_version})")
    return target


@contextlib.contextmanager
def served(folder: Path) -> Iterator[str]:
    """`folder` over HTTP on 127.0.0.1 (a `--network host` build reaches it), as a URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base's name)
        pass


def docker_build(tag: str, dockerfile: Path, context: Path, wheels_url: str,
                 target: str | None = None, build_args: dict[str, str] | None = None) -> None:
    args = {"PIP_FIND_LINKS": wheels_url, "PIP_NO_INDEX": "1", **(build_args or {})}
    command = ["docker", "build", "-q", "--network", "host", "-f", str(dockerfile), "-t", tag]
    command += [a for key, value in args.items() for a in ("--build-arg", f"{key}={value}")]
    command += ["--target", target] if target else []
    _run([*command, str(context)], f"docker build {tag}")


def build_stand_ins(wheelhouse_url: str, flwr_version: str = FLWR_VERSION) -> None:
    for component in COMPONENTS:
        docker_build(flower_image(component, flwr_version), DOCKER / "flower" / "Dockerfile",
                     DOCKER / "flower", wheelhouse_url, target=component,
                     build_args={"BASE_IMAGE": BASE_IMAGE, "FLWR_VERSION": flwr_version})


def build_all(stand_ins: bool = False, say=print) -> dict[str, float]:
    """Every image compose.yml needs; the seconds each step took."""
    seconds: dict[str, float] = {}
    started = time.monotonic()
    official = not stand_ins and all(pulled(flower_image(c)) for c in COMPONENTS)
    seconds["pull"] = time.monotonic() - started
    if not official:
        if not image_exists(BASE_IMAGE):
            say(f"building {BASE_IMAGE} with debootstrap (Docker Hub's images are out of reach)")
            started = time.monotonic()
            build_base()
            seconds["base"] = time.monotonic() - started
    python_version = image_python(flower_image("superexec") if official else BASE_IMAGE)
    say(f"downloading the wheelhouse for Python {python_version} with this machine's pip")
    started = time.monotonic()
    wheelhouse = download_wheelhouse(python_version)
    seconds["wheelhouse"] = time.monotonic() - started
    with served(wheelhouse) as url:
        if not official:
            say(f"building stand-ins for {', '.join(flower_image(c) for c in COMPONENTS)}")
            started = time.monotonic()
            build_stand_ins(url)
            seconds["stand-ins"] = time.monotonic() - started
        say(f"building {APP_IMAGE} (docker/Dockerfile)")
        started = time.monotonic()
        docker_build(APP_IMAGE, DOCKER / "Dockerfile", PROJECT, url)
        seconds["app"] = time.monotonic() - started
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ovalp_flwr.ops.images",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--stand-ins", action="store_true",
                        help="build the flwr/* stand-ins even where Docker Hub is reachable")
    args = parser.parse_args(argv)
    if (why := docker_available()) is not None:
        print(f"cannot build the images: {why}", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        seconds = build_all(args.stand_ins)
    except ImageError as error:
        print(error, file=sys.stderr)
        return 1
    steps = ", ".join(f"{step} {s:.0f} s" for step, s in seconds.items())
    print(f"images ready in {time.monotonic() - started:.0f} s ({steps}): "
          f"{', '.join(flower_image(c) for c in COMPONENTS)}, {APP_IMAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
