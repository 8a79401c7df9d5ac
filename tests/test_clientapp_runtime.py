"""ops/clientapp_runtime.py: ClientApps forked from a process that has imported them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ovalp_flwr.ops import clientapp_runtime as runtime
from ovalp_flwr.ops.deploy import runtime_command, warm_runtime_command, warm_server_runtime_command


@pytest.mark.slow
def test_preload_forgets_the_apps_own_modules_so_the_fab_is_imported_again():
    code = ("import sys; from ovalp_flwr.ops import clientapp_runtime as r; r.preload(); "
            "print('torch' in sys.modules, any(n.split('.')[0] in r.APP_PACKAGES "
            "and n != 'ovalp_flwr.ops.clientapp_runtime' and not n.startswith('ovalp_flwr.ops') "
            "and n != 'ovalp_flwr' for n in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"], out.stderr[-2000:]


def test_the_warm_runtime_takes_flower_superexecs_flags(tmp_path):
    warm, cold = warm_runtime_command("127.0.0.1:9094"), runtime_command("127.0.0.1:9094")
    assert warm[1:3] == ["-m", "ovalp_flwr.ops.clientapp_runtime"]
    assert warm[3:] == cold[1:]
    for certs in (None, tmp_path / "ca.crt"):  # the SuperLink's: the same, forking ServerApps
        server = warm_server_runtime_command("127.0.0.1:9091", certs)
        assert server[1:3] == warm[1:3] and server[-1] == "--serverapps"
        assert server[3:-1] == runtime_command("127.0.0.1:9091", certs)[1:]


@pytest.mark.parametrize("serverapps", [False, True])
def test_an_app_task_is_forked_and_reaped(monkeypatch, serverapps):
    """A node's runtime forks ClientApps, the SuperLink's (`--serverapps`) ServerApps; the
    other task type goes to Flower's own process."""
    from flwr.supercore.constant import TaskType
    from flwr.supercore.superexec.executor import ExecutionSpec

    def child(spec):  # stands in for Flower's run_clientapp / run_serverapp in the child
        os._exit(7 if spec.token == "t" else 1)

    forked, other = ((TaskType.SERVER_APP, TaskType.CLIENT_APP) if serverapps
                     else (TaskType.CLIENT_APP, TaskType.SERVER_APP))
    monkeypatch.setattr(runtime, "run_forked_serverapp" if serverapps else "run_forked_clientapp",
                        child)
    launched = []
    monkeypatch.setattr(runtime.SubprocessExecutor, "launch",
                        lambda self, spec: launched.append(spec.task_type))
    executor = runtime.ForkingExecutor(serverapps=serverapps)
    spec = ExecutionSpec(task_type=other, runtime_api_address="127.0.0.1:1",
                         token="t", insecure=True, root_certificates_path=None,
                         runtime_dependency_install=False, parent_pid=None,
                         suppress_output=False, task_id=1)
    executor.launch(spec)
    assert launched == [other] and not executor.children
    spec = ExecutionSpec(task_type=forked, runtime_api_address="127.0.0.1:1",
                         token="t", insecure=True, root_certificates_path=None,
                         runtime_dependency_install=False, parent_pid=None,
                         suppress_output=False, task_id=1)
    assert executor.launch(spec).status == "accepted"
    (pid,) = executor.children
    deadline = time.monotonic() + 10
    while executor.children and time.monotonic() < deadline:
        executor.reconcile()
        time.sleep(0.01)
    assert not executor.children
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def test_flags_are_checked():
    with pytest.raises(SystemExit):
        runtime.main(["--runtime-api-address", "127.0.0.1:1"])  # neither --insecure nor certs


def test_a_forked_clientapp_asks_again_for_missing_objects_at_once(monkeypatch):
    """Flower's SuperNode starts the ClientApp before the message's objects arrive; with
    Flower's back-off (1 s, then 2 s) objects that land at once would still cost >= 0.8 s."""
    import numpy as np
    from flwr.app import Array, ArrayRecord
    from flwr.supercore.inflatable.inflatable_object import (get_all_nested_objects,
                                                            get_object_tree)
    from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError

    monkeypatch.setattr(runtime.clientapp_process, "pull_and_inflate_object_from_tree",
                        runtime.clientapp_process.pull_and_inflate_object_from_tree)
    monkeypatch.setattr(runtime.clientapp_process, "install_from_fab",
                        runtime.clientapp_process.install_from_fab)
    runtime.warm_clientapp_steps()
    record = ArrayRecord({"w": Array(np.arange(6, dtype=np.float32).reshape(2, 3))})
    stored = {key: obj.deflate() for key, obj in get_all_nested_objects(record).items()}
    refusals = {key: 3 for key in stored}  # each object is missing the first 3 times

    def pull(object_id: str) -> bytes:
        if refusals[object_id]:
            refusals[object_id] -= 1
            raise ObjectUnavailableError(object_id)
        return stored[object_id]

    started = time.monotonic()
    pulled = runtime.clientapp_process.pull_and_inflate_object_from_tree(
        get_object_tree(record), pull, lambda _id: None, return_type=ArrayRecord)
    assert time.monotonic() - started < 0.8
    assert not any(refusals.values())
    np.testing.assert_array_equal(pulled["w"].numpy(), record["w"].numpy())
    assert runtime.clientapp_process.install_from_fab is runtime.install_once


def test_a_fab_is_installed_once_per_sha256(monkeypatch, tmp_path):
    installs = []

    def flower_install(content: bytes, **_kwargs):
        installs.append(content)
        path = tmp_path / "apps" / f"app-{len(installs)}"
        path.mkdir(parents=True)
        return path

    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    monkeypatch.setattr(runtime, "install_from_fab", flower_install)
    first = runtime.install_once(b"fab one", skip_prompt=True)
    assert runtime.install_once(b"fab one", skip_prompt=True) == first
    assert installs == [b"fab one"]
    other = runtime.install_once(b"fab two", skip_prompt=True)
    assert other != first and installs == [b"fab one", b"fab two"]
    first.rmdir()  # an install that is gone is installed again, not trusted
    assert runtime.install_once(b"fab one", skip_prompt=True) == tmp_path / "apps" / "app-3"


def test_an_installed_fab_is_compiled_once(monkeypatch, tmp_path):
    """Each ClientApp child imports the app from its installed copy: the bytecode is there, so a
    child that may not write any (PYTHONDONTWRITEBYTECODE) still compiles nothing."""
    import importlib.util

    def flower_install(_content: bytes, **_kwargs):
        path = tmp_path / "apps" / "app-1"
        (path / "pkg").mkdir(parents=True)
        (path / "client_mod.py").write_text("import pkg.helper\nVALUE = pkg.helper.VALUE\n")
        (path / "pkg" / "__init__.py").write_text("")
        (path / "pkg" / "helper.py").write_text("VALUE = 41 + 1\n")
        return path

    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    monkeypatch.setattr(runtime, "install_from_fab", flower_install)
    installed = runtime.install_once(b"fab", skip_prompt=True)
    for source in ("client_mod.py", "pkg/helper.py"):
        assert Path(importlib.util.cache_from_source(str(installed / source))).is_file(), source
    # a child that imports it with bytecode writes off compiles nothing (builtins.compile unused)
    probe = ("import builtins, sys; calls = []; real = builtins.compile\n"
             "builtins.compile = lambda *a, **k: (calls.append(a), real(*a, **k))[1]\n"
             f"sys.path.insert(0, {str(installed)!r}); import client_mod\n"
             "assert client_mod.VALUE == 42 and not calls, calls")
    done = subprocess.run([sys.executable, "-B", "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
