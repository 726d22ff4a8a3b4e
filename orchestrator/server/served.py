"""The started pipeline as the endpoints serve it (:class:`Served`), and one request as they
drive it (:class:`Run`): its events seen by its trace, kept until the response can start,
recorded in the metrics once whatever way it ends, cancelled when the client goes away."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeGuard

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from orchestrator.api import Pipeline
from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import BadRequest, Problem
from orchestrator.runtime.events import AudioChunk, Event, OutputItem, TextDelta
from orchestrator.runtime.requests import audio_entry_stages, tensor_entry_stages
from orchestrator.server.auth import error_response
from orchestrator.server.chat_tools import name_family, served_family
from orchestrator.server.http import (
    BodyTooLarge,
    b64,
    client_gone,
    error_for,
    npy_bytes,
    part_of,
    read_body,
)
from orchestrator.server.metrics import ServerMetrics, Trace
from orchestrator.server.protocol import ChatCall, ServerLimits, body_too_large, read_chat
from stages.base import StageHealth
from stages.payloads import Item, spell
from stages.requests import Request as PipelineRequest

DEAD_CODES = frozenset({"device_actor_died", "stage_restarting", "crash_loop"})
"""The codes of a stage instance whose device actor died (``runtime.supervisor``: coming back,
in a crash loop, or down for good)."""


class Run:
    """One pipeline request as the app drives it: its events, seen by its trace,
    and recorded in the metrics once (whatever way it ends)."""

    def __init__(
        self,
        app: Served,
        request: PipelineRequest,
        endpoint: str,
        entry: str | None = None,
        context: dict[str, list[Item]] | None = None,
        conversation: str | None = None,
    ) -> None:
        self.app, self.rid = app, uuid.uuid4().hex[:12]
        self.trace = Trace(self.rid, endpoint)
        # conversation: a realtime session's turns, served by one replica of a talker
        self.events = app.pipeline.stream(
            request,
            request_id=self.rid,
            entry=entry,
            context=context or None,
            conversation=conversation,
        )
        self.buffered: list[Event] = []
        self.status = 200
        self._finished = False

    async def until(self, found: Callable[[Event], bool], request: Request) -> bool:
        """Read events until one is ``found`` or the request ends, keeping them for ``rest``;
        False when the client went away first (the request is then cancelled and recorded).
        A request refused up front raises here, before any response has started."""
        reading = asyncio.ensure_future(self._until(found))
        watching = asyncio.ensure_future(client_gone(request))
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


class Served:
    """One started pipeline as every endpoint serves it: its reply stages (text, audio,
    tensors), what it takes (text, audio, arrays), its metrics, and the helpers the
    endpoints share (a body read and checked, a refusal counted, each stage's state)."""

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
        takes_audio = set(self.runtime.entry_stages("audio"))
        self.asr_stage = next(
            (
                s.name
                for s in stages
                if s.name in takes_audio and self.runtime.kinds[s.name].transcribes_speech
            ),
            None,
        )
        """Where ``/v1/audio/transcriptions`` enters: the first stage that transcribes speech and
        may take a recording as the request."""
        self.embed_stage = next(
            (s.name for s in stages if s.name in self.tensor_stages and s.name in takes_text), None
        )
        """Where ``/v1/embeddings`` enters: the first tensor-out stage that may take text."""
        self.tool_family = served_family(self.runtime.kinds, list(stages), list(takes_text))
        """The tool syntax a chat's tools, calls and results are written in (``chat_tools``)."""

    # -- what the endpoints share -------------------------------------------------------------------
    def is_text(self, event: Event) -> TypeGuard[TextDelta]:
        return isinstance(event, TextDelta) and event.stage in self.text_stages

    def is_audio(self, event: Event) -> TypeGuard[AudioChunk]:
        return isinstance(event, AudioChunk) and event.stage in self.audio_stages

    def output_of(self, event: Event) -> JsonObject | None:
        """A tensor stage's item as the reply carries it: ``{"stage", "tensor": base64 .npy}``
        for an array, ``{"stage", "tensors": {name: base64 .npy}}`` for a mapping of them."""
        if not isinstance(event, OutputItem) or event.stage not in self.tensor_stages:
            return None
        value = event.value
        if isinstance(value, dict):
            return {
                "stage": event.stage,
                "tensors": {str(k): b64(npy_bytes(v)) for k, v in value.items()},
            }
        return {"stage": event.stage, "tensor": b64(npy_bytes(value))}

    def read_chat(self, raw: bytes) -> ChatCall:
        """A chat body checked (off the event loop); a request of arrays also against the entry
        stage (``Pipeline.validate``: names, dtype, shape), its problem named by the part sent."""
        call = read_chat(
            raw,
            audio_entry=self.audio_entry,
            has_audio=bool(self.audio_stages),
            limits=self.limits,
            tensor_entry=self.tensor_entry,
            family=self.tool_family,
        )
        name_family(call.request, self.tool_family)
        if call.tensor_at:
            try:
                self.pipeline.validate(call.request)
            except BadRequest as exc:
                raise BadRequest(
                    [
                        Problem(part_of(p.where, call.tensor_at), f"{p.where}: {p.what}", p.fix)
                        for p in exc.problems
                    ]
                ) from None
        return call

    def refuse(self, endpoint: str, exc: BaseException) -> JSONResponse:
        response = error_for(exc)
        self.metrics.refused(endpoint, response.status_code)
        return response

    async def body(self, request: Request, endpoint: str, read: Callable[[bytes], Any]) -> Any:
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

    def stage_states(self, failures: dict[str, StageHealth] | None = None) -> list[JsonObject]:
        """Each stage's device, backend and state; ``failures`` (``Runtime.stage_failures``):
        the stages whose engine stopped though their actor lives, with a code. A stage is
        alive while one of its replicas' actors is; a stage with ``replicas: N`` > 1 lists
        each replica (``replica`` 1-based, its device, whether it is alive, its ``code``)."""
        out = []
        supervisor = self.runtime.supervisor
        for s in self.runtime.stages:
            replicas = self.replica_states(s.name, failures or {})
            alive = any(r["alive"] for r in replicas)
            failed = None
            if not alive:  # an engine that stopped (the first replica's that did)
                found = [(failures or {}).get(h) for h in self.holders(s.name)]
                failed = next((f for f in found if f), None)
            codes = [r.get("code") for r in replicas]
            restart = supervisor.status(self.holders(s.name)[0]) if supervisor else None
            out.append(
                {
                    "name": s.name,
                    "kind": s.kind,
                    "device": s.device,
                    "backend": s.backend,
                    "loaded": alive
                    and any(h in self.runtime.load_results for h in self.holders(s.name)),
                    "alive": alive,
                    "final_output_type": s.final_output_type if s.final_output else None,
                    # every replica's actor dead: the first one's code (coming back or not)
                    **({"code": codes[0]} if all(c in DEAD_CODES for c in codes) else {}),
                    **({"code": failed["code"], "error": failed["message"]} if failed else {}),
                    **({"replicas": replicas} if len(replicas) > 1 else {}),
                    **({"restart": restart} if restart and len(replicas) == 1 else {}),
                }
            )
        return out

    def holders(self, stage: str) -> list[str]:
        return [r.holder for r in self.runtime.replicas[stage]]

    def replica_states(self, stage: str, failures: dict[str, StageHealth]) -> list[JsonObject]:
        """``stage``'s replicas: each one's 1-based ``replica``, ``device``, ``alive`` and, when
        it cannot serve, ``code``: its actor died, or its engine stopped (``failures``, by
        holder)."""
        rows = []
        for ref in self.runtime.replicas[stage]:
            dev = self.runtime.devices.get(ref.key)
            failed = failures.get(ref.holder)
            dead = dev is not None and bool(dev.dead)
            alive = dev is not None and not dead and not self.runtime._closed and not failed
            supervisor = self.runtime.supervisor
            died = (
                supervisor.code_of(ref.key)
                if supervisor is not None
                else (dev.code if dev is not None and dev.code else "device_actor_died")
            )
            code = died if dead else failed["code"] if failed else None
            rows.append(
                {
                    "replica": ref.index + 1,
                    "device": ref.device,
                    "alive": alive,
                    **({"code": code} if code else {}),
                }
            )
        return rows

    def asr_language(self) -> str | None:
        """The language the asr stage transcribes, as its decoder's manifest says (Whisper
        tiny.en: ``en``); None when it does not say."""
        if self.asr_stage is None:
            return None
        artifacts = getattr(self.runtime.kinds[self.asr_stage], "artifacts", None)
        if artifacts is None:
            return None
        graphs = artifacts(self.pipeline.config.stage(self.asr_stage))
        language = graphs["decoder"].metadata.get("language") if "decoder" in graphs else None
        return str(language) if language else None

    def no_stage(self, endpoint: str, what: str, example: str) -> BadRequest:
        """Why ``endpoint`` has nothing to enter at: this pipeline has no ``what``."""
        return BadRequest(
            [
                Problem(
                    "model",
                    f"pipeline {self.model!r} has no {what}, so {endpoint} is not served "
                    f"(its stages: {', '.join(s.name for s in self.runtime.stages)})",
                    f"serve a pipeline with one ({example}); GET /v1/models lists the endpoints "
                    "this one answers",
                )
            ]
        )

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
