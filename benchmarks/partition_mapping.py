"""Our partitions beside their nearest Flower Datasets partitioners (`partition = "flwr:<Name>"`),
on the embedded default's training rows (digits, 1437 rows, 10 classes) over 100 clients, seed 0:
each one's partition summary (what a run prints), how many rows it hands out, and whether it is
row for row one of ours. docs/data.md's mapping table quotes it.

    .venv/bin/python benchmarks/partition_mapping.py

writes `benchmarks/results/partition_mapping.{json,md}`.
"""

from __future__ import annotations

import json
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))  # run as a script: the project's modules

from flwr_datasets import __version__ as FLWR_DATASETS  # noqa: E402

from ovalp_flwr.core.durable import replace_durably  # noqa: E402
from ovalp_flwr.data.partition import (PartitionSpec, partition_indices,  # noqa: E402
                                       summarize_partition)
from ovalp_flwr.features.cache import load_or_build  # noqa: E402
from ovalp_flwr.options import ConfigError  # noqa: E402

OUT = PROJECT / "benchmarks" / "results"
CLIENTS, SEED = 100, 0
COMMAND = ".venv/bin/python benchmarks/partition_mapping.py"
PAIRS = [  # (ours, its run config; Flower's nearest, its run config)
    ("iid", {}, "flwr:IidPartitioner", {}),
    ("shard", {"classes_per_client": 2}, "flwr:PathologicalPartitioner",
     {"num_classes_per_partition": 2}),
    ("shard", {"classes_per_client": 2}, "flwr:ShardPartitioner", {"num_shards_per_partition": 2}),
    ("bernoulli-dirichlet", {}, "flwr:DirichletPartitioner",
     {"alpha": 0.1, "min_partition_size": 0}),
    ("zipf", {"zipf_s": 1.0}, "flwr:LinearPartitioner", {}),
    ("zipf", {"zipf_s": 1.0}, "flwr:SquarePartitioner", {}),
]


def spec_text(kind: str, options: dict) -> str:
    if not options:
        return f"`{kind}`"
    if kind.startswith("flwr:"):
        args = " ".join(f"{k}={json.dumps(v)}" for k, v in options.items())
        return f"`{kind}` `{args}`"
    return f"`{kind}` " + " ".join(f"`{k.replace('_', '-')}={v}`" for k, v in options.items())


def measured(kind: str, options: dict, labels: np.ndarray) -> tuple[list[np.ndarray], dict]:
    flower = kind.startswith("flwr:")
    spec = (PartitionSpec(kind, seed=SEED, partition_args=PartitionSpec.frozen_args(options))
            if flower else PartitionSpec(kind, seed=SEED, **options))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            parts = partition_indices(spec, labels, CLIENTS)
        except ConfigError as err:  # the run would stop with this line
            return [], {"partition": kind, "options": options, "refused": err.allowed}
    summary = summarize_partition(kind, parts, labels)
    return parts, {"partition": kind, "options": options, "summary": str(summary),
                   "rows_handed_out": int(sum(len(p) for p in parts)),
                   "warnings": sorted({str(w.message).split(".")[0] for w in caught
                                       if "flwr_datasets" in w.filename})}


def main() -> None:
    with tempfile.TemporaryDirectory() as cache:
        labels = load_or_build("digits", "pixels", Path(cache), progress=False).train.y
    rows = []
    for ours, ours_options, theirs, their_options in PAIRS:
        mine, ours_row = measured(ours, ours_options, labels)
        other, their_row = measured(theirs, their_options, labels)
        same = bool(other) and all(np.array_equal(a, b) for a, b in zip(mine, other))
        rows.append({"ours": ours_row, "flower": their_row, "row_for_row_equal": same})
        print(json.dumps(rows[-1]), flush=True)
    OUT.mkdir(exist_ok=True)
    replace_durably(OUT / "partition_mapping.json", json.dumps(
        {"command": COMMAND, "flwr_datasets": FLWR_DATASETS, "clients": CLIENTS, "seed": SEED,
         "rows": rows}, indent=1).encode())
    lines = [f"# Our partitions and Flower Datasets' ({CLIENTS} clients, digits' "
             f"{len(labels)} training rows, seed {SEED})", "",
             f"Command: `{COMMAND}` (flwr-datasets {FLWR_DATASETS})", "",
             "| partition | summary (what a run prints) | rows handed out | row for row ours |",
             "|---|---|---:|---|"]
    for row in rows:
        for side in ("ours", "flower"):
            part = row[side]
            if "refused" in part:
                said, handed = f"refused: {part['refused']}", "-"
            else:
                note = "; ".join(part["warnings"])
                said = part["summary"].split(": ", 1)[1] + (f" ({note})" if note else "")
                handed = str(part["rows_handed_out"])
            equal = "" if side == "ours" else ("yes" if row["row_for_row_equal"] else "no")
            lines.append(f"| {spec_text(part['partition'], part['options'])} | {said} | "
                         f"{handed} | {equal} |")
    replace_durably(OUT / "partition_mapping.md", ("\n".join(lines) + "\n").encode())
    print("\n".join(lines))


if __name__ == "__main__":
    main()
