"""A run's results folder, written atomically: `summary.json`, `rounds.csv` and the accuracy
curve `accuracy.png` (`single_run`).

The folder is assembled under a temporary name beside its destination and renamed into
place, so a reader never sees half a run; a rerun with the same name replaces the old
folder in one rename.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ovalp_flwr.core.durable import fsync_dir, write_durably
from ovalp_flwr.federation.single_run import PLOT_FILE, iid_twin, plot_run

ROUND_COLUMNS = (
    "round", "accuracy", "stage", "train_loss", "clients_sampled", "clients_trained",
    "clients_failed", "clients_timed_out", "clients_rejected", "bytes_sent_per_client", "bytes_received_per_client",
    "client_train_seconds_mean", "client_train_seconds_max", "server_aggregate_seconds",
    "server_eval_seconds", "round_seconds",
)


PERSONALIZATION_FILE = "personalization.csv"
RESULT_FILES = ("summary.json", "rounds.csv", PLOT_FILE, PERSONALIZATION_FILE)  # those it has
PERSONALIZATION_COLUMNS = ("method", "partition", "num_train", "num_test", "local", "global",
                           "distortion", "seconds")


def default_run_name(config: dict[str, Any]) -> str:
    """Timestamped, and says what ran: `20261121-130501-digits-ova-two-stage-shard1-seed0`."""
    partition = config["partition"].replace(":", "-")  # flwr:<Name>: no colon in a folder name
    if partition == "shard":
        partition += str(config["classes-per-client"])
    parts = [time.strftime("%Y%m%d-%H%M%S"), config["dataset"], config["head"],
             config["schedule"], partition, f"seed{config['seed']}"]
    return "-".join(parts)


def write_run(results_dir: Path, run_name: str, summary: dict[str, Any],
              carry: Iterable[str] = ()) -> Path:
    """Write `summary.json` + `rounds.csv` under results_dir/run_name atomically; the files
    named in `carry` that the folder holds already (the run's checkpoint) are kept."""
    results_dir.mkdir(parents=True, exist_ok=True)
    final = results_dir / run_name
    staging = results_dir / f".{run_name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for name in carry:  # a hard link: the file is replaced whole, never written in place
        if (final / name).is_file():
            os.link(final / name, staging / name)
    write_durably(staging / "summary.json", json.dumps(summary, indent=2, allow_nan=False) + "\n")
    write_durably(staging / "rounds.csv", _rounds_csv(summary["rounds"]))
    write_durably(staging / PLOT_FILE, plot_run(summary, iid_twin(results_dir, summary)))
    if "methods" in summary.get("personalization", {}):
        write_durably(staging / PERSONALIZATION_FILE, personalization_csv(summary["personalization"]))
    fsync_dir(staging)
    if final.exists():
        retired = results_dir / f".{run_name}.old-{os.getpid()}"
        os.replace(final, retired)
        os.replace(staging, final)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(staging, final)
    fsync_dir(results_dir)
    return final


def read_summary(run_dir: Path) -> dict[str, Any]:
    """Load a run's summary, checking it is one this code wrote (not a partial file)."""
    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable results summary ({err})") from None
    missing = {"final_accuracy", "rounds", "config"} - summary.keys()
    if missing:
        raise ValueError(f"{path}: summary lacks {sorted(missing)}")
    return summary


def _rounds_csv(rounds: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    columns = ROUND_COLUMNS if not any("val_accuracy" in r for r in rounds) \
        else (*ROUND_COLUMNS[:2], "val_accuracy", *ROUND_COLUMNS[2:])  # held-back rows' score
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rounds)
    return buffer.getvalue()


def personalization_csv(personalization: dict[str, Any]) -> str:
    """One row per (method, client): the personalization phase's per-client results."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=PERSONALIZATION_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for method, result in personalization["methods"].items():
        writer.writerows({"method": method, **row} for row in result["clients"])
    return buffer.getvalue()
