"""What a request must be before the app sees it: ASGI middleware around ``orchestrator.server``'s app.

A browser lets any web site's page send requests to ``127.0.0.1``: a
``fetch(url, {method: "POST", mode: "no-cors", body})`` goes out without a
preflight when its ``Content-Type`` is ``text/plain``, and a DNS-rebinding page
(its own name re-pointed at 127.0.0.1) reads the answers as same-origin. Ollama's
loopback server refuses both by checking ``Host`` and ``Origin``; so does this
guard, on every HTTP request, before authentication and before the app:

* **Host**: a loopback name (``localhost``; 127.0.0.0/8, ``::1`` and
  ``::ffff:127.x`` read with :mod:`ipaddress`, never by prefix), with or without
  a port, or a name the user allowed (``serve --allowed-host``). A rebinding
  page's requests carry its own name, so they are refused (403
  ``host_not_allowed``). A server bound to a non-loopback address (which needs
  an API key) and given no ``--allowed-host`` takes any ``Host``: the key guards
  it, and its clients use names this process cannot know.
* **Origin**: absent (curl, the ``openai`` client, a same-origin ``GET``) or this
  server's own (the request's ``Host``, name and port; the scheme is not
  compared, since behind a TLS proxy the page is https and this server http):
  the page at ``/`` is served from here. Any other site's page is refused (403
  ``origin_not_allowed``), with or without a key: the server answers no CORS
  preflight, so no other origin has a use for it.
* **Content-Type**: a ``POST``, ``PUT`` or ``PATCH`` must declare
  ``application/json`` (415 ``unsupported_media_type`` otherwise): a form or a
  ``text/plain`` body is what a page can send without a preflight. The one
  exception, ``/v1/audio/transcriptions`` (:data:`FORM_PATHS`), takes
  ``multipart/form-data``, OpenAI's upload shape, guarded by Host and Origin alone.
* **Security headers** on every response, the page's and the API's:
  :data:`SECURITY_HEADERS`.

WebSocket upgrades (``/v1/realtime``) get the Host and Origin checks too (a
browser opens a WebSocket to any site, sending its page's Origin, with no CORS
in the way); a refused one is answered with the HTTP error instead of the
handshake (:func:`deny_websocket`).

Refusals are OpenAI's error shape, like every other error of the server.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

LOOPBACK_NAMES = frozenset({"localhost"})
"""Names that are loopback by definition (RFC 6761 reserves ``localhost``); addresses are read with ipaddress."""
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
"""Methods whose body the app reads as JSON: each must say ``Content-Type: application/json``."""
JSON_TYPE = "application/json"
FORM_TYPE = "multipart/form-data"
FORM_PATHS = frozenset({"/v1/audio/transcriptions"})
"""The paths that take a multipart form instead (OpenAI's upload shape). A form is what a page
can post without a preflight, so these stand on the Host and Origin checks above: another
site's page sends its Origin (403), a rebinding page its own Host (403)."""
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""What the page (orchestrator/server/web) loads: app.js and style.css from this server, ``fetch`` to this
server, no inline script or style attribute, no frame, no form post (the form is sent by app.js);
the audio plays through an AudioContext, which CSP does not govern."""
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)
"""Sent on every response: no other site may frame the page or read the referrer, no content sniffing."""


def is_loopback(host: str) -> bool:
    """``localhost``, 127.0.0.0/8, ``::1`` (bracketed or not) and ``::ffff:127.x``; any other name
    (``127.attacker.example`` included) or a malformed address is not."""
    name = host.strip().lower().rstrip(".")
    if name in LOOPBACK_NAMES:
        return True
    try:
        ip = ipaddress.ip_address(name.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def split_host(value: str) -> tuple[str, int | None] | None:
    """(name, port) of a ``Host`` header (``name``, ``name:port``, ``[v6]`` or ``[v6]:port``),
    the name lower-case without brackets; None when it is not of that form."""
    value = value.strip().lower()
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        if not sep:
            return None
        port = rest.removeprefix(":") if rest.startswith(":") else None
        if rest and port is None:
            return None
    else:
        name, sep, port_text = value.partition(":")
        port = port_text if sep else None
    if not name or (port is not None and not (port.isdigit() and int(port) <= 65535)):
        return None
    return name, int(port) if port is not None else None


class RequestGuard:
    """ASGI middleware: the ``Host``, ``Origin`` and ``Content-Type`` checks, and the security
    headers (see the module docstring).

    ``allowed_hosts``: names accepted besides the loopback ones; ``None`` accepts any
    ``Host`` (a non-loopback bind with an API key and no ``--allowed-host``)."""

    def __init__(self, app: ASGIApp, *, allowed_hosts: Iterable[str] | None = ()) -> None:
        self.app = app
        self.allowed_hosts = (
            None
            if allowed_hosts is None
            else frozenset(h.lower().strip("[]") for h in allowed_hosts)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                message = {
                    **message,
                    "headers": [
                        *message.get("headers", []),
                        *((k, v) for k, v in SECURITY_HEADERS if k not in present),
                    ],
                }
            await send(message)

        refusal = self.refusal(scope)
        if refusal is not None:
            status, code, param, text = refusal
            log.info(
                "refused %s %s from %s: %s",
                scope.get("method"),
                scope.get("path"),
                scope.get("client"),
                text,
            )
            await _send_error(send_with_headers, status, text, code, param)
            return
        await self.app(scope, receive, send_with_headers)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket upgrade (``/v1/realtime``) gets the Host and Origin checks: a browser opens
        a WebSocket to any site without CORS, sending its page's ``Origin`` — so another site's
        page is refused here, before the handshake completes."""
        refusal = self.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, code, param, text = refusal
        log.info(
            "refused a WebSocket to %s from %s: %s", scope.get("path"), scope.get("client"), text
        )
        await deny_websocket(scope, send, status, text, "invalid_request_error", code, param)

    def refusal(self, scope: Scope) -> tuple[int, str, str, str] | None:
        """(status, code, param, message) of a request that must not reach the app, or None."""
        headers: dict[bytes, bytes] = {}
        for k, v in scope.get("headers") or []:
            headers.setdefault(k.lower(), v)
        host = headers.get(b"host", b"").decode("latin-1")
        split = split_host(host)
        if split is None:
            return (
                400,
                "bad_host",
                "Host",
                f"Host header {host[:80]!r} is missing or malformed: send the server's address",
            )
        if not self.host_allowed(split[0]):
            return (
                403,
                "host_not_allowed",
                "Host",
                f"Host {host[:80]!r} is not this server's name: only loopback names"
                f"{' and ' + ', '.join(sorted(self.allowed_hosts)) if self.allowed_hosts else ''} are served "
                "(serve --allowed-host NAME adds one)",
            )
        origin = headers.get(b"origin")
        if origin is not None and not _same_origin(origin.decode("latin-1"), host):
            return (
                403,
                "origin_not_allowed",
                "Origin",
                f"Origin {origin.decode('latin-1')[:80]!r} is another site: this server answers its own page "
                "and clients that send no Origin (curl, the openai client)",
            )
        if scope.get("method") in BODY_METHODS:
            ctype = headers.get(b"content-type", b"").decode("latin-1")
            media = ctype.partition(";")[0].strip().lower()
            if media != JSON_TYPE and not (media == FORM_TYPE and scope.get("path") in FORM_PATHS):
                return (
                    415,
                    "unsupported_media_type",
                    "Content-Type",
                    f"Content-Type {ctype[:80]!r} is not {JSON_TYPE}: send the body as JSON with "
                    f"'Content-Type: {JSON_TYPE}'",
                )
        return None

    def host_allowed(self, name: str) -> bool:
        return self.allowed_hosts is None or is_loopback(name) or name in self.allowed_hosts


def _same_origin(origin: str, host: str) -> bool:
    """Whether ``origin`` (``scheme://host[:port]``) is this server as the request named it (``Host``)."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return False
    split = split_host(host)
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.path
        or parts.query
        or split is None
    ):
        return False
    default = 443 if parts.scheme == "https" else 80
    return parts.hostname == split[0] and (port or default) == (split[1] or default)


async def deny_websocket(
    scope: Scope,
    send: Send,
    status: int,
    message: str,
    type_: str,
    code: str,
    param: str | None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Refuse a WebSocket handshake: an HTTP response in OpenAI's error shape where the server
    offers ASGI's ``websocket.http.response`` extension (uvicorn's websockets protocols do),
    else a close before accepting (the client sees a 403)."""
    if "websocket.http.response" in (scope.get("extensions") or {}):
        body = json.dumps(
            {"error": {"message": message, "type": type_, "param": param, "code": code}}
        ).encode()
        await send(
            {
                "type": "websocket.http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    *SECURITY_HEADERS,
                    *(headers or []),
                ],
            }
        )
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": f"{code}: {message}"[:120]})


async def _send_error(send: Send, status: int, message: str, code: str, param: str) -> None:
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": param,
                "code": code,
            }
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
