"""The app: the endpoints of one started pipeline (the package docstring describes them)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any, TypeGuard

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.api import Pipeline, audio_entry_stages, tensor_entry_stages
from orchestrator.errors import BadRequest, Problem
from orchestrator.runtime.audio import OPENAI_PCM_RATE, pcm16_bytes, resample, wav_header
from orchestrator.runtime.events import AudioChunk, Event, OutputItem, TextDelta
from orchestrator.server.auth import BearerAuth, error_response
from orchestrator.server.failures import REQUEST_ERRORS, failure
from orchestrator.server.paths import FULL, PATHS_PARAM, paths_asked, redact_paths
from orchestrator.server.protocol import (
    ChatCall,
    ServerLimits,
    body_too_large,
    read_chat,
    read_speech,
)
from orchestrator.server.realtime import Realtime, RealtimeLimits
from orchestrator.server_guard import RequestGuard
from orchestrator.server_metrics import ServerMetrics, Trace
from stages.payloads import spell

log = logging.getLogger(__name__)

AUDIO_EXPIRES_S = 3600
"""``message.audio.expires_at``: nothing is kept server-side; the hour is OpenAI's own figure."""
HEALTH_TIMEOUT_S = 2.0
"""How long ``/health`` waits for a device actor to say how its stages are: an actor
answers in milliseconds; one that does not within this is reported, not waited for."""
WEB_DIR = Path(__file__).parent.parent / "web"
"""The page at ``/`` (index.html, app.js, style.css): package data served as it is, no build step."""


def error_for(exc: BaseException) -> JSONResponse:
    """An exception of a request as OpenAI's error shape and status (``failures.failure``);
    any other exception is raised again."""
    f = failure(exc)
    if f is None:
        raise exc
    headers = None if f.retry_after_s is None else {"Retry-After": str(f.retry_after_s)}
    return error_response(f.status, f.message, f.type, param=f.param, code=f.code, headers=headers)


class BodyTooLarge(Exception):
    """A request body over ``ServerLimits.max_body_bytes`` (413); ``size`` when the header said it."""

    def __init__(self, size: int | None) -> None:
        super().__init__(size)
        self.size = size


async def read_body(request: Request, cap: int) -> bytes:
    """The request's body, read no further than ``cap`` bytes: ``BodyTooLarge`` at once when
    its ``Content-Length`` says more, or as soon as more arrives (the rest is never read)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise BodyTooLarge(int(declared))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise BodyTooLarge(None)
        chunks.append(chunk)
    return b"".join(chunks)


def pcm24k(chunk: AudioChunk) -> bytes:
    """An audio chunk as OpenAI's pcm16: 24 kHz, 16-bit, mono, little-endian."""
    return pcm16_bytes(resample(chunk.audio, chunk.sample_rate, OPENAI_PCM_RATE))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def npy_bytes(value: Any) -> bytes:
    """An array as a ``.npy`` file's bytes (``numpy.save``, never pickled)."""
    import numpy as np

    out = io.BytesIO()
    np.save(out, np.asarray(value), allow_pickle=False)
    return out.getvalue()


def _part_of(where: str, tensor_at: dict[str, str]) -> str:
    """The content part a stage's problem with an array is about: the part of the input it
    names (``request (stage proj, kind exported_graph): embedding``), else the first part."""
    named = where.rpartition(": ")[2] if ": " in where else None
    at = tensor_at.get(named or "") or tensor_at.get("") or next(iter(tensor_at.values()))
    return f"{at}.input_tensor"


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


