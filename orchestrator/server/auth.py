"""Who may drive the server: the API key (``Authorization: Bearer KEY``) and which bind
addresses are loopback (a server bound elsewhere needs the key: ``omni-edge serve``)."""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.server.guard import deny_websocket, is_loopback

__all__ = ["BearerAuth", "error_response", "is_loopback", "websocket_key"]

KEY_SUBPROTOCOL = "openai-insecure-api-key."
"""The WebSocket subprotocol prefix that carries the key from a browser (which cannot set an
``Authorization`` header on a WebSocket): OpenAI's own, ``openai-insecure-api-key.KEY``."""


def websocket_key(scope: Scope) -> bytes | None:
    """The key a WebSocket upgrade carries: ``Authorization: Bearer KEY``, else the subprotocol
    ``openai-insecure-api-key.KEY``; None when it carries none."""
    header = dict(scope.get("headers") or []).get(b"authorization", b"")
    scheme, _, given = header.partition(b" ")
    if scheme.lower() == b"bearer":
        return given.strip()
    for proto in scope.get("subprotocols") or []:
        if proto.startswith(KEY_SUBPROTOCOL):
            return proto[len(KEY_SUBPROTOCOL) :].encode()
    return None


def error_response(
    status: int,
    message: str,
    type_: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return JSONResponse(
        {"error": {"message": message, "type": type_, "param": param, "code": code}},
        status_code=status,
        headers=headers,
    )


class BearerAuth:
    """``Authorization: Bearer KEY`` on every request (401 otherwise), compared in constant time —
    except the page's own static files (``GET /``, ``/static/...``): they hold no data, and
    the page asks for the key before it calls the API. A WebSocket upgrade (``/v1/realtime``)
    carries it as ``Authorization: Bearer KEY`` or, from a browser (which cannot set headers
    on a WebSocket), as OpenAI's subprotocol ``openai-insecure-api-key.KEY``; a query
    parameter is not taken (URLs end up in logs and histories). Refused: the 401 instead of
    the handshake."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.key = app, key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        public = scope.get("method") in ("GET", "HEAD") and (
            path == "/" or path.startswith("/static/")
        )
        if scope["type"] == "websocket":
            given_key = websocket_key(scope)
            if given_key is None or not hmac.compare_digest(given_key, self.key):
                await deny_websocket(
                    scope,
                    send,
                    401,
                    "a valid API key is required: Authorization: Bearer KEY, or "
                    f"the subprotocol {KEY_SUBPROTOCOL}KEY from a browser",
                    "invalid_request_error",
                    "invalid_api_key",
                    None,
                    [(b"www-authenticate", b"Bearer")],
                )
                return
        if scope["type"] == "http" and not public:
            header = dict(scope.get("headers") or []).get(b"authorization", b"")
            scheme, _, given = header.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.key):
                response = error_response(
                    401,
                    "a valid API key is required: Authorization: Bearer KEY",
                    "invalid_request_error",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
