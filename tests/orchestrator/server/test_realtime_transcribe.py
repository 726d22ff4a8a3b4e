"""A realtime session's transcript passes (``orchestrator/server/realtime_transcribe.py``):

* a pause that begins under a running partial pass stops it (dropped), and the pause's closing
  pass runs at once instead of after it;
* a pass started where the audio turned quiet after speech is the closing pass of a pause that
  begins in that quiet: nothing more is run, and the transcript is ready as the pause is heard;
  speech after it (a loud frame past its audio) makes the pause run a closing pass of its own.

Stand-ins for the session and the VAD's segment (the pass scheduling is what is under test);
the "Whisper" is a stand-in whose partial pass would run forever unless stopped, so the test
holds on any machine: without the stop it times out, with it the closing pass follows."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from orchestrator.server.realtime_transcribe import STEP_S, Transcriber
from stages.audio_items import Cancelled
from tests.helpers.waiting import NEVER_HANGS_S

RATE = 16000


@dataclass
class Segmenter:
    """The open segment as the transcriber reads it."""

    heard: int
    span: tuple[int, int] | None = None
    open_start: int | None = 0

    @property
    def open_speech(self) -> int:
        return self.heard

    def pause_span(self) -> tuple[int, int] | None:
        return self.span


@dataclass
class Cutter:
    segmenter: Segmenter
    runner: Any = field(default_factory=lambda: type("R", (), {"rate": RATE})())
    loud: int = 0
    """Samples of loud audio from the start (the rest is silence)."""

    @property
    def graph_samples(self) -> int:
        return self.segmenter.heard

    def audio(self, start: int, end: int) -> dict[str, Any]:
        audio = np.zeros(end - start, np.float32)
        audio[: max(min(self.loud, end) - start, 0)] = 0.3
        return {"audio": audio, "sample_rate": RATE}


class Whisper:
    """The first pass (a partial one) runs until its stop is set (``block_first``); every other
    answers at once."""

    def __init__(self, block_first: bool = True) -> None:
        self.block_first = block_first
        self.passes: list[tuple[int, threading.Event]] = []
        self.partial_started = threading.Event()

    def idle(self) -> bool:
        return True

    def transcribe(
        self, item: dict[str, Any], prefix: list[int], stop: threading.Event
    ) -> tuple[list[int], frozenset[int]]:
        self.passes.append((item["audio"].size, stop))
        if len(self.passes) == 1 and self.block_first:
            self.partial_started.set()
            if not stop.wait(NEVER_HANGS_S):
                raise AssertionError("the partial pass was never stopped")
            raise Cancelled("stopped")
        return [7, 8], frozenset({0, 1})

    def text_of(self, tokens: list[int]) -> str:
        return " ".join(f"w{t}" for t in tokens)


class Turns:
    """What the transcriber reads of ``realtime_turns.Turns``: the session, and ``on_pass``
    calling ``follow`` again, as the real one does through ``_next``."""

    def __init__(self, cutter: Cutter, block_first: bool = True) -> None:
        self.cutter = cutter
        self.sent: list[str] = []
        self.told: list[tuple[int, int] | None] = []
        whisper = Whisper(block_first)

        async def send(type_: str, **fields: Any) -> None:
            self.sent.append(fields["delta"])

        self.s = type("Session", (), {"rt": whisper, "id": "s", "send": staticmethod(send)})()
        self.transcriber = Transcriber(self)

    def upcoming_item(self) -> str:
        return "item"

    async def on_pass(self, key: tuple[int, int] | None) -> None:
        self.told.append(key)
        self.transcriber.follow(self.cutter, 1)  # type: ignore[arg-type]


def test_a_pause_under_a_running_partial_pass_stops_it_and_its_closing_pass_runs_next() -> None:
    async def main() -> None:
        seg = Segmenter(heard=int((STEP_S + 0.1) * RATE))
        turns = Turns(Cutter(seg))
        t, whisper = turns.transcriber, turns.s.rt
        t.follow(turns.cutter, 1)  # type: ignore[arg-type]  # the partial pass starts
        assert await asyncio.to_thread(whisper.partial_started.wait, NEVER_HANGS_S)
        partial = whisper.passes[0][1]
        # the VAD hears a pause: the segment it would close ends a little later
        seg.heard += RATE // 10
        seg.span = (0, seg.heard)
        t.follow(turns.cutter, 1)  # type: ignore[arg-type]
        assert partial.is_set()  # stopped at its next step, not waited for
        closing = t.later(seg.span)
        heard = await asyncio.wait_for(closing, NEVER_HANGS_S)
        assert [size for size, _ in whisper.passes] == [int((STEP_S + 0.1) * RATE), seg.heard]
        assert heard.tokens == [7, 8] and heard.text == "w7 w8"
        assert turns.told == [None, seg.span]  # the dropped pass told, then the closing one
        assert t.agreement.last == [7, 8]  # the stopped pass's (empty) result was not kept

    asyncio.run(main())


def test_a_pause_with_its_closing_pass_running_does_not_stop_it() -> None:
    """Only a partial pass is stopped: a closing pass is what the reply waits for."""

    async def main() -> None:
        seg = Segmenter(heard=RATE, span=(0, RATE))
        turns = Turns(Cutter(seg))
        t, whisper = turns.transcriber, turns.s.rt
        whisper.passes.append((0, threading.Event()))  # the blocking first pass is spent
        t.follow(turns.cutter, 1)  # type: ignore[arg-type]  # the closing pass
        t.follow(turns.cutter, 1)  # type: ignore[arg-type]  # a later append, same pause
        heard = await asyncio.wait_for(t.later(seg.span), NEVER_HANGS_S)
        assert heard.tokens == [7, 8]
        assert len(whisper.passes) == 2 and not whisper.passes[1][1].is_set()

    asyncio.run(main())


async def _settled(t: Transcriber) -> None:
    """The running pass and the tasks it started (``on_pass``) ended."""
    for _ in range(3):
        if t._task is not None:
            await asyncio.wait_for(asyncio.gather(t._task, return_exceptions=True), NEVER_HANGS_S)
        await asyncio.sleep(0)


def test_a_pass_where_the_audio_turned_quiet_is_the_closing_pass_of_the_pause_in_that_quiet() -> (
    None
):
    async def main() -> None:
        speech = int(0.8 * RATE)  # loud, then silence from 0.8 s on
        seg = Segmenter(heard=int(0.3 * RATE))
        turns = Turns(Cutter(seg, loud=speech), block_first=False)
        t, whisper = turns.transcriber, turns.s.rt
        t.follow(turns.cutter, 1)  # type: ignore[arg-type]
        assert whisper.passes == []  # speech still on, and less than a step of it
        seg.heard = speech + 4 * RATE // 100  # 40 ms of quiet after it
        t.follow(turns.cutter, 1)  # type: ignore[arg-type]
        await _settled(t)
        assert [size for size, _ in whisper.passes] == [seg.heard]  # the quiet pass
        # the VAD opens a pause later, in the same quiet
        seg.heard += RATE // 10
        seg.span = (0, seg.heard)
        t.follow(turns.cutter, 1)  # type: ignore[arg-type]
        heard = t.heard(seg.span)
        assert heard is not None and heard.tokens == [7, 8]  # ready as the pause is heard
        await _settled(t)
        assert len(whisper.passes) == 1  # no closing pass was run
        assert turns.told[-1] == seg.span  # the verdict (semantic turn detection) is asked

    asyncio.run(main())


def test_speech_after_a_quiet_pass_gives_the_pause_a_closing_pass_of_its_own() -> None:
    async def main() -> None:
        first = int(0.8 * RATE)
        seg = Segmenter(heard=first + 4 * RATE // 100)
        cutter = Cutter(seg, loud=first)
        turns = Turns(cutter, block_first=False)
        t, whisper = turns.transcriber, turns.s.rt
        t.follow(cutter, 1)  # type: ignore[arg-type]
        await _settled(t)
        assert [size for size, _ in whisper.passes] == [seg.heard]  # a quiet pass (a word gap)
        cutter.loud = int(1.0 * RATE)  # the user goes on: loud again past the pass's audio
        seg.heard = int(1.1 * RATE)
        seg.span = (0, seg.heard)
        t.follow(cutter, 1)  # type: ignore[arg-type]
        heard = await asyncio.wait_for(t.later(seg.span), NEVER_HANGS_S)
        assert [size for size, _ in whisper.passes] == [first + 4 * RATE // 100, seg.heard]
        assert heard.tokens == [7, 8]

    asyncio.run(main())
