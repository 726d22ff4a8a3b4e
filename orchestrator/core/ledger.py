"""The memory ledger: pools, reservations with lifetimes, and admission.

Pure Python, no Ray: the planner uses it to admit a whole pipeline at once,
and the runtime's ledger actor wraps the same class.

Rules (see docs/ledger.md):

* A reservation is ``(pool, purpose, bytes, lifetime, evidence, note)``.
  Lifetimes: ``load`` (freed once the weights are resident), ``session`` (held
  until the stage closes), ``request`` (per in-flight request).
  ``at_load=False`` marks session memory that is allocated only after the
  load (the KV cache, captured graphs): it never coexists with the load
  transient.
* A holder's (one stage's) peak on a pool is the larger of its load path and
  its steady state, not their sum.
* Holders load one at a time, so a pool's peak is the sum of every holder's
  steady state plus the largest excess of one holder's load path over its own
  steady state. This holds in any load order.
* Pools nest: a reservation in a child pool also counts against its parent,
  and admission checks the whole chain.
* ``admit`` is check-and-reserve in one call with nothing awaited inside; it
  answers an :class:`Admission`, whose refusal names the pool, the figures and
  every contributor.
* The pipeline's own reservations (external reserve, safety margins, the Ray
  runtime) are held under :data:`PIPELINE_HOLDER`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, NotRequired, TypedDict

Lifetime = Literal["load", "session", "request"]
Evidence = Literal["D", "E", "M"]

RETAINED_GROWTH = "shape_memory"
"""The purpose of a reservation for memory a backend keeps per new item (OpenVINO's per-shape
memory) over a horizon of items longer than one run shows. Calibration keeps it on top of
the measured resident state, so a short calibration run cannot budget the growth away."""

PIPELINE_HOLDER = "(pipeline)"
"""The holder of the pipeline's own reservations, beside one holder per stage."""


class ReservationDoc(TypedDict):
    """A reservation as plain data (the plan JSON, the ledger actor's calls)."""

    pool: str
    purpose: str
    bytes: int
    lifetime: Lifetime
    evidence: Evidence
    note: str
    at_load: bool


@dataclass(frozen=True)
class Reservation:
    """One claim on one pool."""

    pool: str
    purpose: str
    bytes: int
    lifetime: Lifetime
    evidence: Evidence
    note: str = ""
    at_load: bool = True
    """False for session memory allocated after the load (KV cache, graphs)."""

    def __post_init__(self) -> None:
        if not isinstance(self.bytes, int) or isinstance(self.bytes, bool) or self.bytes < 0:
            raise ValueError(
                f"reservation {self.purpose!r} bytes must be a non-negative int, got {self.bytes!r}"
            )

    def to_dict(self) -> ReservationDoc:
        return ReservationDoc(
            pool=self.pool,
            purpose=self.purpose,
            bytes=self.bytes,
            lifetime=self.lifetime,
            evidence=self.evidence,
            note=self.note,
            at_load=self.at_load,
        )


def load_and_steady(reservations: Iterable[Reservation]) -> tuple[int, int]:
    """``(load path, steady state)`` bytes of one holder's reservations."""
    rs = list(reservations)
    load = sum(
        r.bytes for r in rs if r.lifetime == "load" or (r.lifetime == "session" and r.at_load)
    )
    steady = sum(r.bytes for r in rs if r.lifetime != "load")
    return load, steady


def holder_peak(reservations: Iterable[Reservation], pool: str | None = None) -> int:
    """One holder's peak (on one pool, or over all): max(load path, steady state)."""
    return max(load_and_steady(r for r in reservations if pool is None or r.pool == pool))


@dataclass(frozen=True)
class Pool:
    id: str
    capacity: int
    parent: str | None = None
    note: str = ""


@dataclass(frozen=True)
class Shortfall:
    """Why an admission failed: the pool, its figures and who holds what."""

    pool: str
    capacity: int
    peak: int
    contributors: dict[str, int]
    """holder -> its share of the peak on this pool (including the candidate)."""

    @property
    def over_by(self) -> int:
        return self.peak - self.capacity


