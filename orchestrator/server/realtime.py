"""``/v1/realtime``: a spoken conversation over a WebSocket, in the OpenAI Realtime API's event shapes.

One WebSocket is one session (:class:`Session`). The client streams pcm16 audio
(``input_audio_buffer.append``); the server finds the turns in it and answers
each one through the pipeline, streaming the reply back as events. The event
names and fields are those of the ``openai`` package's
``openai.types.beta.realtime`` models (docs/serving.md, "Realtime (WebSocket)",
lists each one and what differs from OpenAI's API).

**Turn detection** runs in this process, not in the pipeline's vad stage: the
runtime takes one request item per call, not a stream, and the stage yields a
segment only once it is closed, while a session must say ``speech_started``
the moment speech begins (to interrupt a reply). So the server opens the
pipeline's own vad stage's graph once (the stage kind's runner, on the stage's
plan: its route, its session spec; :meth:`Realtime.vad`) and runs it window by
window on each session's appended audio (``stages.vad.runner.Cutter``, with
the session's ``turn_detection`` as its ``SegmentRules``). Speech that has
lasted ``min_speech_ms`` is ``input_audio_buffer.speech_started``; a pause of
``silence_duration_ms`` (default: the vad stage's ``min_silence_ms``) closes
the segment: ``speech_stopped``, ``committed``, and the segment is the
request of one ``Pipeline.stream`` call. It enters at the stage the vad stage
feeds (``entry``: the asr stage transcribes it, the thinker answers, the voice
speaks), since the same graph already cut it: the vad stage would only trim it
again. With ``turn_detection: null`` the client commits the buffer itself, and the
whole pipeline answers it (the vad stage trims its silence).

**Early responses**: once the pause that may end the turn has lasted the
segment's end pad (``prefix_padding_ms``), the segment it would close is known
exactly (``Segmenter.pending``), so the response starts then — transcript,
first tokens, first audio under way while the session waits for the rest of
``silence_duration_ms``. Its events are held; when the pause closes the turn
with that same segment, ``speech_stopped`` and ``committed`` go out and then
the held events. Speech resuming drops it unseen (the pause was inside the
turn). ``response.done`` carries the server's ``timing``: each step in ms
after the end of speech, and ``early_start``. The early reply's state (the
response, the pause it answers, adopt and drop) is
``orchestrator.server.realtime_early``; the client events' models are
``orchestrator.server.realtime_events``.

**A response** holds one admission slot while it runs, not the session: a
pipeline that is full answers an ``error`` event (code ``pipeline_busy``) and
``response.done`` with status ``failed``; the session goes on. The transcript
(the asr stage's text) becomes the user's ``conversation.item.created`` and
``conversation.item.input_audio_transcription.completed``; the thinker's text
streams as ``response.audio_transcript.delta`` (``response.text.delta`` when
the session's modalities are text only), the voice's audio as
``response.audio.delta`` (pcm16 at the session's output rate, resampled with
``orchestrator.runtime.audio.resample``).

**Barge-in**: speech starting while a response runs cancels it (the pipeline's
stream is closed: the decode aborted on its actor, queued sentences dropped),
sends ``conversation.item.truncated`` (``audio_end_ms``: the audio sent) and
``response.done`` with status ``cancelled``, and the new turn proceeds.
``response.cancel`` does the same on request.

**History**: each session keeps its conversation (the user's transcripts, the
assistant's replies as far as their audio was sent: the voice speaks one chunk
per sentence as the runtime cuts them, so the text kept is the sentences whose
audio went out) and passes it to the decode stage of the next turn as
``{"messages": [...]}`` ahead of the transcript (``Pipeline.stream(context=)``).

**Bad events** (not JSON, no ``type``, an unknown type, a field of the wrong
type or range, audio that is not base64 pcm16) are ``error`` events naming the
field (``param``) and the client's ``event_id``; the session continues. A
session that sends nothing while no response runs is closed after
``RealtimeLimits.idle_timeout_s`` (close code 1000, the reason says why).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from orchestrator.api import audio_entry_stages
from orchestrator.core.errors import BadRequest, Problem
from orchestrator.core.units import MiB
from orchestrator.runtime.audio import OPENAI_PCM_RATE, pcm16_bytes, resample
from orchestrator.runtime.events import AudioChunk, StageEvent, TextDelta
from orchestrator.server.failures import failure, internal_failure
from orchestrator.server.realtime_early import EarlyReply, Response
from orchestrator.server.realtime_events import (
    AppendEvent,
    SessionFields,
    SessionUpdate,
    new_id,
    pcm16,
    validated,
)
from stages.base import REQUEST
from stages.vad.runner import Cutter, VadRunner
from stages.vad.segments import SegmentRules

log = logging.getLogger(__name__)

IDLE_TIMEOUT_S = 60.0
"""A session that sends nothing for this long while no response runs is closed (``serve
--realtime-idle-timeout``): a client streaming a microphone sends an event every 20-100 ms,
so a minute of nothing is a client that is gone or forgot its socket."""
MAX_EVENT_BYTES = 15 * MiB
"""The largest client event: OpenAI's own cap on ``input_audio_buffer.append`` (15 MiB), under
uvicorn's WebSocket frame limit (16 MiB), which closes the connection instead of answering."""
MAX_BUFFER_S = 60.0
"""Uncommitted audio a session may hold with ``turn_detection: null`` (server VAD cuts a turn at
the vad stage's ``max_segment_s``): two Whisper windows; 60 s of 24 kHz float32 is 5.8 MB."""
HISTORY_CHARS = 4000
"""The conversation passed to the thinker: the newest turns within this many characters, about
1000 tokens at ~4 characters a token — half of the example's 2048-token context, leaving room
for the system prompt, the new transcript and the reply."""
SAMPLE_RATES = (16000, 24000)
"""pcm16 rates a session takes and sends: 24 kHz is OpenAI's; 16 kHz is what speech models hear."""
SPEECH_STARTED_MIN_MS = 250
"""Speech must last this long before ``speech_started`` is sent when the vad stage names no
``min_speech_ms``: a click or a cough must not interrupt a reply."""


