"""The ServerApp's personalization phase, after the last federated round (README,
"Personalization"): per method, every client fine-tunes the final global model on its own data
(`train.personalize`) and uploads its model once, with its Local (right predictions on its own
test split). Who scores Global is `pft-global`:
- `server` (the default): the server scores every model on its own test split, the global
  distribution its rounds are scored on (`personalize.scoring`): N uploads per method;
- `clients`: every client scores every client's model on its own test split
  (`evaluate.personalized`), for a federation whose server holds no test data: N² transfers.
The server turns the scores into the study's metrics (`personalize.metrics`). No test row leaves
a client either way; the models travel.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.serverapp import Grid

from ovalp_flwr.federation import protocol as p
from ovalp_flwr.ops.console import say
from ovalp_flwr.personalize.metrics import (CrossScores, ServerScores, mean_global, per_client,
                                            per_client_on_server, summarize)
from ovalp_flwr.personalize.options import PersonalizeOptions
from ovalp_flwr.personalize.scoring import ScoreModels, ServerScorer
from ovalp_flwr.core.normalize import NormStats
from ovalp_flwr.federation.exchange import FederationError, SetupCosts, exchange
from ovalp_flwr.federation.setup import by_partition

GLOBAL = "global"  # the federated model itself, scored like a method (nothing fine-tuned)
GLOBAL_MEANS = {
    "server": "accuracy of a client's model on the server's test split (the global "
              "distribution); distortion over the same rows",
    "clients": "mean accuracy of a client's model on the other clients' own test splits; "
               "distortion over every client's test rows",
}


def personalization_phase(grid: Grid, config: PersonalizeOptions, clients: dict[int, dict],
                          global_arrays: ArrayRecord, digest: str, run_name: str,
                          scorer: ServerScorer) -> dict:
    """Every method of `personalize`, and the global model as their reference; what
    `summary.json` holds under "personalization". `scorer` scores models on the server's
    test split (`pft-global = "server"`)."""
    started = time.perf_counter()
    live = set(grid.get_node_ids())
    nodes = [node for node in by_partition(clients) if node in live]
    partitions = {node: int(clients[node][p.PARTITION_ID]) for node in nodes}
    common = {p.NORM_DIGEST: digest} if digest else {}
    costs = SetupCosts()  # what the phase moved: the models out and back (and the scores)
    on_server = config.pft_global == "server"
    if on_server and not scorer.num_test:
        raise FederationError("pft-global='server': the server's test split is empty")
    score_models = scorer.against(global_arrays) if on_server else None
    methods: dict[str, dict] = {}
    timing: dict[str, dict[str, float]] = {}
    if not on_server:  # every client's "model" is the global one, sent and scored once
        reference = _score(grid, nodes, global_arrays, common, {GLOBAL: global_arrays},
                           partitions, costs, model_of=lambda _partition, _suffix: GLOBAL)
        methods[GLOBAL] = _method_result(_clients_rows(reference)[""], None, {}, {})
        _say(GLOBAL, methods[GLOBAL]["summary"], 0.0)
    for method in config.personalization_methods:
        request = ConfigRecord({**common, p.METHOD: method, p.RUN_NAME: run_name})
        sent = time.perf_counter()
        replies = exchange(grid, p.PERSONALIZE, {n: RecordDict({p.ARRAYS: global_arrays,
                                                                p.CONFIG: request})
                                                 for n in nodes}, costs)
        scoring = time.perf_counter()
        models = _models(replies, nodes, partitions)
        if score_models is None:
            rows = _clients_rows(_score(grid, nodes, global_arrays, common, models, partitions,
                                        costs))
        else:
            if GLOBAL not in methods:  # the reference: Local from the first replies
                methods[GLOBAL] = _reference_on_server(score_models, global_arrays, replies,
                                                       nodes, partitions, scorer.num_test)
            rows = _server_rows(_server_scores(score_models, models, replies, nodes, partitions,
                                               scorer.num_test, p.OWN_CORRECT))
        methods[method] = _method_result(rows[""], replies, partitions,
                                         {str(e): rows[f"@{e}"] for e in config.curve_epochs
                                          if f"@{e}" in rows})
        timing[method] = _timing(replies, nodes, scoring - sent, time.perf_counter() - scoring)
        _say(method, methods[method]["summary"], timing[method]["fine_tuning_max"])
    seconds = time.perf_counter() - started
    return {"clients": [partitions[n] for n in nodes],
            "methods": {GLOBAL: methods.pop(GLOBAL), **methods},
            "options": {m: config.personalizer_options(m) for m in config.personalization_methods},
            "pft_global": config.pft_global, "global_means": GLOBAL_MEANS[config.pft_global],
            "test_split": "Local: per client, its training classes' proportions, drawn from the "
                          "test split (from its own domains on multi-domain data); Global: "
                          + ("the server's whole test split" if on_server else
                             "the other clients' own test splits"),
            "costs": costs.to_dict(), "seconds": seconds,
            "timing": {"methods": timing, **_phase_timing(timing, seconds)}}


def _models(replies: dict[int, RecordDict], nodes: list[int], partitions: dict[int, int]
            ) -> dict[str, ArrayRecord]:
    """Every client's final model, `<partition>`, and its snapshots, `<partition>@<epoch>`."""
    models = {str(partitions[n]): replies[n][p.ARRAYS] for n in nodes}
    for node in nodes:
        for key, record in replies[node].array_records.items():
            if key.startswith(p.SNAPSHOT_PREFIX):
                models[f"{partitions[node]}@{key[len(p.SNAPSHOT_PREFIX):]}"] = record
    return models


