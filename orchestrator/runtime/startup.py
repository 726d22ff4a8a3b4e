"""Starting a pipeline: Ray, the ledger actor, the device actors, every stage loaded.

:func:`start` is what ``Runtime.start`` does. It guarantees:

* **Actors together.** The ledger actor and every device actor are created
  at once and awaited together (``ready()``), so the start pays for the
  slowest actor, not for their sum. A device no node offers, or an actor that
  cannot start, is a ``StageFailed`` naming the first stage placed there (the
  first such device in plan order); the other actors are stopped. One that
  died before its ``ready()`` says so (code ``device_actor_not_started``; on a
  cluster's node, with Ray's verdict on the node: ``node_death``), distinct from
  one that died later, while loading (``_map``'s ``loading stage X``) or serving.
* **Loads in waves the ledger decides.** Before loading, the runtime asks the
  ledger actor to admit the not-yet-loaded stages together
  (``LedgerService.admit_together``): the longest prefix, in graph order,
  that fits with every stage at its own peak (load path included) at the
  same time. Those load in parallel — in their device actors, several per
  actor when they share a device — and the next wave starts when this one
  has loaded. Where the ledger would not hold two loads at once, stages load
  one at a time in graph order, as each one alone is admitted.
* **A failed load** fails the start with ``StageFailed`` naming the stage (the
  first failed one in graph order); the other loads of its wave are awaited
  (a vLLM engine start cannot be cut short) and closed, so the ledger
  snapshot after the failure (``ledger_history``: ``after failed load X``) is
  as it was before the wave (``before load X``) — the failed stage holds
  nothing — and then everything that started is torn down.
* **Ray's measured memory** replaces the plan's estimate before any stage
  loads (evidence E → M); on a cluster, each node's own, measured on that node,
  in that node's ``host_ram``.
* **Progress through a callback** (``progress``): one :class:`StageProgress`
  per change of a stage — ``waiting`` for all before Ray starts, ``loading``
  when its load is sent, then ``loaded`` or ``failed`` — called on the
  thread that called ``start``. Drawing it is the caller's business.
* **Timings** in ``runtime.startup``: ``ray_init_s``, ``actors_s``,
  ``loads_s`` (the loading phase), ``start_s``, ``stage_load_s`` (per stage:
  seconds from its load being sent to its answer), ``load_waves`` (the stages
  of each wave) and ``loads_parallel`` (whether any wave held two or more).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from orchestrator.core.errors import ConfigError, StageFailed
from orchestrator.core.ledger import (
    PIPELINE_HOLDER,
    AdmissionAnswer,
    Evidence,
    ReservationDoc,
    TogetherAnswer,
)
from orchestrator.core.profile import HOST_RAM, pool_node
from orchestrator.runtime import cluster as cluster_mod
from orchestrator.runtime import cluster_probe, ledger_actor, node_death
from orchestrator.runtime.device_actor import (
    ACTOR_NICENESS_ENV,
    ACTOR_OPTIONS,
    ActorReady,
    StageLoad,
    actor_class,
    refusal,
)
from orchestrator.runtime.joins import JoinSpec

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

    from orchestrator.runtime.device_actor import LoadReport

ACTOR_READY_TIMEOUT_S = 120.0
"""A device actor's worker start plus its imports: seconds when warm, tens of
seconds on a cold small machine; two minutes ends one that cannot start."""
LOAD_TIMEOUT_S = 900.0
"""One stage's load: a first GGUF conversion, a vLLM engine start, an EP compile
(minutes on VitisAI/OpenVINO NPU first use); docs/benchmarks.md has figures."""
PARALLEL_LOADS = True
"""Load what the ledger admits together in parallel. ``bench/startup.py`` sets it
to False to time the same start with every stage loaded one after another."""

State = Literal["waiting", "loading", "loaded", "failed"]


@dataclass(frozen=True)
class StageProgress:
    """One stage's state while the pipeline starts."""

    stage: str
    device: str
    state: State
    seconds: float | None = None
    """For ``loaded`` and ``failed``: seconds since the load was sent."""
    cause: str | None = None
    """For ``failed``: why."""


ProgressCallback = Callable[[StageProgress], None]


