"""The ledger actor: ``orchestrator.core.ledger.Ledger`` shared by every device actor.

:class:`LedgerService` is plain Python (tested without Ray); :func:`create`
wraps it in a Ray actor with ``max_concurrency=1``, so each method runs alone
and ``admit`` — check and reserve, with nothing awaited inside — is atomic.

Protocol, per stage (the device actor drives it):

1. ``admit(stage, reservations)`` before the load: every reservation of the
   stage's plan, or none (``{"ok": False, "shortfalls": [...]}`` comes back
   and nothing is held).
2. ``release(stage, "load")`` once the weights are resident.
3. ``report(stage, measured)`` after the load and again at close: the
   measured peak (evidence M) next to the plan's budget.
4. ``release(stage)`` when the stage closes or its device actor dies.
5. ``retake(batch)`` when a dead actor's stages load again (a restart): each holder's
   reservations *replaced* by the plan's, all at once or none, so a restart takes them
   exactly once however often it is tried (a release that raced it, or an attempt that
   died after taking them, never counts them twice).

To load several stages at once, the runtime asks ``admit_together(batch)``
first: the longest prefix of the batch whose stages fit with every one of
them at its own peak — load path or steady state, whichever is larger — at
the same time, beside what is already held. Those are admitted (their real
reservations held, as ``admit`` would) and may load in parallel; the device
actors then skip step 1.

The pipeline itself holds the plan's shared reservations (external reserve,
safety margin) and Ray's measured memory under ``ledger.PIPELINE_HOLDER``.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, TypedDict, cast

from orchestrator.core.ledger import (
    Admission,
    AdmissionAnswer,
    Ledger,
    MeasuredPeak,
    PoolRow,
    Reservation,
    ReservationDoc,
    TogetherAnswer,
    holder_peak,
    shortfall_docs,
)

if TYPE_CHECKING:
    from ray.actor import ActorHandle


class PoolDoc(TypedDict):
    """A pool the ledger actor is made with (``PoolPlan.to_dict()``: its other keys are left)."""

    id: str
    capacity_bytes: int
    parent: str | None
    note: str


class LedgerEvent(TypedDict):
    """One step in the ledger actor's log: when, what (admit, refuse, release:load, ...), who,
    how many bytes."""

    t: float
    event: str
    holder: str
    bytes: int


class ActorSnapshot(TypedDict, total=False):
    """The ledger actor's snapshot (``snapshot()``; the run record's ``ledger``): the ledger's
    pools and holders (``LedgerSnapshot``), each holder's measured peak, the bytes held now and
    the last 200 events. Empty where there is no ledger to ask (a runtime closed before its
    ledger started)."""

    pools: list[PoolRow]
    holders: dict[str, list[ReservationDoc]]
    measured: dict[str, MeasuredPeak]
    held_bytes: int
    events: list[LedgerEvent]


class LedgerService:
    """Pools and reservations, plus the measured peaks reported against them."""

    def __init__(self, pools: list[PoolDoc]) -> None:
        self.ledger = Ledger()
        # Parents first: a pool can only name a parent that already exists.
        pending = list(pools)
        while pending:
            progressed = False
            for p in list(pending):
                if p.get("parent") is None or p["parent"] in self.ledger.pools:
                    self.ledger.add_pool(
                        p["id"],
                        int(p["capacity_bytes"]),
                        parent=p.get("parent"),
                        note=p.get("note", ""),
                    )
                    pending.remove(p)
                    progressed = True
            if not progressed:
                raise KeyError(
                    f"pools name parents that do not exist: {[p['id'] for p in pending]}"
                )
        self.measured: dict[str, MeasuredPeak] = {}
        self.events: list[LedgerEvent] = []

    def ready(self) -> int:
        """The actor's process id (its memory is Ray's, charged with the runtime)."""
        return os.getpid()

    def admit(self, holder: str, reservations: list[ReservationDoc]) -> AdmissionAnswer:
        """Check and reserve in one step; the :class:`~orchestrator.core.ledger.Admission`
        as plain data (``Admission.answer``)."""
        rs = [Reservation(**r) for r in reservations]
        admission = self.ledger.admit(holder, rs)
        self._log("admit" if admission.ok else "refuse", holder, sum(r.bytes for r in rs))
        return admission.answer()

    def admit_together(self, batch: list[tuple[str, list[ReservationDoc]]]) -> TogetherAnswer:
        """Admit the longest prefix of ``batch`` (``(holder, reservations)`` in load
        order) whose holders may all load at once; one step, so nothing else is
        admitted in between.

        A prefix of two or more is checked with each holder at its own peak per
        pool (``ledger.holder_peak``: its load path or its steady state, whichever
        is larger) all at the same time — the ledger's usual rule assumes loads one
        at a time and would let their transients overlap unseen. A prefix of one
        is the usual ``admit``. Answers the holders admitted and the shortfalls: why the first
        holder alone is refused (then nothing is admitted), or why the next holder could not
        join the prefix."""
        parsed = [(holder, [Reservation(**r) for r in rs]) for holder, rs in batch]
        why_not = []
        for n in range(len(parsed), 1, -1):
            together = {h: _at_peak(rs) for h, rs in parsed[:n]}
            shortfalls = self.ledger.check(together)
            if shortfalls:
                why_not = list(shortfalls)
                continue
            for holder, rs in parsed[:n]:
                # at their peaks together they fit, so each fits the usual rule too
                self.ledger.held.setdefault(holder, []).extend(rs)
                self._log("admit", holder, sum(r.bytes for r in rs))
            return TogetherAnswer(
                admitted=[h for h, _ in parsed[:n]], shortfalls=shortfall_docs(why_not)
            )
        if not parsed:
            return TogetherAnswer(admitted=[], shortfalls=[])
        holder, rs = parsed[0]
        answer = self.admit(holder, [r.to_dict() for r in rs])
        if not answer["ok"]:
            return TogetherAnswer(admitted=[], shortfalls=answer["shortfalls"])
        return TogetherAnswer(admitted=[holder], shortfalls=shortfall_docs(why_not))

    def retake(self, batch: list[tuple[str, list[ReservationDoc]]]) -> AdmissionAnswer:
        """Hold each holder's ``reservations`` in place of whatever it holds now (a restart's
        stages, loading again), all together at their peaks as ``admit_together`` checks a
        wave, or none: ``{"ok", "shortfalls"}``, and when not ``ok`` every holder keeps what it
        held. One step, so a holder is never counted twice: taking it again after an attempt
        that died with it held replaces, never adds."""
        parsed = [(holder, [Reservation(**r) for r in rs]) for holder, rs in batch]
        before = {h: self.ledger.held.pop(h, None) for h, _ in parsed}
        # several at once: each at its own peak, as a wave loads; one: the usual rule
        extra = {h: _at_peak(rs) for h, rs in parsed} if len(parsed) > 1 else dict(parsed)
        shortfalls = self.ledger.check(extra)
        if shortfalls:
            for h, held in before.items():
                if held is not None:
                    self.ledger.held[h] = held
            for h, rs in parsed:
                self._log("refuse", h, sum(r.bytes for r in rs))
            return Admission(tuple(shortfalls)).answer()
        for holder, rs in parsed:
            self.ledger.held[holder] = list(rs)
            self._log("retake", holder, sum(r.bytes for r in rs))
        return Admission(()).answer()

    def release(self, holder: str, lifetime: str | None = None) -> int:
        freed = self.ledger.release(holder, lifetime)  # type: ignore[arg-type]
        self._log(f"release:{lifetime or 'all'}", holder, freed)
        return freed

    def replace(self, holder: str, purpose: str, reservation: ReservationDoc) -> AdmissionAnswer:
        """Swap one held reservation (by purpose, on the new one's pool) for another — an
        estimate for its measurement; on a cluster, one node's pool at a time. Atomic:
        when not ``ok`` the old one stays. Answers like ``admit``."""
        new = Reservation(**reservation)
        held = self.ledger.held.get(holder, [])
        old = [r for r in held if r.purpose == purpose and r.pool == new.pool]
        keep = [r for r in held if not (r.purpose == purpose and r.pool == new.pool)]
        self.ledger.held[holder] = keep
        admission = self.ledger.admit(holder, [new])
        if not admission.ok:
            self.ledger.held[holder] = keep + old
        self._log("replace" if admission.ok else "refuse", holder, new.bytes)
        return admission.answer()

    def report(self, holder: str, measured: MeasuredPeak) -> None:
        """The holder's measured peak, over what it reported before (a later report's keys win)."""
        merged: dict[str, object] = dict(self.measured.get(holder, {}))
        merged.update(measured)
        self.measured[holder] = cast(MeasuredPeak, merged)

    def held_bytes(self, pool: str | None = None) -> int:
        return self.ledger.held_bytes(pool)

    def holders(self) -> list[str]:
        return sorted(self.ledger.held)

    def snapshot(self) -> ActorSnapshot:
        snap = self.ledger.snapshot()
        return ActorSnapshot(
            pools=snap["pools"],
            holders=snap["holders"],
            measured=self.measured,
            held_bytes=self.ledger.held_bytes(),
            events=self.events[-200:],
        )

    def _log(self, what: str, holder: str, nbytes: int) -> None:
        self.events.append(LedgerEvent(t=time.time(), event=what, holder=holder, bytes=nbytes))


def _at_peak(reservations: list[Reservation]) -> list[Reservation]:
    """One holder as one steady reservation per pool of its peak there (load path
    or steady state, whichever is larger): how it weighs while loading beside others."""
    pools = dict.fromkeys(r.pool for r in reservations)
    return [
        Reservation(
            p,
            "peak_while_loading",
            holder_peak(reservations, p),
            "session",
            "E",
            "load path or steady state, whichever is larger",
        )
        for p in pools
    ]


def create(pools: list[PoolDoc], **options: object) -> ActorHandle:
    """A ``LedgerService`` actor (one method at a time), placed anywhere, or as ``options``
    say (the runtime keeps it on the driver's node of a cluster: a node that leaves
    must not take the ledger with it)."""
    import ray

    actor = ray.remote(LedgerService).options(
        num_cpus=0, max_concurrency=1, max_restarts=0, **options
    )
    return cast("ActorHandle", actor.remote(pools))
