"""What failed, said as the stage's failure: Ray's errors mapped, dead actors marked and
released, engines that stopped inside a living actor found.

* :func:`map_failure`: a Ray error → ``StageFailed(stage, device, cause)``; an actor's death is
  said by ``node_death`` (its phase, its node's fate), the actor is marked dead and the
  holders it hosted are released from the ledger (:func:`device_died`).
* :func:`check_alive`: a request that needs a stage whose every instance sits on a dead actor
  fails at once, before it is admitted.
* :func:`stage_failures`: the engines that stopped in living actors, asked of each actor
  within a timeout (a busy actor is not a failed one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any, TypeVar

from orchestrator.core.errors import ConfigError, PeerLost, StageFailed
from orchestrator.runtime import node_death
from orchestrator.runtime.admission import replicated_limit
from stages.base import StageHealth

if TYPE_CHECKING:
    from ray import ObjectRef

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


def died(rt: Any, stage: str, dev: Device) -> StageFailed:
    """The ``StageFailed`` of a request whose ``stage`` ran on ``dev``, which died: for a
    stage with replicas, its cause names the replica (``replica 2 of 2 (voice#1) on cpu``)."""
    ref = next((r for r in rt.replicas.get(stage, []) if r.key == dev.key), None)
    said = ref.said() if ref is not None else ""
    cause = f"{said} on {dev.id}: {dev.dead or ''}" if said else dev.dead or ""
    return StageFailed(stage, dev.id, cause, code="device_actor_died")


def device_died(rt: Any, dev: Device, reason: str) -> None:
    """``dev``'s actor died: marked dead, the holders it hosted released (a replica's
    siblings keep theirs), no request picks it again and admission's limit is lowered to
    what the live replicas hold (slots already held are kept)."""
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


def check_alive(rt: Any, entry: str | None = None) -> None:
    """``StageFailed`` when a stage the request needs (``downstream(entry)``) sits on a dead
    actor — with replicas, when every replica's actor is dead."""
    for s in rt.downstream(entry):
        refs = rt.replicas[s.name]
        if any(not rt.devices[r.key].dead for r in refs):
            continue
        dev = rt.devices[refs[0].key]
        if len(refs) == 1:
            raise StageFailed(s.name, dev.id, f"its device actor died earlier: {dev.dead}")
        raise StageFailed(
            s.name,
            dev.id,
            f"the device actors of all {len(refs)} replicas died earlier "
            f"({', '.join(rt.devices[r.key].id for r in refs)}); the first: {dev.dead}",
        )


async def stage_failures(rt: Any, timeout_s: float) -> dict[str, StageHealth]:
    """Stages whose engine stopped inside a living device actor (``DeviceActor.health``):
    ledger holder (the stage's name; a replica's, ``voice#1``) → why (``StageHealth``). An
    actor that does not answer within ``timeout_s`` is left out (a busy actor is not a failed
    one; a dead one is ``dev.dead``)."""
    live = [dev for dev in rt.devices.values() if not dev.dead]

    async def ask(dev: Device) -> dict[str, StageHealth]:
        try:
            found: dict[str, StageHealth] = await asyncio.wait_for(
                _awaitable(dev.actor.health.remote()), timeout_s
            )
            return dict(found)
        except Exception as exc:  # dead (noticed by the next request) or slow: not this call's
            log.debug("device actor %s did not report its health: %s", dev.id, exc)
            return {}

    out: dict[str, StageHealth] = {}
    for dev, found in zip(live, await asyncio.gather(*(ask(dev) for dev in live)), strict=True):
        for stage, failure in found.items():
            holder = next((h for h in dev.holders if rt.refs[h].stage == stage), stage)
            out[holder] = failure
    return out


async def _awaitable(ref: ObjectRef[T]) -> T:
    return await ref


def cause_of(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its text (300 characters)."""
    text = str(exc).strip().splitlines()
    head = next((line for line in text if line.strip()), type(exc).__name__)
    return f"{type(exc).__name__}: {head[:300]}"
