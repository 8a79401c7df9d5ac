"""The compose demo, checked without a docker engine: structure, and every flag against the
installed Flower CLIs (the same binaries `ovalp_flwr.ops.deploy` runs as native processes)."""

import json
import re
import shlex
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

DOCKER = Path(__file__).resolve().parent.parent / "docker"
BIN = Path(sys.executable).parent
ENTRYPOINTS = {"flwr/superlink": "flower-superlink", "flwr/supernode": "flower-supernode"}


def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yml").read_text())


# Runs each console script (the file in the venv's bin) as `<script> --help` would, in one
# interpreter: their help texts are byte for byte those of three processes, for one start-up
# (~3 s of CPU) instead of three.
HELP = """if True:
    import contextlib, io, json, runpy, sys
    helps = {}
    for script in sys.argv[1:]:
        sys.argv, out = [script, "--help"], io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            runpy.run_path(script, run_name="__main__")
        helps[script] = out.getvalue()
    print("helps:", json.dumps(helps))
"""


@lru_cache
def helps() -> dict[str, str]:
    """Every Flower binary's `--help` text, by name."""
    scripts = [str(BIN / name) for name in sorted({*ENTRYPOINTS.values(), "flower-superexec"})]
    done = subprocess.run([sys.executable, "-c", HELP, *scripts], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("helps: "))
    by_script = json.loads(line.removeprefix("helps: "))
    return {Path(script).name: text for script, text in by_script.items()}


def flags_of(binary: str) -> set[str]:
    return set(re.findall(r"--[a-z][a-z0-9-]*", helps()[binary]))


def binary(service: dict) -> str:
    image = service.get("image", "").split(":")[0]
    return ENTRYPOINTS.get(image, "flower-superexec")  # built services extend flwr/superexec


@pytest.mark.slow
def test_every_flag_in_the_compose_file_exists_in_the_installed_flower():
    for name, service in compose()["services"].items():
        used = {a for a in service["command"] if a.startswith("--")}
        unknown = used - flags_of(binary(service))
        assert not unknown, f"{name}: {binary(service)} has no {sorted(unknown)}"


def test_supernodes_partition_ids_volumes_and_clientapps_are_consistent():
    services = compose()["services"]
    nodes = {n: s for n, s in services.items() if binary(s) == "flower-supernode"}
    assert len(nodes) == 3
    for i in range(len(nodes)):
        command = nodes[f"supernode-{i}"]["command"]
        config = dict(kv.split("=", 1) for kv in shlex.split(command[command.index("--node-config") + 1]))
        assert config == {"partition-id": str(i), "num-partitions": str(len(nodes)),
                          "data-dir": "/data", "feature-cache-dir": "/cache",
                          "model-dir": "/models"}
        assert command[command.index("--superlink") + 1] == "superlink:8000"
        runtime = services[f"clientapp-{i}"]
        port = command[command.index("--port") + 1]
        assert runtime["command"][runtime["command"].index("--runtime-api-address") + 1] == \
            f"supernode-{i}:{port}"
        # the ClientApp runs in the runtime container: it must see the node's data and cache,
        # and keep its personalized models
        assert sorted(runtime["volumes"]) == [f"node{i}-cache:/cache", f"node{i}-data:/data",
                                              f"node{i}-models:/models"]
    declared = set(compose()["volumes"])
    used = {v.split(":")[0] for s in services.values() for v in s.get("volumes", [])}
    assert used <= declared


def test_superlink_and_serverapp_runtime_meet_on_one_port():
    services = compose()["services"]
    link = services["superlink"]["command"]
    port = link[link.index("--port") + 1]
    assert services["superlink"]["ports"] == [f"127.0.0.1:{port}:{port}"]  # this machine only
    server = services["serverapp"]["command"]
    assert server[server.index("--runtime-api-address") + 1] == f"superlink:{port}"
    assert "--isolation" in link and link[link.index("--isolation") + 1] == "process"


