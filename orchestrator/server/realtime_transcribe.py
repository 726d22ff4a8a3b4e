"""A realtime session's transcript while the user speaks (streaming transcription).

The pipeline's asr stage transcribes a turn once it is closed; here the server runs the same
stage's Whisper (``Realtime.asr``: its runner opened in this process, as the VAD's graph is)
on the segment the VAD has open, while it grows:

* a **partial pass** every :data:`STEP_S` of new speech decodes the segment so far, and the
  words two consecutive passes agree on are committed (``stages.asr.streaming.LocalAgreement``)
  and sent as ``conversation.item.input_audio_transcription.delta`` events (OpenAI's shape);
* a **closing pass** starts the moment the VAD hears a pause (before the pause has lasted
  anything like the turn's end): the speech before it, decoded with the committed words
  forced as its head (a partial pass still running then is stopped at its next decoder step
  and dropped: the closing pass does not wait for it). Its transcript is what the early reply
  answers and what semantic turn detection judges (``realtime_turn_end``); speech resuming
  makes it one more partial pass;
* when the pause closes the turn, the closing pass's words after the committed ones are the
  last delta, sent after ``input_audio_buffer.committed``, and the transcript is the deltas
  joined: ``…transcription.completed`` says exactly the text the deltas spelled.

Scheduling: one pass at a time per session, and passes of all sessions one at a time in the
server (one Whisper); a partial pass starts only while the pipeline has no request in flight
— the decoder and the voice keep their cores while a reply runs (an early reply included) —
and the closing pass always runs (the reply waits for it).

Guarantees: deltas of a turn are sent in order, before its ``committed`` event or right after
it, never after its ``…transcription.completed``; their concatenation is the final
transcript; a pass's result for a segment that is gone (the buffer cleared, the session
ended) is dropped.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.runtime.audio import rms_dbfs
from stages.asr.streaming import LocalAgreement
from stages.audio_items import Cancelled
from stages.vad.runner import Cutter, Segment

STEP_S = 0.5
"""Seconds of new speech between partial passes: whisper_streaming's step is 1 s; half that,
since a 1-4 s question gives only a few passes, and Whisper tiny's pass on one is ~0.1 s."""


QUIET_DB = 35.0
"""A 10 ms frame this far below the segment's loudest one is quiet."""
QUIET_FRAMES = 3
"""Quiet 10 ms frames in a row after speech that start a quiet pass (30 ms: the first appends
after the last word, about 0.1 s before the VAD's probability falls far enough to open a
pause)."""


@dataclass
class _Pass:
    """One transcript pass on the open segment."""

    kind: Literal["partial", "quiet", "closing"]
    """``partial`` (every STEP_S of speech), ``quiet`` (where the audio turned quiet) or
    ``closing`` (a pause heard)."""
    end: int
    """Where its audio ends (the VAD's sample)."""
    stop: threading.Event
    started: float
    tokens: list[int] | None = None
    """Its tokens, once it ended (not stopped)."""
    at: float = 0.0


class Level:
    """The open segment's loudness, 10 ms at a time: where its last loud frame ends."""

    def __init__(self, start: int, frame: int) -> None:
        self.frame = frame
        """Samples in 10 ms (at the VAD's rate)."""
        self.scanned = start
        """The VAD's sample up to which frames were measured."""
        self.peak = float("-inf")
        self.loud_until: int | None = None
        """The end of the last frame within ``QUIET_DB`` of the loudest (None: none yet)."""

    def add(self, db: float) -> None:
        """The next frame's loudness (dBFS; -inf for digital silence)."""
        self.scanned += self.frame
        self.peak = max(self.peak, db)
        if db > float("-inf") and db >= self.peak - QUIET_DB:
            self.loud_until = self.scanned

    def update(self, cutter: Cutter) -> None:
        """Every whole frame the cutter has heard since the last call."""
        while self.scanned + self.frame <= cutter.graph_samples:
            item = cutter.audio(self.scanned, self.scanned + self.frame)
            self.add(rms_dbfs(item["audio"]) if item is not None else float("-inf"))

    def quiet_since(self) -> int:
        """Quiet frames since the last loud one (0 before any)."""
        if self.loud_until is None:
            return 0
        return (self.scanned - self.loud_until) // self.frame


@dataclass(frozen=True)
class Heard:
    """A closing pass: the speech before one pause, transcribed."""

    tokens: list[int]
    text: str
    """The transcript the turn will have if this pause ends it (the deltas joined)."""
    started: float
    """When its pass started (``time.monotonic``): a reply's work starts here."""
    at: float
    """When it was ready."""


