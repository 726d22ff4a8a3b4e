"""Budgets from measured peaks (docs/calibration.md): the margin arithmetic that turns the
measurement store's entries into reservations.

The store itself — keys, samples, entries, the files that keep them — is
``orchestrator.calibration_store``; its names are this module's too (``cal.Key``,
``cal.CalibrationStore``, ``cal.sample``), so callers import one module.
:func:`calibrate` turns an entry into reservations (evidence M) with a margin
from the observed spread; :func:`scaled` does the same from a near match by the
kind's own arithmetic (evidence E, "from M"); :func:`lookup` finds the one or the other.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

from orchestrator.calibration_store import (  # noqa: F401 - the store's names are this module's too
    BUDGET_DERIVED,
    CALIBRATION_ENV,
    CALIBRATION_FORMAT,
    ENTRY_NAME,
    FORMAT_MARK,
    FORMAT_PREFIX,
    MAX_SAMPLES,
    MEASURE_VERSION,
    SAMPLE_INTS,
    SCALING_SETTINGS,
    WORKER_FIELDS,
    CalibrationStore,
    Entry,
    Key,
    Sample,
    Unusable,
    artifact_digest,
    backend_version,
    calibration_dir,
    entry_problem,
    is_entry_file,
    machine_id,
    newer_format,
    now,
    pool_ray_key,
    ray_key,
    sample,
    sample_problem,
    server_key,
    stage_key,
)
from orchestrator.core.documents import JsonObject
from orchestrator.core.ledger import RETAINED_GROWTH, Evidence, Reservation, load_and_steady
from orchestrator.core.units import MiB, fmt_bytes

log = logging.getLogger(__name__)

# -- the margin ------------------------------------------------------------------
FLOOR_FRACTION = 0.05
"""Margin floor: 5 % of the largest peak seen (run-to-run noise here is 1-2 %)."""
SETTLED_FRACTION = 0.03
"""The floor once ``SETTLED_RUNS`` recent runs all stayed within budget (tightening)."""
SETTLED_RUNS = 5
MIN_MARGIN_BYTES = 8 * MiB
SPREAD_K = 2.0
"""The budget is at least the mean of the recent peaks + k x their standard deviation."""
MAX_OVERRUN_WIDENING = 4
REQUEST_PRIOR = 0.10
"""Until ``SPREAD_SAMPLES`` runs show how the part of a peak that requests bring (the
peak above what was resident after the load: activations for the longest input, what
the allocator kept between requests) varies, the margin covers a tenth of that part:
one run is one draw of what its requests carried (docs/calibration.md)."""
SPREAD_SAMPLES = 3
WINDOW = 20
"""Recent samples the spread, overruns and settling are judged over."""
GROWTH_HORIZON_CALLS = 64
"""For a recycled worker whose kind reserves no growth of its own: the calls, at the growth
rate its runs measured, that the budget lets it grow over before it is recycled (the horizon
of ``OPENVINO_ITEM_HORIZON`` in ``orchestrator/core/backends.py``: a recycle costs a reopen,
about 2.5 s for the voice, so at most one every 64 calls)…"""
GROWTH_FRACTION = 0.5
"""…and at most half of what one call needs (resident + its rise) again: a fast-growing
worker is recycled more often rather than budgeted without bound."""


# -- the arithmetic --------------------------------------------------------------------
@dataclass(frozen=True)
class Margin:
    bytes: int
    rule: str
    """How it was derived, e.g. "max(5% of peak, 2.0 x spread 3.1 MiB, 8 MiB)"."""


def margin_for(
    peaks: list[int], overruns: int = 0, settled: bool = False, request_part: int = 0
) -> Margin:
    """The margin above the largest of ``peaks``: max(floor x largest, what it takes to reach k
    standard deviations above their mean, 8 MiB, and while fewer than ``SPREAD_SAMPLES`` runs
    are known, ``REQUEST_PRIOR`` x the part of the peak that requests brought). Each recent
    overrun widens the floor by 5 %; settled runs narrow it to 3 %.

    The spread counts from the mean, not from the largest peak: the largest of N draws already
    sits above the mean by about the spread, and counting k deviations on top of it again (as
    before) put Ray's reservation at 1.29 GiB over 25 runs whose peaks were 525-932 MiB, the
    early overruns widening k on top of a maximum that had already absorbed them. An overrun
    therefore widens the floor only: the largest peak already holds the overrun itself."""
    largest = max(peaks)
    mean = statistics.fmean(peaks)
    spread = statistics.pstdev(peaks) if len(peaks) > 1 else 0.0
    widen = min(overruns, MAX_OVERRUN_WIDENING)
    frac = (SETTLED_FRACTION if settled and not widen else FLOOR_FRACTION) + FLOOR_FRACTION * widen
    k = SPREAD_K
    candidates = {
        "floor": math.ceil(frac * largest),
        "spread": max(0, math.ceil(mean + k * spread - largest)),
        "minimum": MIN_MARGIN_BYTES,
    }
    prior = ""
    if len(peaks) < SPREAD_SAMPLES and request_part > 0:
        candidates["requests"] = math.ceil(REQUEST_PRIOR * request_part)
        prior = f", {REQUEST_PRIOR:.0%} of the {fmt_bytes(request_part)} requests brought"
    which = max(candidates, key=lambda c: candidates[c])
    rule = (
        f"max({frac:.0%} of the largest peak, mean + {k:g} x spread {fmt_bytes(int(spread))}, "
        f"{fmt_bytes(MIN_MARGIN_BYTES)}{prior}) = {which}"
    )
    if widen:
        rule += f"; widened for {widen} recent overrun(s)"
    elif settled:
        rule += f"; tightened: the last {SETTLED_RUNS}+ runs stayed within budget"
    return Margin(candidates[which], rule)


@dataclass(frozen=True)
class Calibration:
    """What calibration did to one stage: the plan's ``calibration`` field."""

    match: str
    """``exact`` (evidence M), ``near`` (E from M, scaled) or ``none``."""
    before_bytes: int
    after_bytes: int
    evidence: str
    margin_bytes: int
    margin_rule: str
    largest_peak_bytes: int
    provenance: Provenance
    note: str = ""
    entry: str = ""
    need: Need | None = None
    """For a recycled worker: what its budget is made of (``resident_bytes``, ``call_rise_bytes``,
    ``growth_bytes`` and ``growth_from``); None when the budget is the largest peak + margin."""

    def to_dict(self) -> JsonObject:
        """The plan's ``calibration`` field (docs/calibration.md)."""
        out: JsonObject = {
            "match": self.match,
            "before_bytes": self.before_bytes,
            "after_bytes": self.after_bytes,
            "evidence": self.evidence,
            "margin": {"bytes": self.margin_bytes, "rule": self.margin_rule},
            "largest_peak_bytes": self.largest_peak_bytes,
            "provenance": self.provenance,
            "note": self.note,
            "entry": self.entry,
        }
        if self.need is not None:
            out["need"] = dict(self.need)
            out["call_rise_bytes"] = self.need[
                "call_rise_bytes"
            ]  # the runner starts its worker from it
        return out


