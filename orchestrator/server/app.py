"""The app: the endpoints of one started pipeline composed (the package docstring describes
them); each group lives in ``endpoints/`` with its routes, ``/v1/realtime`` in ``realtime``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.responses import FileResponse
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from orchestrator.api import Pipeline
from orchestrator.server.auth import BearerAuth
from orchestrator.server.endpoints import chat, embeddings, info, speech, transcriptions
from orchestrator.server.guard import RequestGuard
from orchestrator.server.http import error_for, pcm24k
from orchestrator.server.protocol import (
    ServerLimits,
)
from orchestrator.server.realtime import Realtime, RealtimeLimits
from orchestrator.server.served import Run, Served

__all__ = ["WEB_DIR", "close_app", "create_app", "error_for", "pcm24k"]

WEB_DIR = Path(__file__).parent / "web"
"""The page at ``/`` (index.html, app.js, style.css): package data served as it is, no build step."""


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
    ``server.guard.RequestGuard`` (``allowed_hosts``: names served besides loopback ones, None: any);
    ``limits``: what one request may carry (default ``ServerLimits()``); ``realtime``: what one
    ``/v1/realtime`` session may do (default ``RealtimeLimits()``)."""
    served = Served(pipeline, limits or ServerLimits())
    live = Realtime(served, realtime or RealtimeLimits(), Run)
    routes: list[BaseRoute] = [
        WebSocketRoute("/v1/realtime", live.endpoint),
        *chat.routes(served),
        *speech.routes(served),
        *transcriptions.routes(served),
        *embeddings.routes(served),
        *info.routes(served),
        Route("/", lambda request: FileResponse(WEB_DIR / "index.html"), methods=["GET"]),
        Mount("/static", StaticFiles(directory=WEB_DIR), name="static"),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        live.warm()  # sessions' Whisper (and scorer) open while the server starts
        yield

    starlette = Starlette(routes=routes, lifespan=lifespan)
    starlette.state.omni_edge = served  # for tests and embedding: the metrics, the pipeline
    starlette.state.realtime = live
    outer: ASGIApp = starlette
    if api_key:
        outer = BearerAuth(outer, api_key)
    return RequestGuard(outer, allowed_hosts=allowed_hosts)
