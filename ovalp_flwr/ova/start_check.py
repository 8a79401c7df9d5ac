"""The start checked before it is used (`robust-start`): the screen of every client's
statistics, its verdict on validation rows, and the leave-out check after it. The server's side
of `core/head_init/screen.py` and `core/head_init/leave_out.py`."""

from __future__ import annotations

import time
from logging import INFO

import numpy as np

from ovalp_flwr.federation.aggregators.options import RobustOptions
from ovalp_flwr.core.head_init import HeadInit
from ovalp_flwr.core.head_init.leave_out import gains, leave_out_check
from ovalp_flwr.core.head_init.screen import against_its_word, repaired, screen
from ovalp_flwr.core.normalize import NormStats
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.setup import StatisticsSum
from ovalp_flwr.ops.console import say


def checked_start(robust: RobustOptions, seed: int, feature_norm: str, init: HeadInit,
                  summed: StatisticsSum, clients: dict[int, dict], norm: NormStats | None,
                  features: np.ndarray, labels: np.ndarray) -> dict:
    """`robust-start`: the clients whose statistics break the others' consensus or their own
    moments (`head_init.screen`): those that broke their moments mended to agree with them, or
    all taken out of the start's sums together, as the validation rows say
    (`screen_verdict`; never the test split); under "leave-out", then, one at a time, those
    whose absence does (`head_init.leave_out`). What `summary.json` says of them. They stay in
    the rounds, where `robust-aggregation` bounds their updates: under label skew a client may
    hold a class alone, and only its rounds can teach it."""
    if summed.total is None:
        return {}
    started = time.perf_counter()
    partition = {node: int(clients[node][p.PARTITION_ID]) for node in clients}
    held, kept = len(summed.kept), summed.kept
    described = summed.described(clients, norm) if feature_norm == "standardize" else {}
    screened = screen(kept, described)
    mended = {node: repaired(kept[node], described[node]) for node in screened
              if node in described and against_its_word(kept[node], described[node])}
    candidates = {"out": dict.fromkeys(screened), **({"repaired": mended} if mended else {})}
    gain = gains(init, summed.total, kept, candidates if screened else {}, features,
                 labels, seed)
    chosen = screen_verdict(gain, robust.robust_start_margin)
    if chosen == "out":
        summed.drop(list(screened))
    elif chosen == "repaired":
        summed.replace(mended)
    found = {"screened": [{"partition": partition[node], "why": why}
                          for node, why in sorted(screened.items(), key=lambda i: partition[i[0]])],
             "screen_gain": gain.get("out", 0.0), "screened_out": chosen == "out",
             "repair_gain": gain.get("repaired"), "screen_repaired": chosen == "repaired",
             "screen_seconds": time.perf_counter() - started, "checked_on": "validation"}
    say(INFO, "robust-start: %d of %d clients break the consensus or their own moments (%d "
        "mendable); on the validation rows, without them %+.4f, mended %s: %s%s",
        len(screened), held, len(mended), gain.get("out", 0.0),
        "-" if "repaired" not in gain else f"{gain['repaired']:+.4f}",
        {"out": "taken out", "repaired": "mended"}.get(chosen, "kept"),
        "".join(f"; partition {partition[n]}: {why}" for n, why in list(screened.items())[:3]))
    if robust.robust_start != "leave-out":
        return found
    check = leave_out_check(init, summed.total, summed.kept, features,
                            labels, seed, robust.robust_start_margin)
    summed.drop(check.left_out)
    say(INFO, "robust-start: %d of %d clients left out (start %.4f with the rest, on %d "
        "validation rows; %.1f s)", len(check.left_out), len(summed.kept) + len(check.left_out),
        check.accuracy, len(labels), time.perf_counter() - started)
    return {**found, "check_accuracy": check.accuracy,
            "left_out": [partition[node] for node in check.left_out], "gains": check.gains,
            "check_seconds": time.perf_counter() - started}


def screen_verdict(gain: dict[str, float], margin: float) -> str | None:
    """What the screen does with the clients it found, from each change's gain on validation:
    those that broke their own moments are mended unless that costs more than `margin` (their
    word outranks their forgery; mending `stats-count`'s zero rows costs far more), and all of
    them go out only if that beats the start kept or mended by more than `margin` (leaving out
    loses their rows)."""
    chosen, current = None, 0.0
    if "repaired" in gain and gain["repaired"] >= -margin:
        chosen, current = "repaired", gain["repaired"]
    if "out" in gain and gain["out"] - current > margin:
        chosen = "out"
    return chosen