def _suffixes(models: dict[str, ArrayRecord]) -> list[str]:
    """"" for the final models, "@<epoch>" for each epoch's snapshots."""
    return sorted({"@" + name.split("@")[1] if "@" in name else "" for name in models})


def _score(grid: Grid, nodes: list[int], global_arrays: ArrayRecord, common: dict,
           models: dict[str, ArrayRecord], partitions: dict[int, int], costs: SetupCosts,
           model_of: Callable[[int, str], str] = lambda partition, suffix: f"{partition}{suffix}"
           ) -> dict[str, CrossScores]:
    """Every model scored by every client (`pft-global = "clients"`); one `CrossScores` per
    suffix ("" for the final models, "@<epoch>" for the snapshots). `model_of(partition,
    suffix)` names the model that is that client's: by default its own, `<partition>` or
    `<partition>@<epoch>`."""
    content = {p.ARRAYS: global_arrays, p.CONFIG: ConfigRecord(common),
               **{p.MODEL_PREFIX + name: record for name, record in models.items()}}
    replies = exchange(grid, p.SCORE_PERSONALIZED, {n: RecordDict(content) for n in nodes}, costs)
    order = [partitions[n] for n in nodes]
    num_test = np.array([int(replies[n][p.METRICS][p.NUM_TEST]) for n in nodes])
    out = {}
    for suffix in _suffixes(models):
        def scored(prefix: str) -> np.ndarray:
            return np.array([[float(replies[n][p.METRICS][prefix + model_of(i, suffix)])
                              for n in nodes] for i in order])

        correct, distance = scored(p.CORRECT_PREFIX), scored(p.DISTANCE_PREFIX)
        out[suffix] = CrossScores(order, correct, distance, num_test)
    return out


def _server_scores(score_models: ScoreModels, models: dict[str, ArrayRecord],
                   replies: dict[int, RecordDict], nodes: list[int], partitions: dict[int, int],
                   num_server_test: int, own_key: str,
                   model_of: Callable[[int, str], str] = lambda partition, suffix:
                   f"{partition}{suffix}") -> dict[str, ServerScores]:
    """Every model scored once, by the server (`pft-global = "server"`); Local from what each
    client reported under `own_key`. One `ServerScores` per suffix, as `_score`'s."""
    scored = score_models(models)
    order = [partitions[n] for n in nodes]
    own = np.array([int(replies[n][p.METRICS][own_key]) for n in nodes])
    num_test = np.array([int(replies[n][p.METRICS][p.NUM_TEST]) for n in nodes])
    impossible = [partitions[n] for n, k, t in zip(nodes, own, num_test) if not 0 <= k <= t]
    if impossible:
        raise FederationError(f"{p.PERSONALIZE}: client(s) {impossible} report more right "
                              f"predictions ({own_key}) than test rows, or fewer than none")
    out = {}
    for suffix in _suffixes(models):
        correct = np.array([scored[model_of(i, suffix)][0] for i in order], dtype=float)
        distance = np.array([scored[model_of(i, suffix)][1] for i in order])
        out[suffix] = ServerScores(order, own, num_test, correct, distance, num_server_test)
    return out


