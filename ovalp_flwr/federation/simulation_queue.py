"""Flower's simulation runtime hands messages to virtual SuperNodes in one scan per pass.

Flower's simulation runtime (flwr 1.41 and 1.42, `vce_api.add_messages_to_queue`) polls its in-memory
state every 0.1 s with `get_message_ins(node_id, limit=1)` for every virtual node, and each
call scans every message the state holds: a pass costs nodes x messages (10,000 nodes and a
10% round: 10^7 message checks every 0.1 s; `benchmarks/simulation_queue.py` times it), under
the state's lock, so the ServerApp's pushes and pulls and the runtime's replies wait for it. `install` swaps that loop, in the process that
runs the simulation, for one that hands out the same messages (at most one per node per pass,
the oldest first, marked delivered, expired or foreign ones dropped by the state's own check)
from one scan of the state per pass: messages, not nodes x messages.

Installed when the ClientApp is loaded (`client_app.py`): the simulation runtime loads it, and
starts the loop after that. Elsewhere (a Ray worker, a SuperNode's ClientApp process, a test)
the runtime's module is not loaded and nothing changes. A Flower whose loop or state is not the
one this was written against keeps its own loop (`compatible`): the source of the three
functions this mirrors is compared with theirs in the releases it was checked on, so a later
Flower that leaves them as they are gets the swap, and one that changes them does not.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
import threading
import time
from collections.abc import Callable
from queue import Queue
from typing import Any

VCE_API = "flwr.server.superlink.fleet.vce.vce_api"
# sha256 of the source of what `undelivered` mirrors, as in the Flower releases it was checked
# against (1.41.0 and 1.42.0: the same): the runtime's loop, the state's per-node read and its check
MIRRORED = {
    "add_messages_to_queue": "953f4bd41a931a77",
    "InMemoryLinkState.get_message_ins": "6547c8dcbc62e12f",
    "InMemoryLinkState._check_stored_messages": "2be47567d2478a58",
}
FLOWER_PAUSE = 0.1  # s between Flower's passes (vce_api.py:180)
MIN_PAUSE = 0.01  # s between ours, when a scan is quick


def undelivered(state: Any, node_ids: set[int]) -> list:
    """What one pass of Flower's loop hands out, from one scan: for each of `node_ids`, its
    oldest message not yet delivered, now marked delivered. The state's own check first drops
    expired messages and messages between nodes no longer in one federation, as
    `get_message_ins` does message by message."""
    from flwr.supercore.date import now  # late: only the simulation's process gets here

    with state.lock:
        ids = list(state.message_ins_store)
        state._check_stored_messages(set(ids))  # pylint: disable=protected-access
        found, served = [], set()
        for message_id in ids:
            message = state.message_ins_store.get(message_id)
            if message is None or message.metadata.delivered_at != "":
                continue
            node = message.metadata.dst_node_id
            if node in node_ids and node not in served:
                found.append(message)
                served.add(node)
        delivered_at = now().isoformat()
        for message in found:
            message.metadata.delivered_at = delivered_at
    return found


def add_messages_to_queue(state: Any, queue: Queue, nodes_mapping: dict[int, int],
                          f_stop: threading.Event) -> None:
    """`vce_api.add_messages_to_queue` with one scan of the state per pass, and a pause after
    it of `pause(scan seconds)` instead of Flower's 0.1 s: a round's messages wait 0.01 s, not
    up to 0.1 s, to be handed out, and the scan still holds the state's lock a tenth of the
    time at most (10,000 nodes, 1,000 messages in flight: a 9 ms scan, then 90 ms)."""
    node_ids = set(nodes_mapping)
    while not f_stop.is_set():
        started = time.perf_counter()
        for message in undelivered(state, node_ids):
            queue.put(message)
        f_stop.wait(pause(time.perf_counter() - started))


def pause(scan_seconds: float) -> float:
    """Seconds to wait after a scan that took `scan_seconds`: MIN_PAUSE, or nine times the scan
    (the lock held at most a tenth of the time), at most Flower's 0.1 s."""
    return min(FLOWER_PAUSE, max(MIN_PAUSE, 9 * scan_seconds))


def fingerprint(function: Callable) -> str:
    """The first 16 hex digits of the sha256 of `function`'s source ("" without one)."""
    try:
        return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]
    except (OSError, TypeError):
        return ""


def mirrored(vce_api: Any) -> dict[str, str]:
    """The fingerprints of what `undelivered` mirrors in this runtime and its state."""
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState  # late: as above

    return {name: fingerprint(getattr(InMemoryLinkState, name.split(".")[1], None)
                              if name.startswith("InMemoryLinkState.")
                              else getattr(vce_api, name, None))
            for name in MIRRORED}


def compatible(vce_api: Any) -> bool:
    """The runtime's loop and its state's reads are the ones `undelivered` mirrors, line for
    line (`MIRRORED`), whatever Flower's version number says."""
    return mirrored(vce_api) == MIRRORED


def install(modules: dict[str, Any] | None = None) -> bool:
    """Swap the simulation runtime's loop for `add_messages_to_queue`, if that runtime is
    loaded in this process and compatible; True if it was swapped (or already was)."""
    vce_api = (sys.modules if modules is None else modules).get(VCE_API)
    if vce_api is None:
        return False
    if vce_api.add_messages_to_queue is add_messages_to_queue:
        return True
    if not compatible(vce_api):
        return False
    vce_api.add_messages_to_queue = add_messages_to_queue
    return True
