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
  generator, ``device_actor.INPUT_QUEUE_ITEMS`` waiting per stage input.
  Several requests may be in flight; each keeps its order (one generator and
  one input queue per request and stage). A request may enter the graph at a
  stage that takes text (``stream(entry=...)``, e.g. text straight to the
  voice): only that stage and those downstream of it run, and its text is cut
  and fed as a producer's would be.
* **Failures are named and prompt.** A device actor that dies fails every
  request in flight on it with ``StageFailed(stage, device, cause)`` as soon
  as Ray notices (milliseconds after a kill); the stages
  it hosted are released from the ledger; later requests that need it fail at
  once. No request waits on a dead actor.

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
the inputs that take its port (``_routes``, ``_item_port``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Any

import numpy as np

from orchestrator.config import PipelineConfig, sources
from orchestrator.core.errors import (
    BadRequest,
    ConfigError,
    LedgerLost,
    PeerLost,
    PlanRefused,
    StageFailed,
)
from orchestrator.core.ledger import PIPELINE_HOLDER
from orchestrator.core.plan import PipelinePlan, StagePlan
from orchestrator.runtime import cluster as cluster_mod
from orchestrator.runtime import node_death
from orchestrator.runtime import startup as startup_mod
from orchestrator.runtime.admission import (
    Admission,
    calls_per_request,
    replica_caps,
    replicated_limit,
)
from orchestrator.runtime.balance import Balancer, ReplicaRef
from orchestrator.runtime.device_actor import ACTOR_OPTIONS
from orchestrator.runtime.events import AudioChunk, Event, OutputItem, StageEvent, TextDelta
from orchestrator.runtime.hop import FirstChunk
from orchestrator.runtime.joins import Joiner
from orchestrator.runtime.pump import _StagePump
from orchestrator.runtime.router import Route, RouteTable
from orchestrator.runtime.startup import Device as _Device
from stages.base import REQUEST, StageKind
from stages.payloads import Ports, edge_mismatch, request_payload, spell, split_input
from stages.registry import get_kind
from stages.text_chunks import SentenceChunker

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 60.0
STREAMING = "direct"
"""How items go from a stage to its consumers: ``"direct"``, the producer's device actor feeds
the consumer's (``DeviceActor.stream`` with a route; the driver reads only final outputs and
control events); ``"relay"``, every output comes to the driver, which feeds the consumers
(what the runtime did before). Read when a ``Runtime`` is made; ``bench/streaming.py`` and a
test set it to ``"relay"`` to compare the two (docs/runtime.md, "The data path")."""
GENERATOR_BACKPRESSURE = 16
"""Unread outputs a stage may run ahead of the runtime before Ray pauses it."""


class Runtime:
    """A started pipeline: see the module docstring for what it guarantees."""

    def __init__(
        self,
        plan: PipelinePlan,
        config: PipelineConfig,
        *,
        routes: dict[str, Any] | None = None,
        address: str | None = None,
        log_to_driver: bool = False,
        max_waiting: int | None = None,
    ) -> None:
        if not plan.admitted:
            raise PlanRefused(plan)
        self.plan = plan
        self.config = config
        self.routes = routes or {}
        self.address = address
        self.log_to_driver = log_to_driver
        order = [s.name for s in config.topological()]
        self.stages: list[StagePlan] = sorted(
            plan.stages, key=lambda s: order.index(s.name) if s.name in order else len(order)
        )
        self.kinds: dict[str, StageKind] = {s.name: get_kind(s.kind) for s in self.stages}
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
        self._check_graph()
        self.consumers = {
            s.name: [c.name for c in self.stages if s.name in sources(c.inputs)]
            for s in self.stages
        }
        """Stage → the stages that take its output (fan-out: several)."""
        self.stage_ports = {s.name: self._ports(s.name) for s in self.stages}
        """Stage → its payload types (``StageKind.ports``), read once: the pumps look at them per item."""
        self.routes_out = {s.name: self._routes(s.name) for s in self.stages}
        """Stage → its consumers' inputs that name it, each with the output ports it takes (``_routes``)."""
        self.joins: dict[str, str] = {
            s.name: str(self.config.stage(s.name).join) for s in self.stages if len(s.inputs) > 1
        }
        """Fan-in stage → its join (``zip``, ``all`` or ``latest``)."""
        self.route_tables = {s.name: self.route_table(s.name) for s in self.stages}
        """Stage → its ``router.RouteTable``: what a ``Router`` needs to hand its outputs on."""
        self.actor_envs = {key: self._actor_env(key) for key in self.actor_keys()}
        self.devices: dict[str, _Device] = {}
        self.streaming = STREAMING
        """This runtime's data path (``STREAMING`` when it was made)."""
        self.driver_node = ""
        """The Ray node this process runs on (set at start): the record's ``runtime.streaming``."""
        self.driver_stats: dict[str, Any] = {"items_read": 0, "feeds_sent": 0, "cpu_s": 0.0}
        """What this process did for the requests: outputs it read, ``feed`` calls it made, and
        its CPU seconds (``time.process_time``, every thread) while requests were in flight."""
        self._busy = [0, 0.0]  # requests in flight here, process_time when the first began
        self._busy_lock = threading.Lock()
        self.cluster: cluster_mod.Cluster | None = None
        self.ledger: Any = None
        self.load_results: dict[str, dict[str, Any]] = {}
        self.ray_memory: dict[str, Any] = {}
        self.ledger_history: list[tuple[str, dict[str, Any]]] = []
        self.startup: dict[str, Any] = {}
        self.final_ledger: dict[str, Any] | None = None
        self.ledger_pid = 0
        self.ledger_lost: str | None = None
        """Why the ledger actor stopped answering (it died), once something noticed."""
        self._closed = False
        self._admit_by_replica(max_waiting)
        self._picks: dict[str, dict[str, ReplicaRef]] = {}
        """Request → the instance of each stage it runs on (``balance.Balancer.pick``)."""

    def _admit_by_replica(self, max_waiting: int | None) -> None:
        """Admission's limit from the replicas' caps (``admission``: one replica per stage
        gives the per-device limit exactly) and the balancer that picks them."""
        self.calls_per_request = calls_per_request(
            {h: r.key for h, r in self.refs.items()},
            {h: self._feeder(self.plan.stage(r.stage)) for h, r in self.refs.items()},
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

    # -- start ---------------------------------------------------------------------
    def _check_graph(self) -> None:
        names = {s.name for s in self.stages}
        for s in self.stages:
            if not s.inputs:
                raise ConfigError.single(
                    f"stages.{s.name}.inputs",
                    f"{s.name} has no input",
                    "give it inputs: [request] or the stage(s) that feed it",
                )
            if len(s.inputs) > 1:
                join = self.config.stage(s.name).join
                if join is None:
                    raise ConfigError.single(
                        f"stages.{s.name}.join",
                        f"{s.name} has {len(s.inputs)} inputs ({', '.join(s.inputs)}) and no join",
                        "add join: zip, all or latest",
                    )
                if not self.kinds[s.name].stage_takes_join(self.config.stage(s.name)):
                    raise ConfigError.single(
                        f"stages.{s.name}.inputs",
                        f"{s.name} ({s.kind}) has {len(s.inputs)} inputs, and its kind does not take joined items",
                        f"give {s.name} one input, or use a kind that takes a join (StageKind.takes_join)",
                    )
            for entry in s.inputs:
                source, port = split_input(entry)
                if source == REQUEST:
                    continue
                if source not in names:
                    raise ConfigError.single(
                        f"stages.{s.name}.inputs",
                        f"{source!r} is not a stage of this plan",
                        "plan and run the config the plan was made from",
                    )
                takes = self._ports(s.name).consumes
                gives = self._ports(source).port(port) if port else self._ports(source).produces
                if (
                    edge_mismatch(gives, takes) is not None
                ):  # the config loader checked it first: a guard
                    raise ConfigError.single(
                        f"stages.{s.name}.inputs",
                        f"{s.name} ({s.kind}) takes {spell(takes)}, and {source} ({self.plan.stage(source).kind}) "
                        f"yields {spell(gives)}",
                        f"feed {s.name} from a stage that yields {spell(takes)}, or from the request",
                    )

    @staticmethod
    def _feeder(s: StagePlan) -> tuple[str, ...]:
        """Who calls ``feed`` on ``s`` (admission counts the calls): each stage it takes an input
        from (its actor feeds it directly; a fan-in's join runs in ``s``'s own actor)."""
        return tuple(
            dict.fromkeys(split_input(i)[0] for i in s.inputs if split_input(i)[0] != REQUEST)
        )

    def _routes(self, producer: str) -> list[tuple[str, str, frozenset[str] | None]]:
        """``(consumer, input, ports)`` for each input of a consumer that names ``producer``:
        ``thinker.text`` takes port ``text`` only; a plain ``thinker`` takes every port whose
        types the consumer consumes (None for a single-port producer: every item), and every
        item whose port is unknown (``_item_port``), as a plain input always did."""
        ports = self._ports(producer)
        out: list[tuple[str, str, frozenset[str] | None]] = []
        for c in self.consumers[producer]:
            consumes = self._ports(c).consumes
            for entry in self.plan.stage(c).inputs:
                source, port = split_input(entry)
                if source != producer:
                    continue
                if port is not None:
                    out.append((c, entry, frozenset({port})))
                elif len(ports.port_names()) <= 1:
                    out.append((c, entry, None))
                else:
                    out.append(
                        (
                            c,
                            entry,
                            frozenset(
                                p
                                for p in ports.port_names()
                                if edge_mismatch(ports.port(p), consumes) is None
                            ),
                        )
                    )
        return out

    def route_table(self, producer: str) -> RouteTable:
        """``producer``'s routes to its consumers and its final ports, built once (it pickles:
        the direct mode hands it to the producer's actor, ``DeviceActor.connect``)."""
        s = self.plan.stage(producer)
        ports = self.stage_ports[producer]
        final_ports = None
        if s.final_output_type is not None:
            final_ports = frozenset(
                p
                for p in ports.port_names()
                if any(t.kind == s.final_output_type for t in ports.port(p))
            )
        routes = []
        for c, entry, takes in self.routes_out[producer]:
            cs = self.plan.stage(c)
            sentences = self.kinds[c].text_input == "sentences"
            cfg = next((x for x in self.config.stages if x.name == c), None)
            routes.append(
                Route(
                    consumer=c,
                    device=cs.device or "?",
                    entry=entry,
                    ports=takes,
                    sentences=sentences,
                    first_chunk_chars=getattr(cfg, "first_chunk_chars", None),
                    join=c in self.joins,
                    trace=sentences and c not in self.joins,  # the clocks: per request (Router)
                )
            )
        return RouteTable(
            producer=producer,
            device=s.device or "?",
            port_names=tuple(ports.port_names()),
            final_output=bool(s.final_output),
            final_ports=final_ports,
            routes=tuple(routes),
        )

    def _item_port(self, s: StagePlan, item: Any) -> tuple[str | None, Any]:
        """``(port, payload)`` of an item ``s`` yielded (``RouteTable.item_port``)."""
        return self.route_tables[s.name].item_port(item)

    def _ports(self, name: str) -> Ports:
        """The stage's payload types as its config declares them (``StageKind.ports``)."""
        return self.kinds[name].ports(self.config.stage(name))

    def actor_keys(self) -> list[str]:
        """Every device actor's key, in plan order: a device id, or ``device#k`` for the k-th
        extra replica of a stage on that device (its own process)."""
        return list(dict.fromkeys(r.key for rs in self.replicas.values() for r in rs))

    def actor_of(self, holder: str) -> _Device:
        """The started device actor of a ledger holder (a stage, or one replica: ``voice#1``)."""
        return self.devices[self.refs[holder].key]

    def _dev_for(self, stage: str, rid: str) -> _Device:
        """The actor serving ``stage`` for request ``rid``: its picked replica's (else the first)."""
        ref = self._picks.get(rid, {}).get(stage) or self.replicas[stage][0]
        return self.devices[ref.key]

    def _actor_env(self, actor_key: str) -> dict[str, str]:
        """The environment of an actor: what its stages' kinds ask for, merged."""
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
        return env

    def start(self, progress: startup_mod.ProgressCallback | None = None) -> None:
        """Start (or join) Ray, create the ledger and device actors, load every stage
        (``orchestrator.runtime.startup``: its guarantees, and ``progress``)."""
        startup_mod.start(self, progress)

    # -- requests ------------------------------------------------------------------
    async def stream(
        self,
        prompt: Any,
        *,
        request_id: str | None = None,
        entry: str | None = None,
        context: Mapping[str, Sequence[Any]] | None = None,
        conversation: str | None = None,
    ) -> AsyncIterator[Event]:
        """Run one request; yield its events as they happen (see ``events``).

        ``conversation``: the id of the conversation this request is a turn of (a realtime
        session's): a stage with replicas whose kind keeps state across turns
        (``StageKind.replica_affinity``) serves it on the replica its first turn used.

        ``entry``: the request enters the graph at that stage instead (its text is
        cut as the stage's kind takes text, and fed as a producer would feed it);
        only that stage and the stages downstream of it run. ``BadRequest`` when
        the stage does not exist or does not take text, or the prompt is not text.

        ``context``: items fed to a stage before anything its producers send, by
        stage name (a realtime session's conversation history to the decode stage,
        ``{"thinker": [{"messages": [...]}]}``, which its kind merges with the
        transcript that follows). Each named stage must run for this request and
        take its input from other stages (not the request, not a join)."""
        if self._closed or self.ledger is None:
            raise RuntimeError("the runtime is not started (or already closed)")
        rid = request_id or uuid.uuid4().hex[:12]
        if context:
            self._check_context(context, entry)
        await asyncio.to_thread(
            self.validate_request, prompt, entry
        )  # a bad request is refused first
        self._check_alive(entry)
        await self.admission.acquire()
        agen = None
        self._count_busy(+1)
        try:
            self._check_alive(entry)
            self._picks[rid] = self.balancer.pick(
                (s.name for s in self.downstream(entry)), conversation
            )
            agen = self._stream(prompt, rid, entry, context)
            async for event in agen:
                yield event
        finally:
            try:
                if agen is not None:
                    await agen.aclose()
            finally:
                self.balancer.release(self._picks.pop(rid, {}))
                self._count_busy(-1)
                self.admission.release()

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
        """The stages a request of ``payload`` (text, or audio) may enter at (``stream(entry=...)``):
        those that take it as their config declares them (``StageKind.ports``: an exported graph's
        manifest, not the kind's every payload), that are no fan-in, and downstream of which every
        fan-in gets all its inputs (a join would otherwise wait for an input that does not run)."""
        out = []
        for s in self.stages:
            if (
                not any(t.kind == payload for t in self._ports(s.name).consumes)
                or s.name in self.joins
            ):
                continue
            run = {d.name for d in self.downstream(s.name)}
            if all(
                split_input(i)[0] in run
                for j in run
                if j in self.joins
                for i in self.plan.stage(j).inputs
            ):
                out.append(s.name)
        return out

    def downstream(self, entry: str | None) -> list[StagePlan]:
        """The stages a request entering at ``entry`` runs (all of them for None), in graph order."""
        if entry is None:
            return list(self.stages)
        names, todo = {entry}, [entry]
        while todo:
            for c in self.consumers[todo.pop()]:
                if c not in names:
                    names.add(c)
                    todo.append(c)
        return [s for s in self.stages if s.name in names]

    def validate_request(self, prompt: Any, entry: str | None = None) -> None:
        """Let each stage that takes the request check it (``StageKind.validate_request``
        where a kind has one): ``BadRequest`` before anything is sent to an actor.
        With ``entry``: the stage must take the prompt's payload — text that is not blank, or an
        audio item (``{"audio", "sample_rate"}``, checked by the stage's kind: e.g. a segment the
        caller's own VAD cut, entering at the asr stage)."""
        if entry is not None:
            self._validate_entry(prompt, entry)
            return
        carried = request_payload(prompt)
        for s in self.stages:
            if REQUEST not in s.inputs:
                continue
            takes = self._ports(s.name).consumes
            kinds = {t.kind for t in takes}
            fits = carried in kinds or (
                carried == "tensor"
                and "token_ids" in kinds
                and getattr(getattr(prompt, "dtype", None), "kind", "") in ("i", "u")
            )
            # a text or audio stage's own check names what it takes (its kind's words); arrays, and
            # the stages that take neither, are checked here
            if not fits and (carried in ("tensor", "token_ids") or not kinds & {"text", "audio"}):
                came = {
                    "text": "text",
                    "audio": "audio",
                    "tensor": "a tensor",
                    "token_ids": "token ids",
                }.get(carried or "", f"a {type(prompt).__name__} (no payload a request carries)")
                raise BadRequest.single(
                    "request",
                    f"{came} came, and {s.name} ({s.kind}), which takes the request, consumes {spell(takes)}",
                    f"send {spell(takes)}: text as a string, audio as {{'audio', 'sample_rate'}}, a tensor as a numpy "
                    "array or a mapping of the graph's input names to arrays (docs/pipelines.md#request-payloads)",
                )
            hook = getattr(self.kinds[s.name], "validate_request", None)
            if callable(hook):
                hook(s, self.config.stage(s.name), prompt)

    def _validate_entry(self, prompt: Any, entry: str) -> None:
        payload = "audio" if isinstance(prompt, Mapping) and "audio" in prompt else "text"
        takers = self.entry_stages(payload)
        if entry not in takers:
            what = (
                "is not a stage of this pipeline"
                if entry not in self.kinds
                else (f"({self.plan.stage(entry).kind}) does not take {payload}")
            )
            raise BadRequest.single(
                "entry",
                f"{entry!r} {what}",
                f"enter at a stage that takes {payload}: {', '.join(takers) or 'none has one'}",
            )
        if payload == "audio":
            hook = getattr(self.kinds[entry], "validate_request", None)
            if callable(hook):
                hook(self.plan.stage(entry), self.config.stage(entry), prompt)
            return
        if not isinstance(prompt, str) or not prompt.strip():
            raise BadRequest.single(
                "prompt",
                f"{type(prompt).__name__ if not isinstance(prompt, str) else 'blank text'}: "
                f"stage {entry!r} takes text",
                "send the text to speak",
            )

    def _check_context(self, context: Mapping[str, Sequence[Any]], entry: str | None) -> None:
        runs = {s.name for s in self.downstream(entry)}
        for name in context:
            if name not in runs:
                raise BadRequest.single(
                    f"context.{name}",
                    "is not a stage this request runs",
                    f"name one of {', '.join(sorted(runs))}",
                )
            inputs = list(self.plan.stage(name).inputs)
            if REQUEST in inputs or name in self.joins or name == entry:
                raise BadRequest.single(
                    f"context.{name}",
                    "takes the request itself or joins several inputs: "
                    "context is for a stage fed by one other stage",
                    "put what it needs into the request instead",
                )

    def _check_alive(self, entry: str | None = None) -> None:
        """``StageFailed`` when a stage the request needs (``downstream(entry)``) sits on a dead
        actor — with replicas, when every replica's actor is dead."""
        if self._closed or self.ledger is None:
            raise RuntimeError("the runtime is not started (or already closed)")
        for s in self.downstream(entry):
            refs = self.replicas[s.name]
            if any(not self.devices[r.key].dead for r in refs):
                continue
            dev = self.devices[refs[0].key]
            if len(refs) == 1:
                raise StageFailed(s.name, dev.id, f"its device actor died earlier: {dev.dead}")
            raise StageFailed(
                s.name,
                dev.id,
                f"the device actors of all {len(refs)} replicas died earlier "
                f"({', '.join(self.devices[r.key].id for r in refs)}); the first: {dev.dead}",
            )

    async def _stream(
        self,
        prompt: Any,
        rid: str,
        entry: str | None = None,
        context: Mapping[str, Sequence[Any]] | None = None,
    ) -> AsyncGenerator[Event, None]:
        """One request's events: every stage's stream opened (direct: each with its route,
        which carries its context), a pump per stage (relay: the context fed first, and a
        feeder per join), a feeder for a fed entry stage, the events relayed as they come
        until the last one or a failure (``_watch``), then the request wound down."""
        t0 = time.perf_counter()
        events: asyncio.Queue[Any] = asyncio.Queue()
        chunks_in: dict[str, list[str]] = {c: [] for c in self.consumers}
        stages = self.downstream(entry)
        direct = self.streaming == "direct"
        joiners = {  # the relay joins in the driver; the direct mode in the fan-in's actor
            s.name: Joiner(s.name, s.device or "?", self.joins[s.name], s.inputs)
            for s in stages
            if s.name in self.joins and not direct
        }
        gens = self._open_streams(stages, prompt, rid, entry, chunks_in, context, direct)
        if not direct:
            await self._feed_context(context, rid)
        # sentence consumer -> its first chunk, as its producer's pump saw it
        firsts: dict[str, FirstChunk] = {}
        tasks = [
            asyncio.create_task(
                self._pump(s, gens[s.name], rid, t0, events, chunks_in, joiners, firsts, direct),
                name=f"{rid}:{s.name}",
            )
            for s in stages
        ]
        for name, joiner in joiners.items():
            tasks.append(
                asyncio.create_task(
                    self._feed_joined(
                        self.plan.stage(name), rid, joiner, prompt if entry is None else None
                    ),
                    name=f"{rid}:{name}:join",
                )
            )
        if entry is not None and list(stages[0].inputs) != [REQUEST]:
            tasks.append(
                asyncio.create_task(
                    self._feed_entry(stages[0], rid, prompt, chunks_in), name=f"{rid}:in"
                )
            )
        finished = asyncio.create_task(self._watch(tasks, events))
        done = False
        try:
            while True:
                item = await events.get()
                if item is None:
                    done = True
                    break
                if isinstance(item, BaseException):
                    done = True
                    raise item
                yield item
        finally:
            await self._wind_down(rid, tasks, finished, clean=done)

    def _open_streams(
        self,
        stages: list[StagePlan],
        prompt: Any,
        rid: str,
        entry: str | None,
        chunks_in: dict[str, list[str]],
        context: Mapping[str, Sequence[Any]] | None = None,
        direct: bool = False,
    ) -> dict[str, Any]:
        """Each stage's output stream for request ``rid`` (a Ray streaming generator per stage,
        opened at once): a stage that takes the request alone gets it as its ``initial`` input
        (an entry stage: cut as its kind takes text); the others are fed. ``direct``: each
        stream gets its route (its context, first in its input; a fan-in's request item), and
        its actor feeds its consumers itself."""
        gens = {}
        to = {name: ref.key for name, ref in self._picks.get(rid, {}).items()}
        for s in stages:
            dev = self._dev_for(s.name, rid)
            alone = list(s.inputs) == [REQUEST]
            if s.name == entry:
                # fed by the runtime (_feed_entry), unless it takes the request (then: no feed call
                # is counted for it)
                initial = self._cut(entry, prompt, chunks_in) if alone else None
            else:
                initial = [prompt] if alone else None
            route = None
            if direct:
                route = {
                    "to": to,
                    "context": list((context or {}).get(s.name, [])),
                    "request_item": prompt if entry is None else None,
                }
            gens[s.name] = dev.actor.stream.options(
                num_returns="streaming",
                _generator_backpressure_num_objects=GENERATOR_BACKPRESSURE,
            ).remote(s.name, rid, initial, route)
        return gens

    async def _feed_context(self, context: Mapping[str, Sequence[Any]] | None, rid: str) -> None:
        """Feed each named stage its context items, before the stages that produce for it have
        started their pumps; a failure cancels the request everywhere."""
        try:
            for name, items in (context or {}).items():
                for item in items:
                    await self._feed(self.plan.stage(name), rid, item)
        except BaseException:
            self._cancel_everywhere(rid)
            raise

    async def _wind_down(
        self, rid: str, tasks: list[asyncio.Task[Any]], finished: asyncio.Task[Any], clean: bool
    ) -> None:
        """The request's stream is over: unless it ended ``clean`` (its last event read) with
        every task done, its tasks and its work on every actor are cancelled; then its tasks
        are awaited."""
        if not clean or any(not t.done() for t in tasks):
            for t in tasks:
                t.cancel()
            self._cancel_everywhere(rid)
        finished.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t

    def _sentence_chunker(self, consumer: str) -> SentenceChunker:
        """The chunker for text fed to ``consumer``: sentences, its first chunk cut early when its
        config names ``first_chunk_chars`` (a voice that starts on a few words)."""
        cfg = next((s for s in self.config.stages if s.name == consumer), None)
        return SentenceChunker(first_max_chars=getattr(cfg, "first_chunk_chars", None))

    def _cut(self, stage: str, text: str, chunks_in: dict[str, list[str]]) -> list[str]:
        """``text`` as ``stage``'s kind takes it: sentences, or whole."""
        if self.kinds[stage].text_input != "sentences":
            return [text]
        chunker = self._sentence_chunker(stage)
        chunks = [*chunker.feed(text), *chunker.flush()]
        chunks_in.setdefault(stage, []).extend(chunks)
        return chunks

    async def _feed_entry(
        self, s: StagePlan, rid: str, prompt: Any, chunks_in: dict[str, list[str]]
    ) -> None:
        """Feed an entry stage its prompt the way its producer would: text chunk by chunk (an
        audio item whole), then the end."""
        for chunk in self._cut(s.name, prompt, chunks_in) if isinstance(prompt, str) else [prompt]:
            await self._feed(s, rid, chunk)
        await self._call(s, "end_input", rid)

    async def _feed_joined(self, s: StagePlan, rid: str, joiner: Joiner, prompt: Any) -> None:
        """Feed a fan-in stage its joined items, then its end (once every input has ended).
        A ``request`` input contributes the prompt as its one item."""
        if REQUEST in s.inputs:
            await joiner.put(REQUEST, prompt)
            await joiner.end(REQUEST)
        async for item in joiner.joined():
            await self._feed(s, rid, item)
        await self._call(s, "end_input", rid)

    async def _watch(self, tasks: list[asyncio.Task[Any]], events: asyncio.Queue[Any]) -> None:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            failed = [t for t in done if not t.cancelled() and t.exception() is not None]
            if failed:
                for t in pending:
                    t.cancel()
                events.put_nowait(failed[0].exception())
                return
        events.put_nowait(None)

    def _cancel_everywhere(self, rid: str) -> None:
        for dev in self.devices.values():
            if not dev.dead:
                with contextlib.suppress(Exception):
                    dev.actor.cancel.remote(rid)

    async def _pump(
        self,
        s: StagePlan,
        gen: Any,
        rid: str,
        t0: float,
        events: asyncio.Queue[Any],
        chunks_in: dict[str, list[str]],
        joiners: dict[str, Joiner] | None = None,
        firsts: dict[str, FirstChunk] | None = None,
        direct: bool = False,
    ) -> None:
        """Read one stage's outputs (a :class:`_StagePump`): emit its events, feed its consumers (a
        fan-in consumer through its ``Joiner``, which combines this input with its others), then
        end their input and say the stage is done with its stats.
        ``firsts``: the first-audio trace of each sentence edge (``orchestrator.runtime.hop``),
        filled by a producer's pump and read by its consumer's."""
        pump = _StagePump(
            self,
            s,
            rid,
            t0,
            events,
            chunks_in,
            joiners or {},
            {} if firsts is None else firsts,
            direct=direct,
        )
        try:
            await pump.read(gen)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            dev = self._dev_for(s.name, rid)
            raise await asyncio.to_thread(
                self._map, exc, s.name, dev, f"serving request {rid}"
            ) from None
        await pump.end()
        end = time.perf_counter() - t0
        events.put_nowait(StageEvent(s.name, "done", rid, end, pump.done_stats(end)))

    async def _feed(self, c: StagePlan, rid: str, item: Any) -> None:
        self.driver_stats["feeds_sent"] += 1
        await self._call(c, "feed", rid, [item])

    async def _call(self, c: StagePlan, method: str, rid: str, *args: Any) -> None:
        dev = self._dev_for(c.name, rid)
        try:
            await getattr(dev.actor, method).remote(c.name, rid, *args)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise await asyncio.to_thread(
                self._map, exc, c.name, dev, f"serving request {rid}"
            ) from None

    @staticmethod
    def _event(s: StagePlan, payload: Any, rid: str, t: float, index: int) -> Event:
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

    # -- failures ------------------------------------------------------------------
    def _map(self, exc: BaseException, stage: str, dev: _Device, doing: str = "") -> BaseException:
        """A Ray error → ``StageFailed`` (stage, device, cause); an actor death (``doing``:
        what the actor was doing) is said by ``node_death`` — which may wait for Ray's
        verdict on its node, so an event loop calls this in a thread — and releases the
        stages that actor hosted. A ``StageFailed`` raised in an actor arrives as the
        cause of a ``RayTaskError`` (which Ray makes an instance of the cause's class
        too, with its own ``cause``), so that is looked at first."""
        from ray import exceptions as rex

        if isinstance(exc, rex.RayTaskError) and isinstance(exc.cause, PeerLost):
            # the producer's actor could not feed its consumer's: that actor died (direct mode)
            lost = exc.cause
            peer = self.devices.get(lost.actor_key, dev)
            if not peer.dead:
                self._device_died(peer, node_death.said(lost.stage, peer, doing, lost.cause))
            return self._died(lost.stage, peer)
        if isinstance(exc, rex.RayTaskError):
            cause = exc.cause
            if isinstance(cause, (StageFailed, ConfigError)):
                return cause
            if cause is not None and not isinstance(cause, rex.RayActorError):
                return StageFailed(stage, dev.id, f"{type(cause).__name__}: {cause}")
        if isinstance(exc, (rex.RayActorError, rex.ActorUnavailableError)) or (
            isinstance(exc, rex.RayTaskError) and isinstance(exc.cause, rex.RayActorError)
        ):
            if not dev.dead:
                self._device_died(dev, node_death.said(stage, dev, doing, _cause(exc)))
            return self._died(stage, dev)
        if isinstance(exc, rex.GetTimeoutError):
            return StageFailed(stage, dev.id, f"no answer in time: {exc}")
        if isinstance(exc, StageFailed):
            return exc
        return StageFailed(stage, dev.id, f"{type(exc).__name__}: {exc}")

    def _died(self, stage: str, dev: _Device) -> StageFailed:
        """The ``StageFailed`` of a request whose ``stage`` ran on ``dev``, which died: for a
        stage with replicas, its cause names the replica (``replica 2 of 2 (voice#1) on cpu``)."""
        ref = next((r for r in self.replicas.get(stage, []) if r.key == dev.key), None)
        said = ref.said() if ref is not None else ""
        cause = f"{said} on {dev.id}: {dev.dead or ''}" if said else dev.dead or ""
        return StageFailed(stage, dev.id, cause, code="device_actor_died")

    def _device_died(self, dev: _Device, reason: str) -> None:
        """``dev``'s actor died: marked dead, the holders it hosted released (a replica's
        siblings keep theirs), no request picks it again and admission's limit is lowered to
        what the live replicas hold (slots already held are kept)."""
        if dev.dead:
            return
        dev.dead = reason
        log.error("device actor %s (%s) died: %s", dev.key, dev.id, reason)
        for holder in dev.holders:
            if self.ledger is not None:
                with contextlib.suppress(Exception):
                    self.ledger.release.remote(holder)
        self.balancer.mark_dead(dev.key)
        self.admission.set_limit(
            replicated_limit(self.replica_caps, self.stage_keys, self.balancer.dead)
        )

    async def stage_failures(self, timeout_s: float) -> dict[str, dict[str, Any]]:
        """Stages whose engine stopped inside a living device actor (``DeviceActor.health``):
        ledger holder (the stage's name; a replica's, ``voice#1``) → ``{"code", "message"}``. An actor that does not answer within ``timeout_s``
        is left out (a busy actor is not a failed one; a dead one is ``dev.dead``)."""
        live = [dev for dev in self.devices.values() if not dev.dead]

        async def ask(dev: _Device) -> dict[str, dict[str, Any]]:
            try:
                return dict(
                    await asyncio.wait_for(_awaitable(dev.actor.health.remote()), timeout_s)
                )
            except (
                Exception
            ) as exc:  # dead (noticed by the next request) or slow: not this call's to decide
                log.debug("device actor %s did not report its health: %s", dev.id, exc)
                return {}

        out: dict[str, dict[str, Any]] = {}
        for dev, found in zip(live, await asyncio.gather(*(ask(dev) for dev in live)), strict=True):
            for stage, failure in found.items():
                holder = next((h for h in dev.holders if self.refs[h].stage == stage), stage)
                out[holder] = failure
        return out

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
    def ledger_snapshot(self) -> dict[str, Any]:
        """The ledger actor's pools and holders now (after close: as it was at close).
        ``LedgerLost`` when the ledger actor is gone."""
        import ray

        if self.ledger is None:
            if self.ledger_lost:
                raise LedgerLost(self.ledger_lost)
            return self.final_ledger or {}
        try:
            return dict(ray.get(self.ledger.snapshot.remote(), timeout=CLOSE_TIMEOUT_S))
        except Exception as exc:
            self.ledger_lost = self.ledger_lost or _cause(exc)
            raise LedgerLost(self.ledger_lost) from None

    def measure(self) -> dict[str, dict[str, Any]]:
        """Each live stage's measured peak now (after its requests), next to its budget, by
        ledger holder (the stage's name; ``voice#1`` for a replica)."""
        import ray

        out = {}
        for dev in self.devices.values():
            if dev.dead:
                continue
            for holder in dev.holders:
                if holder in self.load_results:
                    stage = self.refs[holder].stage
                    with contextlib.suppress(Exception):
                        out[holder] = ray.get(
                            dev.actor.measure.remote(stage), timeout=CLOSE_TIMEOUT_S
                        )
        return out

    def close(self) -> dict[str, Any]:
        """Close every stage (releasing its reservations), release the pipeline's own,
        stop the actors and, when this process started Ray, Ray. Returns the final
        ledger snapshot (every pool should hold zero bytes)."""
        import ray

        if self._closed:
            return self.final_ledger or {}
        self._closed = True
        for dev in reversed(list(self.devices.values())):
            if dev.dead:
                continue
            try:
                ray.get(dev.actor.close.remote(), timeout=CLOSE_TIMEOUT_S)
            except Exception as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, LedgerLost) or isinstance(exc, LedgerLost):
                    # its stages are closed; what failed was telling the ledger
                    self.ledger_lost = self.ledger_lost or (cause or exc).cause  # type: ignore[union-attr]
                    continue
                log.warning("closing the device actor for %s failed: %s", dev.id, _cause(exc))
                self._device_died(dev, f"failed to close: {_cause(exc)}")
        if self.ledger is not None:
            try:
                for (
                    dev
                ) in self.devices.values():  # a dead actor's stages, in case its release raced
                    for name in dev.holders:
                        self.ledger.release.remote(name)
                ray.get(self.ledger.release.remote(PIPELINE_HOLDER), timeout=CLOSE_TIMEOUT_S)
                self.final_ledger = dict(
                    ray.get(self.ledger.snapshot.remote(), timeout=CLOSE_TIMEOUT_S)
                )
            except Exception as exc:
                self.ledger_lost = self.ledger_lost or _cause(exc)
                log.warning("the ledger actor did not answer at close: %s", self.ledger_lost)
        for dev in self.devices.values():
            with contextlib.suppress(Exception):
                ray.kill(dev.actor, no_restart=True)
        if self.ledger is not None:
            with contextlib.suppress(Exception):
                ray.kill(self.ledger, no_restart=True)
        self.ledger = None
        if self.cluster is not None:
            cluster_mod.release()
            self.cluster = None
        return self.final_ledger or {}


async def _awaitable(ref: Any) -> Any:
    return await ref


def _cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    head = next((line for line in text if line.strip()), type(exc).__name__)
    return f"{type(exc).__name__}: {head[:300]}"


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


def replica_view(s: StagePlan, p: Any) -> StagePlan:
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
