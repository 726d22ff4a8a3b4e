"""A realtime session's turns: its audio appended, cut into turns by the VAD graph (server
turn detection: a fixed pause, or one as long as the utterance needs) or committed by the
client, each turn committed as a conversation item and answered; the transcript streamed
while the user speaks; the early reply started in the pause and adopted when the pause ends
the turn.

:class:`Turns` holds what one session's turn taking keeps (the buffer or the cutter, whether
the user is speaking, the turn waiting for its response, the early reply, the running
transcript) and speaks through its session (``realtime.Session``: its events, its response,
its settings). The cutter is touched under :attr:`Turns.lock` only: by each append, and by a
transcript pass that ends (``on_pass``: a semantic verdict, an early reply).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, NamedTuple

import numpy as np

from orchestrator.core.errors import BadRequest
from orchestrator.server.realtime_early import EarlyReply, Response
from orchestrator.server.realtime_events import AppendEvent, new_id, pcm16, validated
from orchestrator.server.realtime_transcribe import Heard, Transcriber
from orchestrator.server.realtime_turn_end import pauses
from stages.vad.runner import Cutter, Segment, VadRunner
from stages.vad.segments import SegmentRules

SPEECH_STARTED_MIN_MS = 250
"""``speech_started`` once this much speech is heard, when the vad stage sets no
``min_speech_ms`` (a cough is not a turn)."""


class Pending(NamedTuple):
    """A committed turn waiting for its response."""

    item: str
    audio: np.ndarray
    rate: int
    speech_end: float
    """When its speech ended (``time.monotonic``)."""
    entry: str | None
    """The stage it enters at (``Realtime.entry`` for a segment the VAD cut; None: the client's
    own buffer, which the vad stage trims)."""
    heard: Heard | None
    """Its transcript, when the session has one (``realtime_transcribe``)."""


class Turns:
    """One session's turn taking (the module's guarantees)."""

    def __init__(self, session: Any) -> None:
        # the session (``realtime.Session``), typed Any: naming it here would make the two
        # modules a cycle
        self.s = session
        self.cutter: Cutter | None = None
        self.cutter_ms = 0.0
        """Where the cutter's first sample sits in the session's audio (ms)."""
        self.speaking = False
        self.buffer: list[np.ndarray] = []
        self.buffered = 0
        self.heard_ms = 0.0
        """Audio appended in this session (ms)."""
        self.pending: Pending | None = None
        """A committed turn waiting for its response."""
        self.early = EarlyReply(session.rt.app.metrics)
        """The response started in the current pause, not yet confirmed (``_early_start``)."""
        self.last_item: str | None = None
        self._upcoming: str | None = None
        self.lock = asyncio.Lock()
        """Held while the cutter is fed or decided on (appends, a pass's verdict)."""
        self.transcriber = Transcriber(self)
        """The transcript of the speech the cutter has open (``realtime_transcribe``), when the
        pipeline's asr stage follows the vad stage (``Realtime.streaming``)."""

    async def on_append(self, doc: dict[str, object]) -> None:
        event: AppendEvent = validated(
            AppendEvent, doc, "{'type': 'input_audio_buffer.append', 'audio': base64 pcm16}"
        )
        arrived = time.monotonic()
        samples = await asyncio.to_thread(pcm16, event.audio, "audio")
        if not samples.size:
            return
        start_ms = self.heard_ms
        self.heard_ms += 1000.0 * samples.size / self.s.in_rate
        if self.s.turn is None:
            limit = int(self.s.rt.limits.max_buffer_s * self.s.in_rate)
            if self.buffered + samples.size > limit:
                raise BadRequest.single(
                    "audio",
                    f"the buffer would hold {(self.buffered + samples.size) / self.s.in_rate:.1f} s: "
                    f"over the cap of {self.s.rt.limits.max_buffer_s:g} s of uncommitted audio",
                    "commit (input_audio_buffer.commit) or clear the buffer first",
                )
            self.buffer.append(samples)
            self.buffered += samples.size
            return
        async with self.lock:
            if self.cutter is None:
                runner = await self.s.rt.vad()
                self.cutter = Cutter(runner, self._rules(runner))
                self.cutter_ms = start_ms
            cutter = self.cutter
            segments = await asyncio.to_thread(cutter.feed, samples, self.s.in_rate)
            self.early.note_pause(cutter, arrived)
            await self._turns(cutter, segments, arrived)
            await self._next(cutter, arrived)

    async def _next(self, cutter: Cutter, arrived: float) -> None:
        """What the cutter's state calls for next: a transcript pass, an early reply."""
        if self.cutter is not cutter:
            return
        if self._streaming():
            self.transcriber.follow(cutter, self._min_speech(cutter))
        await self._early_start(cutter, arrived)

    async def on_pass(self, key: tuple[int, int] | None) -> None:
        """A transcript pass ended (``key``: the segment its pause would close, for a closing
        pass): under semantic turn detection a complete utterance's pause is limited to
        ``complete_ms``, which may end the turn now; then the next pass, the early reply."""
        heard = None if key is None else self.transcriber.heard(key)
        turn = self.s.turn or {}
        complete = False
        if heard is not None and turn.get("type") == "semantic_vad":
            judge = await self.s.rt.turn_end()
            complete = await judge.complete(heard.text, turn["eagerness"])
        elif (
            key is None
            and turn.get("type") == "semantic_vad"
            and self.s.rt.idle()
            and (self.cutter is None or self.cutter.segmenter.pause_span() is None)
        ):
            # the words committed so far are read while the user speaks: the verdict at the
            # pause reads only the last ones, beside the thinker reading the question
            (await self.s.rt.turn_end()).warm(self.transcriber.sent)
        async with self.lock:
            cutter = self.cutter
            if cutter is None:
                return
            if complete and cutter.segmenter.pause_span() == key:
                per_ms = cutter.runner.rate // 1000
                limit = pauses(turn["eagerness"]).complete_ms * per_ms
                await self._turns(cutter, cutter.limit_pause(limit), time.monotonic())
            await self._next(cutter, time.monotonic())

    def _streaming(self) -> bool:
        """Whether this session's turns are transcribed here while spoken (the pipeline allows
        it and its Whisper is open: ``Realtime.asr_ready``)."""
        return bool(self.s.rt.streaming) and bool(self.s.rt.asr_ready())

    def _min_speech(self, cutter: Cutter) -> int:
        """Speech (the VAD's samples) that makes a turn: ``speech_started``, passes."""
        return cutter.segmenter.rules.min_speech or SPEECH_STARTED_MIN_MS * (
            cutter.runner.rate // 1000
        )

    def _rules(self, runner: VadRunner) -> SegmentRules:
        assert self.s.turn is not None
        per_ms = runner.rate // 1000
        base = runner.rules
        turn, defaults = self.s.turn, self.s.rt.vad_settings
        if turn.get("type") == "semantic_vad":
            # the stage's own threshold and pad; the pause waits for a complete utterance
            threshold, pad_ms = defaults["threshold"], defaults["prefix_padding_ms"]
            silence_ms = pauses(turn["eagerness"]).incomplete_ms
        else:
            threshold = float(turn["threshold"])
            pad_ms, silence_ms = turn["prefix_padding_ms"], turn["silence_duration_ms"]
        return SegmentRules(
            window=base.window,
            threshold=threshold,
            neg_threshold=base.neg_threshold if threshold == defaults["threshold"] else None,
            min_speech=base.min_speech,
            min_silence=int(silence_ms) * per_ms,
            pad=min(int(pad_ms), int(silence_ms)) * per_ms,
            max_segment=base.max_segment,
        )

    def _ms(self, cutter: Cutter, graph_index: int) -> int:
        return round(self.cutter_ms + 1000.0 * graph_index / cutter.runner.rate)

    async def _turns(self, cutter: Cutter, segments: list[Segment], arrived: float) -> None:
        """Events for what the VAD decided on the last append: speech started, speech stopped → a turn
        (answered by the early response when that one answers exactly this segment)."""
        seg = cutter.segmenter
        min_speech = self._min_speech(cutter)
        spans = cutter.spans[len(cutter.spans) - len(segments) :]
        for segment, span in zip(segments, spans, strict=True):
            end_ms = self._ms(cutter, span[1])
            if not self.speaking:
                await self._speech_started(
                    end_ms - int(1000 * segment["audio"].size / segment["sample_rate"])
                )
            self.speaking = False
            await self.s.send(
                "input_audio_buffer.speech_stopped", audio_end_ms=end_ms, item_id=self._next_item()
            )
            speech_end = self.early.speech_end_at(
                cutter, max(span[1] - seg.rules.pad, span[0]), arrived
            )
            early = await self.early.confirmed(span)
            heard = await self.transcriber.close(span, segment) if self._streaming() else None
            await self._commit(
                segment["audio"],
                int(segment["sample_rate"]),
                early=early,
                speech_end=speech_end,
                heard=heard,
            )
        if not self.speaking and seg.open_speech >= min_speech and seg.open_start is not None:
            await self._speech_started(self._ms(cutter, seg.open_start))

    async def _speech_started(self, at_ms: int) -> None:
        self.speaking = True
        self._upcoming = self._upcoming or new_id("item")
        await self.s.send(
            "input_audio_buffer.speech_started",
            audio_start_ms=max(at_ms, 0),
            item_id=self._upcoming,
        )
        if self.s.response is not None and (self.s.turn or {}).get("interrupt_response", True):
            await self.s.cancel("turn_detected")

    def _next_item(self) -> str:
        if self._upcoming is None:
            self._upcoming = new_id("item")
        return self._upcoming

    def upcoming_item(self) -> str:
        """The id the turn being spoken will be committed as (its transcript deltas name it)."""
        return self._next_item()

    async def on_commit(self, doc: dict[str, object]) -> None:
        if self.s.turn is None:
            audio = np.concatenate(self.buffer) if self.buffer else np.zeros(0, dtype=np.float32)
            self.buffer, self.buffered = [], 0
            rate = self.s.in_rate
        else:
            async with self.lock:
                cutter, self.cutter = self.cutter, None
            # the client ends the turn itself: answered from all of it, by the whole pipeline
            self.transcriber.reset()
            await self.early.drop_current()
            parts = await asyncio.to_thread(cutter.finish) if cutter is not None else []
            audio = (
                np.concatenate([p["audio"] for p in parts])
                if parts
                else np.zeros(0, dtype=np.float32)
            )
            rate = int(parts[0]["sample_rate"]) if parts else self.s.in_rate
            if parts and self.speaking:
                await self.s.send(
                    "input_audio_buffer.speech_stopped",
                    audio_end_ms=int(self.heard_ms),
                    item_id=self._next_item(),
                )
            self.speaking = False
        if not audio.size:
            raise BadRequest.single(
                "input_audio_buffer",
                "holds no speech to commit" if self.s.turn else "is empty",
                "append audio with speech first",
            )
        await self._commit(
            audio, rate, auto=self.s.turn is not None and self.s.turn.get("create_response", True)
        )

    async def _commit(
        self,
        audio: np.ndarray,
        rate: int,
        auto: bool | None = None,
        early: Response | None = None,
        speech_end: float | None = None,
        heard: Heard | None = None,
    ) -> None:
        """``heard``: the turn's transcript (``realtime_transcribe``)."""
        item = self._next_item()
        self._upcoming = None
        await self.s.send(
            "input_audio_buffer.committed", item_id=item, previous_item_id=self.last_item
        )
        await self.transcriber.flush(item)
        self.last_item = item
        if auto is None:
            auto = self._auto_response()
        if early is not None and auto:
            await self._adopt(early)
            return
        self.pending = Pending(
            item,
            audio,
            rate,
            time.monotonic() if speech_end is None else speech_end,
            self.s.rt.entry if self.s.turn is not None else None,
            heard,
        )
        if auto:
            await self.s.respond()

    async def on_clear(self, doc: dict[str, object]) -> None:
        self.reset_buffer()
        await self.s.send("input_audio_buffer.cleared")

    def reset_buffer(self) -> None:
        if self.cutter is not None:
            self.cutter.cancel.set()
        self.transcriber.reset()
        self.early.discard()  # its segment is gone with the buffer, and so is the pause
        self.cutter, self.speaking = None, False
        self.buffer, self.buffered = [], 0

    def _auto_response(self) -> bool:
        return self.s.turn is not None and bool(self.s.turn.get("create_response", True))

    async def _early_start(self, cutter: Cutter, arrived: float) -> None:
        """Start the reply to the segment the current pause will close, before it has lasted
        ``silence_duration_ms``: its transcript, first tokens and first audio are under way while
        the session waits for the rest of the pause. Its events are held; speech resuming (the
        pause was not the turn's end) drops it unseen."""
        streaming = self._streaming()
        # streaming: the reply answers the pause's closing pass, not the audio, so it starts as
        # the pause begins; otherwise once the segment's end pad is heard (its audio whole)
        pending = cutter.closing() if streaming else cutter.pending()
        await self.early.drop_stale(pending)
        if (
            self.early.response is not None
            or self.s.response is not None
            or pending is None
            or not self._auto_response()
        ):
            return
        span, item = pending
        speech_end = self.early.speech_end_at(cutter, span[1] - cutter.segmenter.rules.pad, arrived)
        r = self.early.start(span, self._next_item(), speech_end)
        r.seconds = cutter.seconds(*span)
        # streaming: the transcript is the pause's closing pass, ready or on its way
        heard = self.transcriber.later(span) if streaming else None
        r.task = asyncio.create_task(
            self.s.replies.run(
                r, item["audio"], int(item["sample_rate"]), self.s.rt.entry, heard=heard
            ),
            name=f"realtime:{r.id}:early",
        )

    async def _adopt(self, r: Response) -> None:
        """The turn is confirmed: the early response becomes the session's and its held events go out."""
        if self.s.response is not None:
            await self.s.cancel("turn_detected")
        self.early.adopted(r)
        assert r.task is not None and r.held is not None
        if not r.task.done():
            self.s.response = r
        while r.held:
            type_, fields = r.held.pop(0)
            await self.s.replies.out(r, type_, fields)
        r.held = None
        if r.task.done():  # it ended while held: what it adds to the conversation was kept for now
            self.s.items.add_response(r)
