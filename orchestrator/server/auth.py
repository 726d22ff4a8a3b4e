"""Who may drive the server: the API key (``Authorization: Bearer KEY``), how fast one client
may guess it (:class:`Lockout`), and which bind addresses are loopback (a server bound
elsewhere needs the key: ``omni-edge serve``)."""

from __future__ import annotations

import hmac
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.server.guard import deny_websocket, is_loopback

__all__ = ["BearerAuth", "Lockout", "error_response", "is_loopback", "websocket_key"]

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


@dataclass
class _Failures:
    count: int
    last: float


class Lockout:
    """Wrong keys, counted per client address: the first :attr:`free` are answered at once (a
    typo); after them each further attempt from that address must wait a delay that doubles
    with every failure (:attr:`base_s`, 2×, 4×, … up to :attr:`max_s`). An attempt within the
    delay is refused at once (429, ``Retry-After``) without comparing its key, so guessing goes
    no faster than the delays allow; nothing waits on the server (no connection is held), so
    an attacker cannot tie up the slots other clients need, and other addresses are not
    slowed at all. A right key clears its address; an address forgotten after
    :attr:`forget_s` without a failure starts afresh; at most :attr:`max_clients` addresses
    are remembered (the longest quiet one is forgotten first). A request without a key
    guesses nothing and is not counted. Behind a reverse proxy every client shares its
    address: the proxy should limit them itself."""

    free = 5
    base_s = 1.0
    max_s = 60.0
    forget_s = 600.0
    max_clients = 4096

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._seen: OrderedDict[str, _Failures] = OrderedDict()

    def wait_s(self, client: str) -> float:
        """Seconds before ``client`` may try a key again (0: now)."""
        f = self._seen.get(client)
        if f is None:
            return 0.0
        now = self.clock()
        if now - f.last > self.forget_s:
            del self._seen[client]
            return 0.0
        if f.count < self.free:
            return 0.0
        delay = min(self.base_s * 2 ** (f.count - self.free), self.max_s)
        return max(0.0, f.last + delay - now)

    def failed(self, client: str) -> None:
        f = self._seen.pop(client, None) or _Failures(0, 0.0)
        f.count, f.last = f.count + 1, self.clock()
        self._seen[client] = f  # most recent last
        while len(self._seen) > self.max_clients:
            self._seen.popitem(last=False)

    def succeeded(self, client: str) -> None:
        self._seen.pop(client, None)


class BearerAuth:
    """``Authorization: Bearer KEY`` on every request (401 otherwise), compared in constant time —
    except the page's own static files (``GET /``, ``/static/...``): they hold no data, and
    the page asks for the key before it calls the API. A WebSocket upgrade (``/v1/realtime``)
    carries it as ``Authorization: Bearer KEY`` or, from a browser (which cannot set headers
    on a WebSocket), as OpenAI's subprotocol ``openai-insecure-api-key.KEY``; a query
    parameter is not taken (URLs end up in logs and histories). Refused: the 401 instead of
    the handshake. Wrong keys from one address are slowed (:class:`Lockout`: a 429 with
    ``Retry-After`` while that address must wait)."""

    def __init__(self, app: ASGIApp, key: str, lockout: Lockout | None = None) -> None:
        self.app, self.key = app, key.encode()
        self.lockout = lockout or Lockout()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        public = scope.get("method") in ("GET", "HEAD") and (
            path == "/" or path.startswith("/static/")
        )
        if scope["type"] not in ("http", "websocket") or public:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            given = websocket_key(scope)
        else:
            header = dict(scope.get("headers") or []).get(b"authorization", b"")
            scheme, _, token = header.partition(b" ")
            given = token.strip() if scheme.lower() == b"bearer" else None
        client = str((scope.get("client") or ("?",))[0])
        wait = self.lockout.wait_s(client) if given is not None else 0.0
        if wait > 0:
            await self._refuse(scope, receive, send, 429, wait)
            return
        if given is None or not hmac.compare_digest(given, self.key):
            if given is not None:
                self.lockout.failed(client)
            await self._refuse(scope, receive, send, 401)
            return
        self.lockout.succeeded(client)
        await self.app(scope, receive, send)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, status: int, wait: float = 0.0
    ) -> None:
        if status == 429:
            seconds = max(1, math.ceil(wait))
            message = (
                f"too many wrong API keys from this address: try again in {seconds} s "
                "(each further wrong key doubles the wait)"
            )
            code, headers = "too_many_failed_keys", [(b"retry-after", str(seconds).encode())]
        else:
            message = "a valid API key is required: Authorization: Bearer KEY"
            code, headers = "invalid_api_key", [(b"www-authenticate", b"Bearer")]
        if scope["type"] == "websocket":
            if status == 401:
                message += f", or the subprotocol {KEY_SUBPROTOCOL}KEY from a browser"
            await deny_websocket(
                scope, send, status, message, "invalid_request_error", code, None, headers
            )
            return
        response = error_response(
            status,
            message,
            "invalid_request_error",
            code=code,
            headers={k.decode(): v.decode() for k, v in headers},
        )
        await response(scope, receive, send)
