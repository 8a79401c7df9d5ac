"""Attack rehearsal: clients that lie within the rules.

Reply validation (`validation`) refuses what is malformed. An attacker here sends what passes
every check, finite, of the right shapes and counts, and is hostile all the same:

- `scale-10`, `scale-100`: its update (its model minus the global one sent) times 10 or 100;
- `sign-flip`: minus its update;
- `label-flip`: it trains honestly on its own features with every label moved one class on
  (a fixed permutation of the classes);
- the statistics of the closed-form start, forged so that every check still passes:
  `stats-flip`, its class sums negated (as if each class's rows were reflected through the
  origin: counts, square norms and Gram matrix are then unchanged); `stats-gram`, its Gram
  matrix and square norms times 10 (as if its rows were √10 times longer); `stats-count`, its
  counts times 10, and the sample count it describes and trains with too (as if it held 10 times
  the rows, the extra ones zero): within what `describe` allows, and 10 times FedAvg's weight.

Which clients attack is the run's choice (`attack`, `attack-fraction`), seeded by `seed`: the
same set on every runner, drawn among the clients that hold data (under heavy label skew most
hold none, and an attacker without rows sends nothing into the mean). On the fine-tuning path,
whose clients never load the cached labels, the draw is among all partitions. The update and
statistics attacks are a ClientApp mod (`attack_mod`: on train replies, any path, SCAFFOLD's
variate left honest; on the set-up queries' statistics and counts); label-flip changes the rows
the client trains on (`ova.client`). Under `server-optimizer = "lbfgs"` a reply is a gradient:
it is scaled itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from flwr.app import Context, Message, MetricRecord, RecordDict

from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.node import all_partitions, node_partition, run_config

FACTORS = {"scale-10": 10.0, "scale-100": 100.0, "sign-flip": -1.0}  # update attacks
STATISTICS_ATTACKS = ("stats-flip", "stats-gram", "stats-count")
FORGERY = 10.0  # stats-gram's and stats-count's factor
ATTACKER_STREAM = 7919  # the seed's stream that picks the attackers, apart from the partition's


def attackers(seed: int, sizes: Sequence[int], fraction: float) -> frozenset[int]:
    """The partitions that attack: round(fraction · h) of the h that hold rows (`sizes`: each
    partition's row count), at least one, drawn by seed."""
    holders = np.flatnonzero(np.asarray(sizes) > 0)
    if holders.size == 0:
        return frozenset()
    count = min(holders.size, max(1, round(fraction * holders.size)))
    chosen = np.random.default_rng([seed, ATTACKER_STREAM]).choice(holders, count, replace=False)
    return frozenset(int(i) for i in chosen)


def partition_sizes(context: Context, num_partitions: int) -> list[int]:
    """Every partition's row count on the cached path; on the fine-tuning path, whose clients
    never load the cached labels, every partition counts as holding rows."""
    config = run_config(context)
    if config.finetune != "none":
        return [1] * num_partitions
    return [len(rows) for rows in all_partitions(config, num_partitions)]


def attack_of(context: Context) -> str | None:
    """The attack this node rehearses, or None for an honest one."""
    kind = str(context.run_config.get("attack", "none"))
    if kind == "none":
        return None
    partition_id, num_partitions = node_partition(context)
    chosen = attackers(int(context.run_config.get("seed", 0)),
                       partition_sizes(context, num_partitions),
                       float(context.run_config.get("attack-fraction", 0.1)))
    return kind if partition_id in chosen else None


def flipped(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """label-flip's labels: each moved one class on."""
    return (labels + 1) % num_classes


def poisoned(arrays: dict[str, np.ndarray], sent: dict[str, np.ndarray], factor: float,
             gradient: bool) -> dict[str, np.ndarray]:
    """The reply's arrays with the update (or, for a gradient reply, the gradient) scaled."""
    if gradient:
        return {key: (factor * value).astype(value.dtype) for key, value in arrays.items()}
    return {key: (sent[key] + factor * (value - sent[key])).astype(value.dtype)
            for key, value in arrays.items()}


def forged(arrays: dict[str, np.ndarray], kind: str) -> dict[str, np.ndarray]:
    """A client's statistics (wire form, `ClassStatistics.to_arrays`) as a statistics attack
    sends them."""
    out = dict(arrays)
    if kind == "stats-flip":
        out["sums"] = -arrays["sums"]
    elif kind == "stats-gram":
        for key in ("square-norms", "gram-triu"):
            if key in arrays:
                out[key] = (FORGERY * arrays[key]).astype(arrays[key].dtype)
    elif kind == "stats-count":
        out["counts"] = (FORGERY * arrays["counts"]).astype(arrays["counts"].dtype)
    return out


def _inflated(content: RecordDict) -> RecordDict:
    """stats-count's reply: the sample count it states times FORGERY."""
    metrics = dict(content[p.METRICS])
    metrics[p.NUM_EXAMPLES] = int(FORGERY * metrics[p.NUM_EXAMPLES])
    content[p.METRICS] = MetricRecord(metrics)
    return content


def attack_mod(msg: Message, context: Context, call_next) -> Message:
    """An attacker's replies, poisoned; every other reply as it was."""
    reply = call_next(msg, context)
    kind = attack_of(context)
    if kind is None or kind == "label-flip" or reply.has_error():
        return reply  # honest, or label-flip (`ova.client.train`)
    content = RecordDict(dict(reply.content.items()))
    if kind in STATISTICS_ATTACKS:
        if p.STATISTICS in content.array_records:
            content[p.STATISTICS] = p.to_record(forged(p.from_record(content[p.STATISTICS]), kind))
        if kind == "stats-count" and p.METRICS in content.metric_records \
                and p.NUM_EXAMPLES in content[p.METRICS]:
            content = _inflated(content)
        return Message(content=content, reply_to=msg)
    if p.ARRAYS not in reply.content.array_records or p.ARRAYS not in msg.content.array_records:
        return reply  # not a train reply, or SecAgg+'s statistics exchanges
    gradient = bool(msg.content[p.CONFIG].get(p.GRADIENT)) if p.CONFIG in \
        msg.content.config_records else False
    arrays = poisoned(p.from_record(reply.content[p.ARRAYS]), p.from_record(msg.content[p.ARRAYS]),
                      FACTORS[kind], gradient)
    content[p.ARRAYS] = p.to_record(arrays)
    return Message(content=content, reply_to=msg)
