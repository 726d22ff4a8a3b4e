"""One stage's outputs for one request, handed on to its consumers: each item's port resolved,
its text cut into sentences for a consumer that takes them, the first chunk's hop traced
(``hop.py``), and the items and bytes handed to each consumer counted (``edge_counts``: what
crosses between nodes when two stages are on different ones, docs/cluster.md).

A :class:`RouteTable` is built once per stage by the driver (``Runtime.route_table``) and
pickles across Ray; a :class:`Router` runs it for one request wherever the producer's outputs
are read: in the producer's own device actor (``runtime.STREAMING == "direct"``: items go
producer → consumer, ``DeviceActor.stream``), or in the driver (``"relay"``: ``pump.py``).
Its ``deliver`` callable is what hands items over: a ``feed`` on the consumer's actor (or a
local call when the consumer is in the same actor), or the driver's ``Runtime._feed``."""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.core.errors import StageFailed
from orchestrator.runtime.hop import EdgeTrace, FirstChunk, same_clock
from stages.ar_decode.tool_grammar import CALL_OPEN, call_start, family
from stages.payloads import untag
from stages.text_chunks import SentenceChunker, WholeText


def tool_call_start(tool_call: Mapping[str, object] | None) -> str:
    """The first character of a call under a request's ``tool_call`` (its tool syntax's:
    ``tool_grammar.call_start``; ChatML's when it names none)."""
    return call_start(family(tool_call or {}))


@dataclass(frozen=True)
class Route:
    """One input of a consumer that names the producer."""

    consumer: str
    device: str
    entry: str
    """The consumer's input as its config names it (``thinker``, ``thinker.text``)."""
    ports: frozenset[str] | None
    """The producer's ports this input takes (None: every item)."""
    sentences: bool
    """The consumer takes text cut into sentences (its kind's ``text_input``)."""
    first_chunk_chars: int | None
    """The consumer's ``first_chunk_chars`` (a first chunk cut early), when it has one."""
    join: bool
    """The consumer is a fan-in: its items go through its ``Joiner``."""
    trace: bool
    """The first chunk's hop may be traced (a sentence edge, no join); it is traced for a
    request when the producer and the consumer's replica picked for it share a clock
    (``hop.same_clock`` on their actor keys, ``Router``)."""


@dataclass(frozen=True)
class RouteTable:
    """A producer's routes and what decides which of its items are final outputs."""

    producer: str
    device: str
    port_names: tuple[str, ...]
    final_output: bool
    final_ports: frozenset[str] | None
    """The ports whose items are final outputs (their types match ``final_output_type``);
    None: every item."""
    routes: tuple[Route, ...]

    def item_port(self, item: Any) -> tuple[str | None, Any]:
        """``(port, payload)`` of an item the producer yielded: a tagged item's port
        (``stages.payloads.on_port``; one the stage does not have fails it), else the stage's
        only port, else ``text`` for a ``str``."""
        port, payload = untag(item)
        names = self.port_names
        if port is not None:
            if port not in names:
                raise StageFailed(
                    self.producer,
                    self.device,
                    f"it yielded an item on output port {port!r}, and its "
                    f"ports are {', '.join(names) or 'none'}",
                )
            return port, payload
        if len(names) == 1:
            return names[0], payload
        return ("text" if isinstance(payload, str) and "text" in names else None), payload

    def is_final(self, port: str | None) -> bool:
        """Whether an item on ``port`` is one of the request's final outputs."""
        return self.final_output and (
            self.final_ports is None or port is None or port in self.final_ports
        )


Deliver = Callable[[Route, list[Any], bool, "FirstChunk | None"], Awaitable[None]]
"""``deliver(route, items, end, first)``: hand ``items`` to the route's consumer (in order), then,
when ``end``, end that input; ``first``: the edge's first chunk, once, with the items that carry it."""


