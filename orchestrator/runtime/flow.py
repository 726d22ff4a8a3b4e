"""The flow of one request through a started pipeline: streams opened, outputs pumped, the
request wound down. ``Runtime.stream`` admits a request and hands it to a :class:`RequestFlow`.

A flow guarantees:

* **Every stage it needs streams at once** (``open_streams``): one Ray streaming generator per
  stage, the request given to the stages that take it; in the direct mode each stream carries
  its route (its context first, a fan-in's request item), and the producers' actors feed their
  consumers themselves.
* **One pump per stage** (``pump._StagePump``) reads its outputs in this process: events out,
  and (relay) its consumers fed from here, a fan-in's inputs through its ``Joiner``.
* **The first failure ends the request everywhere** (``watch``): the other tasks are cancelled,
  ``cancel`` reaches every live actor, and the failure is raised as the stage's
  (``runtime.failures.map_failure``). A flow that ends early (its reader went away) is wound
  down the same way; one that ended clean leaves nothing to cancel.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from orchestrator.core.plan import StagePlan
from orchestrator.runtime.actor_inputs import StreamRoute
from orchestrator.runtime.events import AudioChunk, Event, OutputItem, StageEvent, TextDelta
from orchestrator.runtime.hop import FirstChunk
from orchestrator.runtime.joins import Joiner
from orchestrator.runtime.pump import _StagePump
from orchestrator.runtime.router import tool_call_start
from stages.base import REQUEST
from stages.payloads import Item
from stages.requests import ChatRequest, Request, TextRequest

if TYPE_CHECKING:
    from ray import ObjectRefGenerator

    from orchestrator.runtime.balance import ReplicaRef
    from orchestrator.runtime.startup import Device

GENERATOR_BACKPRESSURE = 16
"""Unread outputs a stage may run ahead of the runtime before Ray pauses it."""


class DriverStats(TypedDict):
    """What the driver did for the requests (the run record's ``runtime.streaming.driver``):
    outputs it read, ``feed`` calls it made, its CPU seconds while requests were in flight."""

    items_read: int
    feeds_sent: int
    cpu_s: float


def call_start_of(rt: Any, stages: Sequence[StagePlan], entry: str | None, call: object) -> str:
    """The first character of a call under a request's ``tool_call``: in the tool syntax it
    names (the server names its own), else in the one its decode stage chooses from its chat
    template (the first stage taking the request whose kind has a ``tool_family``:
    ``ArDecodeKind.tool_family``, the choice the stage's prompt and grammar follow)."""
    if not isinstance(call, Mapping):
        return tool_call_start(None)
    if "family" not in call:
        for s in stages:
            probe = getattr(rt.graph.kinds[s.name], "tool_family", None)
            if probe is not None and (s.name == entry or REQUEST in s.inputs):
                return tool_call_start({"family": probe(s)})
    return tool_call_start(call)


class RequestFlow:
    """One request's streams, pumps and feeders (the module's guarantees)."""

    def __init__(
        self,
        rt: Any,
        request: Request,
        rid: str,
        entry: str | None,
        context: Mapping[str, Sequence[Item]] | None,
    ) -> None:
        self.rt, self.request, self.rid, self.entry, self.context = rt, request, rid, entry, context
        self.item: Item = request.item()
        """The request as its entry stage receives it (plain data: it crosses to the actor)."""
        self.plan, self.route_tables, self.driver_stats = rt.plan, rt.route_tables, rt.driver_stats
        self.picks: dict[str, ReplicaRef] = rt.picks.get(rid, {})
        """The replica of each stage serving the request (``balance.Balancer.pick``)."""
        self.direct = rt.streaming == "direct"
        self.stages = rt.downstream(entry)
        self.chunks_in: dict[str, list[str]] = {c: [] for c in rt.consumers}
        call = (
            (request.sampling or {}).get("tool_call") if isinstance(request, ChatRequest) else None
        )
        self.tools = bool(call)
        """The request decodes under a tool grammar: a call's text is cut for no voice
        (``router.Router``'s ``tools``)."""
        self.call_start = call_start_of(rt, self.stages, entry, call)
        """A call's first character in the request's tool syntax (``Router``'s ``call_start``)."""
        self.events: asyncio.Queue[Any] = asyncio.Queue()

    def device(self, stage: str) -> Device:
        """The actor serving ``stage`` for this request: its picked replica's (else the first)."""
        ref = self.picks.get(stage) or self.rt.replicas[stage][0]
        return self.rt.devices[ref.key]

    async def run(self) -> AsyncGenerator[Event, None]:
        """The request's events: every stage's stream opened, a pump per stage (relay: the
        context fed first, and a feeder per join), a feeder for a fed entry stage, the events
        relayed as they come until the last one or a failure, then the request wound down."""
        t0 = time.perf_counter()
        joiners = {  # the relay joins in the driver; the direct mode in the fan-in's actor
            s.name: Joiner(s.name, s.device or "?", self.rt.joins[s.name], s.inputs)
            for s in self.stages
            if s.name in self.rt.joins and not self.direct
        }
        gens = self.open_streams()
        if not self.direct:
            await self._feed_context()
        firsts: dict[str, FirstChunk] = {}  # sentence consumer -> its first chunk, as seen
        tasks = [
            asyncio.create_task(
                self._pump(s, gens[s.name], t0, joiners, firsts), name=f"{self.rid}:{s.name}"
            )
            for s in self.stages
        ]
        for name, joiner in joiners.items():
            item = self.item if self.entry is None else None
            tasks.append(
                asyncio.create_task(
                    self._feed_joined(self.plan.stage(name), joiner, item),
                    name=f"{self.rid}:{name}:join",
                )
            )
        if self.entry is not None and list(self.stages[0].inputs) != [REQUEST]:
            tasks.append(
                asyncio.create_task(self._feed_entry(self.stages[0]), name=f"{self.rid}:in")
            )
        finished = asyncio.create_task(self._watch(tasks))
        done = False
        try:
            while True:
                item = await self.events.get()
                if item is None:
                    done = True
                    break
                if isinstance(item, BaseException):
                    done = True
                    raise item
                yield item
        finally:
            await self._wind_down(tasks, finished, clean=done)

    def open_streams(self) -> dict[str, ObjectRefGenerator]:
        """Each stage's output stream (a Ray streaming generator per stage, opened at once): a
        stage that takes the request alone gets it as its ``initial`` input (an entry stage: cut
        as its kind takes text); the others are fed. Direct: each stream gets its route."""
        gens: dict[str, ObjectRefGenerator] = {}
        to = {name: ref.key for name, ref in self.picks.items()}
        for s in self.stages:
            alone = list(s.inputs) == [REQUEST]
            if s.name == self.entry:
                # fed by the flow (_feed_entry), unless it takes the request (no feed call then)
                initial = self.entry_items(s) if alone else None
            else:
                initial = [self.item] if alone else None
            route = None
            if self.direct:
                route = StreamRoute(
                    to=to,
                    context=list((self.context or {}).get(s.name, [])),
                    request_item=self.item if self.entry is None else None,
                    tools=self.tools,
                    call_start=self.call_start,
                )
            gens[s.name] = (
                self.device(s.name)
                .actor.stream.options(
                    num_returns="streaming",
                    _generator_backpressure_num_objects=GENERATOR_BACKPRESSURE,
                )
                .remote(s.name, self.rid, initial, route)
            )
        return gens

    async def _feed_context(self) -> None:
        """Feed each named stage its context items, before the stages that produce for it have
        started their pumps; a failure cancels the request everywhere."""
        try:
            for name, items in (self.context or {}).items():
                for item in items:
                    await self.feed(self.plan.stage(name), self.rid, item)
        except BaseException:
            self.cancel_everywhere()
            raise

    async def _wind_down(
        self, tasks: list[asyncio.Task[Any]], finished: asyncio.Task[Any], clean: bool
    ) -> None:
        """Unless the request ended ``clean`` (its last event read) with every task done, its
        tasks and its work on every actor are cancelled; then its tasks are awaited."""
        if not clean or any(not t.done() for t in tasks):
            for t in tasks:
                t.cancel()
            self.cancel_everywhere()
        finished.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t

    def entry_items(self, s: StagePlan) -> list[Item]:
        """The request as the entry stage ``s`` takes it, the way its producer would feed it:
        text cut as its kind takes text (``graph.PipelineGraph.cut``) unless the request asks for
        it ``whole``, a recording whole."""
        if isinstance(self.request, TextRequest) and not self.request.whole:
            return list(self.rt.graph.cut(s.name, self.request.text, self.chunks_in))
        return [self.item]

    async def _feed_entry(self, s: StagePlan) -> None:
        """Feed an entry stage its request the way its producer would (``entry_items``), then
        the end."""
        for chunk in self.entry_items(s):
            await self.feed(s, self.rid, chunk)
        await self.call(s, "end_input", self.rid)

    async def _feed_joined(self, s: StagePlan, joiner: Joiner, item: Item | None) -> None:
        """Feed a fan-in stage its joined items, then its end (once every input has ended).
        A ``request`` input contributes the request's item as its one item."""
        if REQUEST in s.inputs:
            await joiner.put(REQUEST, item)
            await joiner.end(REQUEST)
        async for item in joiner.joined():
            await self.feed(s, self.rid, item)
        await self.call(s, "end_input", self.rid)

    async def _watch(self, tasks: list[asyncio.Task[Any]]) -> None:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            failed = [t for t in done if not t.cancelled() and t.exception() is not None]
            if failed:
                for t in pending:
                    t.cancel()
                self.events.put_nowait(failed[0].exception())
                return
        self.events.put_nowait(None)

    def cancel_everywhere(self) -> None:
        for dev in self.rt.devices.values():
            if not dev.dead:
                with contextlib.suppress(Exception):
                    dev.actor.cancel.remote(self.rid)

    async def _pump(
        self,
        s: StagePlan,
        gen: Any,
        t0: float,
        joiners: dict[str, Joiner],
        firsts: dict[str, FirstChunk],
    ) -> None:
        """Read one stage's outputs (a :class:`_StagePump`): emit its events, feed its consumers,
        then end their input and say the stage is done with its stats. ``firsts``: the
        first-audio trace of each sentence edge, filled by a producer's pump and read by its
        consumer's (``orchestrator.runtime.hop``)."""
        pump = _StagePump(
            self, s, self.rid, t0, self.events, self.chunks_in, joiners, firsts, direct=self.direct
        )
        try:
            await pump.read(gen)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            raise await self._failed(exc, s.name) from None
        await pump.end()
        end = time.perf_counter() - t0
        self.events.put_nowait(StageEvent(s.name, "done", self.rid, end, pump.done_stats(end)))

    async def _failed(self, exc: BaseException, stage: str) -> BaseException:
        """``exc`` as the stage's failure (``Runtime.map_failure``, which may wait for Ray's
        verdict on a node: in a thread)."""
        dev = self.device(stage)
        return await asyncio.to_thread(
            self.rt.map_failure, exc, stage, dev, f"serving request {self.rid}"
        )

    async def feed(self, c: StagePlan, rid: str, item: Item) -> None:
        self.driver_stats["feeds_sent"] += 1
        await self.call(c, "feed", rid, [item])

    async def call(self, c: StagePlan, method: str, rid: str, *args: Any) -> None:
        dev = self.device(c.name)
        try:
            await getattr(dev.actor, method).remote(c.name, rid, *args)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise await self._failed(exc, c.name) from None

    @staticmethod
    def event(s: StagePlan, payload: Item, rid: str, t: float, index: int) -> Event:
        if isinstance(payload, str):
            return TextDelta(s.name, payload, rid, t)
        if isinstance(payload, dict) and "audio" in payload:
            return AudioChunk(
                s.name,
                np.asarray(payload["audio"]),
                int(payload.get("sample_rate") or 0),
                index,
                rid,
                t,
            )
        return OutputItem(s.name, payload, rid, t)
