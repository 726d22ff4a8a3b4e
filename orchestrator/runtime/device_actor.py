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
import importlib.util
import inspect
import logging
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from orchestrator.core.errors import ConfigError, LedgerLost, PeerLost, StageFailed
from orchestrator.core.ledger import AdmissionAnswer, MeasuredPeak, ShortfallDoc
from orchestrator.core.memory import descendants, rss_of
from orchestrator.core.plan import StagePlan
from orchestrator.core.profile import Route
from orchestrator.runtime.actor_inputs import NO_SIDE, ConsumerSide, StageInputs, StreamRoute
from orchestrator.runtime.coalesce import routed_finals
from orchestrator.runtime.hop import FirstChunk
from orchestrator.runtime.joins import JoinSpec
from orchestrator.runtime.load_imports import call_loading
from orchestrator.runtime.metering import (
    Hosted,
    LoadMeter,
    begin_request,
    end_request,
    measure,
    meter_requests,
    summarize,
)
from orchestrator.runtime.router import Router, RouteTable
from orchestrator.runtime.stage_stats import StageStats, Stamps, Tally, from_list, timed
from stages.base import StageConfig, StageHealth, StageKind
from stages.payloads import Item

if TYPE_CHECKING:
    from ray.actor import ActorHandle

    from stages.base import StageRunner

log = logging.getLogger(__name__)


class ActorReady(TypedDict):
    """What a device actor answers ``ready()`` with: where it runs and how it started."""

    device: str
    pid: int
    host: str
    node_id: str
    rss_bytes: int
    omp_num_threads: str | None
    niceness: int
    """The process's nice value (``ACTOR_NICENESS_ENV``: the node's raylet's, not Ray's +15)."""


@dataclass(frozen=True)
class StageLoad:
    """What the runtime sends a device actor to load one stage (``DeviceActor.load_stage``):
    the placement's plan as this instance runs it, the stage's config and kind (the kind
    object itself: a decode kind carries the engines registered in the caller's process), the
    profile's route for the placement (None: this process drives the device), whether the
    ledger already admitted its reservations with others (``admit_together``), and its ledger
    holder (the stage's name; ``voice#1`` for a replica)."""

    plan: StagePlan
    config: StageConfig
    kind: StageKind
    route: Route | None = None
    admitted: bool = False
    holder: str | None = None


class LoadReport(TypedDict):
    """What ``DeviceActor.load_stage`` answers (``Runtime.load_results``, the run record's
    stage rows): the stage, its holder and device, the load's seconds, whether it overlapped
    another load in the actor, what the load found (``StageRunner.load_info``, reduced to
    small values) and the measured peak."""

    stage: str
    holder: str
    device: str
    load_s: float
    overlapped: bool
    load_info: dict[str, object]
    measured: MeasuredPeak


class WorkerRestarts(TypedDict):
    """A stage whose route worker was replaced after it died: how many times since its load."""

    restarts: int


class ActorHealth(TypedDict):
    """What ``DeviceActor.health`` answers: the stages that cannot serve though the actor lives
    (``failed``) and those whose route worker was replaced (``workers``), by stage."""

    failed: dict[str, StageHealth]
    workers: dict[str, WorkerRestarts]


StreamMessage = (
    tuple[Literal["out"], Item]
    | tuple[Literal["outs"], list[Item]]
    | tuple[Literal["first"], None]
    | tuple[Literal["stats"], StageStats]
)
"""One message of ``DeviceActor.stream``: an output, several (the direct mode's final outputs
that came together: ``coalesce.routed_finals``), the direct mode's first-output mark, then the
closing stats."""


