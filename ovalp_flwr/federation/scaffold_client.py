"""SCAFFOLD's client half: what a node adds to its gradients, and (`scaffold-variates =
"clients"`) the c_i it keeps in its Context and uploads. The server half, and why the two modes
give the same model bit for bit, is `federation.scaffold`."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message

from ovalp_flwr.federation.options import RoundOptions
from ovalp_flwr.federation.protocol import (ARRAYS, CONFIG, CORRECTION, SHARED_VARIATE, VARIATE,
                                            VARIATE_ROUND, from_record, record_of, to_record,
                                            view_record)
from ovalp_flwr.federation.scaffold import next_variate


class VariateMismatch(RuntimeError):
    """The server sent c for a c_i this node does not hold (it cannot happen unless a node's
    Context is lost under the same node id)."""


def drift_offset(msg: Message, context: Context) -> dict[str, np.ndarray] | None:
    """c - c_i for this round's local steps: as the server sent it, or computed here from the c
    it sent and the c_i this node holds, with the server's own subtraction (the same bits);
    None where the server sent neither (the start of a stage)."""
    content = msg.content  # record_of: not RecordDict's typed views, rebuilt on every access
    correction = record_of(content, CORRECTION, ArrayRecord)
    if correction is not None:
        return from_record(correction)
    shared_record = record_of(content, SHARED_VARIATE, ArrayRecord)
    if shared_record is None:
        return None
    expected = int(content[VARIATE_ROUND][VARIATE_ROUND])
    held = record_of(context.state, VARIATE_ROUND, ConfigRecord)
    held_round = None if held is None else int(held[VARIATE_ROUND])
    own_record = record_of(context.state, VARIATE, ArrayRecord)
    if held_round != expected or own_record is None:
        raise VariateMismatch(
            f"the server sent SCAFFOLD's c for this node's c_i from round {expected}, but the "
            f"node holds {'none' if held_round is None else f'the one from round {held_round}'}")
    own = view_record(own_record)  # views: only the difference is new memory
    shared = view_record(shared_record)
    return {key: np.subtract(value, own[key]) for key, value in shared.items()}


def reply_variate(rounds: RoundOptions, learning_rate: float, context: Context, msg: Message,
                  trained: dict[str, np.ndarray], steps: int,
                  sent: dict[str, np.ndarray] | None) -> ArrayRecord | None:
    """With `scaffold-variates = "clients"` and local steps taken: this node's new c_i
    (`scaffold.next_variate` on the message's arrays, as the server would compute it), kept in
    the Context with the round it answers and returned for the reply; else None."""
    if rounds.drift_correction != "scaffold" or rounds.scaffold_variates != "clients" or not steps:
        return None
    start = view_record(msg.content[ARRAYS])
    variate = next_variate(start, trained, float(steps), learning_rate, sent)
    record = to_record(variate)
    context.state[VARIATE] = record
    context.state[VARIATE_ROUND] = ConfigRecord(
        {VARIATE_ROUND: int(msg.content[CONFIG]["server-round"])})
    return record
