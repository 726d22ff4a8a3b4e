"""The vad runner on the CPU EP in this process: speech the Piper voice said, with silence
around and between, comes back as one audio item per utterance at the input's own rate,
silence trimmed; the same audio fed in small pieces gives the same cuts; silence alone
is refused naming what was heard (or, asked to, gives nothing); long speech is cut at max_segment_s; a bad item names the stage.

The input is built here (the project's own voice, noise 0, digital silence between
sentences), so every bound is a property of the input, not a claim about the model."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.config import parse_config
from orchestrator.core.errors import BadRequest, StageFailed
from orchestrator.planner import plan_pipeline
from stages.base import StageRunner
from stages.registry import get_kind
from tests.helpers.speech import speak
from tests.stages.vad.test_kind import PLAIN, profile, vad_stage

pytestmark = [
    pytest.mark.ort,
    pytest.mark.skipif(
        importlib.util.find_spec("silero_vad") is None, reason="silero-vad is not installed"
    ),
]

SENTENCES = ("Please turn off the lights in the kitchen.", "The weather is nice today.")
GAPS_S = (0.8, 1.2, 0.7)
"""Silence before, between and after the two sentences."""


async def _items(*values: Any) -> AsyncIterator[Any]:
    for v in values:
        yield v


def _segments(runner: StageRunner, *items: Any, rid: str = "r1") -> list[Any]:
    async def main() -> list[Any]:
        return [x async for x in runner.stream(rid, _items(*items))]

    return asyncio.run(main())


def _make_runner(tmp_path: Path, **extra: Any) -> StageRunner:
    config = parse_config(
        {"name": "p", "stages": [vad_stage(PLAIN, **extra)]}, where="t.yaml", base_dir=tmp_path
    )
    plan = plan_pipeline(config, profile(), runtime=False)
    r = get_kind("vad").runner(plan.stage("vad"), config.stage("vad"))
    r.load()
    return r


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StageRunner]:
    r = _make_runner(tmp_path_factory.mktemp("vad"))
    yield r
    r.close()


@pytest.fixture(scope="module")
def speech() -> dict[str, Any]:
    """Silence, sentence one, silence, sentence two, silence, at Piper's 22 050 Hz."""
    said = [speak(s) for s in SENTENCES]
    rate = said[0][1]
    gap = [np.zeros(int(g * rate), dtype=np.float32) for g in GAPS_S]
    audio = np.concatenate([gap[0], said[0][0], gap[1], said[1][0], gap[2]]).astype(np.float32)
    starts = [len(gap[0]), len(gap[0]) + len(said[0][0]) + len(gap[1])]
    return {
        "audio": audio,
        "rate": rate,
        "spans": [(a, a + len(s[0])) for a, s in zip(starts, said, strict=True)],
    }


def test_each_utterance_is_one_segment_at_the_inputs_rate_silence_trimmed(
    runner: Any, speech: dict[str, Any]
) -> None:
    rate = speech["rate"]
    segments = _segments(runner, {"audio": speech["audio"], "sample_rate": rate})
    assert len(segments) == 2
    pad = int(0.1 * rate)
    for seg, (a, b) in zip(segments, speech["spans"], strict=True):
        assert (
            seg["sample_rate"] == rate
            and seg["audio"].dtype == np.float32
            and seg["audio"].ndim == 1
        )
        n = seg["audio"].size
        # the sentence, give or take its own quiet edges, plus at most a pad on each side
        assert 0.7 * (b - a) < n <= (b - a) + 2 * pad + int(0.064 * rate), (n, b - a)
    stats = runner.request_stats("r1")
    assert stats["segments"] == 2 and stats["windows"] == pytest.approx(
        speech["audio"].size / rate * 16000 / 512, abs=2
    )
    assert stats["heard_s"] == pytest.approx(speech["audio"].size / rate, abs=1e-3)
    assert stats["speech_s"] < stats["heard_s"] - 0.8 * sum(GAPS_S)  # silence trimmed