def merged_tls() -> dict:
    """compose.yml with compose.tls.yml on top, as `docker compose -f a -f b` merges them:
    an override's `command` replaces the base one; volumes add up."""
    base, tls = compose(), yaml.safe_load((DOCKER / "compose.tls.yml").read_text())
    services = {name: dict(service) for name, service in base["services"].items()}
    for name, override in tls["services"].items():
        assert name in services, f"compose.tls.yml overrides unknown service {name}"
        volumes = sorted(set(services[name].get("volumes", [])) | set(override.get("volumes", [])))
        services[name] = {**services[name], **override, "volumes": volumes}
    return services


def test_the_tls_overlay_uses_real_flags_and_the_files_certs_py_writes(tmp_path):
    from ovalp_flwr.ops.certs import make_all

    make_all(tmp_path, nodes=3)
    written = {f.name for f in tmp_path.iterdir()}
    services = merged_tls()
    for name, service in services.items():
        command = service["command"]
        unknown = {a for a in command if a.startswith("--")} - flags_of(binary(service))
        assert not unknown, f"{name}: {binary(service)} has no {sorted(unknown)}"
        for path in (a for a in command if a.startswith("/certs/")):
            assert path.removeprefix("/certs/") in written, f"{name}: certs.py writes no {path}"
            assert any(v.endswith(":/certs:ro") for v in service["volumes"]), name
        if name == "superlink" or name.startswith("supernode-"):
            assert "--insecure" not in command, f"{name} still runs insecure under TLS"
    assert "--enable-supernode-auth" in services["superlink"]["command"]
    for i in range(3):  # each node signs with its own key, keeps its own partition
        command = services[f"supernode-{i}"]["command"]
        assert command[command.index("--auth-supernode-private-key") + 1] == f"/certs/supernode-{i}"
        assert f"partition-id={i} " in command[command.index("--node-config") + 1]


# flags that differ between containers and loopback on purpose: where to listen (`--host`:
# 0.0.0.0 in a container, 127.0.0.1 here) and where the SuperLink keeps its state (`--database`:
# a file of the deployment's here, memory in the demo)
PLACE_ONLY = {"--host", "--database"}


def flag_values(command: list[str]) -> dict[str, str | None]:
    """{flag: the value after it, None for a switch}."""
    return {arg: (nxt if nxt is not None and not nxt.startswith("--") else None)
            for arg, nxt in zip(command, [*command[1:], None]) if arg.startswith("--")}


def assert_same_flags(service: str, compose_command: list[str], native_command: list[str]) -> None:
    compose_flags, native_flags = flag_values(compose_command), flag_values(native_command)
    assert set(compose_flags) - PLACE_ONLY == set(native_flags) - PLACE_ONLY, service
    assert compose_flags.get("--isolation") == native_flags.get("--isolation"), service


def test_deploy_runs_the_compose_commands_as_native_processes(tmp_path):
    """`ovalp_flwr.ops.deploy` (the e2e tests) starts what compose starts, flag for flag."""
    from ovalp_flwr.ops import deploy

    isolation = deploy.DEFAULT_ISOLATION
    for services, certs in ((compose()["services"], None), (merged_tls(), tmp_path)):
        key = tmp_path / "supernode-0" if certs else None
        native = {
            "superlink": deploy.superlink_command(8000, isolation, certs, tmp_path / "state.db"),
            "serverapp": deploy.runtime_command("127.0.0.1:8000", certs / "ca.crt" if certs else None),
            "supernode-0": deploy.supernode_command("127.0.0.1:8000", 9094, isolation,
                                                   deploy.node_config(0, 3, "/node{i}"), certs, key),
            "clientapp-0": deploy.runtime_command("127.0.0.1:9094"),
        }
        for name, command in native.items():
            assert Path(command[0]).name == binary(services[name]), name
            assert_same_flags(name, services[name]["command"], command[1:])
