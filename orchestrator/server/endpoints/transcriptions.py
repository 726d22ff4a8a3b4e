"""``POST /v1/audio/transcriptions``: a recording (OpenAI's multipart form) transcribed by the
pipeline's asr stage alone — the request enters the graph there (``Pipeline.stream(entry=)``),
and is ended once that stage is done, so stages downstream of it (a thinker) are cancelled.

The recording is cut into :data:`WINDOW_S` windows (Whisper's), each one request: a window's
transcript is one segment of ``verbose_json`` (``start``/``end``: the window's bounds within the
recording, in seconds), and the text is the segments' joined by a space — what the stage's own
runner does with a longer item. The form is checked (``media_protocol.read_transcription``)
before anything runs."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncGenerator
from typing import Any

import numpy as np
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import BadRequest
from orchestrator.runtime.events import Event, StageEvent, TextDelta
from orchestrator.server.auth import error_response
from orchestrator.server.failures import REQUEST_ERRORS
from orchestrator.server.http import error_for
from orchestrator.server.media_protocol import TranscriptionCall, read_transcription
from orchestrator.server.served import Run, Served
from stages.requests import AudioRequest

WINDOW_S = 30
"""Seconds of audio per request and per segment: Whisper's window."""
LANGUAGES = {"en": "english"}
"""``verbose_json``'s ``language`` is a name, as OpenAI writes it."""
MAX_FIELDS = 32
"""Form fields per request: the served ones are a dozen."""


class Transcriptions:
    """The transcription endpoint of one served pipeline."""

    def __init__(self, served: Served) -> None:
        self.served = served

    async def transcriptions(self, request: Request) -> Response:
        served = self.served
        if served.asr_stage is None:
            return served.refuse(
                "transcriptions",
                served.no_stage(
                    "/v1/audio/transcriptions",
                    "stage that transcribes speech (an asr stage taking the request's audio)",
                    "configs/examples/asr-only.yaml, configs/examples/voice-chat.yaml",
                ),
            )
        raw = await served.body(request, "transcriptions", lambda raw: raw)
        if isinstance(raw, Response):
            return raw
        try:
            call = await self._read(request, raw)
        except BadRequest as exc:
            served.metrics.refused("transcriptions", 400)
            # the form's own field names: chat's mapping (``prompt`` → ``messages``) is not theirs
            return error_response(
                400,
                str(exc),
                "invalid_request_error",
                param=exc.problems[0].where,
                code="bad_request",
            )
        samples, rate = np.asarray(call.recording["audio"]), call.recording["sample_rate"]
        step = WINDOW_S * rate
        segments: list[JsonObject] = []
        for i, start in enumerate(range(0, len(samples), step)):
            text = await self._window(request, AudioRequest(samples[start : start + step], rate))
            if isinstance(text, Response):
                return text
            end = min(start + step, len(samples))
            if text:
                segments.append(
                    {
                        "id": len(segments),
                        "seek": i * WINDOW_S * 100,  # Whisper's seek: 10 ms frames
                        "start": round(start / rate, 3),
                        "end": round(end / rate, 3),
                        "text": text,
                        "temperature": 0.0,
                    }
                )
        return _answer(call, segments, len(samples) / rate)

    async def _read(self, request: Request, raw: bytes) -> TranscriptionCall:
        """The form parsed and checked (the WAV decoded off the event loop)."""
        ctype = request.headers.get("content-type", "")
        if not ctype.lower().startswith("multipart/form-data"):
            raise BadRequest.single(
                "body",
                f"Content-Type {ctype[:60]!r}: a transcription request is a multipart form",
                "send multipart/form-data with the recording as the file part (the openai "
                "client's audio.transcriptions.create does)",
            )

        async def chunks() -> AsyncGenerator[bytes, None]:
            yield raw

        try:
            form = await MultiPartParser(
                request.headers, chunks(), max_files=2, max_fields=MAX_FIELDS
            ).parse()
        except MultiPartException as exc:
            raise BadRequest.single(
                "body", f"is not a readable multipart form ({exc})", "send multipart/form-data"
            ) from None
        try:
            items = list(form.multi_items())
            files = [v for k, v in items if isinstance(v, UploadFile)]
            if any(k != "file" for k, v in items if isinstance(v, UploadFile)):
                name = next(k for k, v in items if isinstance(v, UploadFile) and k != "file")
                raise BadRequest.single(name, "is a file part", "send one file part, named file")
            if len(files) > 1:
                raise BadRequest.single("file", "is given twice", "send one recording")
            data = await files[0].read() if files else None
        finally:
            await form.close()
        fields: list[tuple[str, Any]] = [(k, v) for k, v in items if not isinstance(v, UploadFile)]
        if files:
            fields.append(("file", files[0]))
        return await asyncio.to_thread(
            read_transcription, fields, data, self.served.asr_language(), self.served.limits
        )

    async def _window(self, request: Request, audio: AudioRequest) -> str | Response:
        """One window's transcript: the request entered at the asr stage, ended once that
        stage is done; a refusal or a failure as the response to send."""
        stage = self.served.asr_stage

        def done(event: Event) -> bool:
            return isinstance(event, StageEvent) and event.stage == stage and event.kind == "done"

        run = Run(self.served, audio, "transcriptions", entry=stage)
        try:
            if not await run.until(done, request):
                return Response(status_code=499)
        except REQUEST_ERRORS as exc:
            response = error_for(exc)
            await run.close(response.status_code)
            return response
        text = "".join(
            e.text for e in run.buffered if isinstance(e, TextDelta) and e.stage == stage
        )
        await run.close(200)  # the stages downstream of the asr stage are not wanted: cancelled
        return text.strip()


def _answer(call: TranscriptionCall, segments: list[JsonObject], duration: float) -> Response:
    """The transcript in the asked ``response_format``."""
    text = " ".join(str(s["text"]) for s in segments)
    usage = {"type": "duration", "seconds": math.ceil(duration)}
    fmt = call.response_format
    if fmt == "text":
        return PlainTextResponse(text)
    if fmt == "json":
        return JSONResponse({"text": text, "usage": usage})
    if fmt == "verbose_json":
        language = call.language or ""
        return JSONResponse(
            {
                "task": "transcribe",
                "language": LANGUAGES.get(language, language),
                "duration": round(duration, 3),
                "text": text,
                "segments": segments,
                "usage": usage,
            }
        )
    cues = []
    for n, s in enumerate(segments, 1):
        start, end = _clock(float(s["start"]), fmt), _clock(float(s["end"]), fmt)
        cues.append(
            f"{n}\n{start} --> {end}\n{s['text']}\n"
            if fmt == "srt"
            else f"{start} --> {end}\n{s['text']}\n"
        )
    body = "\n".join(cues)
    return PlainTextResponse(body if fmt == "srt" else "WEBVTT\n\n" + body)


def _clock(seconds: float, fmt: str) -> str:
    """``HH:MM:SS,mmm`` (srt) or ``HH:MM:SS.mmm`` (vtt)."""
    ms = round(seconds * 1000)
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{',' if fmt == 'srt' else '.'}{ms:03d}"


def routes(served: Served) -> list[Route]:
    endpoint = Transcriptions(served)
    return [Route("/v1/audio/transcriptions", endpoint.transcriptions, methods=["POST"])]
