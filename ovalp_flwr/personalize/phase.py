"""The ServerApp's personalization phase, after the last federated round (README,
"Personalization"): per method, every client fine-tunes the final global model on its own data
(`train.personalize`), then every client scores every client's model on its own test split
(`evaluate.personalized`), and the server turns the scores into the study's metrics
(`personalize.metrics`). No test row leaves a client; the models travel.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.serverapp import Grid

from ovalp_flwr.federation import protocol as p
from ovalp_flwr.config import RunConfig
from ovalp_flwr.ops.console import say
from ovalp_flwr.personalize.metrics import CrossScores, per_client, summarize
from ovalp_flwr.core.normalize import NormStats
from ovalp_flwr.federation.exchange import FederationError, SetupCosts, exchange
from ovalp_flwr.federation.setup import by_partition

GLOBAL = "global"  # the federated model itself, scored like a method (nothing fine-tuned)


def personalization_phase(grid: Grid, config: RunConfig, clients: dict[int, dict],
                          global_arrays: ArrayRecord, digest: str, run_name: str) -> dict:
    """Every method of `personalize`, and the global model as their reference; what
    `summary.json` holds under "personalization"."""
    started = time.perf_counter()
    live = set(grid.get_node_ids())
    nodes = [node for node in by_partition(clients) if node in live]
    partitions = {node: int(clients[node][p.PARTITION_ID]) for node in nodes}
    common = {p.NORM_DIGEST: digest} if digest else {}
    costs = SetupCosts()  # what the phase moved: the models out and back, and the scores
    # the reference: every client's "model" is the global one, sent and scored once
    reference = _score(grid, nodes, global_arrays, common, {GLOBAL: global_arrays}, partitions,
                       costs, model_of=lambda _partition, _suffix: GLOBAL)
    methods = {GLOBAL: _method_result(reference, None, {}, {})}
    _say(GLOBAL, methods[GLOBAL]["summary"], 0.0)
    for method in config.personalization_methods:
        request = ConfigRecord({**common, p.METHOD: method, p.RUN_NAME: run_name})
        replies = exchange(grid, p.PERSONALIZE, {n: RecordDict({p.ARRAYS: global_arrays,
                                                                p.CONFIG: request})
                                                 for n in nodes}, costs)
        models = {str(partitions[n]): replies[n][p.ARRAYS] for n in nodes}
        for node in nodes:
            for key, record in replies[node].array_records.items():
                if key.startswith(p.SNAPSHOT_PREFIX):
                    models[f"{partitions[node]}@{key[len(p.SNAPSHOT_PREFIX):]}"] = record
        scores = _score(grid, nodes, global_arrays, common, models, partitions, costs)
        methods[method] = _method_result(scores, replies, partitions, config.curve_epochs)
        _say(method, methods[method]["summary"],
             max(float(replies[n][p.METRICS][p.TRAIN_SECONDS]) for n in nodes))
    return {"clients": [partitions[n] for n in nodes], "methods": methods,
            "options": {m: config.personalizer_options(m) for m in config.personalization_methods},
            "test_split": "per client: its training classes' proportions, drawn from the test "
                          "split (from its own domains on multi-domain data)",
            "costs": costs.to_dict(), "seconds": time.perf_counter() - started}


def _score(grid: Grid, nodes: list[int], global_arrays: ArrayRecord, common: dict,
           models: dict[str, ArrayRecord], partitions: dict[int, int], costs: SetupCosts,
           model_of: Callable[[int, str], str] = lambda partition, suffix: f"{partition}{suffix}"
           ) -> dict[str, CrossScores]:
    """Every model scored by every client; one `CrossScores` per suffix ("" for the final
    models, "@<epoch>" for the snapshots). `model_of(partition, suffix)` names the model that
    is that client's: by default its own, `<partition>` or `<partition>@<epoch>`."""
    content = {p.ARRAYS: global_arrays, p.CONFIG: ConfigRecord(common),
               **{p.MODEL_PREFIX + name: record for name, record in models.items()}}
    replies = exchange(grid, p.SCORE_PERSONALIZED, {n: RecordDict(content) for n in nodes}, costs)
    order = [partitions[n] for n in nodes]
    num_test = np.array([int(replies[n][p.METRICS][p.NUM_TEST]) for n in nodes])
    suffixes = sorted({"@" + name.split("@")[1] if "@" in name else "" for name in models})
    out = {}
    for suffix in suffixes:
        def scored(prefix: str) -> np.ndarray:
            return np.array([[float(replies[n][p.METRICS][prefix + model_of(i, suffix)])
                              for n in nodes] for i in order])

        correct, distance = scored(p.CORRECT_PREFIX), scored(p.DISTANCE_PREFIX)
        out[suffix] = CrossScores(order, correct, distance, num_test)
    return out


def _method_result(scores: dict[str, CrossScores], replies: dict[int, RecordDict] | None,
                   partitions: dict[int, int], curve_epochs: list[int]) -> dict:
    """Per-client rows, the summary, and the PFT-epoch curve (Local every epoch from the
    clients; Global at the snapshot epochs from the cross-scores)."""
    rows = per_client(scores[""])
    if replies is not None:
        by_partition_id = {partitions[n]: replies[n][p.METRICS] for n in replies}
        for row in rows:
            metrics = by_partition_id[row["partition"]]
            row["seconds"] = float(metrics[p.TRAIN_SECONDS])
            row["num_train"] = int(metrics[p.NUM_EXAMPLES])
            row["local_curve"] = [float(a) for a in metrics[p.LOCAL_CURVE]]
    result = {"summary": summarize(rows), "clients": rows}
    if replies is not None:
        curves = [row["local_curve"] for row in rows if row["num_test"] and row["local_curve"]]
        lengths = {len(c) for c in curves}
        result["curve"] = {
            "local": np.mean(curves, axis=0).tolist() if len(lengths) == 1 else [],
            "global": {str(e): summarize(per_client(scores[f"@{e}"]))["global"]
                       for e in curve_epochs if f"@{e}" in scores},
        }
    return result


def _say(method: str, summary: dict, seconds: float) -> None:
    say(INFO, "personalize %-9s local %.4f  global %.4f  c-std %.4f  worst %.4f  average %.4f"
        "  distortion %.3f%s", method, summary["local"], summary["global"], summary["c_std"],
        summary["worst"], summary["average"], summary["distortion"],
        f"  ({seconds:.1f} s)" if seconds else "")


def personalize_after(grid: Grid, config: RunConfig, clients: dict[int, dict],
                      arrays: ArrayRecord, stats: NormStats | None, run_name: str) -> dict:
    """The personalization phase; if a client fails it, the federated run's results are
    still written, with the error in place of the phase's."""
    try:
        return personalization_phase(grid, config, clients, arrays,
                                     stats.digest() if stats else "", run_name)
    except FederationError as err:
        say(WARNING, "personalization stopped: %s", err)
        return {"error": str(err)}
