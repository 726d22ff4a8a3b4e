"""An OpenAI-compatible HTTP front for one started pipeline (``omni-edge serve``).

The app drives a :class:`~orchestrator.api.Pipeline` that was planned, verified
and started once (``Pipeline.from_config``, the path ``run`` takes); every HTTP
request is one ``pipeline.stream`` call. The shapes are OpenAI's, so the
official ``openai`` client works unchanged:

* ``POST /v1/chat/completions``: ``messages`` go to the stage that takes the
  request as ``{"messages": [...], "sampling": {...}}`` (the ar_decode stage
  applies its chat template to the whole list, system message and history
  included; its own ``system_prompt`` is used when the list has none);
  ``max_tokens`` (or ``max_completion_tokens``), ``temperature``, ``top_p`` and
  ``seed`` become the request's ``sampling``. The reply is the text of the
  pipeline's text output; ``stream: true`` sends it as server-sent events
  (``data: {chat.completion.chunk}`` lines, then ``data: [DONE]``).
* ``GET /v1/models``: the pipeline, as the one model.
* ``GET /health``: every stage with its device, backend and whether its device
  actor is alive (503 when one is not).

Errors are OpenAI's ``{"error": {"message", "type", "param", "code"}}``:
``BadRequest`` → 400 (where, what, how to fix), ``PipelineBusy`` → 429 with
``Retry-After``, ``StageFailed`` → 503 naming the stage and the device. With an
API key every request needs ``Authorization: Bearer KEY`` (401 otherwise),
compared in constant time. Audio output is not served yet.
"""

from __future__ import annotations

import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeGuard

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.api import Pipeline
from orchestrator.errors import BadRequest, PipelineBusy, Problem, StageFailed
from orchestrator.runtime.events import TextDelta

RETRY_AFTER_S = 1
"""What a 429 asks a client to wait: requests finish in seconds, and the queue frees a slot as each does."""
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
SAMPLING_FIELDS = {"max_tokens": "max_tokens", "max_completion_tokens": "max_tokens", "temperature": "temperature",
                   "top_p": "top_p", "seed": "seed"}
"""OpenAI request fields → the decode stage's sampling keys."""
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


def chat_request(body: Any) -> dict[str, Any]:
    """The pipeline request of an OpenAI chat body; ``BadRequest`` for what it cannot take."""
    if not isinstance(body, dict):
        raise _bad("body", "is not a JSON object", "send {'model': ..., 'messages': [...]}")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty list of {role, content}", "e.g. [{'role': 'user', 'content': 'Hi'}]")
    out: list[dict[str, str]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
            raise _bad(f"messages[{i}].role", "must be system, developer, user or assistant")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only in this slice
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                raise _bad(f"messages[{i}].content", "only text parts are served", "send text content")
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
        sampling[key] = value
    request: dict[str, Any] = {"messages": out}
    if sampling:
        request["sampling"] = sampling
    return request


class _BearerAuth:
    """``Authorization: Bearer KEY`` on every request (401 otherwise), compared in constant time."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.key = app, key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = dict(scope.get("headers") or []).get(b"authorization", b"")
            scheme, _, given = header.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.key):
                response = error_response(401, "a valid API key is required: Authorization: Bearer KEY",
                                          "invalid_request_error", code="invalid_api_key",
                                          headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(pipeline: Pipeline, *, api_key: str | None = None) -> ASGIApp:
    """The ASGI app serving ``pipeline`` (started; closed by whoever started it)."""
    model = pipeline.plan.pipeline
    created = int(time.time())

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": model, "object": "model", "created": created, "owned_by": "omni-edge"}]})

    async def health(request: Request) -> Response:
        devices = pipeline.runtime.devices
        stages = []
        for s in pipeline.plan.stages:
            dev = devices.get(s.device or "?")
            alive = dev is not None and not dev.dead and not pipeline.runtime._closed
            stages.append({"name": s.name, "device": s.device, "backend": s.backend, "alive": alive,
                           **({"error": dev.dead} if dev is not None and dev.dead else {})})
        ok = all(s["alive"] for s in stages)
        return JSONResponse({"status": "ok" if ok else "unavailable", "pipeline": model, "stages": stages},
                            status_code=200 if ok else 503)

    async def chat(request: Request) -> Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error_for(_bad("body", "is not JSON", "send a JSON object"))
        try:
            prompt = chat_request(body)
        except BadRequest as exc:
            return error_for(exc)
        rid = uuid.uuid4().hex[:12]
        base = {"id": f"chatcmpl-{rid}", "created": int(time.time()), "model": model}
        events = pipeline.stream(prompt, request_id=rid)
        if body.get("stream"):
            return await _stream_response(events, base)
        try:
            text = "".join([e.text async for e in events if _is_reply(e)])
        except (BadRequest, PipelineBusy, StageFailed) as exc:
            return error_for(exc)
        return JSONResponse({**base, "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]})

    def _is_reply(event: Any) -> TypeGuard[TextDelta]:
        return isinstance(event, TextDelta) and event.stage in text_stages

    text_stages = {s.name for s in pipeline.plan.stages if s.final_output and s.final_output_type == "text"}

    async def _stream_response(events: AsyncIterator[Any], base: dict[str, Any]) -> Response:
        # The first event is awaited before the response starts, so a request refused
        # up front (bad, busy, a dead stage) gets its HTTP status, not a broken stream.
        try:
            first = await anext(events, None)
        except (BadRequest, PipelineBusy, StageFailed) as exc:
            return error_for(exc)

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            doc = {**base, "object": "chat.completion.chunk",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            return f"data: {json.dumps(doc)}\n\n"

        async def sse() -> AsyncIterator[str]:
            try:
                yield chunk({"role": "assistant", "content": ""})
                if first is not None and _is_reply(first):
                    yield chunk({"content": first.text})
                if first is not None:
                    async for event in events:
                        if _is_reply(event):
                            yield chunk({"content": event.text})
                yield chunk({}, "stop")
            except (BadRequest, PipelineBusy, StageFailed) as exc:
                yield f"data: {bytes(error_for(exc).body).decode()}\n\n"
            finally:
                await events.aclose()  # type: ignore[attr-defined]
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    app: ASGIApp = Starlette(routes=[
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/", lambda request: FileResponse(WEB_DIR / "index.html"), methods=["GET"]),
        Mount("/static", StaticFiles(directory=WEB_DIR), name="static"),
    ])
    if api_key:
        app = _BearerAuth(app, api_key)
    return app
