"""Carry out an admitted plan: actors up, stages loaded under the ledger, requests streamed.

:class:`Runtime` guarantees:

* **Nothing is re-decided.** Each stage runs on the plan's device with the
  plan's backend, engine kwargs and reservations; a plan that was not
  admitted is refused with ``PlanRefused`` before Ray starts.
* **One actor per device**, placed by this project's custom resource
  (``cluster.device_resource``) and checked with ``ready()`` as soon as it is
  created; a device no node offers, or an actor that cannot start, is a
  ``StageFailed`` naming the first stage placed there.
* **Loads go through the ledger actor** (admit → load → release the load
  transient → report the measured peak), in parallel where the ledger admits
  them together, else one at a time (``startup``, which also creates every
  actor at once). Ray's own memory is measured before the first load and
  replaces the plan's estimate for it. When a load fails, the runtime tears
  down what it started and raises ``StageFailed``; the failed stage holds
  nothing in the ledger.
* **Requests stream stage to stage.** Each stage's outputs are read as a Ray
  streaming generator (one item costs well under an actor call per item; figures
  in docs/benchmarks.md). With ``STREAMING == "direct"`` the producer's actor
  hands them to its consumers' actors itself (``router.Router``,
  ``DeviceActor.stream`` with a route) and the driver reads only final outputs
  and control events; a dead consumer's actor is named as such (``PeerLost``),
  never its producer. Text reaches the next stage as its kind's
  ``text_input`` asks: cut into sentences (``stages.text_chunks``) and fed
  while decoding goes on, or whole once the producer is done.
  Backpressure: at most ``GENERATOR_BACKPRESSURE`` unread items per
  generator, ``actor_inputs.INPUT_QUEUE_ITEMS`` waiting per stage input.
  Several requests may be in flight; each keeps its order (one generator and
  one input queue per request and stage). A request may enter the graph at a
  stage that takes text (``stream(entry=...)``, e.g. text straight to the
  voice): only that stage and those downstream of it run, and its text is cut
  and fed as a producer's would be.
* **Failures are named and prompt.** A device actor that dies fails every
  request in flight on it with ``StageFailed(stage, device, cause)`` as soon
  as Ray notices (milliseconds after a kill); the stages
  it hosted are released from the ledger. No request waits on a dead actor.
* **What died comes back, bounded and said** (``supervisor.py``): the dead actor is restarted
  on its placement as its stages' ``restart`` allows, and requests in flight on it end with
  the code ``stage_restarting``; a request that needs a stage coming back waits for it, at
  most the admission's wait (``Admission.wait_timeout_s``), holding no slot, then fails with
  ``stage_restarting``; one that needs a stage that will not come back (``restart: never``,
  a crash loop, its device gone) fails at once. A stage whose device is gone for good moves
  to its next device when its ``on_device_loss`` says ``fallback`` (``fallback.py``, with
  ``replan``).

* **Each device actor gets the environment its stages ask for**
  (``StageKind.actor_env``, merged; two stages wanting different values for
  one variable are refused before Ray starts).

Graph shape: each stage takes its input from the request and/or other stages
that produce a payload type it consumes (``StageKind.ports``; the config
loader checks every edge first, this is a guard); a stage may feed several
(fan-out: each consumer has its own input queue, and a slow one holds back
its producer's generator, and so that producer's other consumers). A stage
with several inputs (fan-in) must declare a ``join`` and be of a kind that
takes joined items (``StageKind.takes_join``): its inputs' items are combined
in this process (``orchestrator.runtime.joins``: zip, all or latest, bounded)
and fed to it as one ``dict`` keyed by source; it gets ``end_input`` once
every input has ended, and a failed input fails the request naming that
input's stage. An input may name one output port of its producer
(``thinker.hidden_states``): a producer of several ports yields items tagged
with their port (``stages.payloads.on_port``), and each item reaches only
the inputs that take its port (``graph.PipelineGraph.routes_out``).

``Runtime`` is a front: the graph it reads per request is ``graph.py``, a request's checks
``requests.py``, its flow (streams, pumps, feeders, winding down) ``flow.py``, what failed
``failures.py``, and reading the ledger and closing ``closing.py``; starting is ``startup.py``;
restarts, crash loops and moves are ``supervisor.py`` and ``fallback.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING

from orchestrator.config import PipelineConfig
from orchestrator.core.errors import ConfigError, PlanRefused, StageFailed
from orchestrator.core.ledger import MeasuredPeak
from orchestrator.core.memory import RayMemory
from orchestrator.core.plan import PipelinePlan, ReplicaPlan, StagePlan
from orchestrator.core.profile import Route
from orchestrator.runtime import closing, failures, requests
from orchestrator.runtime import cluster as cluster_mod
from orchestrator.runtime import startup as startup_mod
from orchestrator.runtime.admission import (
    Admission,
    calls_per_request,
    replica_caps,
    replicated_limit,
)
from orchestrator.runtime.balance import Balancer, ReplicaRef
from orchestrator.runtime.closing import CLOSE_TIMEOUT_S
from orchestrator.runtime.device_actor import ACTOR_NICENESS_ENV, ACTOR_OPTIONS, LoadReport
from orchestrator.runtime.events import Event
from orchestrator.runtime.fallback import Replan
from orchestrator.runtime.flow import GENERATOR_BACKPRESSURE, DriverStats, RequestFlow
from orchestrator.runtime.graph import PipelineGraph
from orchestrator.runtime.ledger_actor import ActorSnapshot
from orchestrator.runtime.startup import Device as _Device
from orchestrator.runtime.startup import StartupTimings
from orchestrator.runtime.supervisor import Supervisor
from stages.base import StageHealth
from stages.payloads import Item
from stages.requests import Request
from stages.text_chunks import SentenceChunker

if TYPE_CHECKING:
    from ray.actor import ActorHandle

__all__ = [
    "CLOSE_TIMEOUT_S",
    "GENERATOR_BACKPRESSURE",
    "STREAMING",
    "Runtime",
    "replica_refs",
    "replica_view",
]

RECOVERY_POLL_S = 0.1
"""How often a request waiting for a stage that is coming back looks again (it holds no slot)."""

STREAMING = "direct"
"""How items go from a stage to its consumers: ``"direct"``, the producer's device actor feeds
the consumer's (``DeviceActor.stream`` with a route; the driver reads only final outputs and
control events); ``"relay"``, every output comes to the driver, which feeds the consumers
(what the runtime did before). Read when a ``Runtime`` is made; ``bench/streaming.py`` and a
test set it to ``"relay"`` to compare the two (docs/runtime.md, "The data path")."""


class Runtime:
    """A started pipeline: see the module docstring for what it guarantees."""

    def __init__(
        self,
        plan: PipelinePlan,
        config: PipelineConfig,
        *,
        routes: dict[str, Route] | None = None,
        address: str | None = None,
        log_to_driver: bool = False,
        max_waiting: int | None = None,
        replan: Replan | None = None,
    ) -> None:
        if not plan.admitted:
            raise PlanRefused(plan)
        self.config = config
        self.routes = routes or {}
        self.address = address
        self.log_to_driver = log_to_driver
        self.replan = replan
        """Plans one stage again with lost devices masked (``fallback.replanner``), for a stage
        whose ``on_device_loss`` is ``fallback``; None: such a stage stays down."""
        self.use_plan(plan)
        self.replicas: dict[str, list[ReplicaRef]] = replica_refs(self.stages)
        """Stage → its instances (one for a stage of one instance), each with its actor key."""
        self.refs: dict[str, ReplicaRef] = {
            r.holder: r for rs in self.replicas.values() for r in rs
        }
        """Ledger holder → its instance."""
        self.views: dict[str, StagePlan] = {
            r.holder: replica_view(s, s.placements()[r.index])
            for s in self.stages
            for r in self.replicas[s.name]
        }
        """Ledger holder → the stage's plan as that instance runs it (its device, reservations)."""
        self.actor_envs: dict[str, Mapping[str, str]] = {
            key: self._actor_env(key) for key in self.actor_keys()
        }
        """Each actor key's environment; read-only once the runtime starts (``startup.start``)."""
        self.devices: dict[str, _Device] = {}
        self.streaming = STREAMING
        """This runtime's data path (``STREAMING`` when it was made)."""
        self.driver_node = ""
        """The Ray node this process runs on (set at start): the record's ``runtime.streaming``."""
        self.driver_stats = DriverStats(items_read=0, feeds_sent=0, cpu_s=0.0)
        """What this process did for the requests: outputs it read, ``feed`` calls it made, and
        its CPU seconds (``time.process_time``, every thread) while requests were in flight."""
        self._busy = [0, 0.0]  # requests in flight here, process_time when the first began
        self._busy_lock = threading.Lock()
        self.cluster: cluster_mod.Cluster | None = None
        self.ledger: ActorHandle | None = None
        self.load_results: dict[str, LoadReport] = {}
        self.ray_memory = RayMemory()
        """Ray's measured memory (``cluster.ray_memory``; on a cluster, each node's under
        ``nodes``), once the actors are up."""
        self.ledger_history: list[tuple[str, ActorSnapshot]] = []
        self.startup: StartupTimings = {}
        self.final_ledger: ActorSnapshot | None = None
        self.ledger_pid = 0
        self.ledger_lost: str | None = None
        """Why the ledger actor stopped answering (it died), once something noticed."""
        self._closed = False
        self._admit_by_replica(max_waiting)
        self.picks: dict[str, dict[str, ReplicaRef]] = {}
        """Request → the instance of each stage it runs on (``balance.Balancer.pick``)."""
        self.supervisor: Supervisor | None = None
        """Restarts what dies, once the pipeline has started (``supervisor.py``)."""
        self.lost_devices: dict[str, str] = {}
        """Device → why it is gone for good (``lose_device``): never restarted on."""
        self.waiting_for_stages = 0
        """Requests waiting, holding no slot, for a stage that is coming back (``/v1/status``)."""

    def use_plan(self, plan: PipelinePlan) -> None:
        """Run by ``plan`` from now on: its graph and the tables read per request (at the
        start, and when a stage moved to another device: ``fallback.py``)."""
        self.plan = plan
        self.graph = PipelineGraph(plan, self.config)
        """The stages, their kinds and edges, read per request (``graph.py``)."""
        self.stages: list[StagePlan] = self.graph.stages
        self.kinds = self.graph.kinds
        self.consumers = self.graph.consumers
        self.stage_ports = self.graph.stage_ports
        self.routes_out = self.graph.routes_out
        self.joins = self.graph.joins
        self.route_tables = self.graph.route_tables

    def _admit_by_replica(self, max_waiting: int | None) -> None:
        """Admission's limit from the replicas' caps (``admission``: one replica per stage
        gives the per-device limit exactly) and the balancer that picks them."""
        self.calls_per_request = calls_per_request(
            {h: r.key for h, r in self.refs.items()},
            {h: PipelineGraph.feeders(self.plan.stage(r.stage)) for h, r in self.refs.items()},
        )
        """Actor key → the calls one request holds there at most (``admission``)."""
        self.replica_caps = replica_caps(
            self.calls_per_request, int(ACTOR_OPTIONS["max_concurrency"])
        )
        self.stage_keys = {name: [r.key for r in rs] for name, rs in self.replicas.items()}
        self.admission = Admission(
            replicated_limit(self.replica_caps, self.stage_keys), max_waiting=max_waiting
        )
        sticky = [
            s.name
            for s in self.stages
            if self.kinds[s.name].replica_affinity(self.config.stage(s.name)) == "conversation"
        ]
        self.balancer = Balancer(self.replicas, self.replica_caps, sticky)

    # -- the actors ------------------------------------------------------------------
    def actor_keys(self) -> list[str]:
        """Every device actor's key, in plan order: a device id, or ``device#k`` for the k-th
        extra replica of a stage on that device (its own process)."""
        return list(dict.fromkeys(r.key for rs in self.replicas.values() for r in rs))

    def actor_of(self, holder: str) -> _Device:
        """The started device actor of a ledger holder (a stage, or one replica: ``voice#1``)."""
        return self.devices[self.refs[holder].key]

    def _actor_env(self, actor_key: str) -> dict[str, str]:
        """The environment of an actor: what its stages' kinds ask for, merged, and the
        priority of the command that started it (``device_actor.ACTOR_NICENESS_ENV``; a kind's
        own value would win)."""
        env: dict[str, str] = {}
        wanted_by: dict[str, str] = {}
        hosted = [self.views[h] for h, r in self.refs.items() if r.key == actor_key]
        device = hosted[0].device or "?"
        for s in hosted:
            for key, value in self.kinds[s.name].actor_env(s).items():
                if key in env and env[key] != value:
                    raise ConfigError.single(
                        f"stages.{s.name}.devices",
                        f"{s.name} needs {key}={value} in the process of {device}'s actor, and "
                        f"{wanted_by[key]}, placed there too, needs {key}={env[key]}",
                        "place the two stages on different devices",
                    )
                env[key], wanted_by[key] = value, s.name
        local = device.rpartition("/")[2]  # a cluster's desktop/gpu:1 is GPU 1 of its node
        if local.startswith("gpu:"):
            # Placement is by our own resource, not Ray's num_gpus, so Ray does not
            # pick the GPU for the actor: name it, so gpu:1's engine lands on GPU 1.
            env["CUDA_VISIBLE_DEVICES"] = local.split(":", 1)[1]
        return {**ACTOR_NICENESS_ENV, **env}

    def start(self, progress: startup_mod.ProgressCallback | None = None) -> None:
        """Start (or join) Ray, create the ledger and device actors, load every stage
        (``orchestrator.runtime.startup``: its guarantees, and ``progress``); then the
        supervisor watches them (``supervisor.py``). A started runtime is not started again
        (its actors and supervisor stay the ones it has)."""
        if self.ledger is not None and not self._closed:
            return
        startup_mod.start(self, progress)
        self.supervisor = Supervisor(self)
        self.supervisor.start()

    def lose_device(self, device: str, why: str) -> None:
        """``device`` is gone for good (a driver reset the caller's own probe saw, a device
        taken away): its actor, when it dies, is never restarted there; its stages whose
        ``on_device_loss`` is ``fallback`` move to their next device (``supervisor.py``)."""
        self.lost_devices = {**self.lost_devices, device: why}

    # -- requests ------------------------------------------------------------------
    async def stream(
        self,
        request: Request,
        *,
        request_id: str | None = None,
        entry: str | None = None,
        context: Mapping[str, Sequence[Item]] | None = None,
        conversation: str | None = None,
    ) -> AsyncIterator[Event]:
        """Run one request (its record: ``stages.requests``); yield its events as they happen
        (see ``events``).

        ``conversation``: the id of the conversation this request is a turn of (a realtime
        session's): a stage with replicas whose kind keeps state across turns
        (``StageKind.replica_affinity``) serves it on the replica its first turn used.

        ``entry``: the request enters the graph at that stage instead (its text is
        cut as the stage's kind takes text, and fed as a producer would feed it);
        only that stage and the stages downstream of it run. ``BadRequest`` when
        the stage does not exist or does not take text, or the request is not text.

        ``context``: items fed to a stage before anything its producers send, by
        stage name (a realtime session's conversation history to the decode stage,
        ``{"thinker": [{"messages": [...]}]}``, which its kind merges with the
        transcript that follows). Each named stage must run for this request and
        take its input from other stages (not the request, not a join)."""
        self._check_started()
        rid = request_id or uuid.uuid4().hex[:12]
        if context:
            requests.check_context(self.graph, context, entry)
        # a bad request is refused first
        await asyncio.to_thread(self.validate_request, request, entry)
        await self._until_alive(entry)
        await self.admission.acquire()
        agen = None
        self._count_busy(+1)
        try:
            self._check_alive(entry)
            self.picks[rid] = self.balancer.pick(
                (s.name for s in self.downstream(entry)), conversation
            )
            agen = RequestFlow(self, request, rid, entry, context).run()
            async for event in agen:
                yield event
        finally:
            try:
                if agen is not None:
                    await agen.aclose()
            finally:
                self.balancer.release(self.picks.pop(rid, {}))
                self._count_busy(-1)
                self.admission.release()

    def _check_started(self) -> None:
        if self._closed or self.ledger is None:
            raise RuntimeError("the runtime is not started (or already closed)")

    def _check_alive(self, entry: str | None = None) -> None:
        """Every stage the request needs serves now: ``StageFailed`` otherwise (a stage coming
        back: ``stage_restarting``; one that will not: its code)."""
        self._check_started()
        waiting = failures.check_alive(self, entry)
        if waiting:
            raise self._restarting(waiting[0], 0.0)

    async def _until_alive(self, entry: str | None = None) -> None:
        """Wait, holding no slot, while a stage the request needs is coming back (restarting,
        moving), at most the admission's wait; then ``StageFailed`` (``stage_restarting``)."""
        self._check_started()
        t0 = time.monotonic()
        if not failures.check_alive(self, entry):
            return
        with self._busy_lock:
            self.waiting_for_stages += 1
        try:
            while waiting := failures.check_alive(self, entry):
                waited = time.monotonic() - t0
                if waited >= self.admission.wait_timeout_s:
                    raise self._restarting(waiting[0], waited)
                await asyncio.sleep(RECOVERY_POLL_S)
                self._check_started()
        finally:
            with self._busy_lock:
                self.waiting_for_stages -= 1

    def _restarting(self, stage: str, waited: float) -> StageFailed:
        ref = self.replicas[stage][0]
        status = self.supervisor.status(ref.holder) if self.supervisor else None
        attempt = status.get("attempt") if status else None
        said = f"restart {attempt}" if attempt is not None else "moving"
        died = status.get("cause", "?") if status else "?"
        cause = f"the stage is coming back ({said}; it died: {died})"
        if waited:
            cause += f"; it was not back within {waited:.0f} s"
        return StageFailed(stage, ref.device, cause, code="stage_restarting")

    def _count_busy(self, step: int) -> None:
        """One request more (+1) or less (-1) in flight: the driver's CPU seconds are counted
        from the first one's start to the last one's end (``driver_stats["cpu_s"]``)."""
        with self._busy_lock:
            if step > 0 and self._busy[0] == 0:
                self._busy[1] = time.process_time()
            self._busy[0] += step
            if step < 0 and self._busy[0] == 0:
                self.driver_stats["cpu_s"] += time.process_time() - self._busy[1]

    def entry_stages(self, payload: str = "text") -> list[str]:
        """The stages a request of ``payload`` may enter at (``graph.PipelineGraph``)."""
        return self.graph.entry_stages(payload)

    def downstream(self, entry: str | None) -> list[StagePlan]:
        """The stages a request entering at ``entry`` runs (all of them for None), in graph order."""
        return self.graph.downstream(entry)

    def validate_request(self, request: Request, entry: str | None = None) -> None:
        """``BadRequest`` before anything is sent to an actor (``requests.validate_request``)."""
        requests.validate_request(self.graph, request, entry)

    def sentence_chunker(self, consumer: str) -> SentenceChunker:
        """The chunker for text fed to ``consumer`` (``graph.PipelineGraph.sentence_chunker``)."""
        return self.graph.sentence_chunker(consumer)

    # -- failures ------------------------------------------------------------------
    def map_failure(
        self, exc: BaseException, stage: str, dev: _Device, doing: str = ""
    ) -> BaseException:
        """A Ray error as the stage's failure (``failures.map_failure``)."""
        return failures.map_failure(self, exc, stage, dev, doing)

    async def stage_failures(self, timeout_s: float) -> dict[str, StageHealth]:
        """Stages whose engine stopped inside a living actor (``failures.stage_failures``)."""
        return await failures.stage_failures(self, timeout_s)

    def kill_device(self, device: str) -> None:
        """Kill a device actor's process (what a crash or an OOM kill does). For tests
        and drills: the runtime notices through the next call that touches it."""
        import ray

        ray.kill(self.devices[device].actor, no_restart=True)

    def kill_replica(self, stage: str, index: int) -> None:
        """Kill the actor of ``stage``'s replica ``index`` (0-based), as ``kill_device`` does."""
        import ray

        ray.kill(self.devices[self.replicas[stage][index].key].actor, no_restart=True)

    # -- inspection and closing ----------------------------------------------------
    def ledger_snapshot(self) -> ActorSnapshot:
        """The ledger actor's pools and holders now (``closing.ledger_snapshot``)."""
        return closing.ledger_snapshot(self)

    def measure(self) -> dict[str, MeasuredPeak]:
        """Each live stage's measured peak now, by ledger holder (``closing.measure``)."""
        return closing.measure(self)

    def close(self) -> ActorSnapshot:
        """Stop the supervisor, close every stage, release the pipeline, stop the actors and
        (when this process started it) Ray: ``closing.close``. The final ledger snapshot."""
        if self._closed:
            return self.final_ledger or ActorSnapshot()
        self._closed = True
        if self.supervisor is not None:
            self.supervisor.stop()
        return closing.close(self)