class Transcriber:
    """The transcript of the segment one session's cutter has open (the module's guarantees).

    ``turns`` is the session's ``realtime_turns.Turns``: its session sends the deltas, and it is
    told when a closing pass is ready (``on_heard``)."""

    def __init__(self, turns: Any) -> None:
        self.t = turns
        self.start: int | None = None
        """The open segment's start (the VAD's sample) this transcript follows."""
        self.agreement = LocalAgreement()
        self.sent = ""
        """The text of the deltas sent for this segment."""
        self._sent_n = 0
        """How many committed tokens ``sent`` spells."""
        self.covered = 0
        """Where the last pass's audio ended (the VAD's sample)."""
        self.closing: dict[tuple[int, int], Heard] = {}
        """Closing passes, by the bounds of the segment their pause would close."""
        self.unsent = ""
        """The last delta, computed when the turn closed, sent after its ``committed``."""
        self._later: dict[tuple[int, int], asyncio.Future[Heard]] = {}
        """Early replies waiting for the closing pass of their pause (``later``)."""
        self._task: asyncio.Task[None] | None = None
        self._cancel = threading.Event()
        """Set when the segment is forgotten: a pass on it stops."""
        self._running: _Pass | None = None
        """The pass running or last run on this segment."""
        self._quiet: _Pass | None = None
        """The last quiet pass on this segment (running or ended)."""
        self.level: Level | None = None

    # -- following the segment -------------------------------------------------------
    def reset(self) -> None:
        """Forget the segment (its turn closed, or the buffer was cleared): a running pass's
        result is dropped."""
        self._cancel.set()
        self._cancel = threading.Event()
        if self._running is not None:
            self._running.stop.set()
        self._task, self._running, self._quiet, self.level = None, None, None, None
        for waiting in self._later.values():
            waiting.cancel()  # its reply is dropped with the segment
        self._later = {}
        self.start, self.covered = None, 0
        self.agreement, self.sent, self._sent_n, self.closing = LocalAgreement(), "", 0, {}

    def follow(self, cutter: Cutter, min_speech: int) -> None:
        """After each append (under the session's turn lock): a pass started when one is due."""
        seg = cutter.segmenter
        if seg.open_start is None or seg.open_speech < min_speech:
            return
        rate = cutter.runner.rate
        if self.start != seg.open_start:  # a new segment (``reset`` forgets the level too)
            self.reset()
            self.start = self.covered = seg.open_start
            self.level = Level(seg.open_start, rate // 100)
        assert self.level is not None
        self.level.update(cutter)
        span = seg.pause_span()
        running = self._running if self._task is not None and not self._task.done() else None
        if span is not None:
            if span in self.closing or self._accept(span):
                return
            if running is not None:
                if running.kind == "partial" or (
                    running.kind == "quiet" and not self._holds(running)
                ):
                    running.stop.set()  # the pause's closing pass is what the reply waits for
                return
            self._run(cutter, seg.open_start, seg.heard, span)
            return
        quiet = self._quiet_due()
        if running is not None:
            if quiet and (running.kind == "partial" or not self._holds(running)):
                running.stop.set()  # a quiet pass may be the closing one: it goes first
            return
        if quiet and self.t.s.rt.idle():
            self._run(cutter, seg.open_start, self.level.scanned, None, quiet=True)
        elif (
            seg.heard - self.covered >= STEP_S * rate
            and self.t.s.rt.idle()
            and (self._quiet is None or not self._holds(self._quiet))  # no new speech since
        ):
            self._run(cutter, seg.open_start, seg.heard, None)

    def _holds(self, p: _Pass) -> bool:
        """Whether no speech came after ``p``'s audio: no loud frame past its end."""
        loud = None if self.level is None else self.level.loud_until
        return loud is not None and loud <= p.end

    def _quiet_due(self) -> bool:
        """The audio turned quiet after speech, and no quiet pass covers the speech before."""
        assert self.level is not None
        if self.level.quiet_since() < QUIET_FRAMES:
            return False
        return self._quiet is None or not self._holds(self._quiet)

    def _accept(self, span: tuple[int, int]) -> bool:
        """The pause that would close ``span`` began after a quiet pass that ended, was the
        segment's last pass and heard every loud frame: that pass is its closing pass (the
        audio it did not hear is quiet). Its transcript is ready as the pause is heard."""
        q = self._quiet
        if q is None or q.tokens is None or q is not self._running or not self._holds(q):
            return False
        now = time.monotonic()
        self._ready(span, Heard(q.tokens, self._text_after(q.tokens), q.started, max(q.at, now)))
        asyncio.get_running_loop().create_task(self.t.on_pass(span))
        return True

    def heard(self, span: tuple[int, int]) -> Heard | None:
        """The closing pass for the pause that would close ``span``, when it is ready."""
        return self.closing.get(span)

    def later(self, span: tuple[int, int]) -> asyncio.Future[Heard]:
        """The closing pass for the pause that would close ``span``, once it is ready: an early
        reply starts in the pause and waits for its transcript (cancelled when the segment is
        forgotten; a pause that ends otherwise drops the reply first)."""
        found = self.closing.get(span)
        waiting = self._later.get(span)
        if waiting is None:
            waiting = self._later[span] = asyncio.get_running_loop().create_future()
            if found is not None:
                waiting.set_result(found)
        return waiting

    def _ready(self, span: tuple[int, int], heard: Heard) -> None:
        self.closing[span] = heard
        waiting = self._later.get(span)
        if waiting is not None and not waiting.done():
            waiting.set_result(heard)

    def _run(
        self,
        cutter: Cutter,
        start: int,
        end: int,
        key: tuple[int, int] | None,
        quiet: bool = False,
    ) -> None:
        item = cutter.audio(start, end)
        if item is None:
            return
        # a partial or quiet pass has a stop of its own; a closing pass stops with the segment
        kind: Literal["partial", "quiet", "closing"] = (
            "closing" if key is not None else "quiet" if quiet else "partial"
        )
        stop = self._cancel if key is not None else threading.Event()
        p = self._running = _Pass(kind, end, stop, time.monotonic())
        if quiet:
            self._quiet = p
        self._task = asyncio.create_task(
            self._pass(item, p, key, self._cancel), name=f"realtime:{self.t.s.id}:asr"
        )

    async def _pass(
        self,
        item: Segment,
        p: _Pass,
        key: tuple[int, int] | None,
        cancel: threading.Event,
    ) -> None:
        prefix = list(self.agreement.committed)
        try:
            tokens, starts = await asyncio.to_thread(self.t.s.rt.transcribe, item, prefix, p.stop)
        except Cancelled:
            tokens, starts = [], frozenset()
        if cancel.is_set():  # the segment is gone
            return
        if p.stop.is_set():  # stopped for a pass that goes first: it starts now
            asyncio.get_running_loop().create_task(self.t.on_pass(None))
            return
        p.tokens, p.at = tokens, time.monotonic()
        if p.kind == "quiet":
            # a candidate for the pause's closing pass only: the words committed while the user
            # speaks come from the partial passes, every STEP_S, whatever the quiet passes say
            asyncio.get_running_loop().create_task(self.t.on_pass(None))
            return
        self.agreement.update(tokens, starts)
        self.covered = max(self.covered, p.end)
        await self._send(self._text_after(self.agreement.committed))
        if key is not None:
            self._ready(key, Heard(tokens, self._text_after(tokens), p.started, time.monotonic()))
        # told in a task of its own: the turn's handler may be waiting for this pass
        asyncio.get_running_loop().create_task(self.t.on_pass(key))

    # -- the turn's end ----------------------------------------------------------------
    async def close(self, span: tuple[int, int], item: Segment) -> Heard:
        """The turn ``span`` closed: its transcript (``Heard.text``: the deltas joined). The last
        delta is kept for :meth:`flush`; the state is reset for the next segment."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        found = self.closing.get(span)
        if found is None:  # not closed by a pause heard here (cut at max_segment): decode it now
            started = time.monotonic()
            tokens, _ = await asyncio.to_thread(
                self.t.s.rt.transcribe, item, list(self.agreement.committed), self._cancel
            )
            found = Heard(tokens, self._text_after(tokens), started, time.monotonic())
            self._ready(span, found)
        self.agreement.final(found.tokens)
        self.unsent = found.text[len(self.sent) :]
        self.reset()
        return found

    async def flush(self, item_id: str) -> None:
        """Send the closed turn's last delta (after its ``committed``)."""
        delta, self.unsent = self.unsent, ""
        if delta:
            await self.t.s.send(
                "conversation.item.input_audio_transcription.delta",
                item_id=item_id,
                content_index=0,
                delta=delta,
            )

    # -- text -----------------------------------------------------------------------------
    def _text_after(self, tokens: list[int]) -> str:
        """The deltas' text once ``tokens`` (the committed ones and more) are committed: what
        was sent, then what the tokens' transcript adds to it."""
        full = self.t.s.rt.text_of(tokens)
        if full.startswith(self.sent):
            return full
        # the tokenizer spelled the head differently once more followed: what was sent stays,
        # and the new tokens begin a word (LocalAgreement commits whole words)
        rest = self.t.s.rt.text_of(tokens[self._sent_n :])
        return f"{self.sent} {rest}" if self.sent and rest else self.sent + rest

    async def _send(self, text: str) -> None:
        delta = text[len(self.sent) :]
        self._sent_n = len(self.agreement.committed)
        if not delta:
            return
        self.sent = text
        await self.t.s.send(
            "conversation.item.input_audio_transcription.delta",
            item_id=self.t.upcoming_item(),
            content_index=0,
            delta=delta,
        )