class Provenance(TypedDict):
    """Where a calibrated budget's measurements came from (the plan's
    ``calibration.provenance``): how many samples and their span, where they were measured,
    the peaks' range and spread, the recent overruns, the most requests in flight and the
    longest prompt; ``scaled_from`` for a near match."""

    samples: int
    upper_bounds_ignored: int
    first: str
    last: str
    where: list[str]
    peak_min_bytes: int
    peak_max_bytes: int
    spread_bytes: int
    overruns_recent: int
    max_in_flight: int
    max_prompt_chars: int | None
    scaled_from: NotRequired[JsonObject]


class Need(TypedDict):
    """What a recycled worker needs (:func:`_need`): resident after a load, one call's rise,
    the growth it may keep and where that came from, over how many runs; ``needs``,
    ``overruns`` and ``load`` are taken out once the budget is made (:func:`_from_need`)."""

    resident_bytes: int
    call_rise_bytes: int
    growth_bytes: int
    growth_from: str
    runs: int
    needs: NotRequired[list[int]]
    overruns: NotRequired[int]
    load: NotRequired[int]


def _or_peak(s: Sample, key: Literal["load_bytes", "steady_bytes"]) -> int:
    """A sample's load path or steady state; an unknown part counts as the whole peak."""
    value = s.get(key)
    return s["peak_bytes"] if value is None else value


