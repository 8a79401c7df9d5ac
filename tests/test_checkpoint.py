"""Checkpoint and resume, in process: a run killed after round 3 and resumed is the uninterrupted
run; a resume refuses another config and a corrupted checkpoint (README, "Reliability")."""

import numpy as np
import pytest

import client_app
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.config import ConfigError, RunConfig
from ovalp_flwr.federation.local_grid import app_config
from ovalp_flwr.federation.results import read_summary
from server_app import run_server
from test_validation import FaultyGrid  # tests/ is on sys.path under pytest


class ServerDied(Exception):
    """What the ServerApp process meets when it is killed: nothing after it runs."""


def crash_before(server_round: int):
    """A fault that kills the server as round `server_round`'s train messages go out."""
    def fault(message, reply):
        if (message.metadata.message_type == "train"
                and int(message.content[p.CONFIG]["server-round"]) == server_round):
            raise ServerDied(f"killed in round {server_round}")
        return reply
    return fault


class DyingGrid(FaultyGrid):
    """Its fault runs as messages go out, where an exception ends the server (in delivery it
    would become the node's error reply)."""

    trained_rounds: set[int] = set()  # of every DyingGrid: the rounds whose train messages went out

    def push_messages(self, messages):  # the crash must not become an error reply
        messages = list(messages)
        DyingGrid.trained_rounds |= {int(m.content[p.CONFIG]["server-round"]) for m in messages
                                     if m.metadata.message_type == "train"}
        for message in messages:
            if message.metadata.dst_node_id == self.bad:
                self.fault(message, None)
        return super().push_messages(messages)


def resumable_run(cache_dir, tmp_path, name, fault=None, node_seed=0, **overrides):
    run_config = {**app_config(), "encoder": "pixels", "feature-cache-dir": str(cache_dir),
                  "results-dir": str(tmp_path / "results"), "num-server-rounds": 6,
                  "run-name": name, "partition": "shard", **overrides}
    grid = DyingGrid(client_app.app, 4, run_config, fault=fault or (lambda m, r: r),
                     seed=node_seed)
    return read_summary(run_server(grid, RunConfig.from_mapping(run_config)))


def global_arrays(tmp_path, name):
    from ovalp_flwr.federation.checkpoint import read_checkpoint, unpack

    checkpoint = read_checkpoint(tmp_path / "results" / name)
    return checkpoint.round, unpack("global", checkpoint.arrays)


@pytest.mark.parametrize("options", [
    {},  # the default: SGD + SCAFFOLD (control variates on the server), ridge start
    {"server-optimizer": "fedadam", "local-optimizer": "adamw", "drift-correction": "none",
     "head-init": "random", "fraction-train": 0.5},  # FedAdam's moments, sampling
    # the nodes keep their c_i: the resumed run's hold none, and are sent c - c_i
    {"scaffold-variates": "clients", "fraction-train": 0.5},
    # the server's L-BFGS: its curvature pairs and last accepted point
    {"server-optimizer": "lbfgs"},
    # and its weight-decay walk, killed mid-way: the values scored, the heads each ended at
    {"server-optimizer": "lbfgs", "weight-decay": "auto", "lbfgs-path-rounds": 1,
     "num-server-rounds": 8},
], ids=["scaffold", "fedadam-sampled", "scaffold-clients-sampled", "lbfgs", "lbfgs-auto-decay"])
def test_a_run_killed_after_round_3_and_resumed_ends_as_the_uninterrupted_run(
        cache_dir, tmp_path, options):
    whole = resumable_run(cache_dir, tmp_path, "whole", **options)
    with pytest.raises(ServerDied):
        resumable_run(cache_dir, tmp_path, "killed", fault=crash_before(4), **options)
    assert global_arrays(tmp_path, "killed")[0] == 3
    # a new server process, the nodes reconnected under other ids
    DyingGrid.trained_rounds = set()
    resumed = resumable_run(cache_dir, tmp_path, "killed", node_seed=9, resume=True, **options)
    same = ("round", "accuracy", "train_loss", "clients_trained", "bytes_received_per_client",
            *(("objective", "server_step") if options.get("server-optimizer") == "lbfgs" else ()))
    assert [[r[k] for k in same] for r in resumed["rounds"]] == \
        [[r[k] for k in same] for r in whole["rounds"]]
    assert resumed["initial_accuracy"] == whole["initial_accuracy"]
    assert resumed["resumes"][0]["round"] == 3 and "resumes" not in whole
    last = options.get("num-server-rounds", 6)
    assert DyingGrid.trained_rounds == set(range(4, last + 1))  # rounds 1-3 were not trained again
    assert resumed.get("weight_decay_path") == whole.get("weight_decay_path")
    (_, a), (_, b) = global_arrays(tmp_path, "whole"), global_arrays(tmp_path, "killed")
    assert all(np.array_equal(a[key], b[key]) for key in a)


def test_a_resume_refuses_another_config_and_a_corrupted_checkpoint(cache_dir, tmp_path):
    from ovalp_flwr.config import ConfigError

    resumable_run(cache_dir, tmp_path, "done", **{"num-server-rounds": 2})
    with pytest.raises(ConfigError, match=r"learning-rate=0\.5 .*checkpoint to resume has "
                                          r"learning-rate=0\.05"):
        resumable_run(cache_dir, tmp_path, "done", resume=True, **{"learning-rate": 0.5})
    # a finished run resumed with more rounds goes on; with as many it only rewrites its results
    longer = resumable_run(cache_dir, tmp_path, "done", resume=True, **{"num-server-rounds": 3})
    assert [r["round"] for r in longer["rounds"]] == [1, 2, 3]
    path = tmp_path / "results" / "done" / "checkpoint.safetensors"
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 0xFF
    path.write_bytes(bytes(blob))
    with pytest.raises(ConfigError, match="sha256 mismatch"):
        resumable_run(cache_dir, tmp_path, "done", resume=True, **{"num-server-rounds": 3})


