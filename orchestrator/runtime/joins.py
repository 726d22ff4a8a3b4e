"""Fan-in: the items of a stage's several inputs combined as its ``join`` declares.

A stage with several inputs (``inputs: [a, b]``, ``join: zip|all|latest``)
receives *joined items*: a ``dict`` keyed by source (a stage name, or
``request``) in the order its ``inputs`` list them. What each value is:

* ``zip`` — the i-th item of every input: ``{"a": a_i, "b": b_i}``, for
  i = 0, 1, … in sequence order. It ends with the shortest input; items of a
  longer input that found no partner are counted (``unpaired``), never sent.
* ``all`` — once every input has ended, one item holding each input's whole
  output as a list: ``{"a": [a_0, …], "b": [b_0, …]}`` (an input that produced
  nothing: ``[]``).
* ``latest`` — every item of any input, in the order they arrive, yields one
  item holding the newest item of each input seen so far; an input that has
  produced nothing yet is **absent** from the dict (not None).

Bounds (:class:`Joiner`): ``zip`` keeps at most ``buffer_items`` unpaired items
per input — an input that runs ahead of the others waits in ``put`` (its
producer's pump stops reading, so Ray pauses the producer's generator after
``GENERATOR_BACKPRESSURE`` unread items); ``latest`` keeps one item per input
and hands each joined item on before it takes the next; ``all`` keeps each
input's whole output (that is the join's meaning), at most ``all_items``
items per input, past which the request fails naming the joined stage rather
than growing without end. The joined items themselves wait in a queue of
``buffer_items`` before the runtime feeds them to the stage (whose own input
queue is ``actor_inputs.INPUT_QUEUE_ITEMS``).

Pure asyncio: no Ray, so the semantics are tested without a cluster.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import NotRequired, TypedDict

from orchestrator.core.errors import StageFailed
from stages.payloads import Item

JOIN_BUFFER_ITEMS = 4
"""Unpaired items a ``zip`` keeps per input (and joined items waiting to be fed)."""
JOIN_ALL_ITEMS = 4096
"""Items ``all`` keeps per input before it fails the request (it must keep them all)."""

_DONE = object()


@dataclass(frozen=True)
class JoinSpec:
    """A fan-in stage's join, as its device actor builds a ``Joiner`` per request from it (the
    direct mode: ``DeviceActor.connect``)."""

    stage: str
    join: str
    inputs: tuple[str, ...]


class JoinStats(TypedDict):
    """A join's figures for one request (a fan-in stage's ``join`` in its request stats): the
    items each input handed over and the joined items; for ``zip``, the items of each input
    left without a partner and the most each held unpaired at once."""

    join: str
    received: dict[str, int]
    joined: int
    unpaired: NotRequired[dict[str, int]]
    ahead_max: NotRequired[dict[str, int]]


Joined = dict[str, Item | list[Item | None] | None]
"""One joined item: by source, its item (``zip``, ``latest``) or its whole output (``all``)."""


class Joiner:
    """One fan-in stage's join for one request. Producers call ``put(source, item)``
    and ``end(source)`` (each source once); the runtime reads ``joined()``."""

    def __init__(
        self,
        stage: str,
        device: str,
        join: str,
        sources: Sequence[str],
        *,
        buffer_items: int = JOIN_BUFFER_ITEMS,
        all_items: int = JOIN_ALL_ITEMS,
    ) -> None:
        if join not in ("zip", "all", "latest"):
            raise ValueError(f"unknown join {join!r}")
        self.stage, self.device, self.join = stage, device, join
        self.sources = list(sources)
        self.buffer_items = max(1, buffer_items)
        self.all_items = all_items
        self.pending: dict[str, deque[Item | None]] = {s: deque() for s in self.sources}
        self.ended: set[str] = set()
        self.latest: dict[str, Item | None] = {}
        self.received = dict.fromkeys(self.sources, 0)
        self.unpaired = dict.fromkeys(self.sources, 0)
        self.ahead_max = dict.fromkeys(self.sources, 0)
        """The most unpaired items each input held at once (``zip``): at most ``buffer_items``."""
        self.emitted = 0
        self.finished = False
        self._out: asyncio.Queue[Joined | object] = asyncio.Queue(maxsize=self.buffer_items)
        self._changed = asyncio.Condition()
        self._order = asyncio.Lock()
        """Held from taking items to handing the joined item on, so joined items keep their order."""

    # -- producers -------------------------------------------------------------
    async def put(self, source: str, item: Item | None) -> None:
        """Hand over ``source``'s next item; waits while the join holds as many of
        that input's items as it may (see the module docstring)."""
        if source not in self.pending:
            raise KeyError(source)
        if source in self.ended:
            raise RuntimeError(f"{source} already ended")
        self.received[source] += 1
        if self.finished:  # zip ended with a shorter input: the rest has no partner
            self.unpaired[source] += 1
            return
        if self.join == "latest":
            async with self._order:
                self.latest[source] = item
                await self._emit(dict(self._ordered(self.latest)))
            return
        if self.join == "all":
            if len(self.pending[source]) >= self.all_items:
                raise StageFailed(
                    self.stage,
                    self.device,
                    f"join: all keeps every item of each input, and {source} produced more than "
                    f"{self.all_items}; use join: zip or latest, or a producer with fewer, larger items",
                )
            self.pending[source].append(item)
            return
        async with self._changed:
            await self._changed.wait_for(
                lambda: len(self.pending[source]) < self.buffer_items or self.finished
            )
        if self.finished:
            self.unpaired[source] += 1
            return
        self.pending[source].append(item)
        self.ahead_max[source] = max(self.ahead_max[source], len(self.pending[source]))
        await self._pair()

    async def end(self, source: str) -> None:
        """``source`` has no more items. Once every input has ended, so has the join."""
        if source in self.ended:
            return
        self.ended.add(source)
        if self.join == "zip":
            await self._pair()
        elif len(self.ended) == len(self.sources) and not self.finished:
            if self.join == "all":
                await self._emit({s: list(self.pending[s]) for s in self.sources})
                for s in self.sources:
                    self.pending[s].clear()
            await self._finish()

    # -- the consumer ----------------------------------------------------------
    async def joined(self) -> AsyncIterator[Joined]:
        """The joined items, in order, until the join ends."""
        while True:
            item = await self._out.get()
            if item is _DONE:
                return
            assert isinstance(item, dict)
            yield item

    def stats(self) -> JoinStats:
        out = JoinStats(join=self.join, received=dict(self.received), joined=self.emitted)
        if self.join == "zip":
            out["unpaired"] = {s: n for s, n in self.unpaired.items() if n}
            out["ahead_max"] = dict(self.ahead_max)
        return out

    # -- inside ----------------------------------------------------------------
    def _ordered(self, d: dict[str, Item | None]) -> list[tuple[str, Item | None]]:
        return [(s, d[s]) for s in self.sources if s in d]

    async def _emit(self, item: Joined) -> None:
        self.emitted += 1
        await self._out.put(item)

    async def _pair(self) -> None:
        async with self._order:
            while not self.finished and all(self.pending[s] for s in self.sources):
                item: Joined = {s: self.pending[s].popleft() for s in self.sources}
                async with self._changed:
                    self._changed.notify_all()
                await self._emit(item)
            if not self.finished and any(
                s in self.ended and not self.pending[s] for s in self.sources
            ):
                await self._finish()

    async def _finish(self) -> None:
        self.finished = True
        for s in self.sources:
            self.unpaired[s] += len(self.pending[s]) if self.join == "zip" else 0
            if self.join == "zip":
                self.pending[s].clear()
        async with self._changed:
            self._changed.notify_all()
        await self._out.put(_DONE)
