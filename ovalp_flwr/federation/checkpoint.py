"""A run's state after every round, so a server that dies loses at most the round in flight.

After each round the ServerApp writes `results/<run-name>/checkpoint.safetensors`: one file,
written atomically, its sha256 checked when read (`durable.write_arrays`). It holds the
global arrays, the strategy's state (SCAFFOLD's control variates and FedAdam's moments, by
partition id, since node ids change when nodes reconnect; refused and excluded nodes), every
round's record so far, and what the rounds depend on: the run config and the digest of the
global feature statistics. With `resume = true` a run with that `run-name` continues from
it. SCAFFOLD's variates (one per client seen: 10,000 clients of 10 x 784 heads make 300 MB)
live in part files beside it, `checkpoint-variates-<round>.safetensors`, each written once with
the variates that changed in its round and verified like the main file, which names the part
holding each variate (`CheckpointWriter`): a round writes what its sampled clients changed, not
every client seen. Clients keep no state between rounds, and sampling and shuffling are seeded by (seed,
round), so a resumed run ends as the uninterrupted one would, bit for bit on CPU
(tests/test_checkpoint.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ovalp_flwr.config import NOT_PART_OF_THE_RESULT, ConfigError
from ovalp_flwr.core.durable import read_arrays, write_arrays

FILE = "checkpoint.safetensors"
FORMAT = "ovalp-checkpoint/1"
PART_PREFIX = "variates/"  # arrays kept in part files: one per client seen, most unchanged
PART_FILE = "checkpoint-variates-{round}.safetensors"
# what a resume may change: where files go, how many rounds in all, how long a round waits
MAY_CHANGE = NOT_PART_OF_THE_RESULT | {"resume", "num-server-rounds", "round-timeout"}


@dataclass
class Checkpoint:
    """The run after `round`: named arrays (`pack`ed by owner) and JSON-able state."""

    round: int
    arrays: dict[str, np.ndarray]
    state: dict[str, Any]
    parts: dict[str, list[str]] = field(default_factory=dict)  # part file -> the keys it holds


class CheckpointWriter:
    """Writes a run's checkpoints: the arrays under `PART_PREFIX` that changed since the last
    write go to a new part file first, then the main file (atomically) naming every part still
    in use, then parts no longer named are deleted: a crash at any point leaves a checkpoint
    whose files are all there. Whether an array changed is judged by value against a copy of
    what was written, not by identity (an array updated in place still counts as changed)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.written: dict[str, np.ndarray] = {}  # part key -> a copy of the array last written
        self.holder: dict[str, str] = {}  # part key -> the part file that holds it

    def resume_from(self, checkpoint: Checkpoint) -> None:
        """Go on from a checkpoint read back: its parts stay in use until their arrays change."""
        self.holder = {key: name for name, keys in checkpoint.parts.items() for key in keys}
        self.written = {key: checkpoint.arrays[key] for key in self.holder}

    def write(self, checkpoint: Checkpoint) -> None:
        parted = {k: v for k, v in checkpoint.arrays.items() if k.startswith(PART_PREFIX)}
        changed = {k: v for k, v in parted.items() if not _same(self.written.get(k), v)}
        if changed:
            name = PART_FILE.format(round=checkpoint.round)
            write_arrays(self.run_dir / name, changed, {"format": FORMAT + "+part",
                                                        "round": str(checkpoint.round)})
            self.holder.update(dict.fromkeys(changed, name))
            self.written.update({k: np.array(v, copy=True) for k, v in changed.items()})
        for key in set(self.holder) - set(parted):  # gone (SCAFFOLD's stage change)
            del self.holder[key], self.written[key]
        parts: dict[str, list[str]] = {}
        for key, name in self.holder.items():
            parts.setdefault(name, []).append(key)
        rest = {k: v for k, v in checkpoint.arrays.items() if k not in parted}
        write_checkpoint(self.run_dir, Checkpoint(checkpoint.round, rest, checkpoint.state, parts))
        for stale in set(part_files(self.run_dir)) - set(parts):
            (self.run_dir / stale).unlink(missing_ok=True)


def part_files(run_dir: Path) -> list[str]:
    """The part files in a run's folder (`PART_FILE`), in use or not."""
    return sorted(path.name for path in run_dir.glob(PART_FILE.format(round="*")))


def _same(old: np.ndarray | None, new: np.ndarray) -> bool:
    return (old is not None and old.shape == new.shape and old.dtype == new.dtype
            and bool(np.array_equal(old, new)))


def pack(prefix: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`arrays` under `<prefix>/<name>`, to share one file with others."""
    return {f"{prefix}/{key}": value for key, value in arrays.items()}


def unpack(prefix: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays `pack(prefix, ...)` stored."""
    start = f"{prefix}/"
    return {key[len(start):]: value for key, value in arrays.items() if key.startswith(start)}


def write_checkpoint(run_dir: Path, checkpoint: Checkpoint) -> None:
    metadata = {"format": FORMAT, "round": str(checkpoint.round),
                "state": json.dumps(checkpoint.state, allow_nan=False),
                "parts": json.dumps(checkpoint.parts)}
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
        parts = json.loads(metadata.get("parts", "{}"))
        for name, keys in parts.items():
            held, _ = read_arrays(run_dir / name, "run checkpoint part", remedy)
            missing = sorted(set(keys) - set(held))
            if missing:
                raise ValueError(f"{run_dir / name}: lacks {missing[:3]}; {remedy}")
            arrays.update({key: held[key] for key in keys})
        return Checkpoint(int(metadata["round"]), arrays, json.loads(metadata["state"]), parts)
    except (ValueError, OSError) as err:
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