def test_small_pieces_give_the_same_cuts(runner: Any, speech: dict[str, Any]) -> None:
    rate, audio = speech["rate"], speech["audio"]
    whole = _segments(runner, {"audio": audio, "sample_rate": rate}, rid="whole")
    pieces = _segments(
        runner,
        *({"audio": audio[i : i + 3000], "sample_rate": rate} for i in range(0, audio.size, 3000)),
        rid="pieces",
    )
    assert len(pieces) == len(whole) == 2
    window = int(0.032 * rate) + 1
    for p, w in zip(pieces, whole, strict=True):
        assert abs(p["audio"].size - w["audio"].size) <= window


def test_silence_alone_is_refused_naming_what_was_heard(runner: Any) -> None:
    with pytest.raises(BadRequest) as err:
        _segments(runner, {"audio": np.zeros(48000, np.float32), "sample_rate": 16000}, rid="quiet")
    (problem,) = err.value.problems
    assert problem.where == "request (stage vad, kind vad)"
    assert (
        "no speech was heard in 3.00 s of audio" in problem.what
        and "of its 94 windows was 0.0" in problem.what
    )
    assert "speech starts at 0.5" in problem.what and "lower the stage's threshold" in problem.fix


def test_with_no_speech_nothing_silence_yields_nothing(tmp_path: Path) -> None:
    r = _make_runner(tmp_path, no_speech="nothing")
    try:
        assert (
            _segments(r, {"audio": np.zeros(48000, np.float32), "sample_rate": 16000}, rid="quiet")
            == []
        )
        assert r.request_stats("quiet") == {
            "heard_s": 3.0,
            "windows": 94,
            "segments": 0,
            "speech_s": 0.0,
        }
    finally:
        r.close()


def test_long_speech_is_cut_at_max_segment_s(tmp_path: Path, speech: dict[str, Any]) -> None:
    r = _make_runner(tmp_path, max_segment_s=1.0)
    try:
        rate = speech["rate"]
        segments = _segments(r, {"audio": speech["audio"], "sample_rate": rate})
    finally:
        r.close()
    assert len(segments) >= 3
    assert all(s["audio"].size <= rate for s in segments)


@pytest.mark.parametrize(
    ("items", "why"),
    [
        (["hello"], "a vad stage takes audio items"),
        ([{"audio": np.zeros((2, 100), np.float32), "sample_rate": 16000}], "audio must be mono"),
        (
            [
                {"audio": np.zeros(100, np.float32), "sample_rate": 16000},
                {"audio": np.zeros(100, np.float32), "sample_rate": 8000},
            ],
            "8000 Hz after 16000 Hz",
        ),
    ],
)
def test_a_bad_item_fails_the_request_naming_the_stage(
    runner: Any, items: list[Any], why: str
) -> None:
    with pytest.raises(StageFailed) as err:
        _segments(runner, *items, rid="bad")
    assert err.value.stage == "vad" and why in str(err.value)


def test_a_cancelled_request_stops_its_scoring_thread_at_the_next_block(
    runner: StageRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The work runs in a thread (``asyncio.to_thread``), which cancelling the request does not
    stop by itself: the runner sets its request's cancel flag, and the thread stops between
    blocks. ``asyncio.run`` joins the executor's threads before it returns, so what the cut
    had received by then is all the thread ever did."""
    import stages.vad.runner as vad_runner
    from stages.audio_items import RESAMPLE_BLOCK_SAMPLES

    cuts: list[Any] = []
    made = vad_runner.Cutter.__init__

    def seen(self: Any, *a: Any) -> None:
        made(self, *a)
        cuts.append(self)

    monkeypatch.setattr(vad_runner.Cutter, "__init__", seen)
    rate = 48000
    recording = (np.random.default_rng(0).standard_normal(rate * 600) * 0.01).astype(
        np.float32
    )  # 600 s, 440 blocks

    async def main() -> None:
        async def consume() -> None:
            async for _ in runner.stream("long", _items({"audio": recording, "sample_rate": rate})):
                pass

        task = asyncio.create_task(consume())
        while not (cuts and cuts[0].received):  # the thread has started on the first block
            await asyncio.sleep(0.001)
        task.cancel()
        await asyncio.wait({task})

    asyncio.run(main())
    cut = cuts[0]
    assert cut.cancel.is_set()
    assert cut.received <= recording.size // 2, (
        f"the thread went on to {cut.received} of {recording.size} samples"
    )
    assert cut.received % RESAMPLE_BLOCK_SAMPLES == 0  # it stopped between blocks
