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
``{"messages": [...]}`` ahead of the transcript (``Pipeline.stream(context=)``). The conversation
is items the client may add, read, delete and truncate, and a response with no committed audio
answers them: typed turns, a tool's result after a call (``realtime_items``).

**Bad events** (not JSON, no ``type``, an unknown type, a field of the wrong
type or range, audio that is not base64 pcm16) are ``error`` events naming the
field (``param``) and the client's ``event_id``; the session continues. Every free-text and
list field a session takes is capped as HTTP's are, the cap named in the ``error``: ``instructions``
(the system message of every turn) at ``serve --max-content-chars``, ``voice`` and ``event_id`` at
256 characters, ``modalities`` at two; audio by the event's size and ``RealtimeLimits.max_buffer_s``. A
session that sends nothing while no response runs is closed after
``RealtimeLimits.idle_timeout_s`` (close code 1000, the reason says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from orchestrator.config import PipelineConfig
from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import BadRequest, ConfigError, Problem
from orchestrator.core.plan import PipelinePlan
from orchestrator.core.units import MiB
from orchestrator.runtime.audio import OPENAI_PCM_RATE
from orchestrator.runtime.requests import audio_entry_stages
from orchestrator.server import realtime_items as items
from orchestrator.server.limits import FLAGS
from orchestrator.server.realtime_early import Response
from orchestrator.server.realtime_events import (
    RealtimeTool,
    RealtimeToolChoice,
    SemanticSettings,
    SemanticTurnDetection,
    SessionFields,
    SessionTurn,
    SessionUpdate,
    TurnSettings,
    check_event_id,
    check_instructions,
    new_id,
    validated,
)
from orchestrator.server.realtime_events import TurnDetection as ServerVadFields
from orchestrator.server.realtime_reply import Replies
from orchestrator.server.realtime_turn_end import TurnEnd, pauses, semantic_problem
from orchestrator.server.realtime_turns import Turns
from stages.base import REQUEST, SpeechTranscriber, TurnDetection, TurnScorer
from stages.payloads import AudioItem, Item
from stages.registry import get_kind
from stages.requests import ChatItem, ChatMessage, Sampling
from stages.vad.runner import Segment, VadRunner

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


def semantic_turn(eagerness: str) -> SemanticSettings:
    """A session's ``semantic_vad`` turn detection, as ``session.created`` shows it."""
    return SemanticSettings(
        type="semantic_vad", eagerness=eagerness, create_response=True, interrupt_response=True
    )


def end_of_turn(config: PipelineConfig, plan: PipelinePlan) -> tuple[str, TurnDetection] | None:
    """The stage at the pipeline's audio entry that cuts a spoken stream into turns (a vad
    stage: ``StageKind.turn_detection``) and its turn detection (the silence that ends a
    turn: its ``min_silence_ms``); None for a pipeline with none."""
    for name in audio_entry_stages(config):
        found = get_kind(config.stage(name).kind).turn_detection(plan.stage(name))
        if found is not None:
            return name, found
    return None


def end_of_turn_text(config: PipelineConfig, plan: PipelinePlan) -> str | None:
    """How a session ends a spoken turn by default, in words (serve's start-up line)."""
    turn = end_of_turn(config, plan)
    if turn is None:
        return None
    name = turn[0]
    eagerness = get_kind(config.stage(name).kind).semantic_eagerness(config.stage(name))
    if eagerness is not None:
        p = pauses(eagerness)
        return (
            f"after {p.complete_ms} ms of silence when the thinker's model judges the utterance "
            f"complete, {p.incomplete_ms} ms when not ({name} turn_detection: semantic_vad, "
            f"eagerness {eagerness}; a session's turn_detection)"
        )
    return (
        f"after {turn[1].silence_duration_ms} ms of silence ({name} min_silence_ms; a session's "
        "turn_detection.silence_duration_ms)"
    )


def turn_detection_problem(config: PipelineConfig) -> Problem | None:
    """Why a stage's ``turn_detection`` cannot be served, read from the config before anything
    is planned: a ``semantic_vad`` whose stages cannot score a transcript (``realtime_turn_end``)."""
    for name in audio_entry_stages(config):
        stage = config.stage(name)
        if get_kind(stage.kind).semantic_eagerness(stage) is not None:
            return semantic_problem(config, name)
    return None


# -- the endpoint ----------------------------------------------------------------------
class Realtime:
    """``/v1/realtime`` of one app: the pipeline's stages a session uses, the VAD graph shared
    by every session (opened on the first), and one :class:`Session` per WebSocket.

    ``app`` is the served pipeline (``served.Served``: its pipeline, metrics and reply stages); ``make_run``
    its ``served.Run`` (one pipeline request, traced into the metrics)."""

    def __init__(self, app: Any, limits: RealtimeLimits, make_run: Callable[..., Any]) -> None:
        self.app, self.limits, self.make_run = app, limits, make_run
        runtime = app.runtime
        config = app.pipeline.config
        entries = audio_entry_stages(config)
        turn = end_of_turn(config, app.pipeline.plan)
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
            if runtime.kinds[s.name].takes_conversation
            and REQUEST not in s.inputs
            and s.name not in runtime.joins
        ]
        """The stages the conversation so far is passed to (``context``): those whose kind takes
        it (``StageKind.takes_conversation``, a decoder's) fed by another stage."""
        voice = next((s.name for s in runtime.stages if s.name in self.audio_stages), None)
        self.chunker = (lambda: runtime.sentence_chunker(voice)) if voice else None
        self.vad_settings = _turn_defaults(turn[1]) if turn else None
        """The vad stage's own pause settings, in ``server_vad``'s terms (None: no vad stage)."""
        self.defaults = self._session_default()
        """The session's default turn detection: the vad stage's ``turn_detection``."""
        self.entry = self._after_vad(runtime)
        """Where a turn's segment enters the pipeline: the stage the vad stage feeds, when that
        one takes audio (the segment is already cut by the same graph); None: at the start."""
        self._vad: VadRunner | None = None
        self._vad_lock = asyncio.Lock()
        self.text_entry = self._after_asr(runtime)
        """The stage a turn enters at with the session's own transcript (the one the asr stage
        feeds); None: no streaming transcription, the segment enters at ``entry``."""
        self.reply_entry = self.text_entry or next(
            (n for n in self.decode_stages if n in runtime.entry_stages("text")), None
        )
        """The stage a response to the conversation's items enters at (the thinker); None: none."""
        self.streaming = self.text_entry is not None
        """Whether sessions transcribe while the user speaks (``realtime_transcribe``)."""
        self._asr: SpeechTranscriber | None = None
        self._asr_lock = asyncio.Lock()
        self._asr_busy = threading.Lock()
        """Held by the thread running a pass: one Whisper, one pass at a time in the server."""
        self._turn_end: TurnEnd | None = None
        self._scorer_lock = asyncio.Lock()
        self._warming: asyncio.Task[None] | None = None
        if self.defaults is not None and self.defaults["type"] == "semantic_vad":
            problem = self.semantic_problem()
            if problem is not None:
                raise ConfigError([problem])

    def _session_default(self) -> SessionTurn | None:
        """The session's default turn detection: the vad stage's ``turn_detection``
        (``StageKind.semantic_eagerness``), with its own settings for ``server_vad``."""
        if self.vad_settings is None or self.vad_stage is None:
            return None
        stage = self.app.pipeline.config.stage(self.vad_stage)
        eagerness = get_kind(stage.kind).semantic_eagerness(stage)
        if eagerness is not None:
            return semantic_turn(eagerness)
        return self.vad_settings.copy()

    def semantic_problem(self) -> Problem | None:
        """Why this pipeline's sessions cannot end turns semantically (None when they can)."""
        if self.vad_stage is None:
            return Problem(
                "session.turn_detection",
                "this pipeline has no vad stage to detect turns",
                "send turn_detection: null and commit the audio yourself",
            )
        problem = semantic_problem(self.app.pipeline.config, self.vad_stage)
        if problem is None and (not self.streaming or self._scorer() is None):
            thinker = self.text_entry or "the decode stage"
            problem = Problem(
                f"stages.{self.vad_stage}.turn_detection",
                f"semantic_vad scores the transcript with the thinker's model, and {thinker}'s engine "
                "offers no scorer (llama.cpp does)",
                "use {type: server_vad}, or plan the thinker on llamacpp-cpu",
            )
        return problem

    def _scorer(self) -> TurnScorer | None:
        """The thinker's engine's scorer (not loaded), or None."""
        if self.text_entry is None:
            return None
        name = self.text_entry
        return self.app.runtime.kinds[name].turn_scorer(
            self.app.pipeline.plan.stage(name), self.app.pipeline.config.stage(name)
        )

    def _after_asr(self, runtime: Any) -> str | None:
        """The stage the asr stage (the one a VAD-cut turn enters at) feeds, when a text request
        may enter there: the session transcribes with that asr stage's Whisper and the turn
        enters there with its transcript."""
        if self.entry is None or not self.app.runtime.kinds[self.entry].transcribes_speech:
            return None
        consumers = list(runtime.consumers.get(self.entry, []))
        if len(consumers) != 1 or consumers[0] not in runtime.entry_stages("text"):
            return None
        return str(consumers[0])

    def _after_vad(self, runtime: Any) -> str | None:
        if self.vad_stage is None or self.app.pipeline.config.stage(self.vad_stage).final_output:
            return None
        consumers = list(runtime.consumers.get(self.vad_stage, []))
        if len(consumers) != 1 or consumers[0] not in runtime.entry_stages("audio"):
            return None
        return str(consumers[0])

    def end_of_turn_ms(self) -> int | None:
        """The default end-of-turn delay: the silence that closes a turn (the vad stage's ``min_silence_ms``)."""
        return None if self.vad_settings is None else self.vad_settings["silence_duration_ms"]

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

    def warm(self) -> None:
        """Open, in the background, what sessions will need that takes seconds: the asr stage's
        Whisper (streaming transcription) and, when the pipeline's default is ``semantic_vad``,
        the thinker's model (the app's start-up; a session never waits for them: until Whisper
        is open its turns are transcribed by the pipeline's asr stage)."""
        if self.streaming and self._warming is None:
            self._warming = asyncio.get_running_loop().create_task(self._warm())

    async def _warm(self) -> None:
        try:
            await self.asr()
            if self.defaults is not None and self.defaults["type"] == "semantic_vad":
                await self.turn_end()
        except Exception:  # a session's transcript then comes from the pipeline's asr stage
            log.exception("realtime: transcripts while the user speaks are off")

    def asr_ready(self) -> bool:
        """Whether the asr stage's Whisper is open here (``warm`` opens it once)."""
        if self._asr is None and self._warming is None and self.streaming:
            with contextlib.suppress(RuntimeError):  # no running loop: nothing to schedule on
                self.warm()
        return self._asr is not None

    async def asr(self) -> SpeechTranscriber:
        """The asr stage's transcriber in this process (``StageKind.transcriber``: its graphs
        opened once, on its plan)."""
        async with self._asr_lock:
            if self._asr is None:
                assert self.entry is not None
                name = self.entry
                runner = self.app.runtime.kinds[name].transcriber(
                    self.app.pipeline.plan.stage(name), self.app.pipeline.config.stage(name)
                )
                assert runner is not None  # _after_asr: the kind transcribes speech
                t0 = time.perf_counter()
                await asyncio.to_thread(runner.load)
                log.info(
                    "realtime: the %s stage's Whisper opened in the server in %.2f s (transcripts "
                    "while the user speaks)",
                    name,
                    time.perf_counter() - t0,
                )
                self._asr = runner
            return self._asr

    def transcribe(
        self, item: Segment, prefix: list[int], cancel: threading.Event
    ) -> tuple[list[int], frozenset[int]]:
        """One transcript pass (blocking; one at a time in the server; after ``asr``): the
        tokens, the first ones ``prefix``, and where words begin in them."""
        assert self._asr is not None
        with self._asr_busy:
            audio = AudioItem(audio=item["audio"], sample_rate=item["sample_rate"])
            tokens = self._asr.decode_tokens(audio, prefix, cancel)
            return tokens, self._asr.word_starts(tokens)

    def text_of(self, tokens: list[int]) -> str:
        assert self._asr is not None
        return self._asr.text(tokens)

    def idle(self) -> bool:
        """Whether the CPU is the session's to transcribe on: no pipeline request in flight (the
        decoder's and the voice's cores are theirs while one runs) and no pass running."""
        return self.app.runtime.admission.in_flight == 0 and not self._asr_busy.locked()

    async def turn_end(self) -> TurnEnd:
        """The thinker's model scoring transcripts in this process (loaded once)."""
        async with self._scorer_lock:
            if self._turn_end is None:
                scorer = self._scorer()
                assert scorer is not None  # semantic_problem() said so before a session chose it
                t0 = time.perf_counter()
                await asyncio.to_thread(scorer.load)
                log.info(
                    "realtime: the %s stage's model opened in the server in %.2f s (semantic turn "
                    "detection)",
                    self.text_entry,
                    time.perf_counter() - t0,
                )
                self._turn_end = TurnEnd(scorer)
            return self._turn_end

    def close(self) -> None:
        if self._vad is not None:
            self._vad.close()
            self._vad = None
        if self._asr is not None:
            self._asr.close()
            self._asr = None
        if self._turn_end is not None:
            self._turn_end.scorer.close()
            self._turn_end = None

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
        self.turn: SessionTurn | None = rt.defaults.copy() if rt.defaults else None
        self.items = items.Conversation()
        """Its conversation, what each response sees (``realtime_items``)."""
        self.tools: list[RealtimeTool] | None = None
        self.tool_choice: RealtimeToolChoice = "auto"
        self.tool_call: JsonObject | None = None
        """The decode stage's ``tool_call`` of ``tools`` and ``tool_choice`` (None: text only)."""
        self.response: Response | None = None
        self.send_lock = asyncio.Lock()
        self.turns = Turns(self)
        """Its audio, cut into turns, committed and answered (``realtime_turns``)."""
        self.replies = Replies(self)
        """Its responses, each run and told (``realtime_reply``)."""

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

    def session_doc(self) -> JsonObject:
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
            "tools": items.tools_doc(self.tools),
            "tool_choice": items.choice_doc(self.tool_choice),
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
        await self.turns.early.drop_current()
        response = self.response
        if response is not None and response.task is not None:
            response.quiet = True
            response.task.cancel()
            await asyncio.gather(response.task, return_exceptions=True)
        if self.turns.cutter is not None:
            self.turns.cutter.cancel.set()

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
        try:
            event_id = check_event_id(doc)
        except BadRequest as exc:
            p = exc.problems[0]
            await self.error(f"{p.where}: {p.what} ({p.fix})", code="invalid_value", param=p.where)
            return
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
    async def on_session_update(self, doc: dict[str, object]) -> None:
        fields: SessionFields = validated(
            SessionUpdate, doc, "{'type': 'session.update', 'session': {...}}"
        ).session
        check_instructions(
            fields.instructions,
            self.rt.app.limits.max_content_chars,
            FLAGS["max_content_chars"],
        )
        given = fields.model_fields_set
        tools = fields.tools if "tools" in given else self.tools
        choice = (fields.tool_choice or "auto") if "tool_choice" in given else self.tool_choice
        if given & {"tools", "tool_choice"}:  # checked before anything changes
            self.tool_call = await items.session_tool_call(self, tools, choice, "session")
        self.tools, self.tool_choice = tools, choice
        turn = self.turn
        if "turn_detection" in given:
            turn = None if fields.turn_detection is None else self._turn(fields.turn_detection)
        in_rate = fields.input_audio_sample_rate or self.in_rate
        if turn != self.turn or in_rate != self.in_rate:
            self.turns.reset_buffer()
        self.turn, self.in_rate = turn, in_rate
        self.out_rate = fields.output_audio_sample_rate or self.out_rate
        if "instructions" in given:
            self.instructions = fields.instructions or None
        if fields.voice is not None:
            self.voice = fields.voice
        if fields.modalities is not None:
            self.modalities = list(dict.fromkeys(fields.modalities))
        await self.send("session.updated", session=self.session_doc())

    def _turn(self, given: ServerVadFields | SemanticTurnDetection) -> SessionTurn:
        """A ``session.update``'s turn detection as the session keeps it; ``BadRequest`` naming
        the field when this pipeline cannot do it."""
        if self.rt.vad_settings is None:
            raise BadRequest.single(
                "session.turn_detection",
                "this pipeline has no vad stage to detect turns",
                "send turn_detection: null and commit the audio yourself",
            )
        set_ = given.model_dump(exclude_none=True)
        if isinstance(given, ServerVadFields) and set_.pop("eagerness", None) is not None:
            raise BadRequest.single(
                "session.turn_detection.eagerness",
                "is semantic_vad's: server_vad ends a turn after silence_duration_ms",
                "send type: 'semantic_vad' with it, or leave it out",
            )
        if isinstance(given, SemanticTurnDetection):
            problem = self.rt.semantic_problem()
            if problem is not None:
                raise BadRequest.single("session.turn_detection.type", problem.what, problem.fix)
            # the model checked each field the client set; the eagerness's own fill the rest
            return cast(SemanticSettings, {**semantic_turn(given.eagerness or "auto"), **set_})
        # the model checked each field the client set; the stage's own fill the rest
        turn = cast(TurnSettings, {**self.rt.vad_settings, **set_})
        if turn["prefix_padding_ms"] > turn["silence_duration_ms"]:
            raise BadRequest.single(
                "session.turn_detection.prefix_padding_ms",
                f"{turn['prefix_padding_ms']} ms is longer than silence_duration_ms ({turn['silence_duration_ms']} ms): "
                "the padding after speech is cut from the pause that ends it",
                "make prefix_padding_ms at most silence_duration_ms",
            )
        return turn

    async def on_response_create(self, doc: dict[str, object]) -> None:
        if self.response is not None:
            raise BadRequest.single(
                "response",
                f"response {self.response.id} is still in progress",
                "wait for its response.done, or send response.cancel first",
            )
        own, tool_call = await items.response_tools(self, doc)
        if self.turns.pending is None:
            items.check_answerable(self)
        await self.respond(own, tool_call)

    async def on_response_cancel(self, doc: dict[str, object]) -> None:
        if self.response is None:
            event_id = doc.get("event_id")
            await self.error(
                "no response is in progress to cancel",
                code="response_cancel_not_active",
                event_id=event_id if isinstance(event_id, str) else None,
            )
            return
        await self.cancel("client_cancelled")

    # -- responses -------------------------------------------------------------------
    async def respond(self, own: bool = False, tool_call: JsonObject | None = None) -> None:
        """Answer the committed turn, or (none committed) the conversation's items; ``own``:
        ``tool_call`` is the ``response.create``'s, not the session's."""
        if self.response is not None:
            await self.cancel("turn_detected")
        p, self.turns.pending = self.turns.pending, None
        r = Response(new_id("resp"), new_id("item"), p.item if p else "", own_tools=own)
        r.speech_end, r.typed, r.tool_call = (
            (p.speech_end if p else time.monotonic()),
            not p,
            tool_call,
        )
        r.mark("turn_end")
        self.response = r
        audio = p.audio if p else np.zeros(0, dtype=np.float32)
        r.task = asyncio.create_task(
            self.replies.run(
                r,
                audio,
                p.rate if p else self.in_rate,
                p.entry if p else None,
                p.heard if p else None,
            ),
            name=f"realtime:{r.id}",
        )

    async def cancel(self, reason: str) -> None:
        response = self.response
        if response is None or response.task is None:
            return
        response.reason = reason
        response.task.cancel()
        await asyncio.gather(response.task, return_exceptions=True)

    def context(self, sampling: Sampling | None = None) -> dict[str, list[Item]] | None:
        """The conversation so far (the newest ``HISTORY_CHARS`` of it) for each decode stage,
        with ``sampling`` (a response's tools)."""
        messages: list[ChatMessage] = []
        total = 0
        for m in reversed(self.items.messages()):
            total += len(m["content"])
            if total > HISTORY_CHARS and messages:  # the newest is kept whole: it is the turn
                break
            messages.insert(0, m)
        if self.instructions:
            messages.insert(0, ChatMessage(role="system", content=self.instructions))
        if not messages or not self.rt.decode_stages:
            return None
        item = (
            ChatItem(messages=messages)
            if sampling is None
            else ChatItem(messages=messages, sampling=sampling)
        )
        return {name: [item] for name in self.rt.decode_stages}


def _turn_defaults(turn: TurnDetection) -> TurnSettings:
    """A session's ``turn_detection`` as OpenAI's server VAD spells it, from the stage's own."""
    return TurnSettings(
        type="server_vad",
        threshold=float(turn.threshold),
        prefix_padding_ms=int(turn.prefix_padding_ms),
        silence_duration_ms=int(turn.silence_duration_ms),
        create_response=True,
        interrupt_response=True,
    )


HANDLERS: dict[str, Callable[[Session, dict[str, object]], Any]] = {
    "session.update": Session.on_session_update,
    "input_audio_buffer.append": lambda s, doc: s.turns.on_append(doc),
    "input_audio_buffer.commit": lambda s, doc: s.turns.on_commit(doc),
    "input_audio_buffer.clear": lambda s, doc: s.turns.on_clear(doc),
    "response.create": Session.on_response_create,
    "response.cancel": Session.on_response_cancel,
    "conversation.item.create": items.on_item_create,
    "conversation.item.retrieve": items.on_item_retrieve,
    "conversation.item.delete": items.on_item_delete,
    "conversation.item.truncate": items.on_item_truncate,
}
"""The client events a session takes, by ``type``."""
