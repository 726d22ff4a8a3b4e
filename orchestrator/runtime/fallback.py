"""A fallback the user named: one stage moved to the next device of its list when its own is
gone for good (``on_device_loss: fallback``; the supervisor decides when: ``runtime.supervisor``).

:func:`move` guarantees:

* **The same checks as any placement.** The stage alone is planned again
  (:func:`replanner`: the planner's candidates in the stage's ``devices`` order, the lost
  devices masked, the EP coverage and numeric gates read from evidence and run where a
  placement has none, the measurement store's peaks), and its new placement is admitted by the
  live ledger beside what the pipeline holds now: a stage that fits nowhere is refused with
  the usual codes and stays down, holding nothing.
* **Its own actor.** The moved stage loads in a new device actor of its own (``cpu#1`` beside
  the ``cpu`` actor that may be there), with its kind's environment; every live actor is handed
  it, so producers feed it directly.
* **Never silent.** A log line names the stage, both devices and why; the runtime's plan
  (``/v1/plan``), its tables and the balancer show the new placement; the supervisor keeps the
  move (``/health``'s ``moved``, ``stage_moves_total``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypedDict

from orchestrator.config import PipelineConfig
from orchestrator.core.errors import StageFailed
from orchestrator.core.plan import StagePlan
from orchestrator.planner import plan_pipeline, verification_refusals
from orchestrator.runtime import startup as startup_mod
from orchestrator.runtime.admission import calls_per_request, replica_caps, replicated_limit
from orchestrator.runtime.balance import ReplicaRef
from orchestrator.runtime.device_actor import (
    ACTOR_NICENESS_ENV,
    ACTOR_OPTIONS,
    LoadReport,
    StageLoad,
)
from orchestrator.runtime.startup import ACTOR_READY_TIMEOUT_S, LOAD_TIMEOUT_S, Device
from orchestrator.verify.run import verify_pipeline
from stages.base import REQUEST

if TYPE_CHECKING:
    from ray import ObjectRef

log = logging.getLogger(__name__)

Replan = Callable[[str, frozenset[str]], StagePlan]
"""``replan(stage, lost)``: the stage alone planned again with ``lost`` (device ids, or node
names) masked; an admitted ``StagePlan`` of one instance, or ``StageFailed`` naming why not."""


def replanner(
    config: PipelineConfig,
    profile: Any,
    mask: frozenset[str] = frozenset(),
    calibration: Any = None,
    server: bool = False,
) -> Replan:
    """The re-planning of one stage on ``profile`` (a ``HardwareProfile``; the user's ``mask``
    kept masked), as ``admit_plan`` plans: the plan, the gates run for a placement without
    evidence, and the plan again with what they refused."""

    def replan(stage: str, lost: frozenset[str]) -> StagePlan:
        alone = _alone(config, stage)
        masked = frozenset(mask) | lost
        plan = plan_pipeline(alone, profile, mask=masked, calibration=calibration, server=server)
        found = plan.stage(stage)
        if found.admitted and any(
            p.verification is not None and p.verification.status == "unverified"
            for p in found.placements()
        ):
            report = verify_pipeline(alone, profile, mask=masked)
            refused = verification_refusals(getattr(report, "results", None) or [])
            plan = plan_pipeline(
                alone,
                profile,
                mask=masked,
                refused=refused,
                calibration=calibration,
                server=server,
            )
            found = plan.stage(stage)
        if not found.admitted:
            why = "; ".join(f"{r.device}: {r.code} ({r.message})" for r in found.refusals)
            raise StageFailed(stage, "-", f"no other device of its list takes it: {why}")
        return dataclasses.replace(found, inputs=tuple(config.stage(stage).inputs))

    return replan


def _alone(config: PipelineConfig, stage: str) -> PipelineConfig:
    """A pipeline of ``stage`` alone, taking the request (its producers are not re-planned),
    one instance: what the planner plans for its move."""
    cfg = config.stage(stage).model_copy(update={"inputs": [REQUEST], "replicas": 1, "join": None})
    return PipelineConfig.model_construct(
        name=config.name, description=config.description, stages=[cfg], source=config.source
    )


Move = TypedDict(
    "Move",
    {
        "stage": str,
        "holder": str,
        "from": str,
        "to": str,
        "why": str,
        "at": str,
        "seconds": float,
    },
)
"""A stage moved to another device, as ``/health`` says it (``moved``): the stage and its ledger
holder, the device it left and the one it runs on now, why, when (UTC) and the seconds the move
took."""


@dataclasses.dataclass(frozen=True)
class Moved:
    """What :func:`move` did: the new actor's key, its device and the move as said."""

    key: str
    to: str
    said: Move


