"""Request admission: a bounded number in flight, a bounded queue, a clear "busy".

Each request holds Ray actor calls for its whole life: one ``stream`` per
stage on the stage's device actor, and at most one ``feed``/``end_input`` at a
time per stage that feeds a stage there. A device actor runs at most
``max_concurrency`` calls at once; past that Ray queues calls behind the ones
running, so a request's ``feed`` could wait behind other requests' ``stream``
calls that wait for that very feed — a stall with no error and no end.

:class:`Admission` makes that impossible by construction:

* **in flight**: at most ``limit`` requests, with ``limit`` derived from the
  actors' concurrency (:func:`in_flight_limit`): every call of every admitted
  request fits, plus ``CONTROL_CALLS`` spare for ``cancel``/``measure``/``close``;
* **one slot per request, taken whole**: a request waits for one slot or none,
  so no waiting request ever holds part of what another needs;
* **waiting**: at most ``max_waiting`` requests, first come first served;
  beyond that, or after ``wait_timeout_s``, ``PipelineBusy`` (the limit and the
  numbers in flight and waiting) at once.

Thread- and loop-safe: requests may come from several event loops (each
``Pipeline.run`` is its own ``asyncio.run``) or threads.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Mapping, Sequence

from orchestrator.core.errors import PipelineBusy

CONTROL_CALLS = 5
"""Actor calls kept free of requests: ``cancel``, ``measure``, ``close``, ``ready``, and the
supervisor's ``watch`` (held for the actor's whole life: ``runtime.supervisor``)."""
WAIT_TIMEOUT_S = 60.0
"""How long a request may wait for a slot before it is refused as busy."""


def calls_per_request(
    devices: Mapping[str, str], feeders: Mapping[str, str | Sequence[str] | None]
) -> dict[str, int]:
    """Actor calls one request holds at once on each device.

    ``devices``: stage → device; ``feeders``: stage → the stage(s) feeding it
    (None or ``()`` when it takes the request alone; a fan-in: each of its
    inputs' stages). One ``stream`` per stage, and one ``feed``/``end_input``
    per producing stage per consumer device (a producer's actor awaits its
    feeds one at a time)."""
    calls: dict[str, int] = {}
    for device in devices.values():
        calls[device] = calls.get(device, 0) + 1
    fed: set[tuple[str, str]] = set()
    for stage, sources in feeders.items():
        for source in (sources,) if isinstance(sources, str) else sources or ():
            fed.add((source, devices[stage]))
    for _source, device in fed:
        calls[device] = calls.get(device, 0) + 1
    return calls


def in_flight_limit(calls: Mapping[str, int], max_concurrency: int) -> int:
    """Requests that may be in flight at once so every call of each fits in every
    device actor's ``max_concurrency`` (minus ``CONTROL_CALLS``); at least 1."""
    usable = max(1, max_concurrency - CONTROL_CALLS)
    return max(1, min((usable // max(1, n) for n in calls.values()), default=usable))


def replica_caps(calls: Mapping[str, int], max_concurrency: int) -> dict[str, int]:
    """Requests one replica may hold at once, per actor key: the actor's usable calls
    (``max_concurrency`` − ``CONTROL_CALLS``) over the calls one request holds there
    (``calls_per_request`` keyed by replica holder → actor key: as if a request used every
    stage that actor hosts, which is conservative); at least 1."""
    usable = max(1, max_concurrency - CONTROL_CALLS)
    return {key: max(1, usable // max(1, n)) for key, n in calls.items()}


def replicated_limit(
    caps: Mapping[str, int], stage_keys: Mapping[str, Sequence[str]], dead: set[str] | None = None
) -> int:
    """Requests that may be in flight: over every stage, the sum of its live replicas' caps,
    the least of them (at least 1). Each actor's calls stay within its concurrency (each
    replica holds at most its cap), and with fewer requests in flight than this some replica
    of every stage has room, so an admitted request always gets one per stage. With one
    replica per stage it is ``in_flight_limit`` exactly."""
    dead = dead or set()
    sums = [sum(caps.get(k, 1) for k in keys if k not in dead) for keys in stage_keys.values()]
    return max(1, min(sums, default=1))


class Admission:
    """At most ``limit`` requests in flight and ``max_waiting`` waiting (see the module docstring)."""

    def __init__(
        self, limit: int, *, max_waiting: int | None = None, wait_timeout_s: float = WAIT_TIMEOUT_S
    ) -> None:
        self.limit = max(1, int(limit))
        self.max_waiting = self.limit if max_waiting is None else max(0, int(max_waiting))
        self.wait_timeout_s = wait_timeout_s
        self.in_flight = 0
        self._lock = threading.Lock()
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _busy(self, why: str) -> PipelineBusy:
        return PipelineBusy(self.limit, self.in_flight, len(self._waiters), self.max_waiting, why)

    async def acquire(self) -> None:
        """Take one slot, waiting in line when all are taken; ``PipelineBusy`` when
        the line is full or the wait runs past ``wait_timeout_s``."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.in_flight < self.limit and not self._waiters:
                self.in_flight += 1
                return
            if len(self._waiters) >= self.max_waiting:
                raise self._busy("the queue of waiting requests is full")
            fut: asyncio.Future[None] = loop.create_future()
            entry = (loop, fut)
            self._waiters.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout=self.wait_timeout_s)
        except BaseException as exc:
            with self._lock:
                if entry in self._waiters:
                    self._waiters.remove(entry)
                    granted = False
                else:
                    granted = True  # the slot was handed over as we gave up: hand it on
            if granted:
                self.release()
            if isinstance(exc, asyncio.TimeoutError):
                raise self._busy(f"no slot came free within {self.wait_timeout_s:g} s") from None
            raise

    def set_limit(self, limit: int) -> None:
        """A new limit (a replica died): slots already held are kept; none is handed out
        while ``in_flight`` is at or above it."""
        with self._lock:
            self.limit = max(1, int(limit))

    def release(self) -> None:
        """Give a slot back: to the first waiter in line (unless the limit was lowered below
        what is in flight), else to the pool."""
        with self._lock:
            while self._waiters and self.in_flight <= self.limit:
                loop, fut = self._waiters.popleft()
                if loop.is_closed():
                    continue
                loop.call_soon_threadsafe(_grant, fut)
                return  # the slot passes to the waiter: in_flight is unchanged
            self.in_flight = max(0, self.in_flight - 1)


def _grant(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
