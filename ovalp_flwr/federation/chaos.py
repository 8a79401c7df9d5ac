"""Rehearse bad replies on a real deployment: a ClientApp mod that makes one node misbehave.

A SuperNode started with `--node-config "... chaos='nan'"` sends every train reply as that kind
of bad reply (`KINDS`): what a broken or hostile client would send. The server must reject
each one and leave the global head as if it never came (README, "Reliability"); a node
without the key is untouched. Simulated nodes have no config of their own: there the
environment variable `OVALP_CHAOS=<kind>@<partition-id>` picks the node (it reaches Ray's
workers). The in-process tests use the same corruptions.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
from flwr.app import Context, Message, MetricRecord, RecordDict

from ovalp_flwr.federation import protocol as p

CHAOS_KEY = "chaos"  # the node-config key
CHAOS_ENV = "OVALP_CHAOS"  # <kind>@<partition-id>, for simulations


def _nan(arrays: dict, metrics: dict) -> None:
    arrays["weight"][0, 0] = np.nan


def _inf(arrays: dict, metrics: dict) -> None:
    arrays["bias"][-1] = np.inf


def _shape(arrays: dict, metrics: dict) -> None:
    arrays["weight"] = np.vstack([arrays["weight"], arrays["weight"][:1]])


def _dtype(arrays: dict, metrics: dict) -> None:
    arrays["weight"] = arrays["weight"].astype(np.float64)


def _extra_array(arrays: dict, metrics: dict) -> None:
    arrays["backdoor"] = np.ones(3, np.float32)


def _examples(arrays: dict, metrics: dict) -> None:  # would take all of FedAvg's weight
    metrics[p.NUM_EXAMPLES] = 10**9


def _steps(arrays: dict, metrics: dict) -> None:  # would blow up its SCAFFOLD variate
    metrics[p.LOCAL_STEPS] = 1


def _loss(arrays: dict, metrics: dict) -> None:
    metrics[p.TRAIN_LOSS] = float("nan")


# kind -> how it changes a train reply's arrays and metrics ("no-metrics" drops the metrics)
KINDS: dict[str, Callable[[dict, dict], None] | None] = {
    "nan": _nan, "inf": _inf, "shape": _shape, "dtype": _dtype, "extra-array": _extra_array,
    "examples": _examples, "steps": _steps, "loss": _loss, "no-metrics": None,
}


def corrupt(kind: str, content: RecordDict) -> RecordDict:
    """A train reply's content turned into one kind of bad reply."""
    if kind not in KINDS:
        raise ValueError(f"node config {CHAOS_KEY}={kind!r} is not allowed; choose one of: "
                         f"{', '.join(KINDS)}")
    arrays = {key: value.copy() for key, value in p.from_record(content[p.ARRAYS]).items()}
    metrics = dict(content[p.METRICS])
    change = KINDS[kind]
    if change is None:
        return RecordDict({p.ARRAYS: p.to_record(arrays)})
    change(arrays, metrics)
    return RecordDict({p.ARRAYS: p.to_record(arrays), p.METRICS: MetricRecord(metrics)})


def chaos_kind(context: Context) -> str | None:
    """The kind of bad reply this node sends: its node config's, else `OVALP_CHAOS`'s if that
    names its partition; None for a well-behaved node."""
    if context.node_config.get(CHAOS_KEY):
        return str(context.node_config[CHAOS_KEY])
    spec = os.environ.get(CHAOS_ENV, "")
    if not spec:
        return None
    kind, at, partition = spec.partition("@")
    if not at or not partition.isdigit():
        raise ValueError(f"{CHAOS_ENV}={spec!r} is not allowed; use <kind>@<partition-id>, "
                         f"a kind from: {', '.join(KINDS)}")
    return kind if str(context.node_config.get("partition-id")) == partition else None


def chaos_mod(msg: Message, context: Context, call_next) -> Message:
    """Train replies of a node that `chaos_kind` names, corrupted that way."""
    reply = call_next(msg, context)
    kind = chaos_kind(context)
    if not kind or reply.has_error() or p.ARRAYS not in reply.content.array_records:
        return reply  # SecAgg+'s statistics exchanges ride on train messages too: untouched
    return Message(content=corrupt(str(kind), reply.content), reply_to=msg)
