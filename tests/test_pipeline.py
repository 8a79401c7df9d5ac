"""The run both paths share (`runs.pipeline`): one order of steps, a path's hooks, and what the
shared part gives every path (checkpoints carried into the results, the same summary keys)."""

import json

from client_app import app as client_app
from ovalp_flwr.config import RunConfig
from ovalp_flwr.federation.local_grid import InProcessGrid, app_config
from ovalp_flwr.finetune.server import EncoderPath
from ovalp_flwr.ova.server import FeaturePath
from ovalp_flwr.runs.pipeline import RunPath, run

TINY = {"dataset": "digits", "head-init": "random", "limit-per-class": 12,
        "num-server-rounds": 2, "local-epochs": 1, "batch-size": 8, "partition": "shard",
        "classes-per-client": 3, "checkpoint-every": 1}


def one_run(tmp_path, cache_dir, name: str, path_class: type[RunPath], **overrides) -> dict:
    run_config = {**app_config(), **TINY, "feature-cache-dir": str(cache_dir),
                  "results-dir": str(tmp_path), "run-name": name, **overrides}
    config = RunConfig.from_mapping(run_config)
    out = run(InProcessGrid(client_app, 4, run_config, seed=config.seed), path_class(config))
    assert (out / "checkpoint.safetensors").is_file()  # the shared run writes and carries it
    return json.loads((out / "summary.json").read_text())


def test_both_paths_get_the_shared_runs_summary_and_checkpoints(tmp_path, cache_dir):
    cached = one_run(tmp_path, cache_dir, "cached", FeaturePath, encoder="pixels")
    encoder = one_run(tmp_path, cache_dir, "encoder", EncoderPath, encoder="tiny-cnn",
                      finetune="fedavg-lora")
    shared = {"final_accuracy", "best_accuracy", "initial_accuracy", "num_clients", "config",
              "partition", "features", "rounds", "versions", "label_noise", "local_steps",
              "setup", "total_seconds"}
    assert shared <= set(cached) and shared <= set(encoder)
    assert "head_init" in cached and "finetune" in encoder  # each path's own part
    assert [r["round"] for r in encoder["rounds"]] == [1, 2]