@dataclass(frozen=True)
class RealtimeLimits:
    """What one session may do; ``idle_timeout_s`` is ``serve --realtime-idle-timeout``."""

    idle_timeout_s: float = IDLE_TIMEOUT_S
    max_event_bytes: int = MAX_EVENT_BYTES
    max_buffer_s: float = MAX_BUFFER_S

    def __post_init__(self) -> None:
        for name in ("idle_timeout_s", "max_event_bytes", "max_buffer_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"RealtimeLimits.{name} must be a positive number, got {value!r}")


def end_of_turn(config: Any) -> tuple[str, int] | None:
    """(the vad stage, its ``min_silence_ms``): the silence that ends a spoken turn by default;
    None for a pipeline with no vad stage at its audio entry."""
    for name in audio_entry_stages(config):
        stage = config.stage(name)
        if stage.kind == "vad":
            return name, int(stage.min_silence_ms)
    return None


# -- the endpoint ----------------------------------------------------------------------
class Realtime:
    """``/v1/realtime`` of one app: the pipeline's stages a session uses, the VAD graph shared
    by every session (opened on the first), and one :class:`Session` per WebSocket.

    ``app`` is the HTTP app's ``_App`` (its pipeline, metrics and reply stages); ``make_run``
    its ``_Run`` (one pipeline request, traced into the metrics)."""

    def __init__(self, app: Any, limits: RealtimeLimits, make_run: Callable[..., Any]) -> None:
        self.app, self.limits, self.make_run = app, limits, make_run
        runtime = app.runtime
        config = app.pipeline.config
        entries = audio_entry_stages(config)
        turn = end_of_turn(config)
        self.vad_stage = turn[0] if turn else None
        self.audio_entry = bool(entries)
        self.reply_stages: set[str] = set(app.text_stages)
        self.transcript_stages = {
            s.name for s in runtime.stages if s.final_output and s.final_output_type == "text"
        } - self.reply_stages
        self.audio_stages: set[str] = set(app.audio_stages)
        self.decode_stages = [
            s.name
            for s in runtime.stages
            if s.kind == "ar_decode" and REQUEST not in s.inputs and s.name not in runtime.joins
        ]
        """The stages the conversation so far is passed to (``context``): decode stages fed by another stage."""
        voice = next((s.name for s in runtime.stages if s.name in self.audio_stages), None)
        self.chunker = (lambda: runtime._sentence_chunker(voice)) if voice else None
        self.defaults = self._turn_defaults()
        self.entry = self._after_vad(runtime)
        """Where a turn's segment enters the pipeline: the stage the vad stage feeds, when that
        one takes audio (the segment is already cut by the same graph); None: at the start."""
        self._vad: VadRunner | None = None
        self._vad_lock = asyncio.Lock()

    def _turn_defaults(self) -> dict[str, Any] | None:
        """The session's default turn detection: the vad stage's own settings."""
        if self.vad_stage is None:
            return None
        stage = self.app.pipeline.config.stage(self.vad_stage)
        return {
            "type": "server_vad",
            "threshold": float(stage.threshold),
            "prefix_padding_ms": int(stage.speech_pad_ms),
            "silence_duration_ms": int(stage.min_silence_ms),
            "create_response": True,
            "interrupt_response": True,
        }

    def _after_vad(self, runtime: Any) -> str | None:
        if self.vad_stage is None or self.app.pipeline.config.stage(self.vad_stage).final_output:
            return None
        consumers = list(runtime.consumers.get(self.vad_stage, []))
        if len(consumers) != 1 or consumers[0] not in runtime.entry_stages("audio"):
            return None
        return str(consumers[0])

    def end_of_turn_ms(self) -> int | None:
        """The default end-of-turn delay: the silence that closes a turn (the vad stage's ``min_silence_ms``)."""
        return None if self.defaults is None else int(self.defaults["silence_duration_ms"])

    async def vad(self) -> VadRunner:
        """The vad stage's runner in this process (its graph opened once, on its plan's route)."""
        async with self._vad_lock:
            if self._vad is None:
                assert self.vad_stage is not None
                name = self.vad_stage
                kind = self.app.runtime.kinds[name]
                runner = kind.runner(
                    self.app.pipeline.plan.stage(name), self.app.pipeline.config.stage(name)
                )
                t0 = time.perf_counter()
                await asyncio.to_thread(runner.load)
                log.info(
                    "realtime: the %s stage's graph opened in the server in %.2f s",
                    name,
                    time.perf_counter() - t0,
                )
                self._vad = runner
            return self._vad

    def close(self) -> None:
        if self._vad is not None:
            self._vad.close()
            self._vad = None

    async def endpoint(self, websocket: WebSocket) -> None:
        await Session(self, websocket).run()


class Session:
    """One WebSocket's conversation (see the module docstring)."""

    def __init__(self, rt: Realtime, ws: WebSocket) -> None:
        self.rt, self.ws = rt, ws
        self.id = new_id("sess")
        self.instructions: str | None = None
        self.voice = "default"
        self.modalities: list[str] = ["text", "audio"]
        self.in_rate = self.out_rate = OPENAI_PCM_RATE
        self.turn: dict[str, Any] | None = dict(rt.defaults) if rt.defaults else None
        self.cutter: Cutter | None = None
        self.cutter_ms = 0.0
        """Where the cutter's first sample sits in the session's audio (ms)."""
        self.speaking = False
        self.buffer: list[np.ndarray] = []
        self.buffered = 0
        self.heard_ms = 0.0
        """Audio appended in this session (ms)."""
        self.history: list[dict[str, str]] = []
        self.pending: tuple[str, np.ndarray, int, float, str | None] | None = None
        """A committed turn waiting for its response: item id, audio, rate, when its speech ended,
        the stage it enters at (``Realtime.entry`` for a segment the VAD cut; None: the client's
        own buffer, which the vad stage trims)."""
        self.response: Response | None = None
        self.early = EarlyReply(rt.app.metrics)
        """The response started in the current pause, not yet confirmed (``_early_start``)."""
        self.last_item: str | None = None
        self.send_lock = asyncio.Lock()

    # -- sending ---------------------------------------------------------------------
    async def send(self, type_: str, **fields: Any) -> None:
        doc = {"event_id": new_id("event"), "type": type_, **fields}
        async with self.send_lock:
            await self.ws.send_text(json.dumps(doc))

    async def error(
        self,
        message: str,
        *,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        event_id: str | None = None,
    ) -> None:
        await self.send(
            "error",
            error={
                "type": type_,
                "code": code,
                "message": message,
                "param": param,
                "event_id": event_id,
            },
        )

    def session_doc(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "realtime.session",
            "model": self.rt.app.model,
            "modalities": self.modalities,
            "instructions": self.instructions,
            "voice": self.voice,
            "input_audio_format": "pcm16",
            "output_audio_format": "pcm16",
            "input_audio_sample_rate": self.in_rate,
            "output_audio_sample_rate": self.out_rate,
            "input_audio_transcription": (
                {"model": sorted(self.rt.transcript_stages)[0]}
                if self.rt.transcript_stages
                else None
            ),
            "turn_detection": self.turn,
            "tools": [],
            "tool_choice": "none",
        }

    # -- the loop --------------------------------------------------------------------
    async def run(self) -> None:
        offered = self.ws.scope.get("subprotocols") or []
        await self.ws.accept(subprotocol="realtime" if "realtime" in offered else None)
        try:
            if not self.rt.audio_entry:
                await self.error(
                    f"pipeline {self.rt.app.model!r} has no entry stage that takes audio: a realtime "
                    "session is spoken (serve configs/examples/voice-chat.yaml)",
                    code="no_audio_entry",
                    param="model",
                )
                await self.ws.close(1008, "this pipeline takes no audio")
                return
            await self.send("session.created", session=self.session_doc())
            await self._loop()
        except (
            WebSocketDisconnect,
            OSError,
            RuntimeError,
        ) as exc:  # the client went away (a send to a closed socket)
            log.debug("realtime session %s ended: %s", self.id, exc)
        finally:
            await self._end()

    async def _loop(self) -> None:
        idle = self.rt.limits.idle_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(self.ws.receive(), idle)
            except TimeoutError:
                if self.response is not None:
                    continue  # a reply is running: the client is listening, not idle
                await self.ws.close(
                    1000, f"idle: no event for {idle:g} s (serve --realtime-idle-timeout)"
                )
                return
            if message["type"] == "websocket.disconnect":
                return
            raw = message.get("text")
            if raw is None:
                raw = message.get("bytes")
            if raw is None:
                continue
            await self.handle(raw)

    async def _end(self) -> None:
        await self.early.drop_current()
        response = self.response
        if response is not None and response.task is not None:
            response.quiet = True
            response.task.cancel()
            await asyncio.gather(response.task, return_exceptions=True)
        if self.cutter is not None:
            self.cutter.cancel.set()

    async def handle(self, raw: str | bytes) -> None:
        if len(raw) > self.rt.limits.max_event_bytes:
            await self.error(
                f"the event is {len(raw)} bytes: over the cap of {self.rt.limits.max_event_bytes} bytes "
                "per event; send the audio in smaller appends",
                code="event_too_large",
            )
            return
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):
            await self.error(
                "the event is not JSON: send one JSON object per message", code="invalid_json"
            )
            return
        event_id = (
            doc.get("event_id")
            if isinstance(doc, dict) and isinstance(doc.get("event_id"), str)
            else None
        )
        kind = doc.get("type") if isinstance(doc, dict) else None
        handler = HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            what = (
                "is missing"
                if kind is None
                else f"{str(kind)[:60]!r} is not a client event this server takes"
            )
            await self.error(
                f"type: {what}; one of {', '.join(HANDLERS)}",
                code="invalid_event",
                param="type",
                event_id=event_id,
            )
            return
        try:
            await handler(self, doc)
        except BadRequest as exc:
            p = exc.problems[0] if exc.problems else Problem("event", str(exc))
            await self.error(
                f"{p.where}: {p.what}" + (f" ({p.fix})" if p.fix else ""),
                code="invalid_value",
                param=p.where,
                event_id=event_id,
            )

    # -- client events ---------------------------------------------------------------
    async def on_session_update(self, doc: dict[str, Any]) -> None:
        fields: SessionFields = validated(
            SessionUpdate, doc, "{'type': 'session.update', 'session': {...}}"
        ).session
        given = fields.model_fields_set
        turn = self.turn
        if "turn_detection" in given:
            if fields.turn_detection is None:
                turn = None
            else:
                if self.rt.defaults is None:
                    raise BadRequest.single(
                        "session.turn_detection",
                        "this pipeline has no vad stage to detect turns",
                        "send turn_detection: null and commit the audio yourself",
                    )
                set_ = fields.turn_detection.model_dump(exclude_none=True)
                turn = {**self.rt.defaults, **set_}
                if turn["prefix_padding_ms"] > turn["silence_duration_ms"]:
                    raise BadRequest.single(
                        "session.turn_detection.prefix_padding_ms",
                        f"{turn['prefix_padding_ms']} ms is longer than silence_duration_ms ({turn['silence_duration_ms']} ms): "
                        "the padding after speech is cut from the pause that ends it",
                        "make prefix_padding_ms at most silence_duration_ms",
                    )
        in_rate = fields.input_audio_sample_rate or self.in_rate
        if turn != self.turn or in_rate != self.in_rate:
            self._reset_buffer()
        self.turn, self.in_rate = turn, in_rate
        self.out_rate = fields.output_audio_sample_rate or self.out_rate
        if "instructions" in given:
            self.instructions = fields.instructions or None
        if fields.voice is not None:
            self.voice = fields.voice
        if fields.modalities is not None:
            self.modalities = list(dict.fromkeys(fields.modalities))
        await self.send("session.updated", session=self.session_doc())

    async def on_append(self, doc: dict[str, Any]) -> None:
        event: AppendEvent = validated(
            AppendEvent, doc, "{'type': 'input_audio_buffer.append', 'audio': base64 pcm16}"
        )
        arrived = time.monotonic()
        samples = await asyncio.to_thread(pcm16, event.audio, "audio")
        if not samples.size:
            return
        start_ms = self.heard_ms
        self.heard_ms += 1000.0 * samples.size / self.in_rate
        if self.turn is None:
            limit = int(self.rt.limits.max_buffer_s * self.in_rate)
            if self.buffered + samples.size > limit:
                raise BadRequest.single(
                    "audio",
                    f"the buffer would hold {(self.buffered + samples.size) / self.in_rate:.1f} s: "
                    f"over the cap of {self.rt.limits.max_buffer_s:g} s of uncommitted audio",
                    "commit (input_audio_buffer.commit) or clear the buffer first",
                )
            self.buffer.append(samples)
            self.buffered += samples.size
            return
        if self.cutter is None:
            runner = await self.rt.vad()
            self.cutter = Cutter(runner, self._rules(runner))
            self.cutter_ms = start_ms
        cutter = self.cutter
        segments = await asyncio.to_thread(cutter.feed, samples, self.in_rate)
        self.early.note_pause(cutter, arrived)
        await self._turns(cutter, segments, arrived)
        if self.cutter is cutter:
            await self._early_start(cutter, arrived)

    def _rules(self, runner: VadRunner) -> SegmentRules:
        assert self.turn is not None
        per_ms = runner.rate // 1000
        base = runner.rules
        threshold = float(self.turn["threshold"])
        default_threshold = self.rt.defaults["threshold"]  # type: ignore[index]
        return SegmentRules(
            window=base.window,
            threshold=threshold,
            neg_threshold=base.neg_threshold if threshold == default_threshold else None,
            min_speech=base.min_speech,
            min_silence=int(self.turn["silence_duration_ms"]) * per_ms,
            pad=int(self.turn["prefix_padding_ms"]) * per_ms,
            max_segment=base.max_segment,
        )

    def _ms(self, cutter: Cutter, graph_index: int) -> int:
        return round(self.cutter_ms + 1000.0 * graph_index / cutter.runner.rate)

    async def _turns(self, cutter: Cutter, segments: list[dict[str, Any]], arrived: float) -> None:
        """Events for what the VAD decided on the last append: speech started, speech stopped → a turn
        (answered by the early response when that one answers exactly this segment)."""
        seg = cutter.segmenter
        min_speech = seg.rules.min_speech or SPEECH_STARTED_MIN_MS * (cutter.runner.rate // 1000)
        spans = cutter.spans[len(cutter.spans) - len(segments) :]
        for segment, span in zip(segments, spans, strict=True):
            end_ms = self._ms(cutter, span[1])
            if not self.speaking:
                await self._speech_started(
                    end_ms - int(1000 * segment["audio"].size / segment["sample_rate"])
                )
            self.speaking = False
            await self.send(
                "input_audio_buffer.speech_stopped", audio_end_ms=end_ms, item_id=self._next_item()
            )
            speech_end = self.early.speech_end_at(
                cutter, max(span[1] - seg.rules.pad, span[0]), arrived
            )
            await self._commit(
                segment["audio"],
                int(segment["sample_rate"]),
                early=await self.early.confirmed(span),
                speech_end=speech_end,
            )
        if not self.speaking and seg.open_speech >= min_speech and seg.open_start is not None:
            await self._speech_started(self._ms(cutter, seg.open_start))

    async def _speech_started(self, at_ms: int) -> None:
        self.speaking = True
        self._upcoming = new_id("item")
        await self.send(
            "input_audio_buffer.speech_started",
            audio_start_ms=max(at_ms, 0),
            item_id=self._upcoming,
        )
        if self.response is not None and (self.turn or {}).get("interrupt_response", True):
            await self._cancel("turn_detected")

    _upcoming: str | None = None

    def _next_item(self) -> str:
        if self._upcoming is None:
            self._upcoming = new_id("item")
        return self._upcoming

    async def on_commit(self, doc: dict[str, Any]) -> None:
        if self.turn is None:
            audio = np.concatenate(self.buffer) if self.buffer else np.zeros(0, dtype=np.float32)
            self.buffer, self.buffered = [], 0
            rate = self.in_rate
        else:
            cutter, self.cutter = self.cutter, None
            # the client ends the turn itself: answered from all of it
            await self.early.drop_current()
            parts = await asyncio.to_thread(cutter.finish) if cutter is not None else []
            audio = (
                np.concatenate([p["audio"] for p in parts])
                if parts
                else np.zeros(0, dtype=np.float32)
            )
            rate = int(parts[0]["sample_rate"]) if parts else self.in_rate
            if parts and self.speaking:
                await self.send(
                    "input_audio_buffer.speech_stopped",
                    audio_end_ms=int(self.heard_ms),
                    item_id=self._next_item(),
                )
            self.speaking = False
        if not audio.size:
            raise BadRequest.single(
                "input_audio_buffer",
                "holds no speech to commit" if self.turn else "is empty",
                "append audio with speech first",
            )
        await self._commit(
            audio, rate, auto=self.turn is not None and self.turn.get("create_response", True)
        )

    async def _commit(
        self,
        audio: np.ndarray,
        rate: int,
        auto: bool | None = None,
        early: Response | None = None,
        speech_end: float | None = None,
    ) -> None:
        item = self._next_item()
        self._upcoming = None
        await self.send(
            "input_audio_buffer.committed", item_id=item, previous_item_id=self.last_item
        )
        self.last_item = item
        if auto is None:
            auto = self._auto_response()
        if early is not None and auto:
            await self._adopt(early)
            return
        self.pending = (
            item,
            audio,
            rate,
            time.monotonic() if speech_end is None else speech_end,
            self.rt.entry if self.turn is not None else None,
        )
        if auto:
            await self._respond()

    async def on_clear(self, doc: dict[str, Any]) -> None:
        self._reset_buffer()
        await self.send("input_audio_buffer.cleared")

    def _reset_buffer(self) -> None:
        if self.cutter is not None:
            self.cutter.cancel.set()
        self.early.discard()  # its segment is gone with the buffer, and so is the pause
        self.cutter, self.speaking = None, False
        self.buffer, self.buffered = [], 0

    async def on_response_create(self, doc: dict[str, Any]) -> None:
        if self.response is not None:
            raise BadRequest.single(
                "response",
                f"response {self.response.id} is still in progress",
                "wait for its response.done, or send response.cancel first",
            )
        if self.pending is None:
            raise BadRequest.single(
                "input_audio_buffer",
                "no committed audio is waiting for a response",
                "append audio and send input_audio_buffer.commit first",
            )
        await self._respond()

    async def on_response_cancel(self, doc: dict[str, Any]) -> None:
        if self.response is None:
            await self.error(
                "no response is in progress to cancel",
                code="response_cancel_not_active",
                event_id=doc.get("event_id") if isinstance(doc.get("event_id"), str) else None,
            )
            return
        await self._cancel("client_cancelled")

    # -- responses -------------------------------------------------------------------
    async def _respond(self) -> None:
        if self.response is not None:
            await self._cancel("turn_detected")
        assert self.pending is not None
        item, audio, rate, speech_end, entry = self.pending
        self.pending = None
        response = Response(new_id("resp"), new_id("item"), item, speech_end=speech_end)
        response.mark("turn_end")
        self.response = response
        response.task = asyncio.create_task(
            self._run_response(response, audio, rate, entry), name=f"realtime:{response.id}"
        )

    async def _cancel(self, reason: str) -> None:
        response = self.response
        if response is None or response.task is None:
            return
        response.reason = reason
        response.task.cancel()
        await asyncio.gather(response.task, return_exceptions=True)

    # -- early responses: started in the pause, sent once the pause closes the turn
    # (their state: realtime_early.EarlyReply) ----------------------------------------
    def _auto_response(self) -> bool:
        return self.turn is not None and bool(self.turn.get("create_response", True))

    async def _early_start(self, cutter: Cutter, arrived: float) -> None:
        """Start the reply to the segment the current pause will close, before it has lasted
        ``silence_duration_ms``: its transcript, first tokens and first audio are under way while
        the session waits for the rest of the pause. Its events are held; speech resuming (the
        pause was not the turn's end) drops it unseen."""
        pending = cutter.pending()
        await self.early.drop_stale(pending)
        if (
            self.early.response is not None
            or self.response is not None
            or pending is None
            or not self._auto_response()
        ):
            return
        span, item = pending
        speech_end = self.early.speech_end_at(cutter, span[1] - cutter.segmenter.rules.pad, arrived)
        r = self.early.start(span, self._next_item(), speech_end)
        r.task = asyncio.create_task(
            self._run_response(r, item["audio"], int(item["sample_rate"]), self.rt.entry),
            name=f"realtime:{r.id}:early",
        )

    async def _adopt(self, r: Response) -> None:
        """The turn is confirmed: the early response becomes the session's and its held events go out."""
        if self.response is not None:
            await self._cancel("turn_detected")
        self.early.adopted(r)
        assert r.task is not None and r.held is not None
        if not r.task.done():
            self.response = r
        while r.held:
            type_, fields = r.held.pop(0)
            await self._out(r, type_, fields)
        r.held = None
        if r.task.done():  # it ended while held: what it adds to the conversation was kept for now
            self.history += r.history

    # -- one response ------------------------------------------------------------------
    async def _emit(self, r: Response, type_: str, **fields: Any) -> None:
        if r.held is not None:
            r.held.append((type_, fields))
        else:
            await self._out(r, type_, fields)

    async def _out(self, r: Response, type_: str, fields: dict[str, Any]) -> None:
        if type_ == "response.audio.delta" and "first_audio" not in r.marks:
            r.mark("first_audio")
            self.rt.app.metrics.voice_to_voice.observe(
                max(r.marks["first_audio"] - r.speech_end, 0.0)
            )
        elif type_ == "response.done":
            fields["response"]["timing"] = r.timing()
        await self.send(type_, **fields)

    def _context(self) -> dict[str, list[Any]] | None:
        messages: list[dict[str, str]] = []
        total = 0
        for m in reversed(self.history):
            total += len(m["content"])
            if total > HISTORY_CHARS:
                break
            messages.insert(0, m)
        if self.instructions:
            messages.insert(0, {"role": "system", "content": self.instructions})
        if not messages or not self.rt.decode_stages:
            return None
        return {name: [{"messages": messages}] for name in self.rt.decode_stages}

    def _response_doc(
        self,
        r: Response,
        status: str,
        details: dict[str, Any] | None,
        transcript: str,
        usage: dict[str, int] | None,
    ) -> dict[str, Any]:
        content = {
            "type": "audio" if "audio" in self.modalities else "text",
            "transcript" if "audio" in self.modalities else "text": transcript,
        }
        u = usage or {}
        return {
            "id": r.id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "modalities": self.modalities,
            "output_audio_format": "pcm16",
            "voice": self.voice,
            "output": [
                {
                    "id": r.item_id,
                    "object": "realtime.item",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed" if status == "completed" else "incomplete",
                    "content": [content],
                }
            ],
            "usage": {
                "total_tokens": u.get("total_tokens", 0),
                "input_tokens": u.get("prompt_tokens", 0),
                "output_tokens": u.get("completion_tokens", 0),
            },
        }

    async def _run_response(
        self, r: Response, audio: np.ndarray, rate: int, entry: str | None
    ) -> None:
        """One turn's reply: the segment through the pipeline, its events as the session's
        (held while the response is early), then :meth:`_finish`."""
        rt = self.rt
        r.mark("request")
        run = rt.make_run(
            rt.app,
            {"audio": audio, "sample_rate": rate},
            "realtime",
            entry=entry,
            context=self._context(),
            conversation=self.id,
        )
        chunker = rt.chunker() if rt.chunker else None
        status, http = "completed", 499  # 499 (the client went away) unless it ends otherwise
        details: dict[str, Any] | None = None
        wants_audio = "audio" in self.modalities
        seconds = round(audio.size / float(rate), 3)
        try:
            await self._emit(
                r,
                "response.created",
                response={
                    "id": r.id,
                    "object": "realtime.response",
                    "status": "in_progress",
                    "status_details": None,
                    "output": [],
                    "modalities": self.modalities,
                    "voice": self.voice,
                    "usage": None,
                },
            )
            async for event in run.rest():
                await self._on_event(r, event, chunker, wants_audio, seconds)
            await self._tell_user(r, seconds)
            if wants_audio and r.audio_chunks:
                await self._emit(
                    r,
                    "response.audio.done",
                    response_id=r.id,
                    item_id=r.item_id,
                    output_index=0,
                    content_index=0,
                )
            http = 200
        except asyncio.CancelledError:
            status, details, http = (
                "cancelled",
                {"type": "cancelled", "reason": r.reason or "client_cancelled"},
                499,
            )
        except (WebSocketDisconnect, OSError):  # the client went away mid-reply: nobody to tell
            r.quiet = True
        except Exception as exc:
            status, http, err = self._failure(exc)
            details = {"type": "failed", "error": dict(err)}
            if (
                r.held is not None
            ):  # early: the confirmed turn gets a response of its own, which tells
                r.failed_early = r.quiet = True
            elif not r.quiet:
                await self.error(err["message"], type_=err["type"], code=err["code"])
        finally:
            # cancels the request on every stage (if still running) and frees its slot; shielded, so a
            # barge-in arriving while it closes does not leave the request half closed
            closing = asyncio.ensure_future(run.close(http))
            try:
                await asyncio.shield(closing)
            except asyncio.CancelledError:
                await closing
        if self.response is r:
            self.response = None
        if not r.quiet:
            await self._finish(r, status, details, chunker, wants_audio, run.trace.usage())

    @staticmethod
    def _failure(exc: Exception) -> tuple[str, int, dict[str, str]]:
        """A failed response's status, HTTP status (for the metrics) and OpenAI-shaped error
        (``failures.failure``; a fault of this server is logged, and the session goes on)."""
        what = "realtime response"
        f = failure(exc, what) or internal_failure(exc, what)
        return "failed", f.status, {"type": f.type, "code": f.code, "message": f.line}

    async def _on_event(
        self, r: Response, event: Any, chunker: Any, wants_audio: bool, seconds: float
    ) -> None:
        rt = self.rt
        if isinstance(event, TextDelta) and event.stage in rt.transcript_stages:
            r.transcript.append(event.text)
        elif (
            isinstance(event, StageEvent)
            and event.kind == "done"
            and event.stage in rt.transcript_stages
        ):
            await self._tell_user(r, seconds)
        elif isinstance(event, TextDelta) and event.stage in rt.reply_stages:
            await self._tell_user(r, seconds)
            r.mark("first_token")
            r.text.append(event.text)
            if chunker is not None:
                cut = chunker.feed(event.text)
                if cut:
                    r.mark("first_sentence")
                r.chunks += cut
            await self._emit(
                r,
                "response.audio_transcript.delta" if wants_audio else "response.text.delta",
                response_id=r.id,
                item_id=r.item_id,
                output_index=0,
                content_index=0,
                delta=event.text,
            )
        elif isinstance(event, AudioChunk) and event.stage in rt.audio_stages and wants_audio:
            await self._tell_user(r, seconds)
            pcm = pcm16_bytes(resample(event.audio, event.sample_rate, self.out_rate))
            await self._emit(
                r,
                "response.audio.delta",
                response_id=r.id,
                item_id=r.item_id,
                output_index=0,
                content_index=0,
                delta=base64.b64encode(pcm).decode("ascii"),
            )
            r.audio_chunks += 1
            r.audio_ms += 1000.0 * (len(pcm) // 2) / self.out_rate

    async def _tell_user(self, r: Response, seconds: float) -> None:
        """The user's turn as the conversation's item, with its transcript (once per response)."""
        if r.told_user:
            return
        r.told_user = True
        r.mark("transcript")
        text = " ".join(t.strip() for t in r.transcript if t.strip())
        await self._emit(
            r,
            "conversation.item.created",
            previous_item_id=None,
            item={
                "id": r.user_item_id,
                "object": "realtime.item",
                "type": "message",
                "role": "user",
                "status": "completed",
                "content": [{"type": "input_audio", "transcript": text}],
            },
        )
        await self._emit(
            r,
            "conversation.item.input_audio_transcription.completed",
            item_id=r.user_item_id,
            content_index=0,
            transcript=text,
            usage={"type": "duration", "seconds": seconds},
        )

    async def _finish(
        self,
        r: Response,
        status: str,
        details: dict[str, Any] | None,
        chunker: Any,
        wants_audio: bool,
        usage: dict[str, int] | None,
    ) -> None:
        """The reply is over: what was heard of it, the conversation, ``response.done``."""
        if chunker is not None:
            r.chunks += chunker.flush()
        text = "".join(r.text)
        heard = (
            text
            if status == "completed" or not wants_audio or chunker is None
            else " ".join(c.strip() for c in r.chunks[: r.audio_chunks])
        )
        if status == "cancelled" and wants_audio:
            await self._emit(
                r,
                "conversation.item.truncated",
                item_id=r.item_id,
                content_index=0,
                audio_end_ms=int(r.audio_ms),
            )
        said = " ".join(t.strip() for t in r.transcript if t.strip())
        if said and status != "failed":
            r.history = [{"role": "user", "content": said}]
            if heard.strip():
                r.history.append({"role": "assistant", "content": heard.strip()})
        if r.held is None:  # held: added when the turn is confirmed (_adopt)
            self.history += r.history
        await self._emit(
            r, "response.done", response=self._response_doc(r, status, details, heard, usage)
        )


HANDLERS: dict[str, Callable[[Session, dict[str, Any]], Any]] = {
    "session.update": Session.on_session_update,
    "input_audio_buffer.append": Session.on_append,
    "input_audio_buffer.commit": Session.on_commit,
    "input_audio_buffer.clear": Session.on_clear,
    "response.create": Session.on_response_create,
    "response.cancel": Session.on_response_cancel,
}
"""The client events a session takes, by ``type``."""
