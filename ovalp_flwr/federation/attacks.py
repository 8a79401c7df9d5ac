"""Attack rehearsal: clients that lie within the rules; which clients, and how a lie is sent.

Reply validation (`validation`) refuses what is malformed. An attacker sends what passes every
check, finite, of the right shapes and counts, and is hostile all the same. The attacks
themselves are `adversary/`, one file each (scaled or sign-flipped updates, flipped labels,
forged statistics and counts).

Which clients attack is the run's choice (`attack`, `attack-fraction`), seeded by `seed`: the
same set on every runner, drawn among the clients that hold data (under heavy label skew most
hold none, and an attacker without rows sends nothing into the mean). On the fine-tuning path,
whose clients never load the cached labels, the draw is among all partitions. What an attack
lies about in its replies is applied by a ClientApp mod (`attack_mod`: on train replies, any
path, SCAFFOLD's variate left honest; on the set-up queries' statistics and counts); an attack
that trains on lies (label-flip) changes the rows the client trains on (`ova.client`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from flwr.app import Context, Message, MetricRecord, RecordDict

from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.adversary import attack
from ovalp_flwr.federation.adversary.base import Attack
from ovalp_flwr.federation.node import all_partitions, node_data, node_partition, run_config

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
    return [len(rows) for rows in all_partitions(node_data(config), num_partitions)]


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


def attack_mod(msg: Message, context: Context, call_next) -> Message:
    """An attacker's replies with its lies in them; every other reply as it was."""
    reply = call_next(msg, context)
    kind = attack_of(context)
    if kind is None or reply.has_error():
        return reply
    lie = attack(kind)
    content, lied = RecordDict(dict(reply.content.items())), False
    if _overrides(lie, "statistics") and p.STATISTICS in content.array_records:
        content[p.STATISTICS] = p.to_record(lie.statistics(p.from_record(content[p.STATISTICS])))
        lied = True
    if _overrides(lie, "count") and p.METRICS in content.metric_records \
            and p.NUM_EXAMPLES in content[p.METRICS]:
        metrics = dict(content[p.METRICS])
        metrics[p.NUM_EXAMPLES] = lie.count(metrics[p.NUM_EXAMPLES])
        content[p.METRICS], lied = MetricRecord(metrics), True
    if _overrides(lie, "update") and p.ARRAYS in reply.content.array_records \
            and p.ARRAYS in msg.content.array_records:  # a train reply (not SecAgg+'s exchanges)
        gradient = bool(msg.content[p.CONFIG].get(p.GRADIENT)) if p.CONFIG in \
            msg.content.config_records else False
        content[p.ARRAYS] = p.to_record(lie.update(p.from_record(reply.content[p.ARRAYS]),
                                                   p.from_record(msg.content[p.ARRAYS]), gradient))
        lied = True
    return Message(content=content, reply_to=msg) if lied else reply


def _overrides(lie: Attack, hook: str) -> bool:
    """Whether the attack lies through `hook` (an honest default is left alone)."""
    return getattr(type(lie), hook) is not getattr(Attack, hook)
