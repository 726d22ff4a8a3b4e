"""An OpenAI-compatible HTTP front for one started pipeline (``omni-edge serve``).

The app drives a :class:`~orchestrator.api.Pipeline` that was planned, verified
and started once (``Pipeline.from_config``, the path ``run`` takes); every
request that runs the pipeline is one ``pipeline.stream`` call. The shapes are
OpenAI's, so the official ``openai`` client works unchanged (docs/serving.md
has every endpoint, shape and metric):

* ``POST /v1/chat/completions``: ``messages`` go to the stage that takes the
  request as ``{"messages": [...], "sampling": {...}}`` (the ar_decode stage
  applies its chat template to the whole list, system message and history
  included); ``max_tokens`` (or ``max_completion_tokens``), ``temperature``,
  ``top_p`` and ``seed`` become the request's ``sampling``. The reply is the
  text of the pipeline's text output; ``stream: true`` sends it as server-sent
  events (``data: {chat.completion.chunk}`` lines, then ``data: [DONE]``).
  ``modalities: ["text", "audio"]`` adds the audio output stage's audio as
  OpenAI does: ``message.audio`` (base64 WAV at the voice's rate, or pcm16 at
  24 kHz, and the transcript); streamed, ``delta.audio`` chunks carry the
  transcript as it is generated and each audio chunk (pcm16, 24 kHz) the moment
  the voice yields it. ``usage`` carries the decode stage's token counts.
  A user message may carry the request as audio, OpenAI's ``input_audio``
  content part (``{"type": "input_audio", "input_audio": {"data": base64 WAV,
  "format": "wav"}}``), for a pipeline whose entry stage takes audio (a VAD or
  ASR stage): the recording alone is the request then (one such part, no other
  text and no sampling fields, since nothing but the audio reaches the entry
  stage), and the reply is the text of the text output stages downstream of
  another one (the thinker's, not the transcript). A pipeline without an audio
  entry answers 400.
* ``POST /v1/audio/speech``: ``input`` enters the graph at the speech stage
  (the audio output stage whose kind takes text; ``Pipeline.stream(entry=)``),
  so only it runs; the body streams as ``audio/wav`` (at the voice's rate, the
  header's sizes unknown) or ``audio/pcm`` (24 kHz pcm16), ``X-Sample-Rate``.
* ``GET /v1/models``, ``GET /health`` (every stage: device, backend, loaded,
  alive; 503 while one is dead), ``GET /v1/plan`` (the plan with each stage's
  measured peak next to its budget), ``GET /v1/status`` (stages, pools, the
  last requests' latencies), ``GET /metrics`` (Prometheus text,
  ``server_metrics``), ``GET /`` (the page: ``orchestrator/web``, its files
  under ``/static``).

A client that goes away is cancelled all the way down, whenever it leaves:
before the response starts (a watcher on the connection, ``_Run.until``) or
while it streams (the body generator is closed, ``_Stream``); either closes the
pipeline's stream, which cancels the request on every device actor (the vLLM
request aborted, queued sentences dropped) and frees its admission slot.

Errors are OpenAI's ``{"error": {"message", "type", "param", "code"}}``:
``BadRequest`` → 400 (where, what, how to fix), ``PipelineBusy`` → 429 with
``Retry-After``, ``StageFailed`` → 503 naming the stage and the device (a dead
stage fails only the requests that need it). With an API key every request
but the page's static files needs ``Authorization: Bearer KEY`` (401
otherwise), compared in constant time.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any, TypeGuard

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.api import Pipeline, audio_entry_stages, audio_request
from orchestrator.errors import BadRequest, PipelineBusy, Problem, StageFailed
from orchestrator.runtime.audio import OPENAI_PCM_RATE, pcm16_bytes, resample, wav_header
from orchestrator.runtime.events import AudioChunk, Event, TextDelta
from orchestrator.server_guard import RequestGuard
from orchestrator.server_metrics import ServerMetrics, Trace

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
"""What a 429 asks a client to wait: requests finish in seconds, and the queue frees a slot as each does."""
AUDIO_EXPIRES_S = 3600
"""``message.audio.expires_at``: nothing is kept server-side; the hour is OpenAI's own figure."""
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
SAMPLING_FIELDS = {"max_tokens": "max_tokens", "max_completion_tokens": "max_tokens", "temperature": "temperature",
                   "top_p": "top_p", "seed": "seed", "min_tokens": "min_tokens", "top_k": "top_k"}