def _reference_on_server(score_models: ScoreModels, global_arrays: ArrayRecord,
                         replies: dict[int, RecordDict], nodes: list[int],
                         partitions: dict[int, int], num_server_test: int) -> dict:
    """The global model as every client's model, scored once by the server; its Local is what
    the clients reported of it before fine-tuning (the first method's replies)."""
    reference = _server_scores(score_models, {GLOBAL: global_arrays}, replies, nodes, partitions,
                               num_server_test, p.GLOBAL_OWN_CORRECT,
                               model_of=lambda _partition, _suffix: GLOBAL)
    result = _method_result(_server_rows(reference)[""], None, {}, {})
    _say(GLOBAL, result["summary"], 0.0)
    return result


def _clients_rows(scores: dict[str, CrossScores]) -> dict[str, list[dict]]:
    return {suffix: per_client(cross) for suffix, cross in scores.items()}


def _server_rows(scores: dict[str, ServerScores]) -> dict[str, list[dict]]:
    return {suffix: per_client_on_server(server) for suffix, server in scores.items()}


def _method_result(rows: list[dict], replies: dict[int, RecordDict] | None,
                   partitions: dict[int, int], snapshot_rows: dict[str, list[dict]]) -> dict:
    """Per-client rows, the summary, and the PFT-epoch curve (Local every epoch from the
    clients; Global at the snapshot epochs, `snapshot_rows` by epoch)."""
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
            "global": {epoch: mean_global(snapshot) for epoch, snapshot in snapshot_rows.items()},
        }
    return result


def _timing(replies: dict[int, RecordDict], nodes: list[int], exchange_seconds: float,
            scoring_seconds: float) -> dict[str, float]:
    """One method's seconds: its clients' fine-tuning (summed: what one process running them
    in turn spends; the longest: what parallel nodes wait for), the PERSONALIZE exchange
    around it, and the scoring."""
    train = [float(replies[n][p.METRICS][p.TRAIN_SECONDS]) for n in nodes]
    return {"fine_tuning_sum": float(sum(train)), "fine_tuning_max": max(train, default=0.0),
            "exchange": exchange_seconds, "scoring": scoring_seconds}


def _phase_timing(timing: dict[str, dict[str, float]], seconds: float) -> dict[str, float]:
    """The phase's seconds beside its fine-tuning's, summed over methods, and their ratio
    (`phase_over_fine_tuning`: the phase against the clients' fine-tuning run in turn)."""
    fine_tuning = sum(t["fine_tuning_sum"] for t in timing.values())
    return {"phase": seconds, "fine_tuning_sum": fine_tuning,
            "fine_tuning_max": sum(t["fine_tuning_max"] for t in timing.values()),
            "exchange": sum(t["exchange"] for t in timing.values()),
            "scoring": sum(t["scoring"] for t in timing.values()),
            "phase_over_fine_tuning": seconds / fine_tuning if fine_tuning else float("nan")}


def _say(method: str, summary: dict, seconds: float) -> None:
    say(INFO, "personalize %-9s local %.4f  global %.4f  c-std %.4f  worst %.4f  average %.4f"
        "  distortion %.3f%s", method, summary["local"], summary["global"], summary["c_std"],
        summary["worst"], summary["average"], summary["distortion"],
        f"  ({seconds:.1f} s)" if seconds else "")


def personalize_after(grid: Grid, config: PersonalizeOptions, clients: dict[int, dict],
                      arrays: ArrayRecord, stats: NormStats | None, run_name: str,
                      scorer: ServerScorer) -> dict:
    """The personalization phase; if a client fails it, the federated run's results are
    still written, with the error in place of the phase's."""
    try:
        return personalization_phase(grid, config, clients, arrays,
                                     stats.digest() if stats else "", run_name, scorer)
    except FederationError as err:
        say(WARNING, "personalization stopped: %s", err)
        return {"error": str(err)}
