"""ops/clientapp_runtime.py: ClientApps forked from a process that has imported them."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ovalp_flwr.ops import clientapp_runtime as runtime
from ovalp_flwr.ops.deploy import runtime_command, warm_runtime_command


def test_preload_forgets_the_apps_own_modules_so_the_fab_is_imported_again():
    code = ("import sys; from ovalp_flwr.ops import clientapp_runtime as r; r.preload(); "
            "print('torch' in sys.modules, any(n.split('.')[0] in r.APP_PACKAGES "
            "and n != 'ovalp_flwr.ops.clientapp_runtime' and not n.startswith('ovalp_flwr.ops') "
            "and n != 'ovalp_flwr' for n in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"], out.stderr[-2000:]


def test_the_warm_runtime_takes_flower_superexecs_flags():
    warm, cold = warm_runtime_command("127.0.0.1:9094"), runtime_command("127.0.0.1:9094")
    assert warm[1:3] == ["-m", "ovalp_flwr.ops.clientapp_runtime"]
    assert warm[3:] == cold[1:]


def test_a_clientapp_task_is_forked_and_reaped(monkeypatch):
    from flwr.supercore.constant import TaskType
    from flwr.supercore.superexec.executor import ExecutionSpec

    def child(spec):  # stands in for Flower's run_clientapp in the child
        os._exit(7 if spec.token == "t" else 1)

    monkeypatch.setattr(runtime, "run_forked_clientapp", child)
    executor = runtime.ForkingExecutor()
    spec = ExecutionSpec(task_type=TaskType.CLIENT_APP, runtime_api_address="127.0.0.1:1",
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
