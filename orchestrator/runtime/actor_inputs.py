"""A device actor's inputs: each hosted stage's bounded queue per request, the fan-in joins
fed here, and (the direct mode) the routes its outputs take to the consumers' actors.

:class:`StageInputs` guarantees:

* **Backpressure.** A stage's input for a request is a queue of ``INPUT_QUEUE_ITEMS``: a
  ``feed`` waits while it is full, and a ``feed`` is one of the request's tasks here, so
  ``cancel`` ends one waiting on a full queue.
* **Order.** A stream's context (a realtime session's history) comes before any fed item;
  an item fed after its request ended here is dropped, never queued forever
  (``ENDED_MEMORY`` requests remembered).
* **The direct mode.** After ``connect`` (every actor's handle, each stage's routes, each
  fan-in's join), a stream with a route hands its outputs on itself (``begin_route``: a
  ``router.Router``): to a consumer in this actor with a local call, else one ``feed`` on
  its actor; a consumer's actor that died is a ``PeerLost`` naming it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from orchestrator.core.errors import ConfigError, PeerLost, StageFailed
from orchestrator.runtime.hop import FirstChunk
from orchestrator.runtime.joins import Joiner, JoinSpec, JoinStats
from orchestrator.runtime.router import Route, Router, RouteTable
from orchestrator.runtime.stage_stats import Tally
from stages.payloads import Item

if TYPE_CHECKING:
    from ray.actor import ActorHandle

ENDED_MEMORY = 4096
"""How many finished (stage, request) inputs are remembered, so that a late
``feed`` for a request that already ended is dropped rather than queued forever."""
INPUT_QUEUE_ITEMS = 4
"""Items waiting for a stage per request: a TTS stage that is 4 sentences behind
holds the decode stage's chunks back (backpressure) instead of buffering them."""
_END = ("__end__",)
CANCEL_WAIT_S = 6.0
"""How long ``cancel`` waits for the request's tasks here to end (a decode engine's stream
waits up to ``threaded.RELEASE_WAIT_S`` for its engine to let go)."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamRoute:
    """What a stream carries to its actor in the direct mode (``DeviceActor.stream``): the
    actor serving each stage of the request (stage → actor key: the replicas the request was
    given), the stage's context items (fed before anything its producers send), and, for a
    fan-in that takes the request, the request's item; ``tools``: the request decodes under a
    tool grammar (``router.Router``: a call is cut into no sentences)."""

    to: Mapping[str, str]
    context: list[Item]
    request_item: Item | None = None
    tools: bool = False
    call_start: str = "<"
    """A call's first character in the request's tool syntax (``Router``'s ``call_start``)."""


@dataclass(frozen=True)
class ConsumerSide:
    """What the direct mode kept in a consumer's actor about its input for one request: the
    sentences fed to it, its first chunk (the first-audio trace) and its join's figures."""

    chunks_in: list[str] | None
    first: FirstChunk | None
    join: JoinStats | None


NO_SIDE = ConsumerSide(None, None, None)


class StageInputs:
    """The inputs of the stages one device actor hosts (the module's guarantees)."""

    def __init__(self, device: str, key: str) -> None:
        self.device, self.key = device, key
        self.inputs: dict[tuple[str, str], asyncio.Queue[Item | tuple[str]]] = {}
        self.ended: dict[tuple[str, str], None] = {}
        self.first_fed: dict[tuple[str, str], float] = {}
        """(stage, request) → when its first fed item reached this actor (``time.perf_counter``),
        for the first-audio trace (``stamps`` in a stream's figures)."""
        self.tasks: dict[str, set[asyncio.Task[Any]]] = {}
        """Request → its ``stream``, ``feed`` and join tasks here: what ``cancel`` ends."""
        self.stopping: dict[str, set[asyncio.Task[Any]]] = {}
        """A cancelled request's tasks until they ended (``cancel`` waits for them)."""
        self.peers: dict[str, ActorHandle] = {}
        """The direct mode (``connect``): actor key → every device actor's handle."""
        self.tables: dict[str, RouteTable] = {}
        self.join_specs: dict[str, JoinSpec] = {}
        self.sentence_stages: set[str] = set()
        self.context: dict[tuple[str, str], list[Item]] = {}
        self.chunks_in: dict[tuple[str, str], list[str]] = {}
        self.firsts_in: dict[tuple[str, str], FirstChunk] = {}
        self.joiners: dict[tuple[str, str], Joiner] = {}

    def track(self, request_id: str, task: asyncio.Task[Any] | None) -> None:
        """``task`` is one of the request's here (``cancel`` ends it)."""
        if task is not None:
            self.tasks.setdefault(request_id, set()).add(task)

    def end_request(
        self, stage: str, request_id: str, task: asyncio.Task[Any] | None
    ) -> float | None:
        """A request's stream on ``stage`` is over: its input and its task forgotten. Returns
        when its first input was fed (None: it took ``initial``)."""
        self.inputs.pop((stage, request_id), None)
        self.context.pop((stage, request_id), None)
        fed = self.first_fed.pop((stage, request_id), None)
        self.end((stage, request_id))
        if task is not None:
            self.forget_task(request_id, task)
        return fed

    def queue(self, stage: str, request_id: str) -> asyncio.Queue[Item | tuple[str]]:
        key = (stage, request_id)
        q = self.inputs.get(key)
        if q is None:
            q = self.inputs[key] = asyncio.Queue(maxsize=INPUT_QUEUE_ITEMS)
        return q

    # -- the direct mode: items go producer → consumer -------------------------------
    def connect(
        self,
        peers: Mapping[str, ActorHandle],
        tables: Mapping[str, RouteTable],
        joins: Mapping[str, JoinSpec],
    ) -> None:
        """Every device actor's handle (actor key → handle), each stage's routes and each
        fan-in's join: what a ``stream`` with a ``route`` needs to feed its consumers itself."""
        self.peers, self.tables, self.join_specs = dict(peers), dict(tables), dict(joins)
        self.sentence_stages = {
            r.consumer for t in self.tables.values() for r in t.routes if r.sentences
        }

    async def feed(
        self,
        stage: str,
        request_id: str,
        items: list[Item],
        entry: str | None = None,
        first: FirstChunk | None = None,
    ) -> None:
        """Put ``items`` into ``stage``'s input for the request (bounded: a full queue holds
        the caller back), or into its ``Joiner`` for a fan-in fed by a producer (``entry``:
        the consumer's input that names it). The call is one of the request's tasks here, so
        ``cancel`` ends a feed waiting on a full queue."""
        if (stage, request_id) in self.ended:
            return
        task = asyncio.current_task()
        if task is not None:
            self.tasks.setdefault(request_id, set()).add(task)
        try:
            await self.feed_items(stage, request_id, items, entry, first)
        finally:
            if task is not None:
                self.forget_task(request_id, task)

    async def feed_items(
        self,
        stage: str,
        request_id: str,
        items: list[Item],
        entry: str | None,
        first: FirstChunk | None,
    ) -> None:
        key = (stage, request_id)
        if key in self.ended:
            return
        if first is not None:
            self.firsts_in.setdefault(key, first)
        if entry is not None and stage in self.sentence_stages:
            self.chunks_in.setdefault(key, []).extend(i for i in items if isinstance(i, str))
        if entry is not None and stage in self.join_specs:
            joiner = self.joiner(stage, request_id)
            for item in items:
                await joiner.put(entry, item)
            return
        for item in items:
            self.first_fed.setdefault(key, time.perf_counter())
            await self.queue(stage, request_id).put(item)

    async def end_input(self, stage: str, request_id: str, entry: str | None = None) -> None:
        """``stage``'s input for the request has ended (a fan-in's: its input ``entry`` has)."""
        if entry is not None and stage in self.join_specs:
            if (stage, request_id) not in self.ended:
                await self.joiner(stage, request_id).end(entry)
            return
        if (stage, request_id) not in self.ended:
            await self.queue(stage, request_id).put(_END)

    def joiner(self, stage: str, request_id: str) -> Joiner:
        """The fan-in's ``Joiner`` for the request, and the task that feeds its joined items
        into the stage's input, then ends it (a task of the request: ``cancel`` ends it)."""
        key = (stage, request_id)
        joiner = self.joiners.get(key)
        if joiner is None:
            spec = self.join_specs[stage]
            joiner = self.joiners[key] = Joiner(stage, self.device, spec.join, spec.inputs)

            async def drain() -> None:
                async for item in joiner.joined():
                    await self.feed_items(stage, request_id, [item], None, None)
                await self.end_input(stage, request_id)

            task = asyncio.get_running_loop().create_task(drain())
            self.tasks.setdefault(request_id, set()).add(task)
            task.add_done_callback(lambda t: self.forget_task(request_id, t))
        return joiner

    def forget_task(self, request_id: str, task: asyncio.Task[Any]) -> None:
        self.tasks.get(request_id, set()).discard(task)
        if not self.tasks.get(request_id):
            self.tasks.pop(request_id, None)

    async def deliver(
        self,
        request_id: str,
        r: Route,
        items: list[Item],
        end: bool,
        first: FirstChunk | None,
        to: Mapping[str, str] | None = None,
    ) -> None:
        """A router step's items to ``r``'s consumer, on the actor the request's route names for
        it (``to``: consumer → actor key, the replica picked for the request; else its device's):
        in this actor, a local call (never a Ray call to itself); else one ``feed`` on its
        actor. A consumer's actor that died is a ``PeerLost`` naming it; a failure the consumer
        raised (a join past its bound) is raised as it came."""
        key = (to or {}).get(r.consumer, r.device)
        if key == self.key:
            await self.feed_items(r.consumer, request_id, items, r.entry, first)
            if end:
                await self.end_input(r.consumer, request_id, r.entry)
            return
        from ray import exceptions as rex

        peer = self.peers[key]
        try:
            if items or first is not None:
                await peer.feed.remote(r.consumer, request_id, items, r.entry, first)
            if end:
                await peer.end_input.remote(r.consumer, request_id, r.entry)
        except rex.RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, (StageFailed, ConfigError)):
                raise cause from None
            if isinstance(cause, rex.RayActorError):
                raise PeerLost(r.consumer, r.device, key, said(cause)) from None
            raise
        except (rex.RayActorError, rex.ActorUnavailableError) as exc:
            raise PeerLost(r.consumer, r.device, key, said(exc)) from None

    def end(self, key: tuple[str, str]) -> None:
        self.ended[key] = None
        while len(self.ended) > ENDED_MEMORY:
            del self.ended[next(iter(self.ended))]

    async def from_queue(self, stage: str, request_id: str) -> AsyncIterator[Item]:
        for item in self.context.pop((stage, request_id), []):
            yield item  # context first: no producer's feed can overtake it
        q = self.queue(stage, request_id)
        while True:
            fed = await q.get()
            if fed is _END:  # identity: an item may be an array, whose == answers element-wise
                return
            yield cast(Item, fed)

    def begin_route(
        self, stage: str, request_id: str, route: StreamRoute | None, tally: Tally
    ) -> Router | None:
        """The direct mode's ``Router`` for this stream (None: the relay), its context put
        first in its input, a fan-in's ``request`` input given its item."""
        if route is None:
            return None
        key = (stage, request_id)
        if route.context:
            self.context[key] = list(route.context)
        spec = self.join_specs.get(stage)
        if spec is not None and "request" in spec.inputs:
            joiner = self.joiner(stage, request_id)
            request_item = route.request_item

            async def give() -> None:
                await joiner.put("request", request_item)
                await joiner.end("request")

            task = asyncio.get_running_loop().create_task(give())
            self.tasks.setdefault(request_id, set()).add(task)
            task.add_done_callback(lambda t: self.forget_task(request_id, t))
        to = dict(route.to)
        return Router(
            self.tables[stage],
            lambda r, items, end, first: self.deliver(request_id, r, items, end, first, to),
            emitted=tally.emitted,
            at=self.key,
            to=to,
            tools=route.tools,
            call_start=route.call_start,
        )

    def consumer_side(self, key: tuple[str, str]) -> ConsumerSide:
        """What the direct mode kept here about the stage's input for one request (taken out:
        the request is over)."""
        joiner = self.joiners.pop(key, None)
        return ConsumerSide(
            self.chunks_in.pop(key, None),
            self.firsts_in.pop(key, None),
            joiner.stats() if joiner is not None else None,
        )

    async def cancel(self, request_id: str) -> int:
        """Stop every stage's work on ``request_id`` here (its streams, the feeds waiting on a
        full queue, its joins) and wait, at most ``CANCEL_WAIT_S``, for them to end (a decode
        engine's stream ends once the engine has let go of the request); returns how many tasks
        were running."""
        tasks = list(self.tasks.pop(request_id, set()))
        for t in tasks:
            t.cancel()
        self._forget(request_id)
        if tasks:
            self.stopping[request_id] = set(tasks)
            try:
                _, late = await asyncio.wait(tasks, timeout=CANCEL_WAIT_S)
            finally:
                self.stopping.pop(request_id, None)
            if late:
                log.warning(
                    "%d task(s) of request %s still ran %.0f s after its cancel",
                    len(late),
                    request_id,
                    CANCEL_WAIT_S,
                )
        return len(tasks)

    def _forget(self, request_id: str) -> None:
        """Drop what the inputs kept for ``request_id`` (its queues ended first)."""
        keys = {k for k in (*self.inputs, *self.joiners, *self.context) if k[1] == request_id}
        for key in keys:
            self.end(key)
            self.inputs.pop(key, None)
            self.first_fed.pop(key, None)
            self.joiners.pop(key, None)
            self.context.pop(key, None)
            self.chunks_in.pop(key, None)
            self.firsts_in.pop(key, None)

    def pending(self, request_id: str) -> int:
        """How many of the request's tasks (streams, feeds, joins) run here now, those still
        stopping after a ``cancel`` included."""
        stopping = sum(1 for t in self.stopping.get(request_id, ()) if not t.done())
        return len(self.tasks.get(request_id, ())) + stopping


def said(exc: BaseException) -> str:
    head = next((line for line in str(exc).splitlines() if line.strip()), "")[:300]
    return f"{type(exc).__name__}: {head}"
