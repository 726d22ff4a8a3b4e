"""What failed, said as the stage's failure: Ray's errors mapped, dead actors marked and
released, engines that stopped inside a living actor found.

* :func:`map_failure`: a Ray error → ``StageFailed(stage, device, cause)``; an actor's death is
  said by ``node_death`` (its phase, its node's fate), the actor is marked dead and the
  holders it hosted are released from the ledger (:func:`device_died`, once, whichever
  thread noticed first), and the supervisor is told (``runtime.supervisor``): the code a
  request it failed reads is ``stage_restarting`` when the stage comes back.
* :func:`check_alive`: a request that needs a stage whose every instance sits on a dead actor
  that will not come back fails at once, before it is admitted; the stages that are coming
  back (restarting, moving) are returned, for the request to wait on.
* :func:`stage_failures`: the engines that stopped in living actors, asked of each actor
  within a timeout (a busy actor is not a failed one); an actor found dead is said dead at
  once (``/health`` notices a death without waiting for a request).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Any, TypeVar

from orchestrator.core.errors import ConfigError, PeerLost, StageFailed
from orchestrator.runtime import node_death
from orchestrator.runtime.admission import replicated_limit
from stages.base import StageHealth

if TYPE_CHECKING:
    from ray import ObjectRef

    from orchestrator.runtime.device_actor import ActorHealth
    from orchestrator.runtime.startup import Device

T = TypeVar("T")

log = logging.getLogger(__name__)


def map_failure(
    rt: Any, exc: BaseException, stage: str, dev: Device, doing: str = ""
) -> BaseException:
    """A Ray error → ``StageFailed``; an actor death (``doing``: what the actor was doing) is
    said by ``node_death`` — which may wait for Ray's verdict on its node, so an event loop
    calls this in a thread — and releases the stages that actor hosted. A ``StageFailed``
    raised in an actor arrives as the cause of a ``RayTaskError`` (which Ray makes an
    instance of the cause's class too, with its own ``cause``), so that is looked at first."""
    from ray import exceptions as rex

    if isinstance(exc, rex.RayTaskError) and isinstance(exc.cause, PeerLost):
        # the producer's actor could not feed its consumer's: that actor died (direct mode)
        lost = exc.cause
        peer = rt.devices.get(lost.actor_key, dev)
        if not peer.dead:
            device_died(rt, peer, node_death.said(lost.stage, peer, doing, lost.cause))
        return died(rt, lost.stage, peer)
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
            device_died(rt, dev, node_death.said(stage, dev, doing, cause_of(exc)))
        return died(rt, stage, dev)
    if isinstance(exc, rex.GetTimeoutError):
        return StageFailed(stage, dev.id, f"no answer in time: {exc}")
    if isinstance(exc, StageFailed):
        return exc
    return StageFailed(stage, dev.id, f"{type(exc).__name__}: {exc}")


def doing_on(rt: Any, dev: Device) -> str:
    """What ``dev`` was doing when a death was met by no request of its own (the supervisor's
    watch, ``/health``): ``serving request R`` (``and N more``) for the requests in flight that
    picked it, else "" (``running``). The cause then reads as a request meeting it would say."""
    rids = [
        rid
        for rid, picks in list(getattr(rt, "picks", {}).items())
        if any(ref.key == dev.key for ref in picks.values())
    ]
    if not rids:
        return ""
    more = f" and {len(rids) - 1} more" if len(rids) > 1 else ""
    return f"serving request {rids[0]}{more}"


def died(rt: Any, stage: str, dev: Device) -> StageFailed:
    """The ``StageFailed`` of a request whose ``stage`` ran on ``dev``, which died: for a
    stage with replicas, its cause names the replica (``replica 2 of 2 (voice#1) on cpu``);
    its code says whether the stage comes back (``stage_restarting``), is in a crash loop
    (``crash_loop``) or stays down (``device_actor_died``)."""
    ref = next((r for r in rt.replicas.get(stage, []) if r.key == dev.key), None)
    said = ref.said() if ref is not None else ""
    with _DEATHS:  # the code is set with the death, under this lock
        cause = f"{said} on {dev.id}: {dev.dead or ''}" if said else dev.dead or ""
        code = dev.code or "device_actor_died"
    if code == "stage_restarting":
        cause = f"{cause}; the stage is being restarted"
    return StageFailed(stage, dev.id, cause, code=code)


_DEATHS = threading.Lock()
"""One death noticed once: a request, ``/health`` and the supervisor's watch may meet it at once."""


def device_died(rt: Any, dev: Device, reason: str) -> None:
    """``dev``'s actor died: marked dead, the holders it hosted released (a replica's
    siblings keep theirs), no request picks it again and admission's limit is lowered to
    what the live replicas hold (slots already held are kept); the supervisor is told, and
    says what becomes of it (``dev.code``). Once per actor, whichever thread noticed first."""
    with _DEATHS:  # held throughout: a request that meets the death reads its code after
        if dev.dead:
            return
        dev.dead = reason
        log.error("device actor %s (%s) died: %s", dev.key, dev.id, reason)
        for holder in dev.holders:
            if rt.ledger is not None:
                with contextlib.suppress(Exception):
                    rt.ledger.release.remote(holder)
        rt.balancer.mark_dead(dev.key)
        rt.admission.set_limit(replicated_limit(rt.replica_caps, rt.stage_keys, rt.balancer.dead))
        supervisor = getattr(rt, "supervisor", None)
        dev.code = supervisor.died(dev, reason) if supervisor is not None else "device_actor_died"


def check_alive(rt: Any, entry: str | None = None) -> list[str]:
    """The stages the request needs (``downstream(entry)``) that are coming back (every
    instance restarting or moving, none live): the request may wait for them. A
    ``StageFailed`` when one sits on dead actors that will not come back — with replicas,
    when no replica's actor lives or comes back — its code the supervisor's
    (``crash_loop``, ``device_actor_died``)."""
    waiting = []
    supervisor = getattr(rt, "supervisor", None)
    for s in rt.downstream(entry):
        refs = rt.replicas[s.name]
        if any(not rt.devices[r.key].dead for r in refs):
            continue
        if supervisor is not None and supervisor.coming_back(s.name):
            waiting.append(s.name)
            continue
        dev = rt.devices[refs[0].key]
        code, why = "device_actor_died", f"its device actor died earlier: {dev.dead}"
        status = supervisor.status(refs[0].holder) if supervisor is not None else None
        if status and status["state"] == "crash_loop":
            code = "crash_loop"
            why = (
                f"its device actor is in a crash loop ({status.get('restarts', 0)} restarts in "
                f"its window, the limit of its restart policy); the last death: {status['cause']}"
            )
        if len(refs) == 1:
            raise StageFailed(s.name, dev.id, why, code=code)
        raise StageFailed(
            s.name,
            dev.id,
            f"the device actors of all {len(refs)} replicas died earlier "
            f"({', '.join(rt.devices[r.key].id for r in refs)}); the first: {dev.dead}",
            code=code,
        )
    return waiting


async def stage_failures(rt: Any, timeout_s: float) -> dict[str, StageHealth]:
    """Stages that cannot serve inside a living device actor (``DeviceActor.health``: an
    engine that stopped, a route worker being replaced): ledger holder (the stage's name; a
    replica's, ``voice#1``) → why (``StageHealth``). An actor that does not answer within
    ``timeout_s`` is left out (a busy actor is not a failed one); one whose call fails because
    it died is said dead now (:func:`device_died`, in a worker thread: on a cluster's node it
    waits for Ray's verdict). Each answer's route worker restarts go to the supervisor."""
    from ray import exceptions as rex

    live = [dev for dev in list(rt.devices.values()) if not dev.dead]

    async def ask(dev: Device) -> ActorHealth | None:
        try:
            found: ActorHealth = await asyncio.wait_for(
                _awaitable(dev.actor.health.remote()), timeout_s
            )
            return found
        except (rex.RayActorError, rex.ActorUnavailableError) as exc:
            stage = dev.stages[0] if dev.stages else dev.id
            ray_says = cause_of(exc)
            doing = doing_on(rt, dev)
            await asyncio.to_thread(
                lambda: device_died(rt, dev, node_death.said(stage, dev, doing, ray_says))
            )
            return None
        except Exception as exc:  # slow: not this call's to judge
            log.debug("device actor %s did not report its health: %s", dev.id, exc)
            return None

    out: dict[str, StageHealth] = {}
    supervisor = getattr(rt, "supervisor", None)
    for dev, found in zip(live, await asyncio.gather(*(ask(dev) for dev in live)), strict=True):
        if found is None:
            continue
        for stage, failure in found["failed"].items():
            out[holder_of(rt, dev, stage)] = failure
        for stage, workers in found["workers"].items():
            if supervisor is not None:
                supervisor.worker_restarts(holder_of(rt, dev, stage), dev, workers["restarts"])
    return out


def holder_of(rt: Any, dev: Device, stage: str) -> str:
    """The ledger holder of ``stage`` on ``dev`` (a replica's ``voice#1``, else the stage)."""
    return next((h for h in dev.holders if rt.refs[h].stage == stage), stage)


async def _awaitable(ref: ObjectRef[T]) -> T:
    return await ref


def cause_of(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its text (300 characters)."""
    text = str(exc).strip().splitlines()
    head = next((line for line in text if line.strip()), type(exc).__name__)
    return f"{type(exc).__name__}: {head[:300]}"
