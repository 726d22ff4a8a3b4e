"""``POST /v1/audio/speech``: the input spoken by the pipeline's speech stage alone (the
request enters the graph there), streamed as ``audio/wav`` or 24 kHz ``audio/pcm``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from orchestrator.runtime.audio import OPENAI_PCM_RATE, pcm16_bytes, wav_header
from orchestrator.server.auth import error_response
from orchestrator.server.failures import REQUEST_ERRORS
from orchestrator.server.http import StreamResponse, error_for, pcm24k
from orchestrator.server.protocol import read_speech
from orchestrator.server.served import Run, Served
from stages.requests import TextRequest

log = logging.getLogger(__name__)


class Speech:
    """The speech endpoint of one served pipeline."""

    def __init__(self, served: Served) -> None:
        self.served = served

    async def speech(self, request: Request) -> Response:
        read = await self.served.body(
            request, "speech", lambda raw: read_speech(raw, limits=self.served.limits)
        )
        if isinstance(read, Response):
            return read
        text, fmt = read
        if self.served.speech_stage is None:
            return self.served.refuse("speech", self.served.no_speech_stage())
        run = Run(self.served, TextRequest(text), "speech", entry=self.served.speech_stage)
        try:
            if not await run.until(
                self.served.is_audio, request
            ):  # the WAV header needs the voice's sample rate
                return Response(status_code=499)
        except REQUEST_ERRORS as exc:
            response = error_for(exc)
            await run.close(response.status_code)
            return response
        first = next((e for e in run.buffered if self.served.is_audio(e)), None)
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
                    if self.served.is_audio(event):
                        yield pcm16_bytes(event.audio) if fmt == "wav" else pcm24k(event)
                status = 200
            except REQUEST_ERRORS as exc:  # the status is sent: the body ends short
                status = error_for(exc).status_code
                log.warning("speech request %s failed after its audio started: %s", run.rid, exc)
            finally:
                await run.close(status)

        return StreamResponse(
            body(),
            media_type="audio/wav" if fmt == "wav" else "audio/pcm",
            headers={"X-Sample-Rate": str(rate), "Cache-Control": "no-cache"},
        )


def routes(served: Served) -> list[Route]:
    speech = Speech(served)
    return [Route("/v1/audio/speech", speech.speech, methods=["POST"])]
