"""Which train replies enter a round's mean: each decoded once (`replies.TrainReply`), checked
(`check_reply`: the reply's shape, numbers and stated count, `validation`; a reply without data
for finite numbers; SCAFFOLD's own c_i where clients keep them), its weight capped
(`weight-cap`). A refused reply is recorded with its reason and left out, as if it never came;
a node refused `exclude_after` times is no longer sampled."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from logging import WARNING

import numpy as np
from flwr.app import Message

from ovalp_flwr.federation.protocol import NUM_EXAMPLES
from ovalp_flwr.federation.replies import (TrainReply, UndecodableReply, decode_reply, number,
                                           weighted_mean)
from ovalp_flwr.federation.scaffold import ControlVariates
from ovalp_flwr.federation.validation import check_finite
from ovalp_flwr.ops.console import say

# (node, arrays, metrics, the global arrays it was sent) -> why the train reply is refused, or None
ReplyCheck = Callable[[int, dict[str, np.ndarray], dict, dict[str, np.ndarray]], "str | None"]


class ReplyScreen:
    """The round's gate before the mean, and who it refused so far (a checkpoint keeps both)."""

    def __init__(self, check_reply: ReplyCheck | None = None, exclude_after: int = 0,
                 uniform: bool = False, max_weight: float | None = None) -> None:
        self.check_reply, self.exclude_after = check_reply, exclude_after
        self.uniform, self.max_weight = uniform, max_weight
        self.rejected: dict[int, int] = {}  # node -> replies refused so far
        self.excluded: set[int] = set()  # nodes no longer sampled: too many refused replies

    def __call__(self, server_round: int, replies: list[Message], sent: dict[str, np.ndarray],
                 variates: ControlVariates | None = None
                 ) -> tuple[list[TrainReply], list[dict]]:
        """The replies that pass, decoded (weights capped), and {node, reason} for each one
        refused; `sent`: the global arrays the round sent."""
        accepted: list[TrainReply] = []
        rejections: list[dict] = []
        for message in replies:
            node = message.metadata.src_node_id
            try:
                reply = decode_reply(message, self.uniform)
            except UndecodableReply as err:
                reply, reason = None, str(err)
            else:
                reason = (None if self.check_reply is None else
                          self.check_reply(node, reply.arrays, reply.metrics, sent))
            if reason is None and number(reply.metrics.get(NUM_EXAMPLES)) <= 0:
                reason = check_finite(reply.arrays)  # no data: not in the mean, checked here
            elif reason is None and variates is not None:
                reason = variates.check(reply, sent)
            if reason is None:
                accepted.append(self._capped(reply))
            else:
                self.refuse(server_round, node, reason, rejections)
        return accepted, rejections

    def _capped(self, reply: TrainReply) -> TrainReply:
        if self.max_weight is None or reply.weight <= self.max_weight:
            return reply
        return dataclasses.replace(reply, weight=self.max_weight)

    def refuse(self, server_round: int, node: int, reason: str, rejections: list[dict]) -> None:
        """Record a refused reply; a node's first refusal is logged, and after `exclude_after`
        of them it is no longer sampled."""
        rejections.append({"node": node, "reason": reason})
        self.rejected[node] = self.rejected.get(node, 0) + 1
        if self.rejected[node] == 1:
            say(WARNING, "round %s: reply of node %s rejected (not averaged): %s",
                server_round, node, reason)
        if self.exclude_after and self.rejected[node] >= self.exclude_after:
            self.excluded.add(node)
            say(WARNING, "node %s excluded from sampling after %s rejected replies", node,
                self.rejected[node])

    def finite_mean(self, trained: list[TrainReply], server_round: int, rejections: list[dict]
                     ) -> tuple[list[TrainReply], dict[str, np.ndarray]]:
        """The trained replies whose arrays are all finite, and their weighted mean. With weights
        > 0 a sum is finite only if every term is, so one check of the mean clears them all; only
        a non-finite mean (a bad reply, or an overflow) makes each reply be checked, the bad ones
        refused and the mean computed again."""
        mean = weighted_mean(trained) if trained else {}
        if check_finite(mean) is None:
            return trained, mean
        finite = []
        for reply in trained:
            reason = check_finite(reply.arrays)
            if reason is None:
                finite.append(reply)
            else:
                self.refuse(server_round, reply.node, reason, rejections)
        return finite, weighted_mean(finite) if finite else {}
