"""One stage's outputs for one request, read in the driver (``Runtime._pump``): emitted as
events, cut into sentences for a consumer that takes them, fed to the consumers (a fan-in
consumer through its ``Joiner``), the first chunk's hop traced (``hop.py``), and the items and
bytes handed to each consumer counted (``edge_counts``: what crosses between nodes when two
stages are on different ones, docs/cluster.md)."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from orchestrator.plan import StagePlan
from orchestrator.runtime.device_actor import NO_STAMPS, StageStats, Stamps
from orchestrator.runtime.events import StageEvent
from orchestrator.runtime.hop import EdgeTrace, FirstChunk, first_chunk_hop, same_clock
from orchestrator.runtime.joins import Joiner
from stages.text_chunks import WholeText


def payload_bytes(item: Any) -> int:
    """What a payload weighs when it goes from one stage to another, estimated without
    pickling: text as UTF-8, bytes as they are, an array (numpy, torch) its ``nbytes``,
    a number 8, a dict its keys and values, a list or tuple its items; anything else
    ``sys.getsizeof``. Ray's own framing (tens of bytes per object) is not counted."""
    if isinstance(item, str):
        return len(item) if item.isascii() else len(item.encode("utf-8", "surrogatepass"))
    if isinstance(item, (bytes, bytearray)):
        return len(item)
    nbytes = getattr(item, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(item, dict):
        return sum(payload_bytes(k) + payload_bytes(v) for k, v in item.items())
    if isinstance(item, (list, tuple)):
        return sum(payload_bytes(v) for v in item)
    if item is None or isinstance(item, bool):
        return 1
    if isinstance(item, (int, float)):
        return 8
    return sys.getsizeof(item)


class _StagePump:
    """One stage's outputs for one request, as ``Runtime._pump`` reads them: the routes to its
    consumers (each consumer input naming the stage, with the ports it takes), a chunker per
    route (sentences for a consumer that takes them), the first-chunk traces of sentence edges,
    the items and bytes handed to each consumer (``edge_counts``), and when each output arrived.
    ``rt`` is the ``Runtime`` (typed Any: naming it here would make the two modules a cycle)."""

    def __init__(
        self,
        rt: Any,
        s: StagePlan,
        rid: str,
        t0: float,
        events: asyncio.Queue[Any],
        chunks_in: dict[str, list[str]],
        joiners: dict[str, Joiner],
        firsts: dict[str, FirstChunk],
    ) -> None:
        self.rt, self.s, self.rid, self.t0, self.events = rt, s, rid, t0, events
        self.chunks_in, self.joiners, self.firsts = chunks_in, joiners, firsts
        self.sent: dict[
            str, list[int]
        ] = {}  # consumer -> [items, bytes] this request (``edge_counts``)
        self.routes = [
            (rt.plan.stage(c), entry, ports) for c, entry, ports in rt.routes_out[s.name]
        ]
        self.sentences = {
            c.name for c, _, _ in self.routes if rt.kinds[c.name].text_input == "sentences"
        }
        self.chunkers = {
            (c.name, entry): rt._sentence_chunker(c.name)
            if c.name in self.sentences
            else WholeText()
            for c, entry, _ in self.routes
        }
        self.final_kinds = None if s.final_output_type is None else {s.final_output_type}
        self.traces = {
            c.name: EdgeTrace(s.name)
            for c, _, _ in self.routes
            if c.name in self.sentences and c.name not in joiners and same_clock(s.device, c.device)
        }
        self.arrived: list[float] = []  # when each output reached this process (time.perf_counter)
        self.first: float | None = None
        self.stats: dict[str, Any] = {}
        self.stamps: Stamps = NO_STAMPS
        self.index = 0

    async def give(self, c: StagePlan, entry: str, item: Any) -> None:
        _count_item(self.sent, c.name, item)
        if c.name in self.joiners:
            await self.joiners[c.name].put(entry, item)
        else:
            await self.rt._feed(c, self.rid, item)

    async def read(self, gen: Any) -> None:
        """Every output of the stage's stream, and its closing stats."""
        async for ref in gen:
            kind, item = await ref
            if kind == "stats":
                closing: StageStats = item
                self.stamps, self.stats = closing.stamps, closing.figures
                continue
            await self._output(item)

    async def _output(self, item: Any) -> None:
        s, rt = self.s, self.rt
        self.arrived.append(time.perf_counter())
        port, payload = rt._item_port(s, item)
        now = self.arrived[-1] - self.t0
        if self.first is None:
            self.first = now
            self.events.put_nowait(StageEvent(s.name, "first_output", self.rid, now))
        if s.final_output and (
            self.final_kinds is None
            or port is None
            or any(t.kind in self.final_kinds for t in rt.stage_ports[s.name].port(port))
        ):
            self.events.put_nowait(rt._event(s, payload, self.rid, now, self.index))
            self.index += 1
        for c, entry, ports in self.routes:
            if ports is not None and port not in ports and (port is not None or "." in entry):
                continue  # not a port this input takes (a plain input takes an item of unknown port)
            if not isinstance(payload, str):
                await self.give(c, entry, payload)
                continue
            chunker = self.chunkers[(c.name, entry)]
            trace = self.traces.get(c.name)
            if trace is not None and trace.open:
                trace.fed(len(self.arrived) - 1, payload)
            cut = chunker.feed(payload)
            if cut and trace is not None and trace.open:
                self.firsts[c.name] = trace.released(chunker.pending_chars, self.arrived)
            for chunk in cut:
                if c.name in self.sentences:
                    self.chunks_in[c.name].append(chunk)
                await self.give(c, entry, chunk)

    async def end(self) -> None:
        """The stage is done: each route's text still held goes out, its consumers' input ends."""
        emitted = self.stamps.get("emitted") or []
        for c, entry, ports in self.routes:
            if ports is not None and "text" not in ports:
                chunks: list[
                    str
                ] = []  # an input of a non-text port (thinker.hidden_states) gets no text
            else:
                chunks = self.chunkers[(c.name, entry)].flush()
            trace = self.traces.get(c.name)
            if chunks and trace is not None and trace.open:
                self.firsts[c.name] = trace.released(0, self.arrived, at_end=True)
            first = self.firsts.get(c.name)
            if (
                first is not None
                and first.producer == self.s.name
                and len(emitted) == len(self.arrived)
            ):
                first.token_emitted = emitted[first.token_index]
            for chunk in chunks:
                if c.name in self.sentences:
                    self.chunks_in[c.name].append(chunk)
                await self.give(c, entry, chunk)
            if c.name in self.joiners:
                await self.joiners[c.name].end(entry)
        for name in dict.fromkeys(c.name for c, _, _ in self.routes):
            if name not in self.joiners:
                await self.rt._call(self.rt.plan.stage(name), "end_input", self.rid)

    def done_stats(self, end: float) -> dict[str, Any]:
        s = self.s
        stats = {
            **self.stats,
            "device": s.device,
            "backend": s.backend,
            "time_to_first_output_s": _r(self.first),
            "done_s": _r(end),
            "chunks_in": self.chunks_in.get(s.name, []),
            "edges_out": edge_counts(self.sent),
        }
        if s.name in self.firsts and self.arrived:
            hop = first_chunk_hop(self.firsts[s.name], self.stamps, self.arrived[0], self.t0)
            if hop is not None:
                stats["first_chunk_hop"] = hop
        if s.name in self.joiners:
            stats["join"] = self.joiners[s.name].stats()
        stats["throughput"] = _throughput(stats)
        return stats


def _count_item(sent: dict[str, list[int]], consumer: str, item: Any) -> None:
    """One more item, and its bytes, on the edge to ``consumer``."""
    count = sent.setdefault(consumer, [0, 0])
    count[0] += 1
    count[1] += payload_bytes(item)


def edge_counts(sent: dict[str, list[int]]) -> dict[str, dict[str, int]]:
    """A producer's edges for one request, as its ``done`` stats carry them (``edges_out``):
    consumer → ``{"items", "bytes"}`` — what the runtime handed that consumer (after
    cutting text into sentences), which is what crosses the network when the two stages
    are on different nodes (docs/cluster.md, "What crosses between nodes")."""
    return {c: {"items": n, "bytes": b} for c, (n, b) in sent.items()}


def _throughput(stats: dict[str, Any]) -> dict[str, Any] | None:
    if stats.get("decode_tokens_per_s"):
        return {"value": stats["decode_tokens_per_s"], "unit": "tok/s"}
    if stats.get("audio_s") and stats.get("duration_s"):
        busy = stats.get("busy_s") or stats["duration_s"]
        return {"value": round(stats["audio_s"] / busy, 2), "unit": "audio s/s"}
    if stats.get("items") and stats.get("duration_s"):
        return {"value": round(stats["items"] / stats["duration_s"], 2), "unit": "items/s"}
    return None


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)