"""OpenAI request fields → the decode stage's sampling keys (``min_tokens`` and
``top_k`` are vLLM's own extensions of the request, sent as ``extra_body``)."""
CHAT_AUDIO_FORMATS = ("wav", "pcm16")
SPEECH_FORMATS = ("wav", "pcm")
REQUEST_ERRORS = (BadRequest, PipelineBusy, StageFailed)
WEB_DIR = Path(__file__).with_name("web")
"""The page at ``/`` (index.html, app.js, style.css): package data served as it is, no build step."""


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def error_response(status: int, message: str, type_: str, *, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status, headers=headers)


def error_for(exc: BaseException) -> JSONResponse:
    """An exception of a request as OpenAI's error shape and status."""
    if isinstance(exc, BadRequest):
        where = _openai_param(exc.problems[0].where) if exc.problems else None
        return error_response(400, str(exc), "invalid_request_error", param=where, code="bad_request")
    if isinstance(exc, PipelineBusy):
        return error_response(429, str(exc), "rate_limit_error", code="pipeline_busy",
                              headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, StageFailed):
        return error_response(503, str(exc), "server_error", param=exc.stage, code="stage_failed")
    raise exc


def _openai_param(where: str) -> str:
    """The request field a stage's ``BadRequest`` names, in the OpenAI request's terms."""
    if where.startswith("request.sampling."):
        return where.removeprefix("request.sampling.")
    if where in ("prompt", "request.prompt", "request.messages"):
        return "messages"
    return where


def _bad(where: str, what: str, fix: str = "") -> BadRequest:
    return BadRequest([Problem(where, what, fix)])


AUDIO_INPUT_FORMATS = ("wav",)