class StartupTimings(TypedDict, total=False):
    """``Runtime.startup`` (the run record's ``runtime.startup``): the module docstring's
    timings, each set at its step."""

    ray_init_s: float
    cluster_listens_on: list[str]
    actors_s: float
    loads_s: float
    start_s: float
    stage_load_s: dict[str, float]
    load_waves: list[list[str]]
    loads_parallel: bool


@dataclass
class Device:
    """A started device actor and the stages placed on it."""

    id: str
    actor: ActorHandle
    info: ActorReady
    stages: list[str] = field(default_factory=list)
    dead: str | None = None
    key: str = ""
    """Its actor key: ``id``, or ``id#k`` for the k-th extra replica of a stage on the device."""
    holders: list[str] = field(default_factory=list)
    """The ledger holders it hosts (the stages' names; ``voice#1`` for a replica)."""
    code: str = ""
    """Once dead: the code a request it failed reads (``stage_restarting`` when the supervisor
    brings it back, ``crash_loop``, else ``device_actor_died``): ``runtime.supervisor``."""

    def __post_init__(self) -> None:
        self.key = self.key or self.id
        self.holders = self.holders or list(self.stages)


def start(rt: Any, progress: ProgressCallback | None = None) -> None:
    """Start ``rt`` (a ``Runtime``): see the module docstring. On any failure,
    ``rt.close()`` tears down what started before the error is raised. The actors'
    environments are read-only from here on: Ray fixes an actor's when it creates it, so a
    change made later would be silently ignored."""
    rt.actor_envs = {k: MappingProxyType(dict(v)) for k, v in rt.actor_envs.items()}
    tell = progress or (lambda _event: None)
    for holder, s in rt.views.items():  # a stage, or each of its replicas (voice#1)
        tell(StageProgress(holder, s.device or "?", "waiting"))
    t0 = time.perf_counter()
    devices = list(dict.fromkeys(r.device for r in rt.refs.values()))
    try:
        rt.cluster = cluster_mod.connect(
            devices, address=rt.address, log_to_driver=rt.log_to_driver
        )
    except ConfigError:  # an --address where nothing listens: bad input, not a stage's failure
        raise
    except Exception as exc:
        where = (
            f"join the Ray cluster at {rt.address}" if rt.address else "start a local Ray cluster"
        )
        raise StageFailed(
            rt.stages[0].name, devices[0], f"could not {where}: {cause(exc)}"
        ) from None
    rt.startup["ray_init_s"] = round(rt.cluster.started_s, 3)
    if (
        rt.cluster.listening
    ):  # a joined cluster: where it listens (said at join, kept in the record)
        rt.startup["cluster_listens_on"] = list(rt.cluster.listening)
    try:
        _check_resources(rt, devices)
        t1 = time.perf_counter()
        rt.ledger = ledger_actor.create(
            [p.to_dict() for p in rt.plan.pools],
            runtime_env={"env_vars": dict(ACTOR_NICENESS_ENV)},  # loads wait on its answers
            **_on_this_node(rt),
        )
        # one actor per key (a device; a stage's extra replica on it: its own), started while
        # the ledger answers
        pending = {k: create_actor(rt, k) for k in rt.actor_keys()}
        _admit_pipeline(rt)
        _await_actors(rt, pending)
        connect_actors(rt)
        rt.startup["actors_s"] = round(time.perf_counter() - t1, 3)
        _charge_ray(rt)
        t2 = time.perf_counter()
        _load_all(rt, tell)
        rt.startup["loads_s"] = round(time.perf_counter() - t2, 3)
    except BaseException:
        rt.close()
        raise
    rt.startup["start_s"] = round(time.perf_counter() - t0, 3)


def first_stage_on(rt: Any, device: str) -> str:
    return next(r.stage for r in rt.refs.values() if r.device == device)


def _check_resources(rt: Any, devices: list[str]) -> None:
    missing = rt.cluster.missing(devices)
    if missing:
        d = missing[0]
        res = cluster_mod.device_resource(d)
        raise StageFailed(
            first_stage_on(rt, d),
            d,
            (
                f"no node of the Ray cluster at {rt.cluster.address} offers the resource {res!r} "
                f"that marks device {d}; start the node that has it with "
                f"`ray start --address ... --resources '{_resources_hint(d)}'`"
            ),
        )


