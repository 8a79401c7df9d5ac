"""Run the ServerApp's logic against the real ClientApp in one process: no Ray, no SuperLink.

For tests and quick benchmarks: the messages, records, strategy and client handlers are
the ones `flwr run` uses; only delivery differs (a direct call instead of the network).
Each node keeps its own `Context`, so `context.state` persists across rounds as it does
under Flower's runtimes.
"""

from __future__ import annotations

import copy
import tomllib
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.config import flatten_dict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from client_app import app as flower_client_app  # the same ClientApp `flwr run` loads
from ovalp_flwr.config import RunConfig
from server_app import run_server

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def app_config(pyproject: Path = PYPROJECT) -> dict[str, Any]:
    """The `[tool.flwr.app.config]` defaults, as `context.run_config` would hold them (nested
    tables flattened to dotted keys, as Flower does)."""
    return flatten_dict(tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["config"])


class InProcessGrid(Grid):
    """A `Grid` whose nodes are in-process contexts served by a `ClientApp`."""

    static_nodes = True  # every node is there from the start: nothing to wait for (server.py)

    def __init__(self, client_app: ClientApp, num_nodes: int, run_config: dict[str, Any],
                 seed: int = 0, node_configs: list[dict[str, Any]] | None = None) -> None:
        """node_configs[i]: extra `--node-config` entries of partition i's node (e.g. data-dir)."""
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 0, SUPERLINK_NODE_ID, 0
        self.client_app = client_app
        extra = node_configs or [{} for _ in range(num_nodes)]
        if len(extra) != num_nodes:
            raise ValueError(f"node_configs has {len(extra)} entries for {num_nodes} nodes")
        # node ids deliberately not in partition order, as with real SuperNodes
        node_ids = 1000 + np.random.default_rng(seed).permutation(num_nodes)
        self.contexts = {
            int(node): Context(run_id=0, node_id=int(node),
                               node_config={"partition-id": i, "num-partitions": num_nodes,
                                            **extra[i]},
                               state=RecordDict(), run_config=dict(run_config))
            for i, node in enumerate(node_ids)
        }
        self.offline: set[int] = set()  # nodes not connected (tests of faults and late joins)
        self._replies: dict[str, Message] = {}
        self._run: Run | None = None

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        if self._run is None:
            raise RuntimeError("InProcessGrid has no run set")
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return Message(content=content, message_type=message_type, dst_node_id=dst_node_id,
                       group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return [node for node in self.contexts if node not in self.offline]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:  # the SuperLink would assign message ids; we keep our own
            message_id = uuid.uuid4().hex
            self._replies[message_id] = self._deliver(message)
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))

    def _deliver(self, message: Message) -> Message:
        """Call the ClientApp with its own copy of the message, as the network would give it
        (a handler or mod may change what it received: SecAgg+'s does); an exception becomes
        an error reply, as in Flower's runtime."""
        context = self.contexts[message.metadata.dst_node_id]
        if message.metadata.dst_node_id in self.offline:  # what the SuperLink answers for it
            return Message(error=Error(code=0, reason="node offline"), reply_to=message)
        try:
            return self.client_app(copy.deepcopy(message), context)
        except Exception as err:  # noqa: BLE001 - mirrored into the reply like Flower does
            return Message(error=Error(code=0, reason=f"{type(err).__name__}: {err}"),
                           reply_to=message)


def run_local(overrides: dict[str, Any], num_clients: int,
              node_configs: list[dict[str, Any]] | None = None) -> Path:
    """A whole run (ServerApp logic + the real ClientApp) in this process; returns results dir."""
    run_config = {**app_config(), **overrides}
    config = RunConfig.from_mapping(run_config)
    grid = InProcessGrid(flower_client_app, num_clients, run_config, seed=config.seed,
                         node_configs=node_configs)
    return run_server(grid, config)
