"""The device actor: one per device, hosting the stages placed on that device.

:class:`DeviceActor` is an asyncio Ray actor. Its lifecycle, driven by the
runtime (``orchestrator.runtime.runtime.Runtime``):

1. ``ready()`` right after creation (Ray reports a constructor that raised
   only at the first call, so the runtime calls this at once).
2. ``load_stage(...)`` once per stage: ``admit`` on the ledger actor (all of
   the plan's reservations or nothing; skipped when the runtime had them
   admitted with others, ``admitted=True``), the kind's runner created and
   ``load()``-ed in a worker thread, the ``load`` reservations released, the
   measured peak reported. A failure releases everything the stage held — the
   ledger is as before — and raises. Several loads may run at once (each in
   its own thread; the runtime does so only for stages the ledger admitted
   together); the imports they make, whatever they import, run one at a time
   (``orchestrator.runtime.load_imports``). A load that overlapped another in this actor, by a runner that
   does not measure itself, is measured over the processes its load started
   (an ONNX Runtime route worker), since the actor's own process grew for the
   other load too. A figure that grew this process while another load that
   grew it too ran beside it (a runner measuring its own process, or one that
   started no process) is an upper bound: it says so (``upper_bound``), is
   not judged against the budget (``within_budget`` null, with the reason)
   and never calibrates a plan.
3. Per request and stage, ``stream(stage, request_id, initial, route)`` is a
   Ray streaming generator (``num_returns="streaming"``) of ``("out", item)``
   tuples, then one ``("stats", StageStats)``. Its input is ``initial`` (the
   request) or the items sent with ``feed`` and closed with ``end_input`` — a
   bounded queue per request, so a slow stage holds its producer back. With a
   ``route`` (the direct mode, after ``connect``), its outputs go through a
   ``router.Router`` here that feeds the consumers' actors itself, and only
   ``("first", None)`` and final outputs go to the driver.
4. ``close()`` closes every stage (last loaded first) and releases its
   reservations.

Errors leave this actor as ``orchestrator.core.errors.StageFailed`` (stage,
device, cause), which pickles with its three fields; Ray delivers it as the
cause of a ``RayTaskError``.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from orchestrator.core.errors import ConfigError, LedgerLost, PeerLost, StageFailed
from orchestrator.core.memory import RssMeter, descendants, rss_of
from orchestrator.core.plan import StagePlan
from orchestrator.runtime.hop import FirstChunk
from orchestrator.runtime.joins import Joiner, JoinSpec
from orchestrator.runtime.load_imports import call_loading
from orchestrator.runtime.router import Route, Router, RouteTable

if TYPE_CHECKING:
    from stages.base import StageRunner

log = logging.getLogger(__name__)

ENDED_MEMORY = 4096
"""How many finished (stage, request) inputs are remembered, so that a late
``feed`` for a request that already ended is dropped rather than queued forever."""
INPUT_QUEUE_ITEMS = 4
"""Items waiting for a stage per request: a TTS stage that is 4 sentences behind
holds the decode stage's chunks back (backpressure) instead of buffering them."""
_END = ("__end__",)


class Stamps(TypedDict):
    """Absolute stamps on the device's monotonic clock (``time.perf_counter``), for the
    runtime's first-audio trace (``hop.first_chunk_hop``); they never reach a record."""

    emitted: list[float]
    """When each output left the runner."""
    first_fed: float | None
    """When the request's first input was handed to this stage (None: it took ``initial``)."""
    first_taken: float | None
    """When the runner first took an input (None: never)."""
    runner: Any
    """The runner's own ``stamps`` entry of ``request_stats``, as it gave it."""


NO_STAMPS: Stamps = {"emitted": [], "first_fed": None, "first_taken": None, "runner": None}
"""What the runtime holds before a stage's stream has closed."""


@dataclass(frozen=True)
class StageStats:
    """The closing message of a stage's stream, ``("stats", StageStats)``: the figures of
    one request on this stage (``items``, ``first_output_s``, ``duration_s``, ``busy_s``,
    then ``chars``, ``item_latency_s``, ``audio_s``, ``real_time_factor`` where they apply,
    then the runner's ``request_stats``) and the stamps kept apart from them. Sent by
    :meth:`DeviceActor.stream`, read by ``pump._StagePump.read``; it pickles across Ray."""

    figures: dict[str, Any]
    stamps: Stamps
    first: FirstChunk | None = None
    """The direct mode: the first chunk of this stage's sentence input, as its producer's
    router released it (``feed(first=...)``), for the first-audio trace."""