def _resources_hint(device: str) -> str:
    """The ``ray start --resources`` JSON that offers ``device`` (and, on a cluster's node, names the node)."""
    node, _, local = device.rpartition("/")
    res = (
        cluster_mod.node_start_resources(node, [local])
        if node
        else {cluster_mod.device_resource(device): 1.0}
    )
    return json.dumps({k: int(v) for k, v in res.items()})


def _admit_pipeline(rt: Any) -> None:
    """The ledger actor up, and the pipeline's own reservations (not Ray's: measured later) held."""
    import ray

    rt.ledger_pid = int(ray.get(rt.ledger.ready.remote(), timeout=ACTOR_READY_TIMEOUT_S))
    shared = [r.to_dict() for r in rt.plan.shared_reservations if r.purpose != "ray_runtime"]
    admission: AdmissionAnswer = ray.get(rt.ledger.admit.remote(PIPELINE_HOLDER, shared))
    if not admission["ok"]:
        s = admission["shortfalls"][0]
        raise StageFailed(
            PIPELINE_HOLDER,
            s["pool"],
            f"the pipeline's own reservations do not fit {s['pool']} (over by {s['over_by']} bytes)",
        )


def _on_this_node(rt: Any) -> dict[str, object]:
    """For a joined cluster: the ledger actor on the driver's node (it needs no resource,
    so it always fits there), so a node that leaves never takes the ledger with it."""
    if not rt.address:
        return {}
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {
        "scheduling_strategy": NodeAffinitySchedulingStrategy(
            ray.get_runtime_context().get_node_id(), soft=False
        )
    }


def create_actor(rt: Any, key: str) -> tuple[ActorHandle, ObjectRef[ActorReady]]:
    """Create the actor of ``key`` (a device id, or ``device#k``: placed by its device's
    resource; not awaited); returns it and its ``ready()`` reference."""
    device = key.partition("#")[0]
    actor = (
        actor_class()
        .options(
            **ACTOR_OPTIONS,
            resources={cluster_mod.device_resource(device): cluster_mod.ACTOR_RESOURCE_UNITS},
            runtime_env={"env_vars": dict(rt.actor_envs[key])},
        )
        .remote(device, rt.ledger, key)
    )
    return actor, actor.ready.remote()


def _await_actors(rt: Any, pending: dict[str, tuple[ActorHandle, ObjectRef[ActorReady]]]) -> None:
    """Every actor's ``ready()`` within one deadline; the ones that answered join
    ``rt.devices`` (so a failure closes them), the first one that did not, in
    plan order, is the ``StageFailed``."""
    import ray

    deadline = time.monotonic() + ACTOR_READY_TIMEOUT_S
    failures: dict[str, tuple[ActorHandle, BaseException]] = {}
    for key, (actor, ready) in pending.items():
        try:
            info = ray.get(ready, timeout=max(0.0, deadline - time.monotonic()))
        except Exception as exc:
            failures[key] = (actor, exc)
            continue
        hosted = [r for r in rt.refs.values() if r.key == key]
        rt.devices[key] = Device(
            hosted[0].device,
            actor,
            info,
            list(dict.fromkeys(r.stage for r in hosted)),
            key=key,
            holders=[r.holder for r in hosted],
        )
    if failures:
        key, (actor, error) = next(iter(failures.items()))
        device = key.partition("#")[0]
        stage = first_stage_on(rt, device)
        # said before the actors are killed, while Ray's actor table still says where it ran
        why = _not_started(stage, device, actor, error)
        for other, _ in failures.values():
            with contextlib.suppress(Exception):
                ray.kill(other)
        raise StageFailed(stage, device, why, code="device_actor_not_started")


def connect_actors(rt: Any, more: dict[str, ActorHandle] | None = None) -> None:
    """Hand every live device actor (and ``more``: key → a new actor not yet among them, a
    restarted one) the others' handles, the stages' routes and the joins, so a producer's
    actor feeds its consumers' itself (``runtime.STREAMING == "direct"``); note the node this
    process runs on (the record's ``runtime.streaming``). A restart calls it again: every
    actor then feeds the new one."""
    import ray

    rt.driver_node = ray.get_runtime_context().get_node_id()
    peers = {key: dev.actor for key, dev in rt.devices.items() if not dev.dead}
    peers.update(more or {})
    joins = {
        name: JoinSpec(name, join, tuple(rt.plan.stage(name).inputs))
        for name, join in rt.joins.items()
    }
    ray.get(
        [actor.connect.remote(peers, rt.route_tables, joins) for actor in peers.values()],
        timeout=ACTOR_READY_TIMEOUT_S,
    )


