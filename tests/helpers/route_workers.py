"""A runner's route worker, for the tests that recycle it: a real worker (this venv's
interpreter as a route, so the CPU EP runs in a subprocess) and what its limit must be."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from typing import Any

from orchestrator.ort.sessions import ResolvedRoute
from stages.ort_runner import RECYCLE_HEADROOM_FRACTION, RECYCLE_HEADROOM_MIN

WORKER = ResolvedRoute("worker", "interpreter", sys.executable)


def stream(runner: Any, rid: str, *items: Any) -> list[Any]:
    """Every output of one request of ``items``."""

    async def inputs() -> AsyncIterator[Any]:
        for item in items:
            yield item

    async def main() -> list[Any]:
        return [x async for x in runner.stream(rid, inputs())]

    return asyncio.run(main())


def assert_limited_to_its_budget(runner: Any) -> None:
    """The worker is recycled before it could pass the stage's budget: the headroom below it;
    the device actor follows the worker's pid."""
    budget = runner.plan.budget_bytes()
    host = runner._host
    assert host is not None and not host.in_process
    assert host.recycle_limit == budget - max(
        RECYCLE_HEADROOM_MIN, int(RECYCLE_HEADROOM_FRACTION * budget)
    )
    assert 0 < runner.load_info["worker_recycle_limit_bytes"] == host.recycle_limit < budget
    assert runner.process_ids()[0] == host.pid
