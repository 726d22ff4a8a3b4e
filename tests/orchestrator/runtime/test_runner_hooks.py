"""What the device actor reads of a runner is declared on ``StageRunner`` with defaults, not
probed for: a runner that declares nothing is measured by the processes its load started
(``process_ids()`` None), has no worker figures, no request figures and is healthy; an ONNX
Runtime runner whose sessions are in this process says its work runs here (``[]``) and has no
worker to recycle (the device actor read ``getattr(runner, "_host")`` for this before)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from orchestrator.core.plan import StagePlan
from orchestrator.ort.sessions import open_sessions, this_process
from orchestrator.runtime.metering import runner_processes, summarize, worker_stats
from stages.base import StageRunner
from stages.ort_runner import OrtRunner


class Bare(StageRunner):
    def load(self) -> None:
        pass

    async def stream(self, request_id: str, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for item in inputs:
            yield item


def test_a_runner_that_declares_nothing_gets_the_defaults() -> None:
    runner = Bare()
    assert runner_processes(runner) is None  # unknown: the actor measures what the load started
    assert worker_stats(runner) is None
    assert runner.request_stats("r1") == {} and runner.health() is None
    assert summarize(runner.load_info) == {}


class InProcess(OrtRunner, Bare):
    def load(self) -> None:
        self._host = open_sessions(self.route)


def test_an_onnx_runtime_runner_in_this_process_says_its_work_runs_here() -> None:
    pytest.importorskip("onnxruntime")
    runner = InProcess(
        StagePlan(
            name="s",
            kind="exported_graph",
            admitted=True,
            device="cpu",
            backend="ort-cpu",
            route="this-process",
            reservations=(),
            refusals=(),
            engine_kwargs={},
            artifact={},
        ),
        this_process(),
    )
    runner.load()
    try:
        assert runner._host.in_process
        assert runner_processes(runner) == [] and worker_stats(runner) is None
        assert runner.request_stats("r1") == {} and runner.health() is None
    finally:
        runner.close()
