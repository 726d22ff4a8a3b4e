"""``POST /v1/chat/completions``: the pipeline's reply to a chat, whole or streamed as
server-sent events, with its audio (``modalities``) and its arrays (``outputs``)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from orchestrator.core.documents import JsonObject
from orchestrator.runtime.audio import OPENAI_PCM_RATE, pcm16_bytes, wav_header
from orchestrator.runtime.events import AudioChunk, Event
from orchestrator.server.chat_logprobs import choice_logprobs
from orchestrator.server.chat_tools import CallWatch, looks_like_call, reply_call
from orchestrator.server.failures import REQUEST_ERRORS
from orchestrator.server.http import StreamResponse, b64, error_for, pcm24k
from orchestrator.server.served import Run, Served

AUDIO_EXPIRES_S = 3600
"""``message.audio.expires_at``: nothing is kept server-side; the hour is OpenAI's own figure."""


class Chat:
    """The chat endpoint of one served pipeline."""

    def __init__(self, served: Served) -> None:
        self.served = served

    async def chat(self, request: Request) -> Response:
        call = await self.served.body(request, "chat", self.served.read_chat)
        if isinstance(call, Response):
            return call
        run = Run(self.served, call.request, "chat")
        base = {
            "id": f"chatcmpl-{run.rid}",
            "created": int(time.time()),
            "model": self.served.model,
        }
        if call.stream:
            return await self._chat_stream(
                run,
                base,
                call.audio_format,
                call.include_usage,
                request,
                CallWatch(call.tools, self.served.tool_family),
            )
        return await self._chat_whole(run, base, call.audio_format, request, call.tools)

    async def _chat_whole(
        self, run: Run, base: JsonObject, fmt: str | None, request: Request, tools: bool
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
        text = "".join(e.text for e in events if self.served.is_text(e))
        message: JsonObject = {"role": "assistant", "content": text}
        finish = self._finish_reason(run)
        fam = self.served.tool_family
        called = tools and looks_like_call(text, fam)  # a call, or one cut short
        if called:  # no content, and no audio: the runtime cut no sentence of it for a voice
            calls = reply_call(text, run.rid, fam)
            message = {"role": "assistant", "content": None}
            if calls is not None:
                message["tool_calls"], finish = calls, "tool_calls"
        outputs = [o for o in map(self.served.output_of, events) if o is not None]
        if fmt is not None and not called:
            chunks = [e for e in events if self.served.is_audio(e)]
            message = {
                "role": "assistant",
                "content": None,
                "audio": {
                    "id": f"audio-{run.rid}",
                    "expires_at": int(time.time()) + AUDIO_EXPIRES_S,
                    "data": b64(self._whole_audio(chunks, fmt)),
                    "transcript": text,
                },
            }
        if outputs:
            message["outputs"] = outputs
        choice: JsonObject = {"index": 0, "message": message, "finish_reason": finish}
        logprobs = self._logprobs(run)
        if logprobs is not None:
            choice["logprobs"] = logprobs
        doc: JsonObject = {**base, "object": "chat.completion", "choices": [choice]}
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

    def _logprobs(self, run: Run) -> JsonObject | None:
        """The choice's ``logprobs`` (``chat_logprobs``), when the decode stage computed them."""
        return choice_logprobs(
            {
                n: s.get("stats", {})
                for n, s in run.trace.stages.items()
                if n in self.served.text_stages
            }
        )

    def _finish_reason(self, run: Run) -> str:
        reasons = [
            s.get("stats", {}).get("finish_reason")
            for name, s in run.trace.stages.items()
            if name in self.served.text_stages
        ]
        return "length" if "length" in reasons else "stop"

    async def _chat_stream(
        self,
        run: Run,
        base: JsonObject,
        fmt: str | None,
        include_usage: bool,
        request: Request,
        watch: CallWatch,
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

        def chunk(delta: JsonObject, finish: str | None = None, **more: object) -> str:
            doc = {
                **base,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **more}],
            }
            return f"data: {json.dumps(doc)}\n\n"

        def delta_of(event: Event) -> JsonObject | None:
            if self.served.is_text(event):
                said = watch.text(event.text)  # held back while the reply is a call
                if said is None:
                    return None
                return {"audio": {"id": audio_id, "transcript": said}} if fmt else {"content": said}
            if fmt and self.served.is_audio(event):
                return {"audio": {"id": audio_id, "data": b64(pcm24k(event))}}
            output = self.served.output_of(event)
            return {"outputs": [output]} if output is not None else None

        async def sse() -> AsyncIterator[str]:
            status = 499  # the client went away, unless the stream ends otherwise
            try:
                yield chunk({"role": "assistant", "content": None if fmt else ""})
                async for event in run.rest():
                    delta = delta_of(event)
                    if delta is not None:
                        yield chunk(delta)
                finish = self._finish_reason(run)
                logprobs = self._logprobs(run)  # the stage's, with its closing figures
                if logprobs is not None:
                    yield chunk({}, logprobs=logprobs)
                calls = watch.calls(run.rid)
                if calls is not None:
                    yield chunk({"tool_calls": calls})
                    finish = "tool_calls"
                yield chunk({}, finish)
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

        return StreamResponse(
            sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )


def routes(served: Served) -> list[Route]:
    chat = Chat(served)
    return [Route("/v1/chat/completions", chat.chat, methods=["POST"])]
