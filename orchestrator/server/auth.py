"""Who may drive the server: the API key (``Authorization: Bearer KEY``) and which bind
addresses are loopback (a server bound elsewhere needs the key: ``omni-edge serve``)."""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.server_guard import is_loopback

__all__ = ["BearerAuth", "error_response", "is_loopback"]


def error_response(status: int, message: str, type_: str, *, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status, headers=headers)


class BearerAuth:
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
