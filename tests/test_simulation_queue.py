"""The simulation runtime's message loop in one scan per pass: the messages Flower's own
per-node loop hands out, from Flower's real in-memory state."""

import time
import types

import pytest

from flwr.app import RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.proto.task_pb2 import Task  # pylint: disable=no-name-in-module
from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid.inmemory_grid import InMemoryGrid

from ovalp_flwr.federation import simulation_queue
from ovalp_flwr.federation.simulation_queue import VCE_API, install, undelivered


def simulation_state(num_nodes: int):
    """Flower's in-memory state as its simulation sets it up: a run, `num_nodes` nodes; and
    the ServerApp's grid on it."""
    factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    state = factory.state()
    run = Run.create_empty(run_id=7)
    run.primary_task_id, run.federation_id = 9, NOOP_FEDERATION_ID
    state.run_ids[7] = RunRecord(run=run)
    state.task_store[9] = Task(task_id=9, run_id=7)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 9, 7, SUPERLINK_NODE_ID
    nodes = list(_register_nodes(num_nodes, factory))
    grid = InMemoryGrid(state_factory=factory)
    grid.set_run(run)
    return state, grid, nodes


def push(grid, nodes, ttl=None):
    return list(grid.push_messages([grid.create_message(RecordDict(), "query", n, "", ttl)
                                    for n in nodes]))


def flower_pass(state, nodes):
    """One pass of Flower's own loop (`vce_api.add_messages_to_queue`)."""
    return [m for n in nodes for m in state.get_message_ins(node_id=n, limit=1)]


def test_one_scan_hands_out_what_flowers_per_node_pass_does():
    ours, flowers = simulation_state(30), simulation_state(30)
    for (state, grid, nodes) in (ours, flowers):
        push(grid, nodes[:10] + nodes[3:5] + nodes[20:25])  # two messages for nodes 3 and 4
    passes = {}
    for name, (state, _, nodes) in (("ours", ours), ("flower", flowers)):
        first = undelivered(state, set(nodes)) if name == "ours" else flower_pass(state, nodes)
        second = undelivered(state, set(nodes)) if name == "ours" else flower_pass(state, nodes)
        third = undelivered(state, set(nodes)) if name == "ours" else flower_pass(state, nodes)
        index = {n: i for i, n in enumerate(nodes)}
        passes[name] = [sorted(index[m.metadata.dst_node_id] for m in found)
                        for found in (first, second, third)]
        assert all(m.metadata.delivered_at for m in first + second)
    assert passes["ours"] == passes["flower"] == [[*range(10), *range(20, 25)], [3, 4], []]


def test_the_oldest_message_of_a_node_goes_first_and_expired_ones_are_dropped():
    state, grid, nodes = simulation_state(3)
    first, second = push(grid, [nodes[0]]), push(grid, [nodes[0]])
    push(grid, [nodes[1]], ttl=0.05)
    time.sleep(0.1)
    assert [m.metadata.message_id for m in undelivered(state, set(nodes))] == first
    assert [m.metadata.message_id for m in undelivered(state, set(nodes))] == second
    assert len(state.message_ins_store) == 2  # the expired one is gone, as Flower's check does


def test_a_pass_over_10000_nodes_scans_messages_not_nodes():
    state, grid, nodes = simulation_state(10_000)
    push(grid, nodes[::10])
    started = time.perf_counter()
    found = undelivered(state, set(nodes))
    assert len(found) == 1000
    assert time.perf_counter() - started < 2.0  # Flower's pass scans 10,000 x 1,000


def test_install_swaps_the_loop_only_where_the_runtime_runs_and_only_the_loop_it_mirrors():
    from flwr.server.superlink.fleet.vce import vce_api

    loop = lambda *args: None  # noqa: E731 - a Flower whose loop reads otherwise
    runtime = types.SimpleNamespace(add_messages_to_queue=loop)
    assert install({}) is False  # no simulation runtime in this process: nothing to do
    assert install({VCE_API: runtime}) is False
    assert runtime.add_messages_to_queue is loop
    # the installed Flower's own loop is the one mirrored (a Flower that changes it fails here:
    # check `undelivered` against its new source, then record the new fingerprints)
    runtime = types.SimpleNamespace(add_messages_to_queue=vce_api.add_messages_to_queue)
    assert simulation_queue.mirrored(vce_api) == simulation_queue.MIRRORED
    assert install({VCE_API: runtime}) is True
    assert runtime.add_messages_to_queue is simulation_queue.add_messages_to_queue
    assert install({VCE_API: runtime}) is True  # already swapped


def test_the_pause_is_short_after_a_quick_scan_and_bounded_by_flowers():
    assert simulation_queue.pause(0.0001) == simulation_queue.MIN_PAUSE
    assert simulation_queue.pause(0.009) == pytest.approx(0.081)  # 10,000 nodes: lock <= 1/10
    assert simulation_queue.pause(1.0) == simulation_queue.FLOWER_PAUSE
