"""The WebSocket upgrade of ``/v1/realtime`` behind ``server.guard.RequestGuard`` and
``server.auth.BearerAuth``, on a tiny Starlette app (no pipeline, no Ray) through
Starlette's TestClient, which speaks ASGI's ``websocket.http.response`` extension as
uvicorn's websockets protocol does: a refused upgrade is the HTTP error in OpenAI's shape.

Before: the guard passed every non-HTTP scope straight through, so another site's page
(a browser sends its Origin on a WebSocket, and no CORS applies) or a DNS-rebinding name
reached the session; and the key was checked on HTTP only."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.testclient import TestClient, WebSocketDenialResponse
from starlette.websockets import WebSocket

from orchestrator.server.auth import BearerAuth
from orchestrator.server.guard import RequestGuard

KEY = "s3cret-key"


def _app(key: str | None = None) -> Any:
    async def hello(websocket: WebSocket) -> None:
        offered = websocket.scope.get("subprotocols") or []
        await websocket.accept(subprotocol="realtime" if "realtime" in offered else None)
        await websocket.send_text("hello")
        await websocket.close()

    app: Any = Starlette(routes=[WebSocketRoute("/v1/realtime", hello)])
    if key:
        app = BearerAuth(app, key)
    return RequestGuard(app)


def _headers(host: str = "127.0.0.1:8000", **more: str) -> dict[str, str]:
    return {"host": host, **more}


def _denied(client: TestClient, headers: dict[str, str] | None = None, **kwargs: Any) -> Any:
    with (
        pytest.raises(WebSocketDenialResponse) as caught,
        client.websocket_connect("/v1/realtime", headers=headers or _headers(), **kwargs),
    ):
        pass
    return caught.value


def test_another_sites_origin_is_refused_before_the_handshake() -> None:
    client = TestClient(_app())
    denied = _denied(client, _headers(origin="https://evil.example"))
    assert denied.status_code == 403
    assert denied.json()["error"]["code"] == "origin_not_allowed"
    assert denied.json()["error"]["param"] == "Origin"
    assert denied.headers["x-frame-options"] == "DENY"
    with client.websocket_connect(
        "/v1/realtime", headers=_headers(origin="http://127.0.0.1:8000")
    ) as ws:
        assert ws.receive_text() == "hello"  # the page's own origin


def test_a_rebinding_host_is_refused() -> None:
    denied = _denied(TestClient(_app()), _headers("attacker.example:8000"))
    assert denied.status_code == 403
    assert denied.json()["error"]["code"] == "host_not_allowed"


def test_the_key_is_required_as_a_bearer_header_or_openais_subprotocol() -> None:
    client = TestClient(_app(KEY))
    denied = _denied(client)
    assert denied.status_code == 401
    assert denied.json()["error"]["code"] == "invalid_api_key"
    assert "openai-insecure-api-key." in denied.json()["error"]["message"]
    assert _denied(client, _headers(authorization="Bearer wrong")).status_code == 401
    assert (
        _denied(client, subprotocols=["realtime", "openai-insecure-api-key.wrong"]).status_code
        == 401
    )
    with client.websocket_connect(
        "/v1/realtime", headers=_headers(authorization=f"Bearer {KEY}")
    ) as ws:
        assert ws.receive_text() == "hello"
    with client.websocket_connect(
        "/v1/realtime",
        headers=_headers(),
        subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"],
    ) as ws:
        assert ws.accepted_subprotocol == "realtime"  # the key is never echoed back
        assert ws.receive_text() == "hello"