def chat_request(body: Any, *, audio_entry: bool = False) -> dict[str, Any]:
    """The pipeline request of an OpenAI chat body; ``BadRequest`` for what it cannot take.

    With an ``input_audio`` content part (and ``audio_entry``: the pipeline has an entry
    stage that takes audio) the request is the recording, ``{"audio", "sample_rate"}``."""
    if not isinstance(body, dict):
        raise _bad("body", "is not a JSON object", "send {'model': ..., 'messages': [...]}")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty list of {role, content}", "e.g. [{'role': 'user', 'content': 'Hi'}]")
    heard = _input_audio(messages, audio_entry)
    if heard is not None:
        return _audio_only(body, messages, heard)
    out: list[dict[str, str]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
            raise _bad(f"messages[{i}].role", "must be system, developer, user or assistant")
        content = m.get("content")
        if m["role"] == "assistant" and content is None and isinstance(m.get("audio"), dict):
            content = ""  # an earlier audio reply sent back by id: its words are not in the message
        if isinstance(content, list):  # content parts: text only (input_audio is handled above)
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                raise _bad(f"messages[{i}].content", "only text and input_audio parts are served", "send text content")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise _bad(f"messages[{i}].content", "is not text", "send the message's text as a string")
        out.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
    if not any(m["role"] == "user" and m["content"].strip() for m in out):
        raise _bad("messages", "has no user message with text", "add {'role': 'user', 'content': '...'}")
    if body.get("n", 1) != 1:
        raise _bad("n", f"{body.get('n')!r}: one choice per request is served", "leave n unset or 1")
    sampling: dict[str, Any] = {}
    for field, key in SAMPLING_FIELDS.items():
        value = body.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _bad(field, f"{value!r} is not a number")
        if key == "max_tokens" and (not isinstance(value, int) or value < 1):
            raise _bad(field, f"{value!r}: must be a whole number of at least 1", "e.g. 64")
        if key in ("min_tokens", "top_k") and not isinstance(value, int):
            raise _bad(field, f"{value!r}: must be a whole number", "e.g. 16")
        sampling[key] = value
    request: dict[str, Any] = {"messages": out}
    if sampling:
        request["sampling"] = sampling
    return request


def _input_audio(messages: list[Any], audio_entry: bool) -> tuple[str, dict[str, Any]] | None:
    """(where, the decoded recording) of the one ``input_audio`` part, or None when there is none."""
    found = [(i, j, p) for i, m in enumerate(messages) if isinstance(m, dict) and isinstance(m.get("content"), list)
             for j, p in enumerate(m["content"]) if isinstance(p, dict) and p.get("type") == "input_audio"]
    if not found:
        return None
    i, j, part = found[0]
    where = f"messages[{i}].content[{j}]"
    if not audio_entry:
        raise _bad(where, "this pipeline has no entry stage that takes audio",
                   "send the message as text, or serve a pipeline whose first stage is a vad or asr stage "
                   "(configs/examples/voice-chat.yaml)")
    if len(found) > 1:
        raise _bad(f"messages[{found[1][0]}].content[{found[1][1]}]", "a request carries one recording",
                   "send one input_audio part per request")
    if messages[i].get("role") != "user":
        raise _bad(f"messages[{i}].role", f"{messages[i].get('role')!r}: audio is heard from the user only",
                   "put the input_audio part in a user message")
    inner = part.get("input_audio")
    if not isinstance(inner, dict) or not isinstance(inner.get("data"), str):
        raise _bad(f"{where}.input_audio", "must be {'data': base64 audio, 'format': 'wav'}",
                   "e.g. {'type': 'input_audio', 'input_audio': {'data': base64.b64encode(wav_bytes), 'format': 'wav'}}")
    fmt = inner.get("format")
    if fmt not in AUDIO_INPUT_FORMATS:
        raise _bad(f"{where}.input_audio.format", f"{fmt!r} is not read", "send a 16-bit PCM WAV file, format 'wav'")
    try:
        data = base64.b64decode(inner["data"], validate=True)
    except (ValueError, TypeError):
        raise _bad(f"{where}.input_audio.data", "is not base64", "base64-encode the WAV file's bytes") from None
    return where, audio_request(data, where=f"{where}.input_audio.data")


def _audio_only(body: dict[str, Any], messages: list[Any], heard: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """The recording as the request, once nothing else in the body would be silently dropped."""
    where, audio = heard
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        for j, p in enumerate(parts):
            text = p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None
            if isinstance(text, str) and text.strip():
                at = f"messages[{i}].content" + (f"[{j}]" if isinstance(content, list) else "")
                raise _bad(at, f"text next to the recording in {where}: only the audio reaches the pipeline's "
                           "audio entry stage, so this text would be ignored",
                           "send the recording alone (the config's system prompt applies downstream), or text alone")
    for field in SAMPLING_FIELDS:
        if body.get(field) is not None:
            raise _bad(field, "sampling goes to the stage that takes the request, and with audio that stage takes none",
                       "leave it out with input_audio (the config's sampling applies)")
    if body.get("n", 1) != 1:
        raise _bad("n", f"{body.get('n')!r}: one choice per request is served", "leave n unset or 1")
    return audio


def audio_format(body: dict[str, Any], *, has_audio: bool) -> str | None:
    """The audio format a chat body asks for (``modalities`` with ``audio``), or None for text only."""
    modalities = body.get("modalities") or ["text"]
    if not isinstance(modalities, list) or not set(modalities) <= {"text", "audio"}:
        raise _bad("modalities", f"{modalities!r}: only 'text' and 'audio' are served", "e.g. ['text', 'audio']")
    if "audio" not in modalities:
        return None
    if not has_audio:
        raise _bad("modalities", "this pipeline has no audio output stage", "ask for ['text'] only")
    audio = body.get("audio")
    fmt = audio.get("format") if isinstance(audio, dict) else None
    if fmt not in CHAT_AUDIO_FORMATS:
        raise _bad("audio.format", f"{fmt!r} is not served", f"use one of {', '.join(CHAT_AUDIO_FORMATS)}")
    if body.get("stream") and fmt != "pcm16":
        raise _bad("audio.format", f"{fmt!r} cannot be streamed", "use 'pcm16' with stream: true (as OpenAI does)")
    return str(fmt)


def speech_request(body: Any) -> tuple[str, str]:
    """(input text, response format) of an OpenAI speech body; ``BadRequest`` for what it cannot take."""
    if not isinstance(body, dict):
        raise _bad("body", "is not a JSON object", "send {'model': ..., 'input': '...', 'voice': ...}")
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise _bad("input", "must be text that is not blank", "send the text to speak")
    fmt = body.get("response_format") or "wav"
    if fmt not in SPEECH_FORMATS:
        raise _bad("response_format", f"{fmt!r} is not served", f"use one of {', '.join(SPEECH_FORMATS)}")
    speed = body.get("speed")
    if speed not in (None, 1, 1.0):
        raise _bad("speed", f"{speed!r}: the voice speaks at its own speed", "leave speed unset or 1.0")
    return text, str(fmt)


def pcm24k(chunk: AudioChunk) -> bytes:
    """An audio chunk as OpenAI's pcm16: 24 kHz, 16-bit, mono, little-endian."""
    return pcm16_bytes(resample(chunk.audio, chunk.sample_rate, OPENAI_PCM_RATE))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


async def _client_gone(request: Request) -> None:
    """Return once the client has disconnected (its request body already read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _Stream(StreamingResponse):
    """A streamed response whose body generator is always closed when the response
    ends — also when the client went away while a chunk was being sent, where
    Starlette leaves the generator suspended (and so the request running) until
    it is garbage-collected."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


class _BearerAuth:
    """``Authorization: Bearer KEY`` on every request (401 otherwise), compared in constant time —
    except the page's own static files (``GET /``, ``/static/...``): they hold no data, and
    the page asks for the key before it calls the API."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.key = app, key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        public = scope.get("method") in ("GET", "HEAD") and (path == "/" or path.startswith("/static/"))
        if scope["type"] == "http" and not public:
            header = dict(scope.get("headers") or []).get(b"authorization", b"")
            scheme, _, given = header.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.key):
                response = error_response(401, "a valid API key is required: Authorization: Bearer KEY",
                                          "invalid_request_error", code="invalid_api_key",
                                          headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _Run:
    """One pipeline request as the app drives it: its events, seen by its trace,
    and recorded in the metrics once (whatever way it ends)."""

    def __init__(self, app: _App, prompt: Any, endpoint: str, entry: str | None = None) -> None:
        self.app, self.rid = app, uuid.uuid4().hex[:12]
        self.trace = Trace(self.rid, endpoint)
        self.events = app.pipeline.stream(prompt, request_id=self.rid, entry=entry)
        self.buffered: list[Event] = []
        self.status = 200
        self._finished = False

    async def until(self, found: Callable[[Event], bool], request: Request) -> bool:
        """Read events until one is ``found`` or the request ends, keeping them for ``rest``;
        False when the client went away first (the request is then cancelled and recorded).
        A request refused up front raises here, before any response has started."""
        reading = asyncio.ensure_future(self._until(found))
        watching = asyncio.ensure_future(_client_gone(request))
        try:
            await asyncio.wait({reading, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watching.cancel()
            if not reading.done():
                reading.cancel()  # cancels the request on the stages, frees its slot
                await asyncio.wait({reading})
        if reading.cancelled():
            await self.close(499)  # nobody to answer: the response never starts
            return False
        reading.result()  # raises what the request raised
        return True

    async def _until(self, found: Callable[[Event], bool]) -> None:
        async for event in self.events:
            self.trace.see(event)
            self.buffered.append(event)
            if found(event):
                return

    async def rest(self) -> AsyncIterator[Event]:
        """The kept events, then the others as they come."""
        while self.buffered:
            yield self.buffered.pop(0)
        async for event in self.events:
            self.trace.see(event)
            yield event

    async def close(self, status: int | None = None) -> None:
        """End the request (cancelling what still runs) and record it, once."""
        if status is not None:
            self.status = status
        if self._finished:
            return
        self._finished = True
        try:
            await self.events.aclose()  # type: ignore[attr-defined]
        finally:
            if self.status in (400, 429, 503):
                self.app.metrics.refused(self.trace.endpoint, self.status)
            else:
                self.app.metrics.finish(self.trace, self.status)


class _App:
    """The endpoints of one pipeline (see the module docstring)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.runtime = pipeline.runtime
        self.model = pipeline.plan.pipeline
        self.created = int(time.time())
        self.metrics = ServerMetrics(self.runtime)
        if getattr(pipeline, "calibration", None) is not None:  # measured peaks feed the next plan, while serving
            self.metrics.recorder = pipeline.record_calibration
        self.metrics.server_memory = getattr(pipeline, "server_memory", None)  # the serve process's own memory
        stages = self.runtime.stages
        self.text_stages = {s.name for s in stages if s.final_output and s.final_output_type == "text"}
        self.audio_entry = bool(audio_entry_stages(pipeline.config))
        if self.audio_entry:
            # the reply is the text of the text stages downstream of another one (the thinker's,
            # not the transcript the asr stage returns too)
            replies = {n for n in self.text_stages
                       if any(n in {s.name for s in self.runtime.downstream(t)} - {t} for t in self.text_stages)}
            self.text_stages = replies or self.text_stages
        self.audio_stages = {s.name for s in stages if s.final_output and s.final_output_type == "audio"}
        takes_text = set(self.runtime.entry_stages())
        self.speech_stage = next((s.name for s in stages if s.name in self.audio_stages and s.name in takes_text), None)

    # -- helpers -------------------------------------------------------------------
    def is_text(self, event: Event) -> TypeGuard[TextDelta]:
        return isinstance(event, TextDelta) and event.stage in self.text_stages

    def is_audio(self, event: Event) -> TypeGuard[AudioChunk]:
        return isinstance(event, AudioChunk) and event.stage in self.audio_stages

    def refuse(self, endpoint: str, exc: BaseException) -> JSONResponse:
        response = error_for(exc)
        self.metrics.refused(endpoint, response.status_code)
        return response

    async def _json(self, request: Request) -> Any:
        try:
            return await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise _bad("body", "is not JSON", "send a JSON object") from None

    def stage_states(self) -> list[dict[str, Any]]:
        out = []
        for s in self.runtime.stages:
            dev = self.runtime.devices.get(s.device or "?")
            alive = dev is not None and not dev.dead and not self.runtime._closed
            out.append({"name": s.name, "kind": s.kind, "device": s.device, "backend": s.backend,
                        "loaded": s.name in self.runtime.load_results and alive, "alive": alive,
                        "final_output_type": s.final_output_type if s.final_output else None,
                        **({"error": dev.dead} if dev is not None and dev.dead else {})})
        return out

    # -- endpoints -------------------------------------------------------------------
    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": self.created, "owned_by": "omni-edge",
             "stages": [s.name for s in self.runtime.stages]}]})

    async def health(self, request: Request) -> Response:
        stages = self.stage_states()
        ok = all(s["alive"] for s in stages)
        return JSONResponse({"status": "ok" if ok else "unavailable", "pipeline": self.model, "stages": stages},
                            status_code=200 if ok else 503)

    async def plan(self, request: Request) -> Response:
        doc = self.pipeline.plan.to_json()
        measured = await self.metrics.measured_now()
        for s in doc["stages"]:
            m = measured.get(s["name"]) or {}
            s["measured"] = {"pool": self.pipeline.plan.stage(s["name"]).pool,
                             "measured_peak_bytes": m.get("measured_peak_bytes"),
                             "budget_bytes": m.get("budget_bytes", self.pipeline.plan.stage(s["name"]).budget_bytes()),
                             "within_budget": m.get("within_budget")}
        # the serve process's own memory against its shared reservation (``server``)
        server_memory = getattr(self.pipeline, "server_memory", None)
        doc["server"] = await asyncio.to_thread(server_memory) if server_memory is not None else None
        return JSONResponse(doc)

    async def status(self, request: Request) -> Response:
        measured = await self.metrics.measured_now()
        ledger = await self.metrics.ledger() or {}
        held = {p["id"]: p["held_bytes"] for p in ledger.get("pools", [])}
        pools = []
        for p in self.pipeline.plan.pools:
            peaks = [m["measured_peak_bytes"] for name, m in measured.items()
                     if self.pipeline.plan.stage(name).pool == p.id and m.get("measured_peak_bytes") is not None]
            pools.append({"id": p.id, "capacity_bytes": p.capacity_bytes, "budget_bytes": p.peak_bytes,
                          "reserved_bytes": held.get(p.id), "measured_peak_bytes": sum(peaks) if peaks else None})
        stages = [{k: s[k] for k in ("name", "kind", "device", "backend", "alive", "loaded", "final_output_type")}
                  for s in self.stage_states()]
        admission = self.runtime.admission
        return JSONResponse({"pipeline": self.model, "stages": stages, "pools": pools,
                             "queue": {"in_flight": admission.in_flight, "waiting": admission.waiting,
                                       "limit": admission.limit, "max_waiting": admission.max_waiting},
                             "recent": list(self.metrics.recent)})

    async def metrics_text(self, request: Request) -> Response:
        return Response(await self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def chat(self, request: Request) -> Response:
        try:
            body = await self._json(request)
            prompt = chat_request(body, audio_entry=self.audio_entry)
            fmt = audio_format(body, has_audio=bool(self.audio_stages))
        except BadRequest as exc:
            return self.refuse("chat", exc)
        run = _Run(self, prompt, "chat")
        base = {"id": f"chatcmpl-{run.rid}", "created": int(time.time()), "model": self.model}
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._chat_stream(run, base, fmt, usage, request)
        return await self._chat_whole(run, base, fmt, request)

    async def _chat_whole(self, run: _Run, base: dict[str, Any], fmt: str | None, request: Request) -> Response:
        try:
            if not await run.until(lambda e: False, request):
                return Response(status_code=499)
            events = [e async for e in run.rest()]
        except REQUEST_ERRORS as exc:
            response = error_for(exc)
            await run.close(response.status_code)
            return response
        await run.close(200)
        text = "".join(e.text for e in events if self.is_text(e))
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if fmt is not None:
            chunks = [e for e in events if self.is_audio(e)]
            message = {"role": "assistant", "content": None, "audio": {
                "id": f"audio-{run.rid}", "expires_at": int(time.time()) + AUDIO_EXPIRES_S,
                "data": _b64(self._whole_audio(chunks, fmt)), "transcript": text}}
        doc: dict[str, Any] = {**base, "object": "chat.completion", "choices": [
            {"index": 0, "message": message, "finish_reason": self._finish_reason(run)}]}
        usage = run.trace.usage()
        if usage:
            doc["usage"] = usage
        return JSONResponse(doc)

    @staticmethod
    def _whole_audio(chunks: list[AudioChunk], fmt: str) -> bytes:
        if fmt == "pcm16":
            return b"".join(pcm24k(c) for c in chunks)
        pcm = b"".join(pcm16_bytes(c.audio) for c in chunks)
        rate = chunks[0].sample_rate if chunks else OPENAI_PCM_RATE
        return wav_header(rate, len(pcm)) + pcm

    def _finish_reason(self, run: _Run) -> str:
        reasons = [s.get("stats", {}).get("finish_reason") for name, s in run.trace.stages.items()
                   if name in self.text_stages]
        return "length" if "length" in reasons else "stop"

    async def _chat_stream(self, run: _Run, base: dict[str, Any], fmt: str | None, include_usage: bool,
                           request: Request) -> Response:
        # The first event is awaited before the response starts, so a request refused
        # up front (bad, busy, a dead stage) gets its HTTP status, not a broken stream.
        try:
            if not await run.until(lambda e: True, request):
                return Response(status_code=499)
        except REQUEST_ERRORS as exc:
            response = error_for(exc)
            await run.close(response.status_code)
            return response
        audio_id = f"audio-{run.rid}"

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            doc = {**base, "object": "chat.completion.chunk",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            return f"data: {json.dumps(doc)}\n\n"

        def delta_of(event: Event) -> dict[str, Any] | None:
            if self.is_text(event):
                return {"audio": {"id": audio_id, "transcript": event.text}} if fmt else {"content": event.text}
            if fmt and self.is_audio(event):
                return {"audio": {"id": audio_id, "data": _b64(pcm24k(event))}}
            return None

        async def sse() -> AsyncIterator[str]:
            status = 499  # the client went away, unless the stream ends otherwise
            try:
                yield chunk({"role": "assistant", "content": None if fmt else ""})
                async for event in run.rest():
                    delta = delta_of(event)
                    if delta is not None:
                        yield chunk(delta)
                yield chunk({}, self._finish_reason(run))
                usage = run.trace.usage()
                if include_usage and usage:
                    yield f"data: {json.dumps({**base, 'object': 'chat.completion.chunk', 'choices': [], 'usage': usage})}\n\n"
                status = 200
            except REQUEST_ERRORS as exc:
                response = error_for(exc)
                status = response.status_code
                yield f"data: {bytes(response.body).decode()}\n\n"
            finally:
                await run.close(status)
            yield "data: [DONE]\n\n"

        return _Stream(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def speech(self, request: Request) -> Response:
        try:
            text, fmt = speech_request(await self._json(request))
            if self.speech_stage is None:
                raise _bad("model", f"pipeline {self.model!r} has no speech stage (an audio output stage that takes "
                           "text)", "serve a pipeline with a voice stage")
        except BadRequest as exc:
            return self.refuse("speech", exc)
        run = _Run(self, text, "speech", entry=self.speech_stage)
        try:
            if not await run.until(self.is_audio, request):  # the WAV header needs the voice's sample rate
                return Response(status_code=499)
        except REQUEST_ERRORS as exc:
            response = error_for(exc)
            await run.close(response.status_code)
            return response
        first = next((e for e in run.buffered if self.is_audio(e)), None)
        if first is None:
            await run.close(400)
            return error_response(400, f"input {text[:60]!r} has nothing to speak (no letter or digit)",
                                  "invalid_request_error", param="input", code="bad_request")
        rate = first.sample_rate if fmt == "wav" else OPENAI_PCM_RATE

        async def body() -> AsyncIterator[bytes]:
            status = 499
            try:
                if fmt == "wav":
                    yield wav_header(rate, None)
                async for event in run.rest():
                    if self.is_audio(event):
                        yield pcm16_bytes(event.audio) if fmt == "wav" else pcm24k(event)
                status = 200
            except REQUEST_ERRORS as exc:  # the status is sent: the body ends short
                status = error_for(exc).status_code
                log.warning("speech request %s failed after its audio started: %s", run.rid, exc)
            finally:
                await run.close(status)

        return _Stream(body(), media_type="audio/wav" if fmt == "wav" else "audio/pcm",
                       headers={"X-Sample-Rate": str(rate), "Cache-Control": "no-cache"})


def create_app(pipeline: Pipeline, *, api_key: str | None = None,
               allowed_hosts: Iterable[str] | None = ()) -> ASGIApp:
    """The ASGI app serving ``pipeline`` (started; closed by whoever started it), behind
    ``server_guard.RequestGuard`` (``allowed_hosts``: names served besides loopback ones, None: any)."""
    app = _App(pipeline)
    starlette = Starlette(routes=[
        Route("/v1/chat/completions", app.chat, methods=["POST"]),
        Route("/v1/audio/speech", app.speech, methods=["POST"]),
        Route("/v1/models", app.models, methods=["GET"]),
        Route("/v1/plan", app.plan, methods=["GET"]),
        Route("/v1/status", app.status, methods=["GET"]),
        Route("/health", app.health, methods=["GET"]),
        Route("/metrics", app.metrics_text, methods=["GET"]),
        Route("/", lambda request: FileResponse(WEB_DIR / "index.html"), methods=["GET"]),
        Mount("/static", StaticFiles(directory=WEB_DIR), name="static"),
    ])
    starlette.state.omni_edge = app  # for tests and embedding: the metrics, the pipeline
    served: ASGIApp = starlette
    if api_key:
        served = _BearerAuth(served, api_key)
    return RequestGuard(served, allowed_hosts=allowed_hosts)
