"""Reading a started pipeline's ledger and peaks, and closing it.

* :func:`ledger_snapshot`: the ledger actor's pools and holders now (after close: as they
  were at close); ``LedgerLost`` when the ledger actor is gone.
* :func:`measure`: each live stage's measured peak now, next to its budget.
* :func:`close`: every stage closed (releasing its reservations), the pipeline's own
  reservation released, the actors stopped and, when this process started Ray, Ray. A
  device actor that fails to close is marked dead; a ledger that does not answer is said
  (``ledger_lost``), never waited on past ``CLOSE_TIMEOUT_S``.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from orchestrator.core.errors import LedgerLost
from orchestrator.core.ledger import PIPELINE_HOLDER, MeasuredPeak
from orchestrator.runtime import cluster as cluster_mod
from orchestrator.runtime.failures import cause_of, device_died
from orchestrator.runtime.ledger_actor import ActorSnapshot

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 60.0
"""The longest one call of closing waits for an actor's answer."""


def ledger_snapshot(rt: Any) -> ActorSnapshot:
    """The ledger actor's pools and holders now (after close: as it was at close)."""
    import ray

    if rt.ledger is None:
        if rt.ledger_lost:
            raise LedgerLost(rt.ledger_lost)
        final: ActorSnapshot | None = rt.final_ledger
        return final or ActorSnapshot()
    try:
        snapshot: ActorSnapshot = ray.get(rt.ledger.snapshot.remote(), timeout=CLOSE_TIMEOUT_S)
        return snapshot
    except Exception as exc:
        rt.ledger_lost = rt.ledger_lost or cause_of(exc)
        raise LedgerLost(rt.ledger_lost) from None


def measure(rt: Any) -> dict[str, MeasuredPeak]:
    """Each live stage's measured peak now (after its requests), next to its budget, by
    ledger holder (the stage's name; ``voice#1`` for a replica)."""
    import ray

    out = {}
    for dev in rt.devices.values():
        if dev.dead:
            continue
        for holder in dev.holders:
            if holder in rt.load_results:
                stage = rt.refs[holder].stage
                with contextlib.suppress(Exception):
                    out[holder] = ray.get(dev.actor.measure.remote(stage), timeout=CLOSE_TIMEOUT_S)
    return out


def close(rt: Any) -> ActorSnapshot:
    """Close the pipeline (the module's guarantees); the final ledger snapshot (every pool
    should hold zero bytes)."""
    import ray

    for dev in reversed(list(rt.devices.values())):
        if dev.dead:
            continue
        try:
            ray.get(dev.actor.close.remote(), timeout=CLOSE_TIMEOUT_S)
        except Exception as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, LedgerLost) or isinstance(exc, LedgerLost):
                # its stages are closed; what failed was telling the ledger
                rt.ledger_lost = rt.ledger_lost or (cause or exc).cause  # type: ignore[union-attr]
                continue
            log.warning("closing the device actor for %s failed: %s", dev.id, cause_of(exc))
            device_died(rt, dev, f"failed to close: {cause_of(exc)}")
    if rt.ledger is not None:
        try:
            for dev in rt.devices.values():  # a dead actor's stages, in case its release raced
                for name in dev.holders:
                    rt.ledger.release.remote(name)
            ray.get(rt.ledger.release.remote(PIPELINE_HOLDER), timeout=CLOSE_TIMEOUT_S)
            rt.final_ledger = ray.get(rt.ledger.snapshot.remote(), timeout=CLOSE_TIMEOUT_S)
        except Exception as exc:
            rt.ledger_lost = rt.ledger_lost or cause_of(exc)
            log.warning("the ledger actor did not answer at close: %s", rt.ledger_lost)
    for dev in rt.devices.values():
        with contextlib.suppress(Exception):
            ray.kill(dev.actor, no_restart=True)
    if rt.ledger is not None:
        with contextlib.suppress(Exception):
            ray.kill(rt.ledger, no_restart=True)
    rt.ledger = None
    if rt.cluster is not None:
        cluster_mod.release()
        rt.cluster = None
    final: ActorSnapshot | None = rt.final_ledger
    return final or ActorSnapshot()
