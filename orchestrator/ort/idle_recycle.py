"""A route worker recycled while it is idle, before a call would have to wait for it.

``WorkerSessions`` replaces a worker whose RSS plus the largest rise of one call passes its
``recycle_limit`` (OpenVINO's CPU plugin keeps memory for every new shape). Done before a
call, the call waits for the fresh worker: about 2.5 s for the Piper voice on the project's
2-core machine (docs/benchmarks.md), which a spoken reply pays in front of its first sentence
when the recycle falls there. So after each call, when the worker is **near** its limit — its
RSS plus :data:`AHEAD` times that rise passes it: one of the next calls would recycle — and no
call comes for :data:`IDLE_S`, the recycle is done then, in a thread of its own (between a
reply and the next one, while the user speaks).

Guarantees: the limit and the before-a-call recycle are unchanged (this only recycles
earlier, never lets a worker hold more); an idle recycle runs under the host's lock, so it
never cuts a call, and it is skipped when a call ran since it was armed, a unit is open, the
host is stopping or broken, or the worker is no longer near its limit; a failed reopen is
the host's ``RecycleFailed``, raised to the next call as before-a-call recycles' are.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Protocol

from orchestrator.core.errors import VerificationError

log = logging.getLogger(__name__)

IDLE_S = 0.25
"""How long a worker near its limit must go without a call before it is recycled: longer
than the gap between the chunks of one reply's voice (each chunk's call follows the last at
once when the text is ahead), shorter than the gap between two spoken turns."""
AHEAD = 2
"""Near the limit: the RSS plus this many of the largest call rise passes it."""


class _Route(Protocol):
    @property
    def name(self) -> str: ...


class _Stopping(Protocol):
    def is_set(self) -> bool: ...


class _Revival(Protocol):
    @property
    def stopping(self) -> _Stopping: ...


class Host(Protocol):
    """What of ``WorkerSessions`` this reads and calls."""

    @property
    def route(self) -> _Route: ...
    @property
    def revival(self) -> _Revival: ...
    @property
    def recycle_limit(self) -> int | None: ...
    @property
    def recycles(self) -> int: ...
    @property
    def fresh_bytes(self) -> int: ...
    @property
    def calls(self) -> int: ...
    @property
    def _lock(self) -> threading.Lock: ...

    @property
    def largest_rise(self) -> int: ...

    def due(self, ahead: int) -> bool: ...

    def recycle_if_due(self, ahead: int, when: str) -> None: ...


class IdleRecycle:
    """Arms one timer per call that leaves its host near the limit (see the module docstring)."""

    def __init__(self, host: Host, idle_s: float = IDLE_S) -> None:
        self.host = host
        self.idle_s = idle_s
        self.done = 0
        """Recycles done while idle (also counted in the host's ``recycles``)."""
        self._timer: threading.Timer | None = None

    def after_call(self) -> None:
        """After a call (the host's lock held): arm the timer when the worker is near its limit."""
        host = self.host
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        limit, rise = host.recycle_limit, host.largest_rise
        if limit is None or not host.due(AHEAD):
            return
        if host.fresh_bytes and host.fresh_bytes + AHEAD * rise > limit:
            return  # a fresh worker would be as near: recycling early gains nothing
        self._timer = threading.Timer(self.idle_s, self._fire, (host.calls,))
        self._timer.daemon = True
        self._timer.name = f"route-{host.route.name}-idle-recycle"
        self._timer.start()

    @property
    def armed(self) -> bool:
        """Whether a recycle waits for the worker to stay idle."""
        return self._timer is not None and self._timer.is_alive()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _fire(self, calls: int) -> None:
        host = self.host
        with host._lock:
            if host.calls != calls or host.revival.stopping.is_set():
                return
            before = host.recycles
            with contextlib.suppress(VerificationError):  # the next call raises it
                host.recycle_if_due(AHEAD, "idle")
            if host.recycles > before:
                self.done += 1