def _not_started(stage: str, device: str, actor: ActorHandle, exc: BaseException) -> str:
    """Why ``device``'s actor did not answer ``ready()``: no answer in time, or it died
    before it was ready (and, on a cluster's node, whether that node died: ``node_death``)."""
    from ray import exceptions as rex

    if isinstance(exc, rex.GetTimeoutError):
        return (
            f"the device actor did not start: no answer within {ACTOR_READY_TIMEOUT_S:.0f} s "
            f"({cause(exc)})"
        )
    if isinstance(exc, (rex.RayActorError, rex.ActorUnavailableError)):
        return node_death.said_before_ready(stage, device, actor, cause(exc))
    return f"the device actor did not start: {cause(exc)}"


def _charge_ray(rt: Any) -> None:
    """Ray's memory, measured now (before any stage loads), replaces its estimate: on one
    machine in ``host_ram``; on a cluster, each node's in that node's ``NODE/host_ram``
    (:func:`_charge_ray_on_nodes`)."""
    pids = [d.info["pid"] for d in rt.devices.values()] + ([rt.ledger_pid] if rt.ledger_pid else [])
    rt.ray_memory = cluster_mod.ray_memory(rt.cluster, pids)
    if any(p.id == HOST_RAM for p in rt.plan.pools):
        _replace_ray(rt, HOST_RAM, int(rt.ray_memory["bytes"]), "M", rt.ray_memory["measure"])
    elif any(r.purpose == "ray_runtime" for r in rt.plan.shared_reservations):
        _charge_ray_on_nodes(rt)


def _charge_ray_on_nodes(rt: Any) -> None:
    """A cluster: Ray's memory measured on each node (``cluster_probe.node_ray_memory``: its
    Ray session's processes, this pipeline's actors among them; the driver's growth from
    joining added on the driver's node) charged to that node's ``host_ram`` and kept in
    ``rt.ray_memory["nodes"]`` (what ``record_calibration`` records, one sample per node).
    A node whose measurement failed keeps the plan's figure for it."""
    import ray

    measured = cluster_probe.node_ray_memory()
    here = cluster_mod.node_names().get(ray.get_runtime_context().get_node_id())
    growth = int(rt.cluster.driver_growth_bytes)
    for name, m in measured.items():
        if name == here and growth:
            m["bytes"] = int(m["bytes"]) + growth
            m["measure"] += " + the driver's RSS growth from joining"
    rt.ray_memory["nodes"] = measured
    for planned in rt.plan.shared_reservations:
        if planned.purpose != "ray_runtime":
            continue
        found = measured.get(pool_node(planned.pool) or "")
        if found is None:
            _replace_ray(rt, planned.pool, planned.bytes, planned.evidence, planned.note)
        else:
            _replace_ray(rt, planned.pool, int(found["bytes"]), "M", found["measure"])


def _replace_ray(rt: Any, pool: str, nbytes: int, evidence: Evidence, note: str) -> None:
    """Ray's reservation on ``pool`` in the ledger, replacing what it held there; a
    ``StageFailed`` naming the pool when it does not fit."""
    import ray

    reservation = ReservationDoc(
        pool=pool,
        purpose="ray_runtime",
        bytes=nbytes,
        lifetime="session",
        evidence=evidence,
        note=note,
        at_load=True,
    )
    admission: AdmissionAnswer = ray.get(
        rt.ledger.replace.remote(PIPELINE_HOLDER, "ray_runtime", reservation)
    )
    if not admission["ok"]:
        s = admission["shortfalls"][0]
        raise StageFailed(
            PIPELINE_HOLDER,
            pool,
            f"Ray's {'measured' if evidence == 'M' else 'estimated'} memory ({nbytes} bytes) "
            f"does not fit {pool} (over by {s['over_by']} bytes)",
        )


