"""How `make test` hands tests to its pytest-xdist workers (`--dist loadgroup`, conftest.py).

A unit of work is an `xdist_group`'s tests (they share a federation started once, on the worker
that runs them: tests/e2e.py) or one test. pytest-xdist 3.8 groups by appending `@<group>` to
each test's id, which pytest 9 ignores (an id is no longer an attribute it reads back), so its
`loadgroup` hands a group's tests to any worker. Here the workers tell the controller each e2e
test's unit in a file (`UNITS_ENV`), written as they finish collecting.

The workers order the collection: e2e units first, longest first (their markers' `seconds`
summed), then the `slow` in-process tests, then the rest. Units are handed out in that order,
one at a time, to the worker that asks: a worker asks when it holds at most one test that has
not finished (xdist runs a test only once the worker holds the one after it, to plan the
fixtures' teardown). A worker busy with an e2e test gets the last unit in the queue instead,
a short one, so that no long unit waits behind another long one while a worker is free.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

UNITS_ENV = "OVALP_TEST_UNITS"  # the file where workers write {e2e test id: its unit}


def write_units(units: dict[str, str], path: Path) -> None:
    """Whole or not at all: every worker writes the same content, the controller reads it."""
    staged = path.with_name(f"{path.name}.{os.getpid()}")
    staged.write_text(json.dumps(units))
    staged.replace(path)


class LongestFirst(LoadScopeScheduling):
    """Units of `units_file` (a test not in it is a unit of its own), in the collection's
    order, handed out one at a time."""

    def __init__(self, config, log=None, units_file: Path | None = None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # the workers' order, not by unit size
        self.units_file = units_file
        self._units: dict[str, str] | None = None

    @property
    def units(self) -> dict[str, str]:
        """Read once every worker has collected (the scheduler's first use of a test id)."""
        if self._units is None:
            exists = self.units_file is not None and self.units_file.exists()
            self._units = json.loads(self.units_file.read_text()) if exists else {}
        return self._units

    def _split_scope(self, nodeid: str) -> str:
        return self.units.get(nodeid, nodeid)

    def _reschedule(self, node) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        unfinished = [nodeid for unit in self.assigned_work[node].values()
                      for nodeid, done in unit.items() if not done]
        if len(unfinished) > 1:
            return
        self._assign(node, shortest=any(nodeid in self.units for nodeid in unfinished))

    def _assign(self, node, shortest: bool) -> None:
        """Hand `node` the first unit in the queue, or the last one (`shortest`)."""
        scope, unit = self.workqueue.popitem(last=shortest)
        self.assigned_work[node][scope] = unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in unit.items()
                                if not done])
