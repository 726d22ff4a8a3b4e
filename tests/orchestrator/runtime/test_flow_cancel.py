"""A cancelled flow's wait for the actors' answers to ``cancel`` (``flow.RequestFlow._cancelled``):
it ends once every answer came, failures included, and an actor that never answers holds it
no longer than its bound, with a warning. The actors' answers are stood in for by futures:
what a Ray object ref is to ``asyncio``. A real cancel's answer is awaited in
tests/orchestrator/server/test_server.py (a client that goes away)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest

from orchestrator.runtime import flow
from tests.helpers.waiting import NEVER_HANGS_S


def test_the_wait_ends_once_every_actor_answered_failures_included(
    caplog: pytest.LogCaptureFixture,
) -> None:
    order: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        answered, died = loop.create_future(), loop.create_future()
        waiting = asyncio.create_task(
            flow.RequestFlow._cancelled(SimpleNamespace(rid="r1"), [answered, died])  # type: ignore[arg-type]
        )
        await asyncio.sleep(0)
        answered.set_result(2)
        await asyncio.sleep(0)
        order.append("one answered" if not waiting.done() else "ended early")
        died.set_exception(RuntimeError("the actor died"))  # a dead actor's answer is an error
        await waiting
        order.append("ended")

    with caplog.at_level(logging.WARNING, logger=flow.__name__):
        asyncio.run(main())
    assert order == ["one answered", "ended"]
    assert caplog.records == []


def test_an_actor_that_never_answers_holds_the_flow_only_to_its_bound(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(flow, "CANCEL_WAIT_S", 0.0)  # the bound: this plus a second

    async def main() -> None:
        never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        # an unbounded wait fails here instead of hanging the suite
        await asyncio.wait_for(
            flow.RequestFlow._cancelled(SimpleNamespace(rid="r1"), [never]),  # type: ignore[arg-type]
            NEVER_HANGS_S,
        )

    with caplog.at_level(logging.WARNING, logger=flow.__name__):
        asyncio.run(main())
    assert [r.getMessage() for r in caplog.records] == [
        "request r1: an actor did not answer its cancel within 1 s"
    ]