def _n(s: Sample, key: WorkerFigure) -> int:
    """A recycled worker's figure of ``s`` (0 where it has none)."""
    return s.get(key) or 0


WorkerFigure = Literal[
    "resident_bytes",
    "fresh_bytes",
    "call_rise_bytes",
    "worker_calls",
    "retained_bytes",
    "load_bytes",
]


def _profile_of(samples: list[Sample]) -> tuple[int, int, int]:
    """(largest peak, largest load path, largest steady state) of trusted samples; an
    unknown part counts as the whole peak."""
    peak = max(s["peak_bytes"] for s in samples)
    load = max(_or_peak(s, "load_bytes") for s in samples)
    steady = max(_or_peak(s, "steady_bytes") for s in samples)
    return peak, min(load, peak), min(steady, peak)


def provenance(entry: Entry) -> Provenance:
    trusted = entry.trusted()
    peaks = [s["peak_bytes"] for s in trusted]
    recent = trusted[-WINDOW:]
    return Provenance(
        samples=len(trusted),
        upper_bounds_ignored=len(entry.samples) - len(trusted),
        first=trusted[0]["when"],
        last=trusted[-1]["when"],
        where=sorted({s["where"] for s in trusted})[:3],
        peak_min_bytes=min(peaks),
        peak_max_bytes=max(peaks),
        spread_bytes=int(statistics.pstdev(peaks)) if len(peaks) > 1 else 0,
        overruns_recent=sum(1 for s in recent if s["over_budget"] and s["calibrated"]),
        max_in_flight=max((s.get("max_in_flight") or 0) for s in trusted),
        max_prompt_chars=max((s.get("max_prompt_chars") or 0) for s in trusted) or None,
    )


def _margin(entry: Entry) -> Margin:
    trusted = entry.trusted()
    recent = trusted[-WINDOW:]
    overruns = sum(1 for s in recent if s["over_budget"] and s["calibrated"])
    settled = len(recent) >= SETTLED_RUNS and overruns == 0
    request_part = max(
        (
            max(_or_peak(s, "steady_bytes"), 0) - resident
            for s in recent
            if (resident := s.get("resident_bytes")) is not None
        ),
        default=0,
    )
    return margin_for([s["peak_bytes"] for s in recent], overruns, settled, max(0, request_part))


def _rebuild(
    reservations: list[Reservation],
    load: int,
    steady: int,
    evidence: Evidence,
    note: str,
) -> tuple[Reservation, ...]:
    """The stage's reservations with everything but the data (evidence D) replaced by one
    session reservation and one load reservation, so that its load path is ``load`` and its
    steady state ``steady`` (never below what the data alone holds)."""
    data = [r for r in reservations if r.evidence == "D"]
    pool = reservations[0].pool
    d_load, d_steady = load_and_steady(data)
    session = max(0, steady - d_steady)
    transient = max(0, load - (d_load + session))
    out = list(data)
    out.append(
        Reservation(
            pool,
            "measured_beyond_data",
            session,
            "session",
            evidence,
            f"{note}; steady state {fmt_bytes(steady)} less the data above",
        )
    )
    if transient:
        out.append(
            Reservation(
                pool,
                "measured_load_transient",
                transient,
                "load",
                evidence,
                f"{note}; load path {fmt_bytes(load)} above the steady state",
            )
        )
    return tuple(out)


def _growth_floor(reservations: list[Reservation], trusted: list[Sample]) -> tuple[int, str]:
    """The steady state a budget keeps at least when the kind reserves growth over more items
    than a run shows (``RETAINED_GROWTH``): what was resident after the load plus that growth,
    and the words for the note; (0, "") when it reserves none or no sample knows its resident."""
    growth = sum(r.bytes for r in reservations if r.purpose == RETAINED_GROWTH)
    resident = max((r for s in trusted if (r := s.get("resident_bytes")) is not None), default=None)
    if not growth or resident is None:
        return 0, ""
    return resident + growth, (
        f"; at least resident {fmt_bytes(resident)} + {RETAINED_GROWTH} "
        f"{fmt_bytes(growth)} (kept: growth beyond what a run shows)"
    )


