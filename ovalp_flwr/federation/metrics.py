"""The paper's run metrics, computed from results summaries (`results/<run>/summary.json`).

- R(t) = Acc_nonIID(t) / Acc_IID(t) x 100: a non-IID run against the IID run of the same
  method and seed, round by round.
- Acc@95: the first round whose accuracy reaches 95% of the run's *final* accuracy (so a run
  that peaks early and then falls reaches it early; a run still climbing reaches it late).
- Rounds to a target: the first round whose accuracy reaches a fixed accuracy, the same bar
  for every method (Acc@95's bar moves with each run's own final accuracy); round 0 is the
  start, which a start from statistics may already put above the bar.
- Cost to a round: summed client training time, server time (aggregation + evaluation) and
  bytes moved (both directions, all clients, the set-up exchanges included where the summary
  records them), as in the paper's appendix tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

ACC_AT_FRACTION = 0.95


def accuracy_curve(summary: dict[str, Any]) -> list[float]:
    """Global test accuracy after rounds 1..T."""
    return [float(r["accuracy"]) for r in summary["rounds"]]


def start_and_rounds(summary: dict[str, Any], horizon: int = 0) -> list[float]:
    """Accuracy at round 0 (the start) and after rounds 1..T; a run of T < horizon rounds keeps
    its last model, so its last accuracy is carried to the horizon (FedNCM and Fed3R have no
    rounds: their accuracy at every round is their start's)."""
    curve = [float(summary["initial_accuracy"]), *accuracy_curve(summary)]
    return curve + curve[-1:] * max(0, horizon + 1 - len(curve))


def first_round_at(curve: Sequence[float], target: float) -> int | None:
    """First round t >= 0 of a start-and-rounds curve with accuracy >= target; None if none."""
    return next((t for t, acc in enumerate(curve) if acc >= target), None)


def relative_curve(non_iid: Sequence[float], iid: Sequence[float]) -> list[float]:
    """R(t) in percent; both curves must cover the same rounds."""
    if len(non_iid) != len(iid):
        raise ValueError(f"R(t) needs curves of one length; got {len(non_iid)} and {len(iid)} rounds")
    return [100.0 * a / b if b > 0 else float("nan") for a, b in zip(non_iid, iid)]


def acc_at(curve: Sequence[float], fraction: float = ACC_AT_FRACTION) -> int | None:
    """First round (1-based) with accuracy >= fraction x final accuracy; None for an empty curve."""
    if not curve:
        return None
    target = fraction * curve[-1]
    return next(t for t, acc in enumerate(curve, 1) if acc >= target)


def cost_to_round(summary: dict[str, Any], last_round: int) -> dict[str, float]:
    """Client seconds (mean per client, summed over rounds), server seconds and bytes, rounds
    1..last_round."""
    rounds = [r for r in summary["rounds"] if r["round"] <= last_round]
    return {
        "rounds": float(len(rounds)),
        "client_seconds": sum(_num(r, "client_train_seconds_mean") for r in rounds),
        "server_seconds": sum(_num(r, "server_aggregate_seconds") + _num(r, "server_eval_seconds")
                              for r in rounds),
        "bytes": setup_bytes(summary) + sum(_round_bytes(r) for r in rounds),
    }


def setup_bytes(summary: dict[str, Any]) -> float:
    """Bytes of the set-up exchanges (describe, set_norm: the statistics ride on them), both
    ways; 0 for summaries from before they were recorded."""
    setup = summary.get("setup") or {}
    return float(setup.get("bytes_sent", 0.0)) + float(setup.get("bytes_received", 0.0))


def bytes_through(summary: dict[str, Any], horizon: int = 0) -> list[float]:
    """Bytes moved by the end of round t, for t = 0 (set-up alone) .. max(T, horizon)."""
    total, out = setup_bytes(summary), []
    out.append(total)
    for r in summary["rounds"]:
        total += _round_bytes(r)
        out.append(total)
    return out + out[-1:] * max(0, horizon + 1 - len(out))


def _round_bytes(r: dict[str, Any]) -> float:
    """Down (server -> sampled clients) plus up (trained clients -> server)."""
    down = _num(r, "bytes_sent_per_client") * _num(r, "clients_sampled")
    up = _num(r, "bytes_received_per_client") * _num(r, "clients_trained")
    return down + up


def _num(r: dict[str, Any], key: str) -> float:
    """A round's value; absent or None (no client trained) counts as 0."""
    return float(r.get(key) or 0.0)
