"""A run's state after every round, so a server that dies loses at most the round in flight.

After each round the ServerApp writes `results/<run-name>/checkpoint.safetensors`: one file,
written atomically, its sha256 checked when read (`durable.write_arrays`). It holds the
global arrays, the strategy's state (SCAFFOLD's control variates and FedAdam's moments, by
partition id, since node ids change when nodes reconnect; refused and excluded nodes), every
round's record so far, and what the rounds depend on: the run config and the digest of the
global feature statistics. With `resume = true` a run with that `run-name` continues from
it. Clients keep no state between rounds, and sampling and shuffling are seeded by (seed,
round), so a resumed run ends as the uninterrupted one would, bit for bit on CPU
(tests/test_checkpoint.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ovalp_flwr.config import NOT_PART_OF_THE_RESULT, ConfigError
from ovalp_flwr.core.durable import read_arrays, write_arrays

FILE = "checkpoint.safetensors"
FORMAT = "ovalp-checkpoint/1"
# what a resume may change: where files go, how many rounds in all, how long a round waits
MAY_CHANGE = NOT_PART_OF_THE_RESULT | {"resume", "num-server-rounds", "round-timeout"}


@dataclass
class Checkpoint:
    """The run after `round`: named arrays (`pack`ed by owner) and JSON-able state."""

    round: int
    arrays: dict[str, np.ndarray]
    state: dict[str, Any]


def pack(prefix: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`arrays` under `<prefix>/<name>`, to share one file with others."""
    return {f"{prefix}/{key}": value for key, value in arrays.items()}


def unpack(prefix: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays `pack(prefix, ...)` stored."""
    start = f"{prefix}/"
    return {key[len(start):]: value for key, value in arrays.items() if key.startswith(start)}


def write_checkpoint(run_dir: Path, checkpoint: Checkpoint) -> None:
    metadata = {"format": FORMAT, "round": str(checkpoint.round),
                "state": json.dumps(checkpoint.state, allow_nan=False)}
    write_arrays(run_dir / FILE, checkpoint.arrays, metadata)


def read_checkpoint(run_dir: Path) -> Checkpoint | None:
    """The run's checkpoint, or None if it has none; a file that does not verify is an error."""
    path = run_dir / FILE
    if not path.exists():
        return None
    remedy = "delete it to start the run afresh, or resume from a copy"
    try:
        arrays, metadata = read_arrays(path, "run checkpoint", remedy)
        if metadata.get("format") != FORMAT:
            raise ValueError(f"{path}: format {metadata.get('format')!r}, expected {FORMAT!r}; "
                             f"{remedy}")
        return Checkpoint(int(metadata["round"]), arrays, json.loads(metadata["state"]))
    except ValueError as err:
        raise ConfigError("resume", True, str(err)) from None


def check_resumable(checkpoint: Checkpoint, config: dict[str, Any], num_rounds: int) -> None:
    """The checkpoint must be of this run: the same config (both `comparable`: bar
    `MAY_CHANGE`), and no more rounds than the run asks for."""
    saved = checkpoint.state["config"]
    for key in sorted(set(saved) | set(config)):
        if saved.get(key) != config.get(key):
            raise ConfigError(key, config.get(key),
                              f"the checkpoint to resume has {key}={saved.get(key)!r} (round "
                              f"{checkpoint.round}); resume with the run's own config, or drop "
                              "resume (or change run-name) to start afresh")
    if checkpoint.round > num_rounds:
        raise ConfigError("num-server-rounds", num_rounds,
                          f"the checkpoint to resume is at round {checkpoint.round}; use at least that")


def comparable(config: dict[str, Any]) -> dict[str, Any]:
    """The config as the checkpoint keeps it: what a resume must not change."""
    return {key: value for key, value in config.items() if key not in MAY_CHANGE}