def calibrate(
    reservations: list[Reservation], entry: Entry
) -> tuple[tuple[Reservation, ...], Calibration] | None:
    """The stage's reservations from an exact entry (evidence M), or None when it holds no
    trusted sample. The budget is the largest peak seen plus the margin, never below it."""
    trusted = entry.trusted()
    if not trusted or not reservations or len({r.pool for r in reservations}) != 1:
        return None
    before = max(load_and_steady(reservations))
    peak, load, steady = _profile_of(trusted)
    prov = provenance(entry)
    needed = _need(reservations, trusted)
    if needed is not None:
        return _from_need(reservations, entry, needed, before, peak, prov)
    margin = _margin(entry)
    floor, floor_note = _growth_floor(reservations, trusted)
    note = (
        f"measured: largest peak {fmt_bytes(peak)} of {prov['samples']} run(s) "
        f"({prov['first'][:16]}..{prov['last'][:16]}) + margin {fmt_bytes(margin.bytes)}{floor_note}"
    )
    out = _rebuild(reservations, load + margin.bytes, max(steady + margin.bytes, floor), "M", note)
    after = max(load_and_steady(out))
    assert after >= peak + margin.bytes, (
        "a calibrated budget is never below the largest peak plus its margin"
    )
    return out, Calibration(
        "exact", before, after, "M", margin.bytes, margin.rule, peak, prov, entry=str(entry.path)
    )


def _limited(s: Sample) -> bool:
    """Whether ``s`` is a run of a worker recycled at a limit, with the figures to budget it from."""
    return (
        s.get("recycle_limit_bytes") is not None
        and s.get("call_rise_bytes") is not None
        and s.get("resident_bytes") is not None
    )


def _need(reservations: list[Reservation], trusted: list[Sample]) -> Need | None:
    """What a recycled worker needs to do its work, when the latest run was one (else None):
    the most it held right after a load (or a reopen), the largest rise one call caused, and the
    growth it may keep before it is recycled — the kind's ``RETAINED_GROWTH`` reservation, else
    the growth rate its runs measured over ``GROWTH_HORIZON_CALLS`` (at most ``GROWTH_FRACTION`` of
    the rest). Its peak is not among them: the recycle limit, set from the budget, decided it."""
    if not _limited(trusted[-1]):
        return None
    recent = [s for s in trusted[-WINDOW:] if _limited(s)]
    resident = max(max(_n(s, "resident_bytes"), _n(s, "fresh_bytes")) for s in recent)
    rise = max(_n(s, "call_rise_bytes") for s in recent)
    kind_growth = sum(r.bytes for r in reservations if r.purpose == RETAINED_GROWTH)
    calls = sum(_n(s, "worker_calls") for s in recent)
    rate = sum(_n(s, "retained_bytes") for s in recent) / calls if calls else 0.0
    if kind_growth:
        growth, source = kind_growth, f"the kind's {RETAINED_GROWTH} reservation"
    else:
        growth = min(
            math.ceil(rate * GROWTH_HORIZON_CALLS), math.ceil(GROWTH_FRACTION * (resident + rise))
        )
        source = (
            f"{fmt_bytes(int(rate))} a call measured over {calls} call(s) x {GROWTH_HORIZON_CALLS} "
            f"(at most {GROWTH_FRACTION:.0%} of resident + rise)"
        )
    return Need(
        resident_bytes=resident,
        call_rise_bytes=rise,
        growth_bytes=growth,
        growth_from=source,
        runs=len(recent),
        needs=[
            max(_n(s, "resident_bytes"), _n(s, "fresh_bytes")) + _n(s, "call_rise_bytes")
            for s in recent
        ],
        overruns=sum(1 for s in recent if s["over_budget"] and s["calibrated"]),
        load=max(
            _n(s, "resident_bytes") if s.get("load_bytes") is None else _n(s, "load_bytes")
            for s in recent
        ),
    )


