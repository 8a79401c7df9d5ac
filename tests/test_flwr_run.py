"""One real `flwr run` on Ray virtual SuperNodes, through the launcher `make run` uses."""

import json
import os
import subprocess

import pytest

from ovalp_flwr import launch
from ovalp_flwr.cache import load_or_build

pytestmark = pytest.mark.e2e


def flower_processes() -> set[int]:
    """Live (non-zombie) Flower/Ray processes on this machine."""
    pattern = ("flower-superlink|flower-superexec|flwr-simulation|flwr-serverapp|flwr-clientapp|"
               "raylet|gcs_server|ray::")
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return {int(pid) for pid in found.split() if launch._alive(int(pid))}


def test_flwr_run_two_rounds_on_ray_and_leaves_no_process(tmp_path):
    cache_dir, results_dir = tmp_path / "cache", tmp_path / "results"
    load_or_build("digits", "pixels", cache_dir, progress=False)
    before = flower_processes()
    run_config = (f"encoder='pixels' feature-cache-dir='{cache_dir}' results-dir='{results_dir}' "
                  "num-server-rounds=2 run-name='e2e' partition='shard'")
    code = launch.simulate(launch.PROJECT, num_supernodes=4, flwr_home=tmp_path / "flwr-home",
                           flwr_args=["--run-config", run_config], num_gpus=0.0)
    assert code == 0
    summary = json.loads((results_dir / "e2e" / "summary.json").read_text())
    assert [r["round"] for r in summary["rounds"]] == [1, 2]
    assert summary["num_clients"] == 4
    assert [r["stage"] for r in summary["rounds"]] == [1, 2]
    assert summary["final_accuracy"] > 0.2  # 10 classes: chance is 0.1
    assert flower_processes() - before == set(), "the run left Flower/Ray processes behind"
    assert os.path.exists(tmp_path / "flwr-home" / "config.toml")


def test_flwr_run_with_a_bad_config_fails_with_one_line(tmp_path, capfd):
    code = launch.simulate(launch.PROJECT, num_supernodes=2, flwr_home=tmp_path / "flwr-home",
                           flwr_args=["--run-config", "head='mlp'"], num_gpus=0.0)
    output = capfd.readouterr().out
    assert code != 0
    assert "run config: head='mlp' is not allowed; choose one of: ova, softmax" in output
    assert "Traceback" not in output