class ShortfallDoc(TypedDict):
    """A :class:`Shortfall` as plain data (the ledger actor's answers)."""

    pool: str
    capacity: int
    peak: int
    contributors: dict[str, int]
    over_by: int


@dataclass(frozen=True)
class Admission:
    """What ``Ledger.admit`` answers: admitted (``ok``, the reservations now held),
    or refused with the pools that would overflow (nothing new held)."""

    shortfalls: tuple[Shortfall, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.shortfalls

    def __bool__(self) -> bool:
        # ``if ledger.admit(...)`` read as "admitted" when it used to mean "refused":
        # make the question explicit.
        raise TypeError("ask Admission.ok (or look at .shortfalls), not the admission's truth")

    def answer(self) -> AdmissionAnswer:
        """The admission as plain data, as the ledger actor answers ``admit``."""
        return AdmissionAnswer(ok=self.ok, shortfalls=shortfall_docs(self.shortfalls))


def shortfall_docs(shortfalls: Iterable[Shortfall]) -> list[ShortfallDoc]:
    return [
        ShortfallDoc(
            pool=s.pool,
            capacity=s.capacity,
            peak=s.peak,
            contributors=dict(s.contributors),
            over_by=s.over_by,
        )
        for s in shortfalls
    ]


class AdmissionAnswer(TypedDict):
    """The ledger actor's answer to ``admit`` and ``replace``: admitted (``ok``) or refused
    with the pools that would overflow."""

    ok: bool
    shortfalls: list[ShortfallDoc]


class TogetherAnswer(TypedDict):
    """The ledger actor's answer to ``admit_together``: the holders admitted (a prefix of the
    batch, in order) and why the next one could not join them (or why the first alone was
    refused: then none is admitted)."""

    admitted: list[str]
    shortfalls: list[ShortfallDoc]


class PoolRow(TypedDict):
    """One pool in a ledger snapshot: its capacity, its peak now and who makes it up."""

    id: str
    capacity_bytes: int
    parent: str | None
    peak_bytes: int
    held_bytes: int
    contributors: dict[str, int]


class LedgerSnapshot(TypedDict):
    """The ledger as plain data for reports: its pools and what each holder holds."""

    pools: list[PoolRow]
    holders: dict[str, list[ReservationDoc]]


class MeasuredPeak(TypedDict):
    """A stage's measured peak next to its budget (evidence M), as its device actor reports it
    to the ledger actor (``report``) and the runtime keeps it (the run record's ``measured``,
    calibration's samples): the peak, the load's and the steady state's, what stays resident,
    whether the figure is only an upper bound (another load in the same process), the budget
    and the verdict (``within_budget``; null with ``within_budget_reason`` when not judged),
    how and where it was measured, the requests it served, and a recycled route worker's
    figures (``worker``)."""

    measured_peak_bytes: int
    load_peak_bytes: int | None
    steady_peak_bytes: int | None
    resident_bytes: int | None
    upper_bound: bool
    budget_bytes: int
    budget_over_measured: float | None
    within_budget: bool | None
    within_budget_reason: NotRequired[str]
    evidence: str
    method: str
    where: str
    when: str
    requests: int
    max_in_flight: int
    worker: dict[str, int] | None


@dataclass
class Ledger:
    """Pools and the reservations held against them, by holder."""

    pools: dict[str, Pool] = field(default_factory=dict)
    held: dict[str, list[Reservation]] = field(default_factory=dict)

    # -- pools ---------------------------------------------------------------
    def add_pool(
        self, pool_id: str, capacity: int, parent: str | None = None, note: str = ""
    ) -> None:
        if parent is not None and parent not in self.pools:
            raise KeyError(f"parent pool {parent!r} of {pool_id!r} is not defined")
        self.pools[pool_id] = Pool(pool_id, capacity, parent, note)

    def chain(self, pool_id: str) -> list[str]:
        """``pool_id`` and its ancestors, innermost first."""
        out = []
        current: str | None = pool_id
        while current is not None:
            out.append(current)
            current = self.pools[current].parent
        return out

    # -- arithmetic ----------------------------------------------------------
    def _counts_in(self, reservation_pool: str, pool_id: str) -> bool:
        return reservation_pool in self.pools and pool_id in self.chain(reservation_pool)

    def holder_profile(
        self, holder: str, pool_id: str, extra: Iterable[Reservation] = ()
    ) -> tuple[int, int]:
        """``(load_path, steady)`` bytes of one holder on ``pool_id`` (children included)."""
        return load_and_steady(
            r for r in [*self.held.get(holder, []), *extra] if self._counts_in(r.pool, pool_id)
        )

    def peak(
        self, pool_id: str, extra: dict[str, list[Reservation]] | None = None
    ) -> tuple[int, dict[str, int]]:
        """The pool's peak and each holder's share of it.

        A holder's share is its steady state, plus — for the holder whose
        load path most exceeds its steady state — that excess.
        """
        extra = extra or {}
        holders = set(self.held) | set(extra)
        shares: dict[str, int] = {}
        worst_holder, worst_excess = None, 0
        for h in sorted(holders):
            load, steady = self.holder_profile(h, pool_id, extra.get(h, []))
            if load == 0 and steady == 0:
                continue
            shares[h] = steady
            if load - steady > worst_excess:
                worst_holder, worst_excess = h, load - steady
        if worst_holder is not None:
            shares[worst_holder] += worst_excess
        return sum(shares.values()), shares

    def check(self, extra: dict[str, list[Reservation]]) -> list[Shortfall]:
        """Pools that would overflow if ``extra`` were added (nothing changes)."""
        touched = {p for rs in extra.values() for r in rs for p in self._chain_or_unknown(r.pool)}
        out = []
        for pool_id in sorted(touched):
            pool = self.pools[pool_id]
            peak, shares = self.peak(pool_id, extra)
            if peak > pool.capacity:
                out.append(Shortfall(pool_id, pool.capacity, peak, shares))
        return out

    def _chain_or_unknown(self, pool_id: str) -> list[str]:
        if pool_id not in self.pools:
            raise KeyError(f"reservation names pool {pool_id!r}, which the ledger does not have")
        return self.chain(pool_id)

    # -- mutation ------------------------------------------------------------
    def admit(self, holder: str, reservations: list[Reservation]) -> Admission:
        """Check and reserve in one step: when ``.ok`` the reservations are held,
        otherwise nothing new is held and ``.shortfalls`` says why."""
        shortfalls = self.check({holder: reservations})
        if not shortfalls:
            self.held.setdefault(holder, []).extend(reservations)
        return Admission(tuple(shortfalls))

    def release(self, holder: str, lifetime: Lifetime | None = None) -> int:
        """Drop a holder's reservations (all, or those of one lifetime); returns bytes freed."""
        rs = self.held.get(holder, [])
        keep = [r for r in rs if lifetime is not None and r.lifetime != lifetime]
        freed = sum(r.bytes for r in rs) - sum(r.bytes for r in keep)
        if keep:
            self.held[holder] = keep
        else:
            self.held.pop(holder, None)
        return freed

    def held_bytes(self, pool_id: str | None = None) -> int:
        """Bytes currently held (all pools, or one pool with its children)."""
        return sum(
            r.bytes
            for rs in self.held.values()
            for r in rs
            if pool_id is None or self._counts_in(r.pool, pool_id)
        )

    def snapshot(self) -> LedgerSnapshot:
        """Plain data for reports: pools with capacity, peak and contributors."""
        pools = []
        for pool_id, pool in self.pools.items():
            peak, shares = self.peak(pool_id)
            pools.append(
                PoolRow(
                    id=pool_id,
                    capacity_bytes=pool.capacity,
                    parent=pool.parent,
                    peak_bytes=peak,
                    held_bytes=self.held_bytes(pool_id),
                    contributors=shares,
                )
            )
        return LedgerSnapshot(
            pools=pools, holders={h: [r.to_dict() for r in rs] for h, rs in self.held.items()}
        )