class Router:
    """One producer's outputs for one request (see the module docstring). ``take`` each output
    (its port and payload, whether it is final), then ``route`` it; ``finish`` at the end.
    ``chunks_in`` and ``firsts`` (consumer → its sentences, its first chunk), when given, are
    filled as the relay's driver keeps them; ``emitted``: when each output left the runner (in
    the producer's actor), so a first chunk carries its token's stamp as it is released.
    ``at``: the producer's actor key for this request, and ``to``: each consumer's (the
    replicas picked for it; else the table's devices): a route's hop is traced only when the
    two share a clock (one machine or one node), whichever replicas serve the request.
    ``tools``: the request decodes under a tool grammar (its sampling's ``tool_call``), whose
    reply is a call exactly when its first character is ``call_start`` (:data:`CALL_OPEN`'s in
    ChatML's tool syntax; :func:`tool_call_start` of the request's ``tool_call``): a call is never
    cut into sentences (a voice does not read it aloud), while text is, from its first piece on
    (the first piece decides, so nothing is held back)."""

    def __init__(
        self,
        table: RouteTable,
        deliver: Deliver,
        *,
        chunks_in: dict[str, list[str]] | None = None,
        firsts: dict[str, FirstChunk] | None = None,
        emitted: list[float] | None = None,
        at: str | None = None,
        to: Mapping[str, str] | None = None,
        tools: bool = False,
        call_start: str = CALL_OPEN[0],
    ) -> None:
        self.table, self.deliver, self.call_start = table, deliver, call_start
        self.call: bool | None = None if tools else False
        """Whether the producer's text is a tool call (None: not known before its first piece)."""
        self.chunks_in, self.emitted = chunks_in, emitted
        self.firsts: dict[str, FirstChunk] = {} if firsts is None else firsts
        self.sent: dict[str, list[int]] = {}
        """Consumer → [items, bytes] this request (``edge_counts``)."""
        self.chunkers = {
            (r.consumer, r.entry): SentenceChunker(first_max_chars=r.first_chunk_chars)
            if r.sentences
            else WholeText()
            for r in table.routes
        }
        here, there = at or table.device, to or {}
        self.traces = {
            r.consumer: EdgeTrace(table.producer)
            for r in table.routes
            if r.trace and same_clock(here, there.get(r.consumer, r.device))
        }
        self.arrived: list[float] = []
        """When each output reached the router (``time.perf_counter``)."""

    def take(self, item: Any) -> tuple[str | None, Any, bool]:
        """An output arrived: ``(port, payload, final)``."""
        self.arrived.append(time.perf_counter())
        port, payload = self.table.item_port(item)
        return port, payload, self.table.is_final(port)

    async def route(self, port: str | None, payload: Any) -> None:
        """Hand one output on to every input that takes its port (text as each one takes it);
        a tool call's text goes to no input that takes sentences."""
        if self.call is None and isinstance(payload, str) and payload:
            self.call = payload.startswith(self.call_start)
        for r in self.table.routes:
            if r.ports is not None and port not in r.ports and (port is not None or "." in r.entry):
                continue  # not a port this input takes (a plain input takes an item of unknown port)
            if not isinstance(payload, str):
                await self._give(r, [payload])
                continue
            if r.sentences and self.call:
                continue  # a call's JSON is no speech: its consumer gets none of it
            chunker = self.chunkers[(r.consumer, r.entry)]
            trace = self.traces.get(r.consumer)
            if trace is not None and trace.open:
                trace.fed(len(self.arrived) - 1, payload)
            cut = chunker.feed(payload)
            first = None
            if cut and trace is not None and trace.open:
                first = self._released(r, trace.released(chunker.pending_chars, self.arrived))
            await self._give(r, cut, first=first)

    async def finish(self, emitted: list[float] | None = None) -> None:
        """The stage is done: each route's text still held goes out, its input ends.
        ``emitted``: the producer's stamps, when they came only now (the relay)."""
        for r in self.table.routes:
            chunks: list[str] = (
                []  # an input of a non-text port (thinker.hidden_states) gets no text
                if r.ports is not None and "text" not in r.ports
                else self.chunkers[(r.consumer, r.entry)].flush()
            )
            trace = self.traces.get(r.consumer)
            first = None
            if chunks and trace is not None and trace.open:
                first = self._released(r, trace.released(0, self.arrived, at_end=True))
            known = self.firsts.get(r.consumer)
            if (
                emitted is not None
                and known is not None
                and known.producer == self.table.producer
                and len(emitted) == len(self.arrived)
            ):
                known.token_emitted = emitted[known.token_index]
            await self._give(r, chunks, first=first, end=True)

    def edges_out(self) -> dict[str, dict[str, int]]:
        return edge_counts(self.sent)

    def _released(self, r: Route, first: FirstChunk) -> FirstChunk:
        if self.emitted is not None and first.token_index < len(self.emitted):
            first.token_emitted = self.emitted[first.token_index]
        self.firsts[r.consumer] = first
        return first

    async def _give(
        self, r: Route, items: list[Any], *, first: FirstChunk | None = None, end: bool = False
    ) -> None:
        for item in items:
            _count_item(self.sent, r.consumer, item)
            if r.sentences and self.chunks_in is not None:
                self.chunks_in.setdefault(r.consumer, []).append(item)
        if items or end:
            await self.deliver(r, items, end, first)


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