@dataclass
class _Hosted:
    plan: StagePlan
    runner: StageRunner
    load_s: float
    load_info: dict[str, Any]
    tree_load_peak: int
    tree_resident: int
    request_meter: RssMeter | None = None
    """For runners that do not measure themselves: the processes the load started
    (a route worker), else this actor's process, sampled while requests run."""
    tree_request_growth: int = 0
    load_note: str = ""
    """Set when the load overlapped another in this actor: how it was measured then."""
    overlapped_with: set[str] = field(default_factory=set)
    """The stages whose loads ran in this actor while this one loaded."""
    holder: str = ""
    """Its ledger holder: the stage's name, or ``voice#1`` for a replica of a stage with
    ``replicas: N`` > 1 (each replica runs in its own actor, so the stage's name is unique here)."""
    in_process: bool = True
    """Whether the load grew this actor's own process (False: it ran in processes it started)."""
    busy: int = 0
    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    measured: dict[str, Any] = field(default_factory=dict)


class DeviceActor:
    """Hosts the stages placed on one device (see the module docstring)."""

    def __init__(self, device: str, ledger: Any, key: str | None = None) -> None:
        self.device = device
        self.key = key or device
        """This actor's key among its peers: the device id, or ``device#k`` for the k-th extra
        replica of a stage on that device (its own process)."""
        self.ledger = ledger
        self.stages: dict[str, _Hosted] = {}
        self.order: list[str] = []
        self.inputs: dict[tuple[str, str], asyncio.Queue[Any]] = {}
        self.ended: dict[tuple[str, str], None] = {}
        self.first_fed: dict[tuple[str, str], float] = {}
        """(stage, request) → when its first fed item reached this actor (``time.perf_counter``),
        for the first-audio trace (``stamps`` in a stream's figures)."""
        self.tasks: dict[str, set[asyncio.Task[Any]]] = {}
        """Request → its ``stream``, ``feed`` and join tasks here: what ``cancel`` ends."""
        self.peers: dict[str, Any] = {}
        """The direct mode (``connect``): actor key → every device actor's handle."""
        self.tables: dict[str, RouteTable] = {}
        self.join_specs: dict[str, JoinSpec] = {}
        self.sentence_stages: set[str] = set()
        self.context: dict[tuple[str, str], list[Any]] = {}
        self.chunks_in: dict[tuple[str, str], list[str]] = {}
        self.firsts_in: dict[tuple[str, str], FirstChunk] = {}
        self.joiners: dict[tuple[str, str], Joiner] = {}
        self._loading: dict[str, set[str]] = {}
        """Loads in flight: stage -> the other loads that ran beside it."""
        self._importing = asyncio.Lock()
        """Held while a stage's ``runner_imports`` are imported: one stage at a time."""
        self.ledger_error: str | None = None
        """Set when a report or release to the ledger actor failed (it died): closing
        goes on without it, and ``close`` then raises ``LedgerLost``."""

    async def _tell_ledger(self, method: str, *args: Any) -> Any:
        """A report or release that must not stop a close: a dead ledger is noted
        (``ledger_error``), not raised here."""
        try:
            return await getattr(self.ledger, method).remote(*args)
        except Exception as exc:
            head = next((line for line in str(exc).splitlines() if line.strip()), "")[:300]
            self.ledger_error = self.ledger_error or f"{type(exc).__name__}: {head}"
            log.warning(
                "the ledger actor did not take %s(%s): %s",
                method,
                args[0] if args else "",
                self.ledger_error,
            )
            return None

    async def ready(self) -> dict[str, Any]:
        import ray

        return {
            "device": self.device,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "rss_bytes": rss_of(os.getpid()),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        }

    # -- loading ---------------------------------------------------------------
    async def load_stage(
        self,
        plan_doc: dict[str, Any],
        stage_config: Any,
        kind: Any,
        route: Any = None,
        admitted: bool = False,
        holder: str | None = None,
    ) -> dict[str, Any]:
        plan = StagePlan.from_dict(plan_doc)
        name = plan.name
        holder = holder or name
        if not admitted:
            await self._admit(plan, holder)
        before = set(descendants(os.getpid()))
        meter = _LoadMeter(before)
        meter.start()
        overlapped = self._begin_load(name)
        runner, load_s = await self._make_and_load(plan, stage_config, kind, route, meter, holder)
        meter.stop()
        overlapped_with = self._loading.pop(name, set())
        overlapped = bool(overlapped_with) or overlapped
        hosted = _Hosted(
            plan,
            runner,
            load_s,
            _summarize(runner.load_info),
            meter.peak_growth,
            meter.growth,
            overlapped_with=set(overlapped_with),
            holder=holder,
        )
        if runner.measured_peak_bytes() is None:
            _meter_requests(hosted, meter, before, overlapped)
        else:
            hosted.in_process = bool(hosted.load_info.get("in_process", True))
        self.stages[name] = hosted
        self.order.append(name)
        await self.ledger.release.remote(holder, "load")
        hosted.measured = self._measure(hosted)
        await self.ledger.report.remote(holder, hosted.measured)
        return {
            "stage": name,
            "holder": holder,
            "device": self.device,
            "load_s": round(load_s, 3),
            "overlapped": overlapped,
            "load_info": hosted.load_info,
            "measured": hosted.measured,
        }

    async def _admit(self, plan: StagePlan, holder: str) -> None:
        """All of the plan's reservations from the ledger, or ``StageFailed`` naming the shortfall."""
        admission = await self.ledger.admit.remote(holder, [r.to_dict() for r in plan.reservations])
        if not admission["ok"]:
            raise StageFailed(plan.name, self.device, refusal(admission["shortfalls"][0]))

    async def _make_and_load(
        self,
        plan: StagePlan,
        stage_config: Any,
        kind: Any,
        route: Any,
        meter: _LoadMeter,
        holder: str,
    ) -> tuple[StageRunner, float]:
        """The kind's runner, made and ``load()``-ed in worker threads, and the seconds its load
        took. A failure stops ``meter``, releases everything the stage held (the ledger is as
        before, and the load counts in no other load's figure) and raises ``StageFailed``."""
        name = plan.name
        runner = None
        try:
            await self._import_first(kind)
            params = inspect.signature(kind.runner).parameters

            def make() -> Any:
                return (
                    kind.runner(plan, stage_config, route=route)
                    if "route" in params
                    else kind.runner(plan, stage_config)
                )

            # the runner is made and loaded as a load: whatever either imports, the imports of
            # the loads running beside it never interleave with them (load_imports)
            runner = await asyncio.to_thread(call_loading, make)
            t0 = time.perf_counter()
            await asyncio.to_thread(call_loading, runner.load)
            return runner, time.perf_counter() - t0
        except BaseException as exc:
            meter.stop()
            self._loading.pop(name, None)
            for others in self._loading.values():
                others.discard(name)  # a failed load holds nothing: it counts in no one's figure
            if runner is not None:
                try:
                    await asyncio.to_thread(runner.close)
                except Exception:
                    log.debug("close after a failed load raised", exc_info=True)
            await self.ledger.release.remote(holder)
            cause = exc.cause if isinstance(exc, StageFailed) else f"{type(exc).__name__}: {exc}"
            raise StageFailed(name, self.device, f"load failed: {cause}") from None

    async def _import_first(self, kind: Any) -> None:
        """Import the kind's ``runner_imports`` not imported yet, one stage at a time."""
        async with self._importing:
            missing = [m for m in getattr(kind, "runner_imports", ()) if m not in sys.modules]
            if missing:
                await asyncio.to_thread(
                    call_loading, lambda: [importlib.import_module(m) for m in missing]
                )

    def _begin_load(self, name: str) -> bool:
        """Note a load in flight; every load running now (this one too) overlapped
        the others. Returns whether this one did so far."""
        self._loading[name] = set()
        for other, others in self._loading.items():
            if other != name:
                others.add(name)
                self._loading[name].add(other)
        return bool(self._loading[name])

    def _upper_bound(self, h: _Hosted) -> str | None:
        """Why ``h``'s figure is only an upper bound, or None: its load grew this process while
        another load that also grew this process ran beside it (a load measured over the
        processes it started, or beside loads that ran in theirs, is its own)."""
        if not h.in_process or not h.overlapped_with:
            return None
        in_process = [
            o
            for o in sorted(h.overlapped_with)
            if o not in self.stages or self.stages[o].in_process
        ]
        if not in_process:
            return None
        return (
            f"{', '.join(in_process)} loaded in this process at the same time and is counted too: "
            "an upper bound"
        )

    def _measure(self, h: _Hosted) -> dict[str, Any]:
        own = h.runner.measured_peak_bytes()
        load: int | None
        steady: int | None
        if own is not None:
            peak, method = int(own), f"{type(h.runner).__name__}.measured_peak_bytes()"
            lp, rg = (
                h.load_info.get("load_peak_growth_bytes"),
                h.load_info.get("resident_growth_bytes"),
            )
            load = min(int(lp), peak) if isinstance(lp, int) else None
            steady = peak if load is not None and peak > load else None
            resident = min(int(rg), peak) if isinstance(rg, int) else None
        else:
            growth = h.tree_request_growth
            if h.busy and h.request_meter is not None:
                growth = max(growth, h.request_meter.window_growth)
            if not h.in_process and h.request_meter is not None:
                # processes of its own (a route worker): all they hold is this stage's, so their
                # highest RSS since the load counts, memory kept between requests included
                growth = max(growth, h.request_meter.peak_growth)
            load, steady = h.tree_load_peak, h.tree_resident + growth
            peak = max(load, steady)
            resident = min(h.tree_resident, peak)
            method = (
                "RSS growth of the device actor's process tree: max(peak during load, resident after "
                "load + the highest RSS above it while this stage had requests in flight, sampled every "
                "10 ms in the processes its load started (memory they kept between requests counts), "
                "else the largest rise of one busy period in the actor's own process)"
            )
        bound = self._upper_bound(h)
        for note in (h.load_note, bound):
            if note:
                method += f"; {note}"
        budget = h.plan.budget_bytes()
        judged: dict[str, Any] = {"within_budget": peak <= budget}
        if bound and peak > budget:
            # not this stage's peak: another load in this process is in the figure (a bound
            # within the budget still shows the stage within it)
            judged = {"within_budget": None, "within_budget_reason": f"not judged: {bound}"}
        return {
            "measured_peak_bytes": peak,
            "load_peak_bytes": load,
            "steady_peak_bytes": steady,
            "resident_bytes": resident,
            "upper_bound": bound is not None,
            "budget_bytes": budget,
            "budget_over_measured": round(budget / peak, 3) if peak else None,
            **judged,
            "evidence": "M",
            "method": method,
            "where": f"{socket.gethostname()}:{self.device} pid {os.getpid()}",
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "requests": h.requests,
            "max_in_flight": h.max_in_flight,
            # a worker the runtime recycles at a limit: what calibration budgets it from
            "worker": _worker_stats(h.runner),
        }

    async def measure(self, stage: str) -> dict[str, Any]:
        h = self._hosted(stage)
        h.measured = self._measure(h)
        await self._tell_ledger("report", h.holder, h.measured)
        return h.measured

    # -- requests ----------------------------------------------------------------
    def _hosted(self, stage: str) -> _Hosted:
        h = self.stages.get(stage)
        if h is None:
            raise StageFailed(stage, self.device, "the stage is not loaded on this device actor")
        return h

    def _queue(self, stage: str, request_id: str) -> asyncio.Queue[Any]:
        key = (stage, request_id)
        q = self.inputs.get(key)
        if q is None:
            q = self.inputs[key] = asyncio.Queue(maxsize=INPUT_QUEUE_ITEMS)
        return q

    # -- the direct mode: items go producer → consumer -------------------------------
    async def connect(
        self,
        peers: Mapping[str, Any],
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
        items: list[Any],
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
            await self._feed_items(stage, request_id, items, entry, first)
        finally:
            if task is not None:
                self._forget_task(request_id, task)

    async def _feed_items(
        self,
        stage: str,
        request_id: str,
        items: list[Any],
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
            joiner = self._joiner(stage, request_id)
            for item in items:
                await joiner.put(entry, item)
            return
        for item in items:
            self.first_fed.setdefault(key, time.perf_counter())
            await self._queue(stage, request_id).put(item)

    async def end_input(self, stage: str, request_id: str, entry: str | None = None) -> None:
        """``stage``'s input for the request has ended (a fan-in's: its input ``entry`` has)."""
        if entry is not None and stage in self.join_specs:
            if (stage, request_id) not in self.ended:
                await self._joiner(stage, request_id).end(entry)
            return
        if (stage, request_id) not in self.ended:
            await self._queue(stage, request_id).put(_END)

    def _joiner(self, stage: str, request_id: str) -> Joiner:
        """The fan-in's ``Joiner`` for the request, and the task that feeds its joined items
        into the stage's input, then ends it (a task of the request: ``cancel`` ends it)."""
        key = (stage, request_id)
        joiner = self.joiners.get(key)
        if joiner is None:
            spec = self.join_specs[stage]
            joiner = self.joiners[key] = Joiner(stage, self.device, spec.join, spec.inputs)

            async def drain() -> None:
                async for item in joiner.joined():
                    await self._feed_items(stage, request_id, [item], None, None)
                await self.end_input(stage, request_id)

            task = asyncio.get_running_loop().create_task(drain())
            self.tasks.setdefault(request_id, set()).add(task)
            task.add_done_callback(lambda t: self._forget_task(request_id, t))
        return joiner

    def _forget_task(self, request_id: str, task: asyncio.Task[Any]) -> None:
        self.tasks.get(request_id, set()).discard(task)
        if not self.tasks.get(request_id):
            self.tasks.pop(request_id, None)

    async def _deliver(
        self,
        request_id: str,
        r: Route,
        items: list[Any],
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
            await self._feed_items(r.consumer, request_id, items, r.entry, first)
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
                raise PeerLost(r.consumer, r.device, key, _said(cause)) from None
            raise
        except (rex.RayActorError, rex.ActorUnavailableError) as exc:
            raise PeerLost(r.consumer, r.device, key, _said(exc)) from None

    def _end(self, key: tuple[str, str]) -> None:
        self.ended[key] = None
        while len(self.ended) > ENDED_MEMORY:
            del self.ended[next(iter(self.ended))]

    async def _from_queue(self, stage: str, request_id: str) -> AsyncIterator[Any]:
        for item in self.context.pop((stage, request_id), []):
            yield item  # context first: no producer's feed can overtake it
        q = self._queue(stage, request_id)
        while True:
            item = await q.get()
            if item is _END:  # identity: an item may be an array, whose == answers element-wise
                return
            yield item

    async def stream(
        self,
        stage: str,
        request_id: str,
        initial: list[Any] | None = None,
        route: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[tuple[str, Any]]:
        """The request's outputs on ``stage``: without ``route``, every output as ``("out",
        item)`` (the relay); with one (the direct mode), ``("first", None)`` once, then
        ``("out", payload)`` for final outputs only, each output handed on to the consumers
        by a ``Router`` after it is yielded. Then ``("stats", StageStats)``."""
        h = self._hosted(stage)
        key = (stage, request_id)
        task = asyncio.current_task()
        if task is not None:
            self.tasks.setdefault(request_id, set()).add(task)
        tally = _Tally()
        router = self._begin_route(stage, request_id, route, tally)
        inputs = _timed(
            _from_list(initial) if initial is not None else self._from_queue(stage, request_id),
            tally.waited,
        )
        t0 = time.perf_counter()
        _begin_request(h)
        agen: Any = h.runner.stream(request_id, inputs)  # an async generator: closed below
        side: dict[str, Any] = {}
        try:
            async for item in agen:
                tally.count(item, t0)
                if router is None:
                    yield ("out", item)
                    continue
                port, payload, final = router.take(item)
                if tally.items == 1:
                    yield ("first", None)
                if final:
                    yield ("out", payload)
                await router.route(port, payload)
            if router is not None:
                await router.finish()
        except (
            StageFailed,
            ConfigError,
            PeerLost,
        ):  # a failed stage, a refused request, a lost peer
            raise
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:
            raise StageFailed(
                stage, self.device, f"request {request_id}: {type(exc).__name__}: {exc}"
            ) from None
        finally:
            h.in_flight -= 1
            await agen.aclose()
            side = self._consumer_side(key)
            fed = self._end_request(h, stage, request_id, task)
        yield ("stats", self._closing(h, request_id, tally, t0, fed, initial, router, side))

    def _begin_route(
        self, stage: str, request_id: str, route: Mapping[str, Any] | None, tally: _Tally
    ) -> Router | None:
        """The direct mode's ``Router`` for this stream (None: the relay), its context put
        first in its input, a fan-in's ``request`` input given its item."""
        if route is None:
            return None
        key = (stage, request_id)
        if route.get("context"):
            self.context[key] = list(route["context"])
        spec = self.join_specs.get(stage)
        if spec is not None and "request" in spec.inputs:
            joiner = self._joiner(stage, request_id)
            request_item = route.get("request_item")

            async def give() -> None:
                await joiner.put("request", request_item)
                await joiner.end("request")

            task = asyncio.get_running_loop().create_task(give())
            self.tasks.setdefault(request_id, set()).add(task)
            task.add_done_callback(lambda t: self._forget_task(request_id, t))
        to = dict(route.get("to") or {})
        return Router(
            self.tables[stage],
            lambda r, items, end, first: self._deliver(request_id, r, items, end, first, to),
            emitted=tally.emitted,
            at=self.key,
            to=to,
        )

    def _consumer_side(self, key: tuple[str, str]) -> dict[str, Any]:
        """What the direct mode kept here about the stage's input for one request: the sentences
        fed to it, its first chunk and its join's figures (taken out: the request is over)."""
        joiner = self.joiners.pop(key, None)
        return {
            "chunks_in": self.chunks_in.pop(key, None),
            "first": self.firsts_in.pop(key, None),
            "join": joiner.stats() if joiner is not None else None,
        }

    def _closing(
        self,
        h: _Hosted,
        request_id: str,
        tally: _Tally,
        t0: float,
        fed: float | None,
        initial: list[Any] | None,
        router: Router | None,
        side: dict[str, Any],
    ) -> StageStats:
        """The stream's closing record: the tally's figures, the runner's, and in the direct
        mode the edges its router counted and what its input was handed (``side``)."""
        stats = tally.figures(time.perf_counter() - t0, fed_items=initial is None)
        figures = dict(h.runner.request_stats(request_id) or {})
        runner_stamps = figures.pop("stamps", None)
        stats.update(figures)
        if router is not None:
            stats["edges_out"] = router.edges_out()
            stats["chunks_in"] = side["chunks_in"] or []
            if side["join"] is not None:
                stats["join"] = side["join"]
        # absolute stamps on this machine's monotonic clock; the runtime reads them (the
        # first-audio trace) and takes them out before the figures reach a record
        stamps: Stamps = {
            "emitted": tally.emitted,
            "first_fed": fed,
            "first_taken": tally.waited[2] or None,
            "runner": runner_stamps,
        }
        return StageStats(stats, stamps, side["first"] if router is not None else None)

    def _end_request(
        self, h: _Hosted, stage: str, request_id: str, task: asyncio.Task[Any] | None
    ) -> float | None:
        """A request's stream on ``stage`` is over (its runner's generator closed): the busy
        period's memory figure, its input and its task forgotten. Returns when its first
        input was fed (None: it took ``initial``)."""
        if h.request_meter is not None:
            h.busy -= 1
            if h.busy == 0:
                h.request_meter.stop()
                h.tree_request_growth = max(h.tree_request_growth, h.request_meter.window_growth)
        self.inputs.pop((stage, request_id), None)
        self.context.pop((stage, request_id), None)
        fed = self.first_fed.pop((stage, request_id), None)
        self._end((stage, request_id))
        if task is not None:
            self._forget_task(request_id, task)
        return fed

    async def cancel(self, request_id: str) -> int:
        """Stop every stage's work on ``request_id`` here (its streams, the feeds waiting on a
        full queue, its joins); returns how many tasks were running."""
        tasks = list(self.tasks.pop(request_id, set()))
        for t in tasks:
            t.cancel()
        keys = {k for k in (*self.inputs, *self.joiners, *self.context) if k[1] == request_id}
        for key in keys:
            self._end(key)
            self.inputs.pop(key, None)
            self.first_fed.pop(key, None)
            self.joiners.pop(key, None)
            self.context.pop(key, None)
            self.chunks_in.pop(key, None)
            self.firsts_in.pop(key, None)
        return len(tasks)

    async def pending(self, request_id: str) -> int:
        """How many of the request's tasks (streams, feeds, joins) run here now."""
        return len(self.tasks.get(request_id, ()))

    async def health(self) -> dict[str, dict[str, Any]]:
        """The hosted stages that can no longer serve though this actor lives (a runner's
        ``health()``: an engine that stopped), each as ``{"code", "message"}``."""
        out = {}
        for name, h in self.stages.items():
            state = h.runner.health()
            if state:
                out[name] = dict(state)
        return out

    # -- closing -----------------------------------------------------------------
    async def close_stage(self, stage: str) -> dict[str, Any]:
        h = self.stages.pop(stage, None)
        if h is None:
            return {}
        self.order.remove(stage)
        if h.request_meter is not None:
            h.request_meter.stop()
        h.measured = self._measure(h)
        await self._tell_ledger("report", h.holder, h.measured)
        try:
            await asyncio.to_thread(h.runner.close)
        finally:
            await self._tell_ledger("release", h.holder)
        return h.measured

    async def close(self) -> dict[str, Any]:
        """Close every stage, last loaded first; every runner is closed even when the
        ledger actor is gone, and then ``LedgerLost`` names it."""
        out = {}
        for stage in reversed(list(self.order)):
            out[stage] = await self.close_stage(stage)
        if self.ledger_error:
            raise LedgerLost(self.ledger_error)
        return out


def _said(exc: BaseException) -> str:
    head = next((line for line in str(exc).splitlines() if line.strip()), "")[:300]
    return f"{type(exc).__name__}: {head}"


def refusal(shortfall: dict[str, Any]) -> str:
    """The cause of a ``StageFailed`` for a load the ledger refused: the pool, its figures, who holds what."""
    s = shortfall
    who = ", ".join(f"{h} {b / 2**20:.0f} MiB" for h, b in s["contributors"].items())
    return (
        f"the ledger refused the load: pool {s['pool']} would peak at {s['peak'] / 2**20:.0f} MiB "
        f"of {s['capacity'] / 2**20:.0f} MiB (over by {s['over_by'] / 2**20:.0f} MiB; {who})"
    )


class _LoadMeter(RssMeter):
    """RSS of this process and its descendants (``RssMeter(children=True)``) and,
    from the same samples, of the processes started since ``before`` was taken
    (``new_now``, ``new_peak``, and each one's peak, ``pid_peak``) and of this
    process alone (``root_growth``, ``root_peak_growth``): what one load's route
    worker holds while another load grows the actor's own process, and what an
    in-process load grew while other loads started workers."""

    def __init__(self, before: set[int]) -> None:
        super().__init__(children=True)
        self.before = before
        self.new_now = self.new_peak = 0
        self.pid_peak: dict[int, int] = {}
        self.root_base: int | None = None
        self.root_now = self.root_peak = 0

    def current(self) -> int:
        root = self.pids[0]
        children = [(p, rss_of(p)) for p in descendants(root)]
        new = [(p, rss) for p, rss in children if p not in self.before]
        self.new_now = sum(rss for _, rss in new)
        self.new_peak = max(self.new_peak, self.new_now)
        for p, rss in new:
            self.pid_peak[p] = max(self.pid_peak.get(p, 0), rss)
        self.root_now = rss_of(root)
        if self.root_base is None:
            self.root_base = self.root_now
        self.root_peak = max(self.root_peak, self.root_now)
        return self.root_now + sum(rss for _, rss in children)

    @property
    def root_growth(self) -> int:
        return max(0, self.root_now - (self.root_base or 0))

    @property
    def root_peak_growth(self) -> int:
        return max(0, self.root_peak - (self.root_base or 0))


class _RunnerMeter(RssMeter):
    """``RssMeter`` over the processes the runner says are its own, asked again at
    each sample: a runner that replaces its route worker (a recycle,
    ``WorkerSessions.recycle_limit``) is followed to the new one."""

    def __init__(self, pids: list[int], runner: StageRunner) -> None:
        super().__init__(pids)
        self.runner = runner

    def current(self) -> int:
        ids = _runner_processes(self.runner)
        if ids:
            self.pids = tuple(ids)
        return super().current()


def _runner_processes(runner: StageRunner) -> list[int] | None:
    """The processes a runner's work runs in, when it says (``StageRunner.process_ids``: an ONNX
    Runtime route worker and its children; ``[]`` in this process); None when unknown."""
    ids = runner.process_ids()
    return None if ids is None else [int(p) for p in ids]


def _meter_requests(hosted: _Hosted, meter: _LoadMeter, before: set[int], overlapped: bool) -> None:
    """For a runner that does not measure itself: the meter its requests are sampled with (the
    processes its load started, else this actor's process), and, when its load overlapped
    another in this actor, its load figures from the processes that are its own alone."""
    runner = hosted.runner
    known = _runner_processes(runner)
    own = [p for p in descendants(os.getpid()) if p not in before] if known is None else known
    hosted.in_process = not own
    request_meter = (
        _RunnerMeter(own, runner) if known else RssMeter(own or os.getpid(), children=False)
    )
    hosted.request_meter = request_meter.start(sampling=False)
    if known and overlapped:
        # the processes the runner says are its own (its route worker): their whole RSS,
        # never another load's worker started meanwhile
        hosted.tree_load_peak = sum(meter.pid_peak.get(p, 0) for p in own)
        hosted.tree_resident = sum(rss_of(p) for p in own)
        hosted.tree_load_peak = max(hosted.tree_load_peak, hosted.tree_resident)
        hosted.load_note = (
            "another stage loaded in this actor at the same time: the load is measured "
            "over the processes the runner started"
        )
    elif overlapped and own:
        hosted.tree_load_peak, hosted.tree_resident = meter.new_peak, meter.new_now
        hosted.load_note = (
            "another stage loaded in this actor at the same time: the load is measured "
            "over the processes started during it"
        )
    elif overlapped:
        # in this process: its growth only, not the workers other loads started meanwhile
        hosted.tree_load_peak, hosted.tree_resident = (
            meter.root_peak_growth,
            meter.root_growth,
        )


def _begin_request(h: _Hosted) -> None:
    """Count a request in on ``h``; the first of a busy period starts sampling its memory."""
    h.requests += 1
    h.in_flight += 1
    h.max_in_flight = max(h.max_in_flight, h.in_flight)
    if h.request_meter is not None:
        if h.busy == 0:
            h.request_meter.rebase()
            h.request_meter.resume()
        h.busy += 1


@dataclass
class _Tally:
    """What one request's stream on a stage counts as its outputs leave the runner."""

    waited: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    """Filled by ``_timed``: seconds spent waiting for inputs, when the last and the first
    input were handed over."""
    emitted: list[float] = field(default_factory=list)
    """When each output left the runner (``time.perf_counter``): the trace's stamps."""
    latencies: list[float] = field(default_factory=list)
    first: float | None = None
    items: int = 0
    chars: int = 0
    audio_s: float = 0.0

    def count(self, item: Any, t0: float) -> None:
        now = time.perf_counter()
        self.emitted.append(now)
        if self.first is None:
            self.first = now - t0
        if self.waited[1]:
            self.latencies.append(now - self.waited[1])
        self.items += 1
        if isinstance(item, str):
            self.chars += len(item)
        elif isinstance(item, dict) and "audio" in item and item.get("sample_rate"):
            self.audio_s += float(getattr(item["audio"], "size", 0)) / float(item["sample_rate"])

    def figures(self, duration: float, fed_items: bool) -> dict[str, Any]:
        """The request's figures on the stage (``StageStats.figures``, before the runner's own);
        ``fed_items``: its inputs were fed one by one (not the request's ``initial``)."""
        stats: dict[str, Any] = {
            "items": self.items,
            "first_output_s": _r(self.first),
            "duration_s": _r(duration),
            "busy_s": _r(max(0.0, duration - self.waited[0])),
        }
        if self.chars:
            stats["chars"] = self.chars
        if self.latencies and fed_items:
            # Per output: seconds from its input being handed over to the output
            # (for a 1:1 stage such as a TTS, the time it took to speak that chunk).
            stats["item_latency_s"] = [round(x, 4) for x in self.latencies]
        if self.audio_s:
            stats["audio_s"] = round(self.audio_s, 3)
            stats["real_time_factor"] = round(max(0.0, duration - self.waited[0]) / self.audio_s, 4)
        return stats


async def _timed(items: AsyncIterator[Any], waited: list[float]) -> AsyncIterator[Any]:
    """Pass items through, adding the time spent waiting for each to ``waited[0]``
    (so a stage's busy time excludes waiting on its producer); ``waited[1]`` is
    when the last item was handed over, ``waited[2]`` when the first was."""
    while True:
        t = time.perf_counter()
        try:
            item = await items.__anext__()
        except StopAsyncIteration:
            waited[0] += time.perf_counter() - t
            return
        waited[1] = time.perf_counter()
        waited[0] += waited[1] - t
        if not waited[2]:
            waited[2] = waited[1]
        yield item


async def _from_list(items: list[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _summarize(info: Mapping[str, Any]) -> dict[str, Any]:
    """A runner's load_info, small enough for a run record: scalars kept, the EP
    node assignment reduced to nodes per EP, other large values to their size."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if key == "assignment" and isinstance(value, list):
            out["nodes_per_ep"] = {
                a.get("ep", "?"): len(a.get("nodes", [])) for a in value if isinstance(a, dict)
            }
        elif isinstance(value, (str, int, float, bool)) or value is None:
            out[key] = value
        elif isinstance(value, (list, tuple)) and len(str(value)) <= 400:
            out[key] = list(value)
        elif isinstance(value, dict) and len(str(value)) <= 400:
            out[key] = value
        else:
            out[key] = (
                f"<{type(value).__name__} of {len(value) if hasattr(value, '__len__') else '?'}>"
            )
    return out


ACTOR_OPTIONS: dict[str, Any] = {
    "num_cpus": 0,
    "max_restarts": 0,
    "max_task_retries": 0,
    "max_concurrency": 64,
}
"""No CPU reservation (placement is by the device resource; Ray's CPU count would
only block a small machine), no restarts (a dead actor is reported, not hidden),
up to 64 concurrent calls (requests × stages, plus feeds)."""


def actor_class() -> Any:
    """``DeviceActor`` as a Ray actor class (created on demand: importing this
    module does not import Ray). Create it with ``.options(**ACTOR_OPTIONS, ...)``."""
    import ray

    return ray.remote(DeviceActor)


def _worker_stats(runner: StageRunner) -> dict[str, int] | None:
    """The runner's ``worker_stats()`` (a recycled route worker's figures), or None."""
    try:
        return runner.worker_stats()
    except Exception:  # a figure that cannot be read is no figure, never a failed measure
        log.debug("worker_stats() raised", exc_info=True)
        return None
