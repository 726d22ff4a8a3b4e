"""What every HTTP endpoint of ``serve`` shares: the body read under its cap, OpenAI's error
shape, audio and arrays as a reply carries them, and a streamed response that always closes
its body (so a client that leaves mid-stream cancels its request at once)."""

from __future__ import annotations

import base64
import io
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from orchestrator.runtime.audio import OPENAI_PCM_RATE, pcm16_bytes, resample
from orchestrator.runtime.events import AudioChunk
from orchestrator.server.auth import error_response
from orchestrator.server.failures import failure


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


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def npy_bytes(value: Any) -> bytes:
    """An array as a ``.npy`` file's bytes (``numpy.save``, never pickled)."""
    import numpy as np

    out = io.BytesIO()
    np.save(out, np.asarray(value), allow_pickle=False)
    return out.getvalue()


def part_of(where: str, tensor_at: dict[str, str]) -> str:
    """The content part a stage's problem with an array is about: the part of the input it
    names (``request (stage proj, kind exported_graph): embedding``), else the first part."""
    named = where.rpartition(": ")[2] if ": " in where else None
    at = tensor_at.get(named or "") or tensor_at.get("") or next(iter(tensor_at.values()))
    return f"{at}.input_tensor"


async def client_gone(request: Request) -> None:
    """Return once the client has disconnected (its request body already read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class StreamResponse(StreamingResponse):
    """A streamed response whose body generator is always closed when the response
    ends — also when the client went away while a chunk was being sent, where
    Starlette leaves the generator suspended (and so the request running) until
    it is garbage-collected."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
