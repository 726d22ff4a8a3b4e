"""The vad's route worker is recycled at its budget like the voice's
(tests/orchestrator/ort/test_worker_recycle.py), between items, never in the middle of
one: an item's windows carry the graph's state from call to call (``OrtRunner._unit``).

Once the limit is checked against the budget it is set to one byte, so the worker is
over it whenever it is asked: a recycle per call would be one per window scored.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from orchestrator.config import parse_config
from orchestrator.planner import plan_pipeline
from stages.registry import get_kind
from stages.vad.runner import VadRunner
from tests.helpers.route_workers import WORKER, assert_limited_to_its_budget, stream
from tests.helpers.speech import speak
from tests.stages.vad.test_kind import PLAIN, profile, vad_stage

pytestmark = [
    pytest.mark.ort,
    pytest.mark.skipif(
        importlib.util.find_spec("silero_vad") is None, reason="silero-vad is not installed"
    ),
]

SENTENCES = ("Please turn off the lights in the kitchen.", "The weather is nice today.")


def test_the_vads_worker_is_recycled_at_its_budget_between_items_with_the_same_cuts(
    tmp_path: Path,
) -> None:
    config = parse_config(
        {"name": "p", "stages": [vad_stage(PLAIN)]}, where="t.yaml", base_dir=tmp_path
    )
    plan = plan_pipeline(config, profile(), runtime=False)
    runner = VadRunner(plan.stage("vad"), get_kind("vad").artifact(config.stage("vad")), WORKER)  # type: ignore[attr-defined]
    said = [speak(s) for s in SENTENCES]
    rate = said[0][1]
    gap = np.zeros(rate, dtype=np.float32)
    item = {
        "audio": np.concatenate([gap, said[0][0], gap, said[1][0], gap]).astype(np.float32),
        "sample_rate": rate,
    }
    runner.load()
    try:
        assert_limited_to_its_budget(runner)
        first = stream(runner, "r0", item)
        pid0 = runner.process_ids()[0]
        assert runner.request_stats("r0")["worker_recycles"] == 0
        runner._host.recycle_limit = 1
        again = stream(runner, "r1", item)
        stats = runner.request_stats("r1")
        # recycled before the item's windows and before the end's (the last partial window),
        # never between the hundreds of windows in between
        assert stats["windows"] > 100 and stats["worker_recycles"] == 2
        assert runner.process_ids()[0] == runner._host.pid != pid0
        # the state went on from window to window in one worker: the same cuts
        assert len(again) == len(first) == 2
        assert all(
            np.array_equal(a["audio"], b["audio"]) for a, b in zip(again, first, strict=True)
        )
    finally:
        runner.close()
