"""An ONNX Runtime stage lends its planned CPU threads while idle and takes them back for every
session call (``stages.cpu_share``): what a decoder on the same CPU may borrow is read inside the
route worker's call and between calls, so the order is the calls' own, not a timing."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.ort.sessions import ResolvedRoute, WorkerSessions
from stages import cpu_share
from stages.exported_graph.kind import ExportedGraphKind
from stages.exported_graph.runner import ExportedGraphRunner
from tests.helpers.graphs import K, write_artifact
from tests.stages.exported_graph.test_warmup import _plan, _request

pytestmark = [pytest.mark.ort]


def test_a_session_call_takes_the_stages_threads_back_and_close_stops_the_lending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planned, stage = _plan(tmp_path, write_artifact(tmp_path / "full", "full"), "tensor")
    stage_plan = replace(planned, cpu_threads=1)  # as the plan splits a CPU's cores
    assert stage_plan.device == "cpu"
    seen: list[int] = []
    run = WorkerSessions.run

    def spy(self: WorkerSessions, *args: Any, **kwargs: Any) -> Any:
        seen.append(cpu_share.lent_threads("cpu", "thinker"))
        return run(self, *args, **kwargs)

    monkeypatch.setattr(WorkerSessions, "run", spy)
    runner = ExportedGraphRunner(
        stage_plan,
        ExportedGraphKind().artifact(stage),
        ResolvedRoute("worker", "interpreter", sys.executable),
    )
    runner.load()
    try:
        assert seen == [0]  # the warm-up computed on the stage's own threads
        assert cpu_share.lent_threads("cpu", "thinker") == stage_plan.cpu_threads  # idle: lent
        assert cpu_share.lent_threads("gpu:0", "thinker") == 0  # to its own device only
        _request(runner, "r1", {"x": np.ones((2, K), np.float32)})
        assert seen == [0, 0]
        assert cpu_share.lent_threads("cpu", "thinker") == stage_plan.cpu_threads
    finally:
        runner.close()
    assert cpu_share.lent_threads("cpu", "thinker") == 0  # closed: nothing left to lend