def test_resume_needs_a_run_name():
    from ovalp_flwr.config import ConfigError

    with pytest.raises(ConfigError, match="resume=True .*set run-name"):
        RunConfig.from_mapping({**app_config(), "resume": True})


def test_a_round_writes_only_the_variates_that_changed_and_drops_unused_parts(tmp_path):
    """SCAFFOLD's variates (one per client seen) go to part files: round 2 writes the one that
    changed (also in place), round 3 after a stage change none; a resume reads them all back."""
    from ovalp_flwr.federation.checkpoint import (Checkpoint, CheckpointWriter, part_files,
                                                  read_checkpoint)

    variates = {f"variates/{pid}/weight": np.full((2, 3), pid, np.float32) for pid in range(4)}
    writer = CheckpointWriter(tmp_path)
    writer.write(Checkpoint(1, {"global/weight": np.zeros(3), **variates}, {"r": 1}))
    assert part_files(tmp_path) == ["checkpoint-variates-1.safetensors"]
    variates["variates/2/weight"][0, 0] = 9.0  # updated in place: still a change
    writer.write(Checkpoint(2, {"global/weight": np.ones(3), **variates}, {"r": 2}))
    back = read_checkpoint(tmp_path)
    assert back.parts == {"checkpoint-variates-1.safetensors": [f"variates/{p}/weight" for p in (0, 1, 3)],
                          "checkpoint-variates-2.safetensors": ["variates/2/weight"]}
    assert all(np.array_equal(back.arrays[k], v) for k, v in variates.items())
    assert np.array_equal(back.arrays["global/weight"], np.ones(3)) and back.state == {"r": 2}
    resumed = CheckpointWriter(tmp_path)
    resumed.resume_from(back)
    kept = {k: back.arrays[k] for k in ("variates/0/weight",)}  # a new stage: the rest are gone
    resumed.write(Checkpoint(3, {"global/weight": np.ones(3), **kept}, {"r": 3}))
    assert part_files(tmp_path) == ["checkpoint-variates-1.safetensors"]
    assert set(read_checkpoint(tmp_path).arrays) == {"global/weight", "variates/0/weight"}
    (tmp_path / "checkpoint-variates-1.safetensors").unlink()
    with pytest.raises(ConfigError, match="checkpoint-variates-1.safetensors"):
        read_checkpoint(tmp_path)


def test_a_finished_run_keeps_its_variates_parts_and_goes_on_with_more_rounds(cache_dir, tmp_path):
    from ovalp_flwr.federation.checkpoint import part_files

    resumable_run(cache_dir, tmp_path, "short", **{"num-server-rounds": 3})
    run_dir = tmp_path / "results" / "short"
    assert part_files(run_dir)  # carried over when the results were written
    longer = resumable_run(cache_dir, tmp_path, "short", resume=True, **{"num-server-rounds": 4})
    whole = resumable_run(cache_dir, tmp_path, "whole", **{"num-server-rounds": 4})
    assert [r["accuracy"] for r in longer["rounds"]] == [r["accuracy"] for r in whole["rounds"]]


# the encoder path (`finetune`) on a tiny random CNN: the same checkpoints through the shared run
ENCODER = {"encoder": "tiny-cnn", "dataset": "digits", "head-init": "random",
           "limit-per-class": 12, "local-epochs": 1, "batch-size": 8, "classes-per-client": 3,
           "num-server-rounds": 4}


@pytest.mark.parametrize("method", ["fedavg-lora", "full"])
def test_an_encoder_run_killed_and_resumed_ends_as_the_uninterrupted_run(cache_dir, tmp_path,
                                                                         method):
    options = {**ENCODER, "finetune": method}
    whole = resumable_run(cache_dir, tmp_path, "whole", **options)
    with pytest.raises(ServerDied):
        resumable_run(cache_dir, tmp_path, "killed", fault=crash_before(3), **options)
    assert global_arrays(tmp_path, "killed")[0] == 2
    DyingGrid.trained_rounds = set()
    resumed = resumable_run(cache_dir, tmp_path, "killed", node_seed=9, resume=True, **options)
    same = ("round", "accuracy", "train_loss", "clients_trained")
    assert [[r[k] for k in same] for r in resumed["rounds"]] == \
        [[r[k] for k in same] for r in whole["rounds"]]
    assert resumed["resumes"][0]["round"] == 2 and DyingGrid.trained_rounds == {3, 4}
    (_, a), (_, b) = global_arrays(tmp_path, "whole"), global_arrays(tmp_path, "killed")
    assert all(np.array_equal(a[key], b[key]) for key in a)


def test_flora_writes_no_checkpoint_and_refuses_to_resume(cache_dir, tmp_path):
    options = {**ENCODER, "finetune": "flora", "drift-correction": "none",
               "num-server-rounds": 2}
    resumable_run(cache_dir, tmp_path, "flora", **options)
    assert not (tmp_path / "results" / "flora" / "checkpoint.safetensors").exists()
    with pytest.raises(ConfigError, match="resume=True .*FLoRA"):
        resumable_run(cache_dir, tmp_path, "flora", resume=True, **options)
