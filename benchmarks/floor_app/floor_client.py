"""The floor ClientApp: answers at once, on the project's plumbing (`client_app.py`'s). A query
gets a sample count back; a train message its first head, changed (a reply must be new
objects, as a trained head is)."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from ovalp_flwr.federation import simulation_queue

# the project's plumbing (client_app.py): the simulation's message loop in one scan per pass
simulation_queue.install()
app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    return Message(RecordDict({"metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    record = msg.content["arrays"]
    head = {key: Array(record[key].numpy() + np.float32(0.5)) for key in ("weight", "bias")}
    return Message(RecordDict({"arrays": ArrayRecord(head),
                               "metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)