def replica_refs(stages: Sequence[StagePlan]) -> dict[str, list[ReplicaRef]]:
    """Each stage's instances (``StagePlan.placements()``) with their actor keys: the device id,
    or ``device#k`` for the k-th extra replica of a stage on a device that already hosts one
    (its own process: a second engine cannot share the first's process or its threads)."""
    out: dict[str, list[ReplicaRef]] = {}
    for s in stages:
        placed = s.placements()
        seen: dict[str, int] = {}
        refs = []
        for p in placed:
            device = p.device or "?"
            k = seen[device] = seen.get(device, -1) + 1
            key = device if k == 0 else f"{device}#{k}"
            refs.append(ReplicaRef(s.name, p.index, len(placed), p.holder, device, key))
        out[s.name] = refs
    return out


def replica_view(s: StagePlan, p: ReplicaPlan) -> StagePlan:
    """The stage's plan as replica ``p`` (a ``ReplicaPlan``) runs it: its device, backend,
    reservations, engine kwargs and threads; ``s`` itself for a stage of one instance."""
    if not s.replicas:
        return s
    node = {"node": p.node} if p.node else {}
    return dataclasses.replace(
        s,
        device=p.device,
        backend=p.backend,
        route=p.route,
        reservations=p.reservations,
        engine_kwargs=dict(p.engine_kwargs),
        verification=p.verification,
        calibration=p.calibration,
        cpu_threads=p.cpu_threads,
        cpu_threads_from=p.cpu_threads_from,
        replicas=(),
        details={**s.details, **node},
    )
