"""Bounds on ``omni-edge serve``'s connections: how many, and how long each may wait or stall.

The serve process is also the Ray driver, so a socket nobody ends costs it a
file descriptor for good, and a stream whose client stopped reading holds an
admission slot of the pipeline. uvicorn (0.54) bounds neither on its own: its
keep-alive timeout starts only after a first response, so a connection that
sends nothing, or dribbles a header byte now and then, is never closed; its
``limit_concurrency`` answers 503 once connections pass it, idle ones included,
so idle sockets would lock everyone out; and a response's ``send`` waits for
the client's reads without end. :func:`protocol_class` is uvicorn's own HTTP
protocol (httptools', as uvicorn picks when it is installed, else h11's) with
the missing bounds (:class:`TransportLimits`; each a ``serve`` flag). It imports
no uvicorn itself: ``serve`` hands it uvicorn's protocol class.

* **Headers**: a request line and headers must arrive within
  ``header_timeout_s`` of the connection opening (or of the previous
  response's end). The deadline does not move when bytes arrive, so a client
  sending one byte a second is closed like a silent one.
* **Body**: a request body that stalls ``read_timeout_s`` between two pieces is
  closed (not while the server itself stopped reading: flow control).
* **Writes**: a response the client stops reading (the transport's buffer
  stays past its high-water mark, the socket full, for ``write_timeout_s``:
  a client that reads nothing, or too little to drain it) is aborted.
  The app sees the client gone (``http.disconnect``), which cancels the
  request on every stage and frees its admission slot, as when a client
  leaves.
* **Connections**: at most ``max_connections`` open. One more closes the
  connection that has waited longest for its request's headers (idle or
  half-sent: no work lost); when every one has a request in progress, the new
  one is closed. So idle sockets can never lock out a real request, and the
  process keeps descriptors for Ray. uvicorn's ``limit_concurrency`` is set
  one above as a backstop; ``keep_alive_s`` is uvicorn's ``timeout_keep_alive``.
* **WebSockets** (``/v1/realtime``): once a connection is upgraded the bounds
  above stop (uvicorn's WebSocket protocol owns the socket; its pings close a
  peer that stops answering) and the session's own idle timeout applies.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 1000
"""Open connections at most. The page holds 2 (its stream and its status poll), a client a few; 1000
is far above any real load on one pipeline (whose admission queue holds tens) and well under the
descriptors a process gets (:data:`FD_RESERVE` more are kept for Ray and the route workers)."""
FD_RESERVE = 1024
"""Descriptors kept for everything but client sockets: Ray's driver, the route workers' pipes, model files."""
KEEP_ALIVE_S = 5
"""uvicorn's own default for an idle keep-alive connection between requests."""
HEADER_TIMEOUT_S = 10.0
"""A request's line and headers are a few hundred bytes: 10 s is Go's common ReadHeaderTimeout, and far
longer than any real client on a network that can carry the replies takes."""
READ_TIMEOUT_S = 30.0
"""The longest pause inside a request body: an upload of a recording over a slow link pauses for
round trips, never for half a minute."""
WRITE_TIMEOUT_S = 30.0
"""How long a client may read nothing of its response: the page and the openai client read as
it arrives, and a reply held longer than this only keeps a pipeline slot from others."""


@dataclass(frozen=True)
class TransportLimits:
    max_connections: int = MAX_CONNECTIONS
    keep_alive_s: int = KEEP_ALIVE_S
    header_timeout_s: float = HEADER_TIMEOUT_S
    read_timeout_s: float = READ_TIMEOUT_S
    write_timeout_s: float = WRITE_TIMEOUT_S

    def uvicorn_kwargs(self, base: type[asyncio.Protocol]) -> dict[str, Any]:
        """What ``uvicorn.Config`` takes for these limits, on uvicorn's HTTP protocol ``base``."""
        return {
            "http": protocol_class(self, base),
            "limit_concurrency": self.max_connections + 1,
            "timeout_keep_alive": self.keep_alive_s,
        }


