"""One stage's outputs for one request, read in the driver (``flow.RequestFlow``): emitted as
events. In the direct mode (``runtime.STREAMING == "direct"``) the stage's own actor hands its
outputs to its consumers, and the driver reads only ``("first", _)``, its final outputs and its
closing stats (which carry its edges, and what its input was handed: ``chunks_in``, the first
chunk). In the relay (``"relay"``) every output comes here and a ``router.Router`` run here
hands it on, its ``deliver`` the driver's ``feed`` (a fan-in consumer through its ``Joiner``).
``payload_bytes``, ``edge_counts`` live in ``router.py`` and are re-exported here."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, TypedDict

from orchestrator.core.plan import StagePlan
from orchestrator.runtime.events import Event, StageEvent
from orchestrator.runtime.hop import FirstChunk, first_chunk_hop
from orchestrator.runtime.joins import Joiner
from orchestrator.runtime.router import Route, Router, _count_item, edge_counts, payload_bytes
from orchestrator.runtime.stage_stats import NO_STAMPS, StageStats, Stamps
from stages.payloads import Item

if TYPE_CHECKING:
    from ray import ObjectRefGenerator

    from orchestrator.runtime.device_actor import StreamMessage

__all__ = ["_StagePump", "_count_item", "edge_counts", "payload_bytes"]


class _StagePump:
    """One stage's outputs for one request, as ``flow.RequestFlow`` reads them: its events, when
    each output arrived, and (relay) its router to the consumers. ``rt`` is the request's flow
    (typed Any: naming it here would make the two modules a cycle)."""

    def __init__(
        self,
        rt: Any,
        s: StagePlan,
        rid: str,
        t0: float,
        events: asyncio.Queue[Event | BaseException | None],
        chunks_in: dict[str, list[str]],
        joiners: dict[str, Joiner],
        firsts: dict[str, FirstChunk],
        *,
        direct: bool = False,
    ) -> None:
        self.rt, self.s, self.rid, self.t0, self.events = rt, s, rid, t0, events
        self.chunks_in, self.joiners, self.firsts = chunks_in, joiners, firsts
        picks = rt.picks  # the replicas serving the request
        self.pick = picks.get(s.name)
        """The replica of the stage serving the request (None: not balanced, a single instance)."""
        self.router = (
            None
            if direct
            else Router(
                rt.route_tables[s.name],
                self._deliver,
                chunks_in=chunks_in,
                firsts=firsts,
                at=picks[s.name].key if s.name in picks else None,
                to={name: ref.key for name, ref in picks.items()},
                tools=rt.tools,
                call_start=rt.call_start,
            )
        )
        self.arrived: list[float] = []  # when each output reached this process (time.perf_counter)
        self.first: float | None = None
        """Seconds from the request's start to the stage's first output reaching the driver."""
        self.first_arrived: float | None = None
        self.stats: dict[str, object] = {}
        self.stamps: Stamps = NO_STAMPS
        self.first_in: FirstChunk | None = None
        """The direct mode: the first chunk of this stage's input, as its actor kept it."""
        self.index = 0

    async def _deliver(
        self, r: Route, items: list[Item], end: bool, first: FirstChunk | None
    ) -> None:
        """The relay's hand-over: each item fed from here (a fan-in's through its joiner)."""
        c = self.rt.plan.stage(r.consumer)
        joiner = self.joiners.get(r.consumer) if r.join else None
        for item in items:
            if joiner is not None:
                await joiner.put(r.entry, item)
            else:
                await self.rt.feed(c, self.rid, item)
        if end:
            if joiner is not None:
                await joiner.end(r.entry)
            else:
                await self.rt.call(c, "end_input", self.rid)

    async def read(self, gen: ObjectRefGenerator) -> None:
        """Every output of the stage's stream (``DeviceActor.stream``'s messages), and its
        closing stats."""
        async for ref in gen:
            message: StreamMessage = await ref
            if message[0] == "stats":
                closing: StageStats = message[1]
                self.stamps, self.stats = closing.stamps, closing.figures
                self.first_in = closing.first
                continue
            if message[0] == "first":
                self._first_output(time.perf_counter())
                continue
            if message[0] == "outs":  # final outputs that came together (coalesce)
                for item in message[1]:
                    await self._output(item)
                continue
            await self._output(message[1])

    def _first_output(self, now: float) -> None:
        if self.first is None:
            self.first_arrived, self.first = now, now - self.t0
            self.events.put_nowait(StageEvent(self.s.name, "first_output", self.rid, self.first))

    async def _output(self, item: Item) -> None:
        s = self.s
        self.arrived.append(time.perf_counter())
        self.rt.driver_stats["items_read"] += 1
        self._first_output(self.arrived[-1])
        now = self.arrived[-1] - self.t0
        if self.router is None:  # the direct mode: a final output's payload
            self.events.put_nowait(self.rt.event(s, item, self.rid, now, self.index))
            self.index += 1
            return
        port, payload, final = self.router.take(item)
        if final:
            self.events.put_nowait(self.rt.event(s, payload, self.rid, now, self.index))
            self.index += 1
        await self.router.route(port, payload)

    async def end(self) -> None:
        """The stage is done: (relay) each route's text still held goes out, its consumers'
        input ends; in the direct mode its actor did that."""
        if self.router is not None:
            await self.router.finish(self.stamps.get("emitted") or [])

    def done_stats(self, end: float) -> dict[str, object]:
        s = self.s
        figures = dict(self.stats)
        # the direct mode: what the stage's actor counted (its edges, the sentences it was fed)
        fed = figures.pop("chunks_in", None)
        edges = figures.pop("edges_out", {})
        join = figures.pop("join", None)
        replica = self.pick if self.pick is not None and self.pick.of > 1 else None
        stats: dict[str, object] = {
            **figures,
            # a stage with replicas: the one that served the request, and its device
            **({"holder": replica.holder} if replica is not None else {}),
            "device": replica.device if replica is not None else s.device,
            "backend": s.backend,
            "time_to_first_output_s": _r(self.first),
            "done_s": _r(end),
            "chunks_in": [*self.chunks_in.get(s.name, []), *(fed if isinstance(fed, list) else [])],
            "edges_out": edges if self.router is None else self.router.edges_out(),
        }
        first = self.firsts.get(s.name) if self.router is not None else self.first_in
        if first is not None and self.first_arrived is not None:
            hop = first_chunk_hop(first, self.stamps, self.first_arrived, self.t0)
            if hop is not None:
                stats["first_chunk_hop"] = hop
        if s.name in self.joiners:
            stats["join"] = self.joiners[s.name].stats()
        elif join is not None:
            stats["join"] = join
        stats["throughput"] = _throughput(stats)
        supervisor = getattr(self.rt.rt, "supervisor", None)
        served = (
            supervisor.served_by(self.pick.holder if self.pick else s.name) if supervisor else None
        )
        if served:  # the stage's actor was restarted, or the stage moved, before this request
            stats["restarted"] = served
        return stats


class Throughput(TypedDict):
    """A stage's throughput in a request's stats: decode tokens, seconds of audio or items per
    second of its work."""

    value: float
    unit: str


def _throughput(stats: dict[str, object]) -> Throughput | None:
    def figure(key: str) -> float:
        value = stats.get(key)
        return float(value) if isinstance(value, int | float) else 0.0

    rate = stats.get("decode_tokens_per_s")
    if isinstance(rate, int | float) and rate:
        return Throughput(value=rate, unit="tok/s")
    if figure("audio_s") and figure("duration_s"):
        busy = figure("busy_s") or figure("duration_s")
        return Throughput(value=round(figure("audio_s") / busy, 2), unit="audio s/s")
    if figure("items") and figure("duration_s"):
        return Throughput(value=round(figure("items") / figure("duration_s"), 2), unit="items/s")
    return None


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)