class DeviceActor:
    """Hosts the stages placed on one device (see the module docstring)."""

    def __init__(self, device: str, ledger: ActorHandle, key: str | None = None) -> None:
        self.device = device
        self.key = key or device
        """This actor's key among its peers: the device id, or ``device#k`` for the k-th extra
        replica of a stage on that device (its own process)."""
        self.ledger = ledger
        self.stages: dict[str, Hosted] = {}
        self.order: list[str] = []
        self.io = StageInputs(device, self.key)
        """The hosted stages' inputs per request, their joins and (direct) their routes."""
        self._loading: dict[str, set[str]] = {}
        """Loads in flight: stage -> the other loads that ran beside it."""
        self._importing = asyncio.Lock()
        """Held while a stage's ``runner_imports`` are imported: one stage at a time."""
        self.ledger_error: str | None = None
        """Set when a report or release to the ledger actor failed (it died): closing
        goes on without it, and ``close`` then raises ``LedgerLost``."""
        self._closed = asyncio.Event()
        """Set by ``close``: the supervisor's ``watch`` call then returns."""

    async def _tell_ledger(self, method: str, holder: str, *args: MeasuredPeak) -> None:
        """A report or release that must not stop a close: a dead ledger is noted
        (``ledger_error``), not raised here."""
        try:
            await getattr(self.ledger, method).remote(holder, *args)
        except Exception as exc:
            head = next((line for line in str(exc).splitlines() if line.strip()), "")[:300]
            self.ledger_error = self.ledger_error or f"{type(exc).__name__}: {head}"
            log.warning(
                "the ledger actor did not take %s(%s): %s", method, holder, self.ledger_error
            )

    async def ready(self) -> ActorReady:
        import ray

        return ActorReady(
            device=self.device,
            pid=os.getpid(),
            host=socket.gethostname(),
            node_id=ray.get_runtime_context().get_node_id(),
            rss_bytes=rss_of(os.getpid()),
            omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
            niceness=os.getpriority(os.PRIO_PROCESS, 0),
        )

    # -- loading ---------------------------------------------------------------
    async def load_stage(self, load: StageLoad) -> LoadReport:
        """Load one stage (the module docstring's step 2); the report of its load."""
        plan = load.plan
        name = plan.name
        holder = load.holder or name
        if not load.admitted:
            await self._admit(plan, holder)
        before = set(descendants(os.getpid()))
        meter = LoadMeter(before)
        meter.start()
        overlapped = self._begin_load(name)
        runner, load_s = await self._make_and_load(load, meter, holder)
        meter.stop()
        overlapped_with = self._loading.pop(name, set())
        overlapped = bool(overlapped_with) or overlapped
        hosted = Hosted(
            plan,
            runner,
            load_s,
            summarize(runner.load_info),
            meter.peak_growth,
            meter.growth,
            overlapped_with=set(overlapped_with),
            holder=holder,
        )
        if runner.measured_peak_bytes() is None:
            meter_requests(hosted, meter, before, overlapped)
        else:
            hosted.in_process = bool(hosted.load_info.get("in_process", True))
        self.stages[name] = hosted
        self.order.append(name)
        await self.ledger.release.remote(holder, "load")
        hosted.measured = measure(hosted, self.stages, self.device)
        await self.ledger.report.remote(holder, hosted.measured)
        return LoadReport(
            stage=name,
            holder=holder,
            device=self.device,
            load_s=round(load_s, 3),
            overlapped=overlapped,
            load_info=hosted.load_info,
            measured=hosted.measured,
        )

    async def _admit(self, plan: StagePlan, holder: str) -> None:
        """All of the plan's reservations from the ledger, or ``StageFailed`` naming the shortfall."""
        admission: AdmissionAnswer = await self.ledger.admit.remote(
            holder, [r.to_dict() for r in plan.reservations]
        )
        if not admission["ok"]:
            raise StageFailed(plan.name, self.device, refusal(admission["shortfalls"][0]))

    async def _make_and_load(
        self, load: StageLoad, meter: LoadMeter, holder: str
    ) -> tuple[StageRunner, float]:
        """The kind's runner, made and ``load()``-ed in worker threads, and the seconds its load
        took. A failure stops ``meter``, releases everything the stage held (the ledger is as
        before, and the load counts in no other load's figure) and raises ``StageFailed``."""
        name, kind = load.plan.name, load.kind
        runner = None
        try:
            await self._import_first(kind)
            params = inspect.signature(kind.runner).parameters

            def make() -> StageRunner:
                return (
                    kind.runner(load.plan, load.config, route=load.route)
                    if "route" in params
                    else kind.runner(load.plan, load.config)
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

    async def _import_first(self, kind: StageKind) -> None:
        """Import the kind's ``runner_imports`` not imported yet, one stage at a time. One not
        installed is left to the runner (ar_decode names torch for the engines that load a
        checkpoint; a llama.cpp stage in an install without torch never imports it), so a
        module the runner does need is said by its own import, naming the stage."""
        async with self._importing:
            missing = [
                m
                for m in kind.runner_imports
                if m not in sys.modules and importlib.util.find_spec(m) is not None
            ]
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

    async def measure(self, stage: str) -> MeasuredPeak:
        h = self._hosted(stage)
        h.measured = measure(h, self.stages, self.device)
        await self._tell_ledger("report", h.holder, h.measured)
        return h.measured

    # -- requests ----------------------------------------------------------------
    def _hosted(self, stage: str) -> Hosted:
        h = self.stages.get(stage)
        if h is None:
            raise StageFailed(stage, self.device, "the stage is not loaded on this device actor")
        return h

    async def stream(
        self,
        stage: str,
        request_id: str,
        initial: list[Item] | None = None,
        route: StreamRoute | None = None,
    ) -> AsyncIterator[StreamMessage]:
        """The request's outputs on ``stage``: without ``route``, every output as ``("out",
        item)`` (the relay); with one (the direct mode), ``("first", None)`` once, then
        ``("out", payload)`` for final outputs only, each output handed on to the consumers
        by a ``Router`` after it is yielded. Then ``("stats", StageStats)``."""
        h = self._hosted(stage)
        key = (stage, request_id)
        task = asyncio.current_task()
        self.io.track(request_id, task)
        tally = Tally()
        router = self.io.begin_route(stage, request_id, route, tally)
        inputs = timed(
            from_list(initial) if initial is not None else self.io.from_queue(stage, request_id),
            tally.waited,
        )
        t0 = time.perf_counter()
        begin_request(h)
        agen: Any = h.runner.stream(request_id, inputs)  # an async generator: closed below
        side = NO_SIDE
        try:
            if router is None:
                async for item in agen:
                    tally.count(item, t0)
                    yield ("out", item)
            else:
                direct = router

                def take(item: Item) -> tuple[bool, Item | None, Awaitable[None]]:
                    tally.count(item, t0)
                    port, payload, final = direct.take(item)
                    return tally.items == 1, payload if final else None, direct.route(port, payload)

                async for message in routed_finals(agen, take):
                    yield message  # type: ignore[misc]
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
            side = self.io.consumer_side(key)
            end_request(h)
            fed = self.io.end_request(stage, request_id, task)
        yield ("stats", self._closing(h, request_id, tally, t0, fed, initial, router, side))

    def _closing(
        self,
        h: Hosted,
        request_id: str,
        tally: Tally,
        t0: float,
        fed: float | None,
        initial: list[Item] | None,
        router: Router | None,
        side: ConsumerSide,
    ) -> StageStats:
        """The stream's closing record: the tally's figures, the runner's, and in the direct
        mode the edges its router counted and what its input was handed (``side``)."""
        stats = tally.figures(time.perf_counter() - t0, fed_items=initial is None)
        figures = dict(h.runner.request_stats(request_id) or {})
        runner_stamps = figures.pop("stamps", None)
        stats.update(figures)
        if router is not None:
            stats["edges_out"] = router.edges_out()
            stats["chunks_in"] = side.chunks_in or []
            if side.join is not None:
                stats["join"] = side.join
        # absolute stamps on this machine's monotonic clock; the runtime reads them (the
        # first-audio trace) and takes them out before the figures reach a record
        stamps: Stamps = {
            "emitted": tally.emitted,
            "first_fed": fed,
            "first_taken": tally.waited[2] or None,
            "runner": runner_stamps if isinstance(runner_stamps, dict) else None,
        }
        return StageStats(stats, stamps, side.first if router is not None else None)

    # -- inputs (``actor_inputs.StageInputs``): what other actors and the driver call ------
    async def connect(
        self,
        peers: Mapping[str, ActorHandle],
        tables: Mapping[str, RouteTable],
        joins: Mapping[str, JoinSpec],
    ) -> None:
        """Every device actor's handle (actor key → handle), each stage's routes and each
        fan-in's join: what a ``stream`` with a ``route`` needs to feed its consumers itself."""
        self.io.connect(peers, tables, joins)

    async def feed(
        self,
        stage: str,
        request_id: str,
        items: list[Item],
        entry: str | None = None,
        first: FirstChunk | None = None,
    ) -> None:
        """Put ``items`` into ``stage``'s input for the request (``StageInputs.feed``)."""
        await self.io.feed(stage, request_id, items, entry, first)

    async def end_input(self, stage: str, request_id: str, entry: str | None = None) -> None:
        """``stage``'s input for the request has ended (a fan-in's: its input ``entry`` has)."""
        await self.io.end_input(stage, request_id, entry)

    async def cancel(self, request_id: str) -> int:
        """Stop every stage's work on ``request_id`` here (its streams, the feeds waiting on a
        full queue, its joins) and return once they ended (``StageInputs.cancel``); returns how
        many tasks were running."""
        return await self.io.cancel(request_id)

    async def pending(self, request_id: str) -> int:
        """How many of the request's tasks (streams, feeds, joins) run here now, those still
        stopping after a ``cancel`` included."""
        return self.io.pending(request_id)

    async def health(self) -> ActorHealth:
        """How the hosted stages are, asked of each runner now: ``failed``, the stages that
        cannot serve though this actor lives (a runner's ``health()``: an engine that stopped,
        a route worker being replaced); ``workers``, each stage whose route worker was replaced
        after it died, with how many times."""
        failed: dict[str, StageHealth] = {}
        workers: dict[str, WorkerRestarts] = {}
        for name, h in self.stages.items():
            state = h.runner.health()
            if state:
                failed[name] = StageHealth(code=state["code"], message=state["message"])
            restarts = h.runner.worker_restarts()
            if restarts:
                workers[name] = WorkerRestarts(restarts=int(restarts))
        return ActorHealth(failed=failed, workers=workers)

    async def watch(self) -> str:
        """Answers only when this actor closes: the supervisor holds one such call on every
        device actor, so an actor's death reaches it at once, as this call's failure
        (``runtime.supervisor``)."""
        await self._closed.wait()
        return "closed"

    # -- closing -----------------------------------------------------------------
    async def close_stage(self, stage: str) -> MeasuredPeak | None:
        h = self.stages.pop(stage, None)
        if h is None:
            return None
        self.order.remove(stage)
        if h.request_meter is not None:
            h.request_meter.stop()
        h.measured = measure(h, self.stages, self.device)
        await self._tell_ledger("report", h.holder, h.measured)
        try:
            await asyncio.to_thread(h.runner.close)
        finally:
            await self._tell_ledger("release", h.holder)
        return h.measured

    async def close(self) -> dict[str, MeasuredPeak]:
        """Close every stage, last loaded first; every runner is closed even when the
        ledger actor is gone, and then ``LedgerLost`` names it."""
        out = {}
        try:
            for stage in reversed(list(self.order)):
                measured = await self.close_stage(stage)
                if measured is not None:
                    out[stage] = measured
        finally:
            self._closed.set()
        if self.ledger_error:
            raise LedgerLost(self.ledger_error)
        return out


def refusal(shortfall: ShortfallDoc) -> str:
    """The cause of a ``StageFailed`` for a load the ledger refused: the pool, its figures, who holds what."""
    s = shortfall
    who = ", ".join(f"{h} {b / 2**20:.0f} MiB" for h, b in s["contributors"].items())
    return (
        f"the ledger refused the load: pool {s['pool']} would peak at {s['peak'] / 2**20:.0f} MiB "
        f"of {s['capacity'] / 2**20:.0f} MiB (over by {s['over_by'] / 2**20:.0f} MiB; {who})"
    )


class ActorOptions(TypedDict):
    num_cpus: int
    max_restarts: int
    max_task_retries: int
    max_concurrency: int


ACTOR_OPTIONS = ActorOptions(num_cpus=0, max_restarts=0, max_task_retries=0, max_concurrency=64)
"""No CPU reservation (placement is by the device resource; Ray's CPU count would
only block a small machine), no restarts by Ray (a dead actor is reported, and brought back
by the runtime's supervisor as its stages' ``restart`` says: ``runtime.supervisor``), up to 64
concurrent calls (requests × stages, plus feeds, plus ``admission.CONTROL_CALLS``)."""


ACTOR_NICENESS_ENV = {"RAY_worker_niceness": "0"}
"""In every device actor's environment, and the ledger actor's. Ray adds 15 to a worker's nice value, so that its
raylet comes first; a stage's engine at nice 15 gives way to every ordinary process on the
machine (a browser, the server in front of it): on a PC, the stages run at the priority of the
command that started them (the node's raylet's) instead. ``0`` is the increment Ray applies."""


def actor_class() -> Any:
    """``DeviceActor`` as a Ray actor class (created on demand: importing this
    module does not import Ray). Create it with ``.options(**ACTOR_OPTIONS, ...)``."""
    import ray

    return ray.remote(DeviceActor)