def protocol_class(limits: TransportLimits, base: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol ``base`` (``HttpToolsProtocol`` or ``H11Protocol``; the caller
    imports uvicorn) with ``limits`` enforced (see the module docstring)."""
    return type(f"Bounded{base.__name__}", (_Bounded, base), {"limits": limits, "waiting": {}})


class _Bounded:
    """The bounds, mixed into a uvicorn HTTP protocol (HttpToolsProtocol or H11Protocol: both
    keep ``transport``, ``flow``, ``cycle``, ``connections``, ``loop`` and ``client``, and call
    ``on_response_complete``). Its phase: ``headers`` (waiting for a request's headers, with a
    fixed deadline), ``body`` (reading its body, with an inactivity deadline) or ``app`` (the
    request is the app's: only the write bound applies)."""

    limits: TransportLimits
    waiting: dict[_Bounded, None]
    """The class's connections in the ``headers`` phase, longest waiting first (a dict keeps order)."""
    transport: asyncio.Transport
    flow: Any
    cycle: Any
    connections: set[Any]
    loop: asyncio.AbstractEventLoop
    client: tuple[str, int] | None

    _phase = "headers"
    _last_read = 0.0
    _seen: Any = None
    _timer: asyncio.TimerHandle | None = None
    _write_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._wait_for_headers()
        if len(self.connections) > self.limits.max_connections:
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self.waiting.pop(self, None)
        for timer in (self._timer, self._write_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._write_timer = None
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        self._last_read = self.loop.time()
        super().data_received(data)  # type: ignore[misc]
        if (
            self._phase == "headers" and self.cycle is not self._seen
        ):  # a request's headers are complete
            self._read_body()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if self.transport.is_closing():
            return
        if (
            self.cycle is not None and not self.cycle.response_complete
        ):  # a pipelined request runs now
            self._seen, self._phase = self.cycle, "app"
            self.waiting.pop(self, None)
            self._cancel()
            return
        self._wait_for_headers()

    def handle_websocket_upgrade(self, *args: Any) -> None:
        """The connection becomes a WebSocket (``/v1/realtime``): uvicorn hands the transport to
        its WebSocket protocol, and these HTTP bounds stop (the session has its own idle timeout;
        without this the header deadline, armed for a request that never comes, closed every
        WebSocket ``--header-timeout`` seconds after it opened)."""
        self.waiting.pop(self, None)
        self._cancel()
        for timer in (self._write_timer,):
            if timer is not None:
                timer.cancel()
        self._write_timer = None
        self._phase = "upgraded"
        super().handle_websocket_upgrade(*args)  # type: ignore[misc]

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(
                self.limits.write_timeout_s, self._write_stalled
            )

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    # -- the bounds ------------------------------------------------------------------
    def _wait_for_headers(self) -> None:
        self._seen, self._phase = self.cycle, "headers"
        self._last_read = self.loop.time()
        self.waiting.pop(self, None)
        self.waiting[self] = None
        self._arm(self.limits.header_timeout_s)

    def _read_body(self) -> None:
        self._phase = "body"
        self.waiting.pop(self, None)
        self._arm(self.limits.read_timeout_s)

    def _arm(self, delay: float) -> None:
        self._cancel()
        self._timer = self.loop.call_later(max(delay, 0.0), self._check)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self._phase == "upgraded":
            return
        if self._phase == "headers":
            if self.cycle is self._seen:
                self._close(
                    f"no complete request headers within {self.limits.header_timeout_s:g} s"
                )
            else:  # completed by the last bytes
                self._read_body()
            return
        if self._phase == "body":
            cycle = self.cycle
            if cycle is None or not cycle.more_body or cycle.response_complete:
                self._phase = "app"  # the body is in: the request is the app's now
            elif self.flow.read_paused:  # the server stopped reading, not the client
                self._arm(self.limits.read_timeout_s)
            else:
                quiet = self.loop.time() - self._last_read
                if quiet >= self.limits.read_timeout_s:
                    self._close(f"its request body stalled for {self.limits.read_timeout_s:g} s")
                else:
                    self._arm(self.limits.read_timeout_s - quiet)

    def _write_stalled(self) -> None:
        self._write_timer = None
        if not self.transport.is_closing():
            log.warning(
                "closed the connection of %s: it stopped reading its response (the send buffer stayed "
                "full for %g s: serve --write-timeout); its request is cancelled",
                _peer(self.client),
                self.limits.write_timeout_s,
            )
            self._abort()  # close() would wait to flush what it never reads

    def _close(self, why: str) -> None:
        log.info("closed the connection of %s: %s", _peer(self.client), why)
        self._abort()

    def _abort(self) -> None:
        """Close now, unflushed, and stop counting this connection at once (uvicorn drops it from
        ``connections`` only when the loop reports it lost, and counts it for ``limit_concurrency``)."""
        self.connections.discard(self)
        self.waiting.pop(self, None)
        self.transport.abort()

    def _make_room(self) -> None:
        oldest = next((c for c in self.waiting if c is not self), None)
        if oldest is not None:
            oldest._close(
                f"{self.limits.max_connections} connections are open (serve --max-connections), "
                "and it had waited longest for a request"
            )
        else:
            log.warning(
                "refused a connection from %s: %d connections are open, each with a request in "
                "progress (serve --max-connections)",
                _peer(self.client),
                len(self.connections) - 1,
            )
            self._abort()


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"