def move(rt: Any, holder: str, from_device: str, why: str, get: Callable[..., list[Any]]) -> Moved:
    """Move ``holder`` off ``from_device`` (gone: ``why``) onto the next device of its stage's
    list (the module's guarantees); ``get(refs, timeout_s, what)`` waits on Ray as the
    supervisor does (a stop ends it). ``StageFailed`` when it fits nowhere."""
    ref: ReplicaRef = rt.refs[holder]
    stage = ref.stage
    replan: Replan | None = getattr(rt, "replan", None)
    if replan is None:
        raise StageFailed(stage, from_device, "the runtime has no profile to plan it again on")
    lost = frozenset({from_device, *getattr(rt, "lost_devices", {})})
    t0 = time.monotonic()
    view = replan(stage, lost)
    device = view.device or "?"
    kind = rt.kinds[stage]
    kind.prepare(
        view, None
    )  # the weights in the form the new backend loads (a GGUF converted once)
    key = _free_key(rt, device)
    rt.actor_envs = {**rt.actor_envs, key: MappingProxyType(_actor_env(rt, view))}
    actor, ready = startup_mod.create_actor(rt, key)
    try:
        info = get([ready], ACTOR_READY_TIMEOUT_S, "start")[0]
        startup_mod.connect_actors(rt, {key: actor})
        load: ObjectRef[LoadReport] = actor.load_stage.remote(
            StageLoad(
                view,
                rt.config.stage(stage),
                kind,
                rt.routes.get(view.route or ""),
                admitted=False,  # the live ledger admits it beside what the pipeline holds now
                holder=holder,
            )
        )
        result = get([load], LOAD_TIMEOUT_S, "load")[0]
    except BaseException:
        _undo(rt, holder, actor)
        raise
    new = ReplicaRef(stage, ref.index, ref.of, holder, device, key)
    _publish(rt, new, view, Device(device, actor, info, [stage], key=key, holders=[holder]))
    rt.load_results = {**rt.load_results, holder: result}
    said = Move(
        {
            "stage": stage,
            "holder": holder,
            "from": from_device,
            "to": device,
            "why": why,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds": round(time.monotonic() - t0, 3),
        }
    )
    log.warning(
        "stage %s moved from %s to %s (on_device_loss: fallback): %s; loaded there in %.1f s",
        holder,
        from_device,
        device,
        why,
        said["seconds"],
    )
    return Moved(key, device, said)


def _free_key(rt: Any, device: str) -> str:
    """An actor key for a new actor on ``device``: ``device``, else ``device#k`` with the
    first ``k`` no actor of the runtime has had."""
    if device not in rt.devices:
        return device
    k = 1
    while f"{device}#{k}" in rt.devices:
        k += 1
    return f"{device}#{k}"


def _actor_env(rt: Any, view: StagePlan) -> dict[str, str]:
    env = {**ACTOR_NICENESS_ENV, **rt.kinds[view.name].actor_env(view)}
    local = (view.device or "").rpartition("/")[2]
    if local.startswith("gpu:"):  # placement is by our resource, not Ray's num_gpus
        env["CUDA_VISIBLE_DEVICES"] = local.split(":", 1)[1]
    return env


def _undo(rt: Any, holder: str, actor: Any) -> None:
    """A move that failed holds nothing: its holder released, its actor killed."""
    import ray

    if rt.ledger is not None:
        try:
            rt.ledger.release.remote(holder)
        except Exception as exc:
            log.warning("could not release %s after a failed move: %s", holder, exc)
    try:
        ray.kill(actor, no_restart=True)
    except Exception as exc:
        log.debug("the failed move's actor did not die cleanly: %s", exc)


def _publish(rt: Any, new: ReplicaRef, view: StagePlan, dev: Device) -> None:
    """The runtime's tables, plan and balancer with ``new`` in place of the holder's old
    instance (each table replaced whole: readers on other threads see one or the other)."""
    old_plan = rt.plan.stage(new.stage)
    placed = dict(
        device=view.device,
        backend=view.backend,
        route=view.route,
        reservations=view.reservations,
        engine_kwargs=dict(view.engine_kwargs),
        verification=view.verification,
        calibration=view.calibration,
        cpu_threads=view.cpu_threads,
        cpu_threads_from=view.cpu_threads_from,
    )
    node = view.details.get("node")
    if old_plan.replicas:
        replica = dataclasses.replace(
            old_plan.replicas[new.index], node=node if isinstance(node, str) else None, **placed
        )
        replicas = tuple(replica if r.index == new.index else r for r in old_plan.replicas)
        top = placed if new.index == 0 else {}
        stage_plan = dataclasses.replace(old_plan, replicas=replicas, **top)
        holder_view = dataclasses.replace(
            old_plan, replicas=(), details={**old_plan.details, "node": node}, **placed
        )
    else:
        details = {**old_plan.details, **({"node": node} if isinstance(node, str) else {})}
        stage_plan = holder_view = dataclasses.replace(old_plan, details=details, **placed)
    rt.use_plan(
        dataclasses.replace(
            rt.plan, stages=tuple(stage_plan if s.name == new.stage else s for s in rt.plan.stages)
        )
    )
    rt.views = {**rt.views, new.holder: holder_view}
    rt.replicas = {
        **rt.replicas,
        new.stage: [new if r.holder == new.holder else r for r in rt.replicas[new.stage]],
    }
    rt.refs = {**rt.refs, new.holder: new}
    rt.calls_per_request = calls_per_request(
        {h: r.key for h, r in rt.refs.items()},
        {h: rt.graph.feeders(rt.plan.stage(r.stage)) for h, r in rt.refs.items()},
    )
    rt.replica_caps = replica_caps(rt.calls_per_request, int(ACTOR_OPTIONS["max_concurrency"]))
    rt.stage_keys = {name: [r.key for r in rs] for name, rs in rt.replicas.items()}
    rt.devices = {**rt.devices, dev.key: dev}
    rt.balancer.replace(new, rt.replica_caps[new.key])
    rt.admission.set_limit(replicated_limit(rt.replica_caps, rt.stage_keys, rt.balancer.dead))