def _from_need(
    reservations: list[Reservation],
    entry: Entry,
    need: Need,
    before: int,
    peak: int,
    prov: Provenance,
) -> tuple[tuple[Reservation, ...], Calibration]:
    """A recycled worker's reservations: steady state = resident + one call's rise + growth + a
    margin from the spread of (resident + rise) over its runs; the load path as measured + margin.
    Stationary figures, so the budget converges however long the runs (docs/calibration.md)."""
    needs, overruns, load = need.pop("needs"), need.pop("overruns"), need.pop("load")
    settled = need["runs"] >= SETTLED_RUNS and overruns == 0
    margin = margin_for(needs, overruns, settled)
    steady = need["resident_bytes"] + need["call_rise_bytes"] + need["growth_bytes"] + margin.bytes
    note = (
        f"measured need: resident {fmt_bytes(need['resident_bytes'])} + one call's rise "
        f"{fmt_bytes(need['call_rise_bytes'])} + growth {fmt_bytes(need['growth_bytes'])} "
        f"({need['growth_from']}) + margin {fmt_bytes(margin.bytes)} over {need['runs']} run(s); the largest "
        f"peak {fmt_bytes(peak)} is not evidence of need: the worker is recycled at its budget"
    )
    out = _rebuild(reservations, load + margin.bytes, steady, "M", note)
    after = max(load_and_steady(out))
    return out, Calibration(
        "exact",
        before,
        after,
        "M",
        margin.bytes,
        margin.rule,
        peak,
        prov,
        note=note,
        entry=str(entry.path),
        need=need,
    )


def scaled(
    reservations: list[Reservation],
    entry: Entry,
    scaling: Mapping[str, Any],
) -> tuple[tuple[Reservation, ...], Calibration] | None:
    """From a near match (other scaling settings): the measured load path and steady state
    moved by exactly what the kind's own arithmetic changes between the two (the difference
    of its metadata reservations then and now), with the entry's margin. Evidence E (from M)."""
    trusted = entry.trusted()
    if (
        not trusted
        or not entry.basis
        or not reservations
        or len({r.pool for r in reservations}) != 1
    ):
        return None
    before = max(load_and_steady(reservations))
    peak, load, steady = _profile_of(trusted)
    old_load, old_steady = load_and_steady(entry.basis)
    new_load, new_steady = load_and_steady(reservations)
    margin = _margin(entry)
    s_load = max(0, load + (new_load - old_load))
    s_steady = max(0, steady + (new_steady - old_steady))
    old_scaling = entry.key.get("scaling", {})
    changed = ", ".join(
        f"{k} {old_scaling.get(k)}→{scaling.get(k)}"
        for k in sorted(set(old_scaling) | set(scaling))
        if old_scaling.get(k) != scaling.get(k)
    )
    note = (
        f"E from M: measured {fmt_bytes(peak)} at {changed or 'other settings'}, moved by the kind's "
        f"arithmetic (load {fmt_bytes(new_load - old_load)}, steady {fmt_bytes(new_steady - old_steady)}) "
        f"+ margin {fmt_bytes(margin.bytes)}"
    )
    floor, floor_note = _growth_floor(reservations, trusted)
    note += floor_note
    out = _rebuild(
        reservations, s_load + margin.bytes, max(s_steady + margin.bytes, floor), "E", note
    )
    after = max(load_and_steady(out))
    prov = provenance(entry)
    prov["scaled_from"] = dict(old_scaling)
    return out, Calibration(
        "near",
        before,
        after,
        "E",
        margin.bytes,
        margin.rule,
        peak,
        prov,
        note=note,
        entry=str(entry.path),
    )


def lookup(
    store: CalibrationStore,
    key: Key,
    reservations: list[Reservation],
) -> tuple[tuple[Reservation, ...], Calibration] | None:
    """Calibrated reservations for ``key``: an exact entry, else a near one, else None."""
    entry = store.load(key)
    if entry is not None:
        found = calibrate(reservations, entry)
        if found is not None:
            return found
    near = store.near(key)
    if near is not None:
        return scaled(reservations, near, key.scaling)
    return None


def calibrated_shared(
    store: CalibrationStore, key: Key, reservation: Reservation
) -> Reservation | None:
    """A pipeline cost (``ray_runtime``, ``server``) from its measurements: largest + margin (M)."""
    entry = store.load(key)
    if entry is None or not entry.trusted():
        return None
    peak = max(s["peak_bytes"] for s in entry.trusted())
    margin = _margin(entry)
    prov = provenance(entry)
    return Reservation(
        reservation.pool,
        reservation.purpose,
        peak + margin.bytes,
        reservation.lifetime,
        "M",
        f"measured: largest {fmt_bytes(peak)} of {prov['samples']} run(s), last {prov['last'][:16]}, "
        f"+ margin {fmt_bytes(margin.bytes)} (metadata estimate {fmt_bytes(reservation.bytes)})",
        reservation.at_load,
    )
