"""The threaded engine base: a stream closed early returns only once the engine has let go of
its request, so the request that comes next never queues behind a cancelled one's last step.

The engine here is slow by construction: its step holds the request until the test opens a gate,
and only then reads the request's ``cancel``, the way a generation's stopping check does."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from stages.ar_decode.engines import threaded
from stages.ar_decode.engines.threaded import EngineRequest, ThreadedEngineRunner


class _GatedRunner(ThreadedEngineRunner):
    """One token, then a step that lasts until ``gate`` opens; the cancel is read after it."""

    title = "gated"
    stopped = "its gated engine stopped"

    def __init__(self) -> None:
        super().__init__(SimpleNamespace(name="decode", device="cpu"), SimpleNamespace())  # type: ignore[arg-type]
        self.gate = threading.Event()
        self.in_step = threading.Event()
        self.generating = False

    def load(self) -> None:
        self._started()

    def _ready(self) -> bool:
        return self._thread is not None

    async def _accept(
        self, request_id: str, inputs: AsyncIterator[Any]
    ) -> tuple[EngineRequest, tuple[Any, ...]]:
        req = self._new_request(request_id)
        return req, ("add", req)

    def _serve_engine(self) -> None:
        while True:
            for cmd in self._take(block=True):
                if cmd[0] == "stop":
                    return
                if cmd[0] == "add":
                    self._generate(cmd[1])

    def _generate(self, req: EngineRequest) -> None:
        self.generating = True
        req.produced()
        req.put("first")
        self.in_step.set()
        self.gate.wait(30)  # the step in flight: the cancel is not seen before it ends
        self.generating = False
        req.end("abort" if req.cancel.is_set() else "stop")


async def _nothing() -> AsyncIterator[Any]:
    return
    yield


def test_a_stream_closed_early_ends_once_the_engine_has_let_go_of_the_request() -> None:
    runner = _GatedRunner()
    runner.load()

    async def main() -> None:
        stream = runner.stream("r1", _nothing())
        assert await stream.__anext__() == "first"
        assert runner.in_step.wait(10)
        closing = asyncio.create_task(stream.aclose())
        for _ in range(20):
            await asyncio.sleep(0.01)
        # the engine is still in its step: the stream has not ended, the engine holds the request
        assert not closing.done() and runner.generating
        runner.gate.set()
        await asyncio.wait_for(closing, 10)
        # closed: the engine works on it no more, and the request says it was aborted
        assert not runner.generating
        assert runner.request_stats("r1")["finish_reason"] == "abort"

    try:
        asyncio.run(main())
    finally:
        runner.gate.set()
        runner.close()


def test_an_engine_that_never_lets_go_holds_the_stream_only_release_wait_s(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(threaded, "RELEASE_WAIT_S", 0.2)
    runner = _GatedRunner()
    runner.load()

    async def main() -> None:
        stream = runner.stream("r1", _nothing())
        assert await stream.__anext__() == "first"
        await asyncio.wait_for(stream.aclose(), 10)  # the gate stays shut: the wait gives up

    try:
        with caplog.at_level(logging.WARNING, logger=threaded.__name__):
            asyncio.run(main())
        assert runner.generating  # still in its step: the stream ended anyway, and said so
        assert "the engine still held request r1 0 s after its abort" in caplog.text
    finally:
        runner.gate.set()
        runner.close()
