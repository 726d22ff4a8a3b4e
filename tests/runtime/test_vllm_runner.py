"""The decode stage's runner on its own: vLLM in this process, streaming deltas."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from orchestrator.config import load_config
from orchestrator.errors import StageFailed
from orchestrator.pipeline import prepare_models
from orchestrator.plan import StagePlan
from orchestrator.planner import plan_pipeline
from stages.registry import get_kind
from tests.conftest import REPO, make_profile

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


async def _prompt(text: str) -> AsyncIterator[Any]:
    yield text


async def _collect(runner: Any, rid: str, text: str) -> tuple[str, float]:
    t0 = time.perf_counter()
    first = None
    parts = []
    async for d in runner.stream(rid, _prompt(text)):
        first = first if first is not None else time.perf_counter() - t0
        parts.append(d)
    return "".join(parts), first or 0.0


@pytest.fixture(scope="module")
def thinker() -> Iterator[tuple[Any, StagePlan]]:
    if importlib.util.find_spec("vllm") is None:  # not importorskip: the runner must be the one to import it
        pytest.skip("vllm is not installed")
    config = load_config(REPO / "configs/voice-assistant.yaml")
    plan = plan_pipeline(config, make_profile(), runtime=False)
    sp = plan.stage("thinker")
    assert sp.admitted and sp.device == "cpu", sp.refusals
    prepare_models(plan)
    runner = get_kind("ar_decode").runner(sp, config.stage("thinker"))
    runner.fresh_process = "torch" not in sys.modules  # type: ignore[attr-defined]
    runner.load()
    yield runner, sp
    runner.close()


def test_load_runs_the_engine_in_process_with_the_plans_kwargs(thinker: tuple[Any, StagePlan]) -> None:
    runner, sp = thinker
    info = runner.load_info
    assert info["in_process"] and info["model_dir"].endswith("SmolLM2-135M-Instruct.Q4_1-bfloat16")
    cfg = runner._engine.vllm_config
    assert cfg.cache_config.kv_cache_memory_bytes == sp.engine_kwargs["kv_cache_memory_bytes"]
    assert cfg.model_config.max_model_len == sp.engine_kwargs["max_model_len"]
    assert cfg.scheduler_config.max_num_seqs == sp.engine_kwargs["max_num_seqs"]


def test_streams_text_deltas_with_the_chat_template_and_sampling(thinker: tuple[Any, StagePlan]) -> None:
    runner, _ = thinker
    text, first = asyncio.run(_collect(runner, "one", "Tell me one fact about the Moon."))
    stats = runner.request_stats("one")
    assert text.strip() and "<|im_" not in text
    assert 0 < stats["tokens"] <= 96  # sampling.max_tokens in the config
    assert stats["prompt_tokens"] > 30  # system prompt + user turn through the chat template
    assert first < 2.0 and stats["decode_tokens_per_s"] > 3


def test_concurrent_requests_and_an_early_abort(thinker: tuple[Any, StagePlan]) -> None:
    runner, _ = thinker

    async def main() -> tuple[list[tuple[str, float]], bool]:
        both = await asyncio.gather(_collect(runner, "a", "Name three colors."), _collect(runner, "b", "What is two plus two?"))
        gen = runner.stream("c", _prompt("Count from one to one hundred."))
        async for _ in gen:
            break
        await gen.aclose()
        await asyncio.sleep(0.3)
        return both, runner._engine.has_unfinished_requests()

    both, unfinished = asyncio.run(main())
    assert all(t.strip() for t, _ in both) and both[0][0] != both[1][0]
    assert not unfinished  # the aborted request left the engine
    assert runner.request_stats("c")["tokens"] < 96


def test_measured_peak_is_within_the_plans_budget(thinker: tuple[Any, StagePlan]) -> None:
    runner, sp = thinker
    peak, budget = runner.measured_peak_bytes(), sp.budget_bytes()
    assert peak is not None and 0.25 * 2**30 < peak <= budget
    if runner.fresh_process:  # torch imported by an earlier test is not this stage's memory
        assert budget / peak <= 1.5


def test_an_engine_vllm_refuses_is_a_stage_failure(thinker: tuple[Any, StagePlan]) -> None:
    _, sp = thinker
    config = load_config(REPO / "configs/voice-assistant.yaml")
    bad = StagePlan.from_dict({**sp.to_dict(), "engine_kwargs": {**sp.engine_kwargs, "kv_cache_memory_bytes": 4096}})
    runner = get_kind("ar_decode").runner(bad, config.stage("thinker"))
    with pytest.raises(StageFailed) as info:
        runner.load()
    assert info.value.stage == "thinker" and "vLLM engine did not start: ValueError" in info.value.cause
    runner.close()
