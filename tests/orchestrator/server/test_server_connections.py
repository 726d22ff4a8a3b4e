"""``orchestrator/server/transport.py`` on both of uvicorn's HTTP protocols (httptools' and
h11's), in front of a tiny Starlette app in a thread (no pipeline, no Ray): the
connection cap evicts the longest-waiting connection, a half-sent request is closed at
the header timeout, and a response nobody reads is aborted at the write timeout with
the app seeing the client gone; a WebSocket (``/v1/realtime``) outlives the HTTP
deadlines once upgraded. ``serve`` itself is driven in
tests/orchestrator/server/test_server_transport.py."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from orchestrator.server.transport import TransportLimits
from tests.helpers.waiting import LOOP_CLOCK_S, NEVER_HANGS_S, wait_until

uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

LIMITS = TransportLimits(
    max_connections=20, header_timeout_s=1.0, read_timeout_s=1.0, write_timeout_s=1.0
)
CHUNK = b"x" * 65536


def _base(name: str) -> Any:
    if name == "httptools":
        pytest.importorskip("httptools")
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return H11Protocol


class _Server:
    def __init__(self, base: Any, limits: TransportLimits = LIMITS) -> None:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response, StreamingResponse
        from starlette.routing import Route, WebSocketRoute
        from starlette.websockets import WebSocket

        self.stream_ended = threading.Event()

        async def endless() -> AsyncIterator[bytes]:
            try:
                while True:  # never ends by itself: only a client gone ends it
                    yield CHUNK
                    await asyncio.sleep(0)
            finally:
                self.stream_ended.set()

        async def stream(request: Request) -> Response:
            return StreamingResponse(endless(), media_type="application/octet-stream")

        async def health(request: Request) -> Response:
            return JSONResponse({"status": "ok"})

        async def echo(websocket: WebSocket) -> None:
            await websocket.accept()
            while True:
                await websocket.send_text(await websocket.receive_text())

        app = Starlette(
            routes=[Route("/health", health), Route("/stream", stream), WebSocketRoute("/ws", echo)]
        )
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.server = uvicorn.Server(
            uvicorn.Config(
                app,
                host="127.0.0.1",
                port=self.port,
                log_level="warning",
                lifespan="off",
                **limits.uvicorn_kwargs(base),
            )
        )
        self.thread = threading.Thread(
            target=self.server.run, name="transport-test-uvicorn", daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"


@pytest.fixture(params=["httptools", "h11"])
def protocol(request: pytest.FixtureRequest) -> Any:
    return _base(request.param)


@pytest.fixture
def server(protocol: Any) -> Iterator[_Server]:
    s = _Server(protocol)
    try:
        yield s
    finally:
        s.server.should_exit = True
        s.thread.join(timeout=20)


@pytest.fixture
def untimed_server(protocol: Any) -> Iterator[_Server]:
    """``LIMITS``' connection cap with header and read deadlines no test outlasts: a connection
    found closed there was closed by the cap."""
    never = 10 * NEVER_HANGS_S
    s = _Server(
        protocol,
        TransportLimits(
            max_connections=LIMITS.max_connections,
            header_timeout_s=never,
            read_timeout_s=never,
            write_timeout_s=never,
        ),
    )
    try:
        yield s
    finally:
        s.server.should_exit = True
        s.thread.join(timeout=20)


def _closed(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (end of stream or reset), without waiting."""
    try:
        return sock.recv(1 << 20, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _closed_within(sock: socket.socket, seconds: float, since: float | None = None) -> float | None:
    """Seconds from ``since`` (``time.monotonic()``; now by default) until the server closed
    ``sock``; None if still open ``seconds`` after ``since``."""
    t0 = time.monotonic() if since is None else since
    sock.settimeout(0.1)
    while time.monotonic() - t0 < seconds:
        try:
            if sock.recv(1 << 20) == b"":
                return time.monotonic() - t0
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - t0
    return None


def test_the_connection_cap_closes_the_longest_waiting_and_lets_a_request_in(
    untimed_server: _Server,
) -> None:
    server = untimed_server
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(60)]
    try:
        assert httpx.get(f"{server.url}/health", timeout=NEVER_HANGS_S).status_code == 200
        keep = LIMITS.max_connections - 1  # the cap, less the one that made room for /health

        def still_open() -> list[int] | None:
            opened = [i for i, s in enumerate(idle) if not _closed(s)]
            return opened if len(opened) <= keep else None

        opened = wait_until(still_open, f"at most {keep} idle connections still open")
        # no deadline can have closed any: the cap closed the oldest, and only as many as needed
        assert opened == list(range(len(idle) - keep, len(idle))), opened
    finally:
        for s in idle:
            s.close()


def test_a_half_sent_request_is_closed_at_the_header_timeout(server: _Server) -> None:
    t0 = time.monotonic()  # before the connection: its header deadline starts after this
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        took = _closed_within(s, LIMITS.header_timeout_s + NEVER_HANGS_S, since=t0)
    assert took is not None and took >= LIMITS.header_timeout_s - LOOP_CLOCK_S, took


def test_a_response_nobody_reads_is_aborted_and_the_app_sees_the_client_gone(
    server: _Server,
) -> None:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    t0 = time.monotonic()  # before the connection: its write deadline starts after this
    try:
        s.connect(("127.0.0.1", server.port))
        s.sendall(b"GET /stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        s.settimeout(NEVER_HANGS_S)
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        # this client reads no more; the stream is endless: only the write timeout ends it
        assert server.stream_ended.wait(LIMITS.write_timeout_s + NEVER_HANGS_S), (
            "the endless stream still runs"
        )
        took = time.monotonic() - t0
    finally:
        s.close()
    assert took >= LIMITS.write_timeout_s - LOOP_CLOCK_S, took
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200


def test_a_websocket_outlives_the_header_and_read_deadlines(server: _Server) -> None:
    """Before: the header deadline armed for the upgrade request fired after the upgrade (no HTTP
    request ever followed on that protocol) and aborted every WebSocket after --header-timeout."""
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{server.port}/ws", open_timeout=NEVER_HANGS_S) as ws:
        # Two plain connections opened after the upgrade: one never ends its headers, one stalls
        # in its body. Their deadlines were armed after any the WebSocket could have had, and a
        # loop fires its timers in order: once both are closed, the WebSocket's would have fired.
        with (
            socket.create_connection(("127.0.0.1", server.port)) as headers,
            socket.create_connection(("127.0.0.1", server.port)) as body,
        ):
            headers.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            body.sendall(
                b"POST /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{"
            )
            for sock in (headers, body):
                assert _closed_within(sock, NEVER_HANGS_S) is not None, "a deadline never fired"
        ws.send("still here")
        assert ws.recv(timeout=NEVER_HANGS_S) == "still here"
