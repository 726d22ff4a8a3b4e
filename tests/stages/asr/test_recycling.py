"""The asr's route worker is recycled at its budget like the voice's
(tests/orchestrator/ort/test_worker_recycle.py) once that budget is calibrated, between
windows, never in the middle of a decode: a window's encoder run and every decoder step
of it, whose cache is fed back from step to step, run in one worker (``OrtRunner._unit``).
At an estimate it is not (``AsrRunner.recycles_at_estimate``): the estimate sits below
one window's work, and the worker would be replaced before every window.

Once the limit is checked against the budget it is set to one byte, so the worker is
over it whenever it is asked: a recycle per call would be one per token decoded.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from orchestrator.config import parse_config
from orchestrator.planner import plan_pipeline
from stages.asr.runner import AsrRunner
from stages.registry import get_kind
from tests.helpers.route_workers import WORKER, assert_limited_to_its_budget, stream
from tests.helpers.speech import speak
from tests.stages.asr.test_kind import asr_stage, profile

pytestmark = [pytest.mark.slow, pytest.mark.ort]

SENTENCES = ("Please turn off the lights in the kitchen.", "The weather is nice today.")
CALIBRATED = {"match": "exact", "evidence": "M", "provenance": "this test"}
"""What the store writes into a calibrated stage's plan (only its presence matters here)."""


def test_the_asrs_worker_is_recycled_at_a_calibrated_budget_between_windows_never_mid_decode(
    whisper_graphs: dict[str, Path], tmp_path: Path
) -> None:
    config = parse_config(
        {"name": "p", "stages": [asr_stage(whisper_graphs)]}, where="t.yaml", base_dir=tmp_path
    )
    estimated = plan_pipeline(config, profile(), runtime=False).stage("asr")
    artifacts = get_kind("asr").artifacts(config.stage("asr"))  # type: ignore[attr-defined]
    at_estimate = AsrRunner(estimated, artifacts, WORKER)
    at_estimate.load()
    try:  # planned from metadata alone: no limit, so no worker figures for calibration to misread
        assert at_estimate._host.recycle_limit is None and at_estimate.worker_stats() is None
        assert "worker_recycle_limit_bytes" not in at_estimate.load_info
    finally:
        at_estimate.close()

    runner = AsrRunner(dataclasses.replace(estimated, calibration=CALIBRATED), artifacts, WORKER)
    items = [{"audio": a, "sample_rate": r} for a, r in (speak(s) for s in SENTENCES)]
    runner.load()
    try:
        assert_limited_to_its_budget(runner)
        # measured, never reached: this plan's budget is the estimate's (528 MiB on the CPU EP),
        # below what a worker holds after one 30 s window (~760 MiB here)
        runner._host.recycle_limit = 1 << 50
        first = stream(runner, "r0", *items)
        pid0 = runner.process_ids()[0]
        assert runner.request_stats("r0")["worker_recycles"] == 0
        runner._host.recycle_limit = 1
        calls = runner._host.calls
        again = stream(runner, "r1", *items)
        # one recycle before each item's one window, none between its decoder steps
        assert runner.request_stats("r1")["worker_recycles"] == 2
        assert (
            runner._host.calls - calls >= 2 * 5
        )  # an encoder run and at least four steps a sentence
        assert runner.process_ids()[0] == runner._host.pid != pid0
        assert again == first  # the cache went on from step to step in one worker: the same tokens
    finally:
        runner.close()
