"""The decode stage's runner on its own: vLLM in this process, streaming deltas."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from orchestrator.api import prepare_models
from orchestrator.config import load_config
from orchestrator.core.errors import StageFailed
from orchestrator.core.plan import StagePlan
from orchestrator.planner import plan_pipeline
from stages.registry import get_kind
from tests.helpers import REPO
from tests.helpers.profiles import make_profile
from tests.helpers.waiting import await_until

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


async def _prompt(prompt: Any) -> AsyncIterator[Any]:
    yield prompt


async def _collect(runner: Any, rid: str, text: Any) -> tuple[str, bool | None]:
    """The reply, and whether the engine was still decoding it when its first delta came."""
    decoding = None
    parts = []
    async for d in runner.stream(rid, _prompt(text)):
        if decoding is None:
            decoding = runner._engine.has_unfinished_requests()
        parts.append(d)
    return "".join(parts), decoding


_threads_after_load: list[int] = []
"""torch's threads once the module's runner had loaded."""


@pytest.fixture(scope="module")
def thinker() -> Iterator[tuple[Any, StagePlan]]:
    if (
        importlib.util.find_spec("vllm") is None
    ):  # not importorskip: the runner must be the one to import it
        pytest.skip("vllm is not installed")
    config = load_config(REPO / "configs/voice-assistant.yaml")
    plan = plan_pipeline(config, make_profile(), runtime=False)
    sp = plan.stage("thinker")
    assert sp.admitted and sp.device == "cpu", sp.refusals
    prepare_models(plan)
    runner = get_kind("ar_decode").runner(sp, config.stage("thinker"))
    import torch

    before = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        # the process as earlier work in it may leave it: torch's pool (and this thread's
        # OpenMP count) at 1, a new thread's OpenMP count at the machine's cores, and
        # torch.set_num_threads a no-op (a vLLM CPU worker started before replaces it); seen
        # aborting the engine's first step ("thread_num 2 vs. 1") on a 2-core machine
        torch._C.set_num_threads(1)
        mp.setattr(torch, "set_num_threads", lambda n: None)
        runner.load()
        _threads_after_load.append(torch.get_num_threads())
    yield runner, sp
    runner.close()
    torch._C.set_num_threads(before)


def test_load_runs_the_engine_in_process_with_the_plans_kwargs(
    thinker: tuple[Any, StagePlan],
) -> None:
    runner, sp = thinker
    info = runner.load_info
    # the plan's threads where it plans them, whatever the process had done to torch before
    assert _threads_after_load == [sp.cpu_threads or 1]
    assert info["in_process"] and info["model_dir"].endswith("SmolLM2-135M-Instruct.Q4_1-bfloat16")
    cfg = runner._engine.vllm_config
    assert cfg.cache_config.kv_cache_memory_bytes == sp.engine_kwargs["kv_cache_memory_bytes"]
    assert cfg.model_config.max_model_len == sp.engine_kwargs["max_model_len"]
    assert cfg.scheduler_config.max_num_seqs == sp.engine_kwargs["max_num_seqs"]


def test_streams_text_deltas_with_the_chat_template_and_sampling(
    thinker: tuple[Any, StagePlan],
) -> None:
    runner, _ = thinker
    asyncio.run(_collect(runner, "one", "Tell me one fact about the Moon."))
    stats = runner.request_stats("one")
    # Any reply ends on end-of-sequence or at the config's sampling.max_tokens;
    # which one, and how long it is, is the model's business.
    assert 1 <= stats["tokens"] <= 96 and stats["finish_reason"] in ("stop", "length")
    assert stats["prompt_tokens"] > 30  # system prompt + user turn through the chat template
    # A request's own sampling overrides the config's: min_tokens = max_tokens fixes
    # the length, so there is a decode rate to read whatever the model says.
    _, decoding = asyncio.run(
        _collect(
            runner, "fixed", {"prompt": "Hi.", "sampling": {"min_tokens": 20, "max_tokens": 20}}
        )
    )
    fixed = runner.request_stats("fixed")
    assert (fixed["tokens"], fixed["finish_reason"]) == (20, "length")
    # streamed: the first delta came while the engine still had 19 tokens to decode (an order,
    # not a speed), and the rate is there to read
    assert decoding is True
    assert fixed["decode_tokens_per_s"] > 0


def test_concurrent_requests_and_an_early_abort(thinker: tuple[Any, StagePlan]) -> None:
    runner, _ = thinker

    def fixed(prompt: str, n: int) -> dict[str, Any]:
        return {"prompt": prompt, "sampling": {"min_tokens": n, "max_tokens": n}}

    async def main() -> bool:
        await asyncio.gather(
            _collect(runner, "a", fixed("Name three colors.", 10)),
            _collect(runner, "b", fixed("What is two plus two?", 30)),
        )
        # Without the abort this request would run to exactly 96 tokens.
        gen = runner.stream("c", _prompt(fixed("Count from one to one hundred.", 96)))
        async for _ in gen:
            break
        await gen.aclose()
        await await_until(
            lambda: not runner._engine.has_unfinished_requests(), "the engine without requests"
        )
        return True

    assert asyncio.run(main())
    # Each request got its own length: the two ran as their own vLLM requests.
    assert runner.request_stats("a")["tokens"] == 10 and runner.request_stats("b")["tokens"] == 30
    # the aborted request left the engine before its end: min_tokens = 96 leaves it no other way
    assert runner.request_stats("c")["tokens"] < 96


def test_measured_peak_is_within_the_plans_budget(thinker: tuple[Any, StagePlan]) -> None:
    runner, sp = thinker
    peak, budget = runner.measured_peak_bytes(), sp.budget_bytes()
    assert peak is not None and 0.25 * 2**30 < peak <= budget
    # That the budget is not loose (budget / peak <= 1.5) needs a process that had not imported
    # torch before the load, which this module cannot promise (an earlier test may have): the
    # device actor is one, and tests/orchestrator/runtime/test_voice_pipeline.py asserts it there.


def test_an_engine_vllm_refuses_is_a_stage_failure(thinker: tuple[Any, StagePlan]) -> None:
    _, sp = thinker
    config = load_config(REPO / "configs/voice-assistant.yaml")
    bad = StagePlan.from_dict(
        {**sp.to_dict(), "engine_kwargs": {**sp.engine_kwargs, "kv_cache_memory_bytes": 4096}}
    )
    runner = get_kind("ar_decode").runner(bad, config.stage("thinker"))
    with pytest.raises(StageFailed) as info:
        runner.load()
    assert (
        info.value.stage == "thinker"
        and "vLLM engine did not start: ValueError" in info.value.cause
    )
    runner.close()


def test_a_reply_left_at_the_configs_max_tokens_takes_what_the_prompt_leaves() -> None:
    """``max_tokens`` written up to the context (an imported vLLM-Omni deploy file: 2047 of 2048)
    means "as long as the context allows", as vLLM's server reads a missing ``max_tokens``; a
    ``max_tokens`` the request asked for itself is never shortened, and a prompt that leaves
    no room is refused."""
    from types import SimpleNamespace

    from orchestrator.core.errors import BadRequest
    from stages.ar_decode.prompt import check_length

    stage = SimpleNamespace(max_model_len=2048, sampling=SimpleNamespace(max_tokens=2047))
    sampling = {"max_tokens": 2047, "min_tokens": 0}
    check_length(stage, 48, sampling)
    assert sampling["max_tokens"] == 2000
    asked = {"max_tokens": 2010, "min_tokens": 0}
    with pytest.raises(BadRequest, match="over the stage's max_model_len of 2048"):
        check_length(stage, 48, asked)
    assert asked["max_tokens"] == 2010
    with pytest.raises(BadRequest, match="over the stage's max_model_len of 2048"):
        check_length(stage, 2048, {"max_tokens": 2047, "min_tokens": 0})
    with pytest.raises(BadRequest):  # min_tokens cannot be met in the room left
        check_length(stage, 2000, {"max_tokens": 2047, "min_tokens": 64})