def _load_all(rt: Any, tell: ProgressCallback) -> None:
    """Every stage loaded, wave by wave, as the ledger admits them together."""
    import ray

    # one load per instance, by ledger holder (a stage, or one replica: voice#1)
    remaining: list[str] = list(rt.views)
    rt.startup["stage_load_s"], rt.startup["load_waves"] = {}, []
    while remaining:
        batch = remaining if PARALLEL_LOADS else remaining[:1]
        snapshot = ray.get(rt.ledger.snapshot.remote())
        answer: TogetherAnswer = ray.get(
            rt.ledger.admit_together.remote(
                [(h, [r.to_dict() for r in rt.views[h].reservations]) for h in batch]
            )
        )
        wave = remaining[: len(answer["admitted"])]
        for h in wave or remaining[:1]:
            rt.ledger_history.append((f"before load {h}", snapshot))
        if not wave:
            h, s = remaining[0], rt.views[remaining[0]]
            failure = StageFailed(s.name, s.device or "?", refusal(answer["shortfalls"][0]))
            tell(StageProgress(h, s.device or "?", "failed", 0.0, failure.cause))
            rt.ledger_history.append(
                (f"after failed load {h}", ray.get(rt.ledger.snapshot.remote()))
            )
            raise failure
        rt.startup["load_waves"].append(list(wave))
        _load_wave(rt, wave, tell)
        remaining = remaining[len(wave) :]
    rt.startup["loads_parallel"] = any(len(w) > 1 for w in rt.startup["load_waves"])


def _load_wave(rt: Any, wave: list[str], tell: ProgressCallback) -> None:
    """Load ``wave`` (ledger holders admitted together) in parallel; every load is awaited,
    and when one failed, the others are closed before the failure is raised."""
    import ray

    sent = time.perf_counter()
    refs: dict[ObjectRef[LoadReport], str] = {}
    for h in wave:
        s, dev = rt.views[h], rt.actor_of(h)
        ref = dev.actor.load_stage.remote(
            StageLoad(
                s,
                rt.config.stage(s.name),
                rt.kinds[s.name],
                rt.routes.get(s.route or ""),
                admitted=True,
                holder=h,
            )
        )
        refs[ref] = h
        tell(StageProgress(h, dev.id, "loading"))
    failures: dict[str, BaseException] = {}
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    waiting = list(refs)
    while waiting:
        done, waiting = ray.wait(
            waiting, num_returns=1, timeout=max(0.0, deadline - time.monotonic())
        )
        if not done:
            for ref in waiting:
                h, s = refs[ref], rt.views[refs[ref]]
                late = StageFailed(
                    s.name,
                    s.device or "?",
                    f"no answer in time: the load took more than {LOAD_TIMEOUT_S:.0f} s",
                )
                failures[h] = late
                seconds = time.perf_counter() - sent
                tell(StageProgress(h, s.device or "?", "failed", seconds, late.cause))
            break
        h = refs[done[0]]
        s, dev = rt.views[h], rt.actor_of(h)
        seconds = round(time.perf_counter() - sent, 3)
        rt.startup["stage_load_s"][h] = seconds
        try:
            rt.load_results[h] = ray.get(done[0])
        except BaseException as exc:
            failures[h] = failure = rt.map_failure(exc, s.name, dev, f"loading stage {h}")
            why = getattr(failure, "cause", str(failure))
            tell(StageProgress(h, dev.id, "failed", seconds, why))
            continue
        tell(StageProgress(h, dev.id, "loaded", seconds))
    if failures:
        _undo_wave(rt, wave, failures)


def _undo_wave(rt: Any, wave: list[str], failures: dict[str, BaseException]) -> None:
    """Close the wave's loaded stages (the ledger as before the wave), note the
    ledger after each failure, raise the first failure in graph order."""
    import ray

    for h in wave:
        dev = rt.actor_of(h)
        if h in rt.load_results and not dev.dead:
            with contextlib.suppress(Exception):
                ray.get(
                    dev.actor.close_stage.remote(rt.views[h].name), timeout=ACTOR_READY_TIMEOUT_S
                )
            rt.load_results.pop(h, None)
    after = ray.get(rt.ledger.snapshot.remote())
    for h in wave:
        if h in failures:
            rt.ledger_history.append((f"after failed load {h}", after))
    first = next(h for h in wave if h in failures)
    raise failures[first] from None


def cause(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    head = next((line for line in text if line.strip()), type(exc).__name__)
    return f"{type(exc).__name__}: {head[:300]}"