class _Run:
    """One pipeline request as the app drives it: its events, seen by its trace,
    and recorded in the metrics once (whatever way it ends)."""

    def __init__(
        self,
        app: _App,
        prompt: Any,
        endpoint: str,
        entry: str | None = None,
        context: dict[str, list[Any]] | None = None,
        conversation: str | None = None,
    ) -> None:
        self.app, self.rid = app, uuid.uuid4().hex[:12]
        self.trace = Trace(self.rid, endpoint)
        extra: dict[str, Any] = {"context": context} if context else {}
        if conversation is not None:  # a realtime session's turns: one replica of a talker
            extra["conversation"] = conversation
        self.events = app.pipeline.stream(prompt, request_id=self.rid, entry=entry, **extra)
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

    def __init__(self, pipeline: Pipeline, limits: ServerLimits) -> None:
        self.pipeline = pipeline
        self.limits = limits
        self.runtime = pipeline.runtime
        self.model = pipeline.plan.pipeline
        self.created = int(time.time())
        self.metrics = ServerMetrics(self.runtime)
        if (
            getattr(pipeline, "calibration", None) is not None
        ):  # measured peaks feed the next plan, while serving
            self.metrics.recorder = pipeline.record_calibration
        self.metrics.server_memory = getattr(
            pipeline, "server_memory", None
        )  # the serve process's own memory
        stages = self.runtime.stages
        self.text_stages = {
            s.name for s in stages if s.final_output and s.final_output_type == "text"
        }
        self.audio_entry = bool(audio_entry_stages(pipeline.config))
        if self.audio_entry:
            # the reply is the text of the text stages downstream of another one (the thinker's,
            # not the transcript the asr stage returns too)
            replies = {
                n
                for n in self.text_stages
                if any(
                    n in {s.name for s in self.runtime.downstream(t)} - {t}
                    for t in self.text_stages
                )
            }
            self.text_stages = replies or self.text_stages
        self.audio_stages = {
            s.name for s in stages if s.final_output and s.final_output_type == "audio"
        }
        self.tensor_stages = {
            s.name for s in stages if s.final_output and s.final_output_type == "tensor"
        }
        """Their items go in the reply as ``outputs`` (base64 .npy): OpenAI's shape has no place for arrays."""
        self.tensor_entry = bool(tensor_entry_stages(pipeline.config))
        takes_text = set(self.runtime.entry_stages())
        self.speech_stage = next(
            (s.name for s in stages if s.name in self.audio_stages and s.name in takes_text), None
        )

    # -- helpers -------------------------------------------------------------------
    def is_text(self, event: Event) -> TypeGuard[TextDelta]:
        return isinstance(event, TextDelta) and event.stage in self.text_stages

    def is_audio(self, event: Event) -> TypeGuard[AudioChunk]:
        return isinstance(event, AudioChunk) and event.stage in self.audio_stages

    def output_of(self, event: Event) -> dict[str, Any] | None:
        """A tensor stage's item as the reply carries it: ``{"stage", "tensor": base64 .npy}``
        for an array, ``{"stage", "tensors": {name: base64 .npy}}`` for a mapping of them."""
        if not isinstance(event, OutputItem) or event.stage not in self.tensor_stages:
            return None
        value = event.value
        if isinstance(value, dict):
            return {
                "stage": event.stage,
                "tensors": {str(k): _b64(npy_bytes(v)) for k, v in value.items()},
            }
        return {"stage": event.stage, "tensor": _b64(npy_bytes(value))}

    def read_chat(self, raw: bytes) -> ChatCall:
        """A chat body checked (off the event loop); a request of arrays also against the entry
        stage (``Pipeline.validate``: names, dtype, shape), its problem named by the part sent."""
        call = read_chat(
            raw,
            audio_entry=self.audio_entry,
            has_audio=bool(self.audio_stages),
            limits=self.limits,
            tensor_entry=self.tensor_entry,
        )
        if call.tensor_at:
            try:
                self.pipeline.validate(call.prompt)
            except BadRequest as exc:
                raise BadRequest(
                    [
                        Problem(_part_of(p.where, call.tensor_at), f"{p.where}: {p.what}", p.fix)
                        for p in exc.problems
                    ]
                ) from None
        return call

    def refuse(self, endpoint: str, exc: BaseException) -> JSONResponse:
        response = error_for(exc)
        self.metrics.refused(endpoint, response.status_code)
        return response

    async def _body(self, request: Request, endpoint: str, read: Callable[[bytes], Any]) -> Any:
        """The body read under the size cap and checked by ``read`` in a worker thread (JSON,
        base64 and WAV decoding stay off the event loop); a refusal as a ``Response``."""
        try:
            raw = await read_body(request, self.limits.max_body_bytes)
            return await asyncio.to_thread(read, raw)
        except BodyTooLarge as exc:
            self.metrics.refused(endpoint, 413)
            return error_response(
                413,
                body_too_large(self.limits, exc.size),
                "invalid_request_error",
                param="body",
                code="body_too_large",
            )
        except ClientDisconnect:
            return Response(status_code=499)
        except BadRequest as exc:
            return self.refuse(endpoint, exc)

    def stage_states(
        self, failures: dict[str, dict[str, Any]] | None = None
    ) -> list[dict[str, Any]]:
        """Each stage's device, backend and state; ``failures`` (``Runtime.stage_failures``):
        the stages whose engine stopped though their actor lives, with a code. A stage is
        alive while one of its replicas' actors is; a stage with ``replicas: N`` > 1 lists
        each replica (``replica`` 1-based, its device, whether it is alive, its ``code``)."""
        out = []
        for s in self.runtime.stages:
            replicas = self.replica_states(s.name, failures or {})
            alive = any(r["alive"] for r in replicas)
            failed = None
            if not alive:  # an engine that stopped (the first replica's that did)
                found = [(failures or {}).get(h) for h in self._holders(s.name)]
                failed = next((f for f in found if f), None)
            out.append(
                {
                    "name": s.name,
                    "kind": s.kind,
                    "device": s.device,
                    "backend": s.backend,
                    "loaded": alive
                    and any(h in self.runtime.load_results for h in self._holders(s.name)),
                    "alive": alive,
                    "final_output_type": s.final_output_type if s.final_output else None,
                    **(
                        {"code": "device_actor_died"}
                        if all(r.get("code") == "device_actor_died" for r in replicas)
                        else {}
                    ),
                    **({"code": failed["code"], "error": failed["message"]} if failed else {}),
                    **({"replicas": replicas} if len(replicas) > 1 else {}),
                }
            )
        return out

    def _holders(self, stage: str) -> list[str]:
        return [r.holder for r in self.runtime.replicas[stage]]

    def replica_states(
        self, stage: str, failures: dict[str, dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """``stage``'s replicas: each one's 1-based ``replica``, ``device``, ``alive`` and, when
        it cannot serve, ``code``: its actor died, or its engine stopped (``failures``, by
        holder)."""
        rows = []
        for ref in self.runtime.replicas[stage]:
            dev = self.runtime.devices.get(ref.key)
            failed = failures.get(ref.holder)
            dead = dev is not None and bool(dev.dead)
            alive = dev is not None and not dead and not self.runtime._closed and not failed
            code = "device_actor_died" if dead else failed["code"] if failed else None
            rows.append(
                {
                    "replica": ref.index + 1,
                    "device": ref.device,
                    "alive": alive,
                    **({"code": code} if code else {}),
                }
            )
        return rows

    def no_speech_stage(self) -> BadRequest:
        """Why ``/v1/audio/speech`` has nothing to enter at: each audio output stage and what it
        takes instead of text (an Omni pipeline's code2wav takes the talker's codes, and the
        talker needs the thinker's hand-over, so text can only enter at the thinker, whose
        reply — not the input — would be spoken)."""
        takes = [
            f"{name} ({self.runtime.plan.stage(name).kind}) takes "
            f"{spell(self.runtime.kinds[name].ports(self.pipeline.config.stage(name)).consumes)}"
            for name in sorted(self.audio_stages)
        ]
        if not takes:
            return BadRequest(
                [
                    Problem(
                        "model",
                        f"pipeline {self.model!r} has no speech stage: no stage's final output "
                        "is audio",
                        "serve a pipeline with a voice stage (configs/voice-assistant.yaml)",
                    )
                ]
            )
        fix = (
            "ask /v1/chat/completions with modalities ['text', 'audio'] for the pipeline's spoken reply, "
            "or serve a pipeline with a voice stage that takes text (configs/voice-assistant.yaml)"
        )
        return BadRequest(
            [
                Problem(
                    "model",
                    f"pipeline {self.model!r} has no speech stage (an audio output stage that "
                    f"takes text, to speak the input as it is): {'; '.join(takes)}",
                    fix,
                )
            ]
        )

    # -- endpoints -------------------------------------------------------------------
    async def models(self, request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model,
                        "object": "model",
                        "created": self.created,
                        "owned_by": "omni-edge",
                        "stages": [s.name for s in self.runtime.stages],
                    }
                ],
            }
        )

    async def health(self, request: Request) -> Response:
        """200 while every stage can serve (``status: degraded`` naming each dead replica of a
        stage whose other replicas serve); 503 naming each stage that cannot (stage, device,
        code): a dead device actor (every replica's), or an engine that stopped inside a
        living one."""
        failures = (
            await self.runtime.stage_failures(HEALTH_TIMEOUT_S) if not self.runtime._closed else {}
        )
        stages = self.stage_states(failures)
        ok = all(s["alive"] for s in stages)
        degraded = [
            {"stage": s["name"], "replica": r["replica"], "device": r["device"], "code": r["code"]}
            for s in stages
            if s["alive"]
            for r in s.get("replicas", [])
            if not r["alive"] and "code" in r
        ]
        doc: dict[str, Any] = {
            "status": ("degraded" if degraded else "ok") if ok else "unavailable",
            "pipeline": self.model,
            "stages": stages,
        }
        if degraded:  # a dead replica whose siblings serve: still 200, named
            doc["degraded"] = degraded
        if not ok:
            doc["failed"] = [
                {"stage": s["name"], "device": s["device"], "code": s.get("code", "unavailable")}
                for s in stages
                if not s["alive"]
            ]
        return JSONResponse(doc, status_code=200 if ok else 503)

    async def plan(self, request: Request) -> Response:
        """The plan with its measured peaks; absolute paths cut to their file names unless a
        loopback client asks for them whole (``server.paths``)."""
        asked, refused = paths_asked(request.query_params, request.client)
        if refused is not None:
            status, message, code = refused
            return error_response(
                status, message, "invalid_request_error", param=PATHS_PARAM, code=code
            )
        doc = self.pipeline.plan.to_json()
        measured = await self.metrics.measured_now()
        for s in doc["stages"]:
            holders = self._holders(s["name"]) if s["name"] in self.runtime.replicas else []
            # a stage's own fields are its first replica's; each replica has its own figure
            s["measured"] = self._measured(measured, holders[0] if holders else s["name"])
            for r in s.get("replicas", []):
                r["measured"] = self._measured(measured, r["holder"])
        # the serve process's own memory against its shared reservation (``server``)
        server_memory = getattr(self.pipeline, "server_memory", None)
        doc["server"] = (
            await asyncio.to_thread(server_memory) if server_memory is not None else None
        )
        return JSONResponse(doc if asked == FULL else redact_paths(doc))

    def _measured(self, measured: dict[str, dict[str, Any]], holder: str) -> dict[str, Any]:
        """A stage's (or one replica's) measured peak next to its budget, for ``/v1/plan``."""
        view = self.runtime.views.get(holder) or self.pipeline.plan.stage(holder)
        m = measured.get(holder) or {}
        return {
            "pool": view.pool,
            "measured_peak_bytes": m.get("measured_peak_bytes"),
            "budget_bytes": m.get("budget_bytes", view.budget_bytes()),
            "within_budget": m.get("within_budget"),
        }

    async def status(self, request: Request) -> Response:
        measured = await self.metrics.measured_now()
        ledger = await self.metrics.ledger() or {}
        held = {p["id"]: p["held_bytes"] for p in ledger.get("pools", [])}
        pools = []
        for p in self.pipeline.plan.pools:
            peaks = [
                m["measured_peak_bytes"]
                for name, m in measured.items()
                if self.runtime.views[name].pool == p.id
                and m.get("measured_peak_bytes") is not None
            ]
            pools.append(
                {
                    "id": p.id,
                    "capacity_bytes": p.capacity_bytes,
                    "budget_bytes": p.peak_bytes,
                    "reserved_bytes": held.get(p.id),
                    "measured_peak_bytes": sum(peaks) if peaks else None,
                }
            )
        failures = (
            await self.runtime.stage_failures(HEALTH_TIMEOUT_S) if not self.runtime._closed else {}
        )
        stages = [
            {
                k: s[k]
                for k in (
                    "name",
                    "kind",
                    "device",
                    "backend",
                    "alive",
                    "loaded",
                    "final_output_type",
                )
            }
            for s in self.stage_states(failures)
        ]
        admission = self.runtime.admission
        return JSONResponse(
            {
                "pipeline": self.model,
                "stages": stages,
                "pools": pools,
                "queue": {
                    "in_flight": admission.in_flight,
                    "waiting": admission.waiting,
                    "limit": admission.limit,
                    "max_waiting": admission.max_waiting,
                },
                "recent": list(self.metrics.recent),
            }
        )

    async def metrics_text(self, request: Request) -> Response:
        return Response(
            await self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    async def chat(self, request: Request) -> Response:
        call = await self._body(request, "chat", self.read_chat)
        if isinstance(call, Response):
            return call
        run = _Run(self, call.prompt, "chat")
        base = {"id": f"chatcmpl-{run.rid}", "created": int(time.time()), "model": self.model}
        if call.stream:
            return await self._chat_stream(
                run, base, call.audio_format, call.include_usage, request
            )
        return await self._chat_whole(run, base, call.audio_format, request)

    async def _chat_whole(
        self, run: _Run, base: dict[str, Any], fmt: str | None, request: Request
    ) -> Response:
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
        outputs = [o for o in map(self.output_of, events) if o is not None]
        if fmt is not None:
            chunks = [e for e in events if self.is_audio(e)]
            message = {
                "role": "assistant",
                "content": None,
                "audio": {
                    "id": f"audio-{run.rid}",
                    "expires_at": int(time.time()) + AUDIO_EXPIRES_S,
                    "data": _b64(self._whole_audio(chunks, fmt)),
                    "transcript": text,
                },
            }
        if outputs:
            message["outputs"] = outputs
        doc: dict[str, Any] = {
            **base,
            "object": "chat.completion",
            "choices": [
                {"index": 0, "message": message, "finish_reason": self._finish_reason(run)}
            ],
        }
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
        reasons = [
            s.get("stats", {}).get("finish_reason")
            for name, s in run.trace.stages.items()
            if name in self.text_stages
        ]
        return "length" if "length" in reasons else "stop"

    async def _chat_stream(
        self,
        run: _Run,
        base: dict[str, Any],
        fmt: str | None,
        include_usage: bool,
        request: Request,
    ) -> Response:
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
            doc = {
                **base,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return f"data: {json.dumps(doc)}\n\n"

        def delta_of(event: Event) -> dict[str, Any] | None:
            if self.is_text(event):
                return (
                    {"audio": {"id": audio_id, "transcript": event.text}}
                    if fmt
                    else {"content": event.text}
                )
            if fmt and self.is_audio(event):
                return {"audio": {"id": audio_id, "data": _b64(pcm24k(event))}}
            output = self.output_of(event)
            return {"outputs": [output]} if output is not None else None

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
        read = await self._body(request, "speech", lambda raw: read_speech(raw, limits=self.limits))
        if isinstance(read, Response):
            return read
        text, fmt = read
        if self.speech_stage is None:
            return self.refuse("speech", self.no_speech_stage())
        run = _Run(self, text, "speech", entry=self.speech_stage)
        try:
            if not await run.until(
                self.is_audio, request
            ):  # the WAV header needs the voice's sample rate
                return Response(status_code=499)
        except REQUEST_ERRORS as exc:
            response = error_for(exc)
            await run.close(response.status_code)
            return response
        first = next((e for e in run.buffered if self.is_audio(e)), None)
        if first is None:
            await run.close(400)
            return error_response(
                400,
                f"input {text[:60]!r} has nothing to speak (no letter or digit)",
                "invalid_request_error",
                param="input",
                code="bad_request",
            )
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

        return _Stream(
            body(),
            media_type="audio/wav" if fmt == "wav" else "audio/pcm",
            headers={"X-Sample-Rate": str(rate), "Cache-Control": "no-cache"},
        )


def close_app(app: ASGIApp) -> None:
    """Close what the app opened itself — the realtime turn detector's VAD session (in this
    process, or a route worker) — once serving has stopped, before the pipeline is closed."""
    inner: Any = app
    while inner is not None and not isinstance(inner, Starlette):
        inner = getattr(inner, "app", None)
    live = getattr(getattr(inner, "state", None), "realtime", None)
    if live is not None:
        live.close()


def create_app(
    pipeline: Pipeline,
    *,
    api_key: str | None = None,
    limits: ServerLimits | None = None,
    allowed_hosts: Iterable[str] | None = (),
    realtime: RealtimeLimits | None = None,
) -> ASGIApp:
    """The ASGI app serving ``pipeline`` (started; closed by whoever started it), behind
    ``server_guard.RequestGuard`` (``allowed_hosts``: names served besides loopback ones, None: any);
    ``limits``: what one request may carry (default ``ServerLimits()``); ``realtime``: what one
    ``/v1/realtime`` session may do (default ``RealtimeLimits()``)."""
    app = _App(pipeline, limits or ServerLimits())
    live = Realtime(app, realtime or RealtimeLimits(), _Run)
    starlette = Starlette(
        routes=[
            WebSocketRoute("/v1/realtime", live.endpoint),
            Route("/v1/chat/completions", app.chat, methods=["POST"]),
            Route("/v1/audio/speech", app.speech, methods=["POST"]),
            Route("/v1/models", app.models, methods=["GET"]),
            Route("/v1/plan", app.plan, methods=["GET"]),
            Route("/v1/status", app.status, methods=["GET"]),
            Route("/health", app.health, methods=["GET"]),
            Route("/metrics", app.metrics_text, methods=["GET"]),
            Route("/", lambda request: FileResponse(WEB_DIR / "index.html"), methods=["GET"]),
            Mount("/static", StaticFiles(directory=WEB_DIR), name="static"),
        ]
    )
    starlette.state.omni_edge = app  # for tests and embedding: the metrics, the pipeline
    starlette.state.realtime = live
    served: ASGIApp = starlette
    if api_key:
        served = BearerAuth(served, api_key)
    return RequestGuard(served, allowed_hosts=allowed_hosts)
