"""Reservations from measured peaks: a candidate's calibration key, its reservations replaced by the measurement store's calibrated ones (evidence M, or scaled from a near match), and the plan's notes on what was used or why not."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator import calibration as cal
from orchestrator.core.ledger import Reservation
from orchestrator.core.plan import (
    StagePlan,
)
from orchestrator.core.profile import (
    HardwareProfile,
)
from orchestrator.core.units import fmt_bytes
from orchestrator.planner_options import Calibrating, Candidate, artifact_record, capacity_of


def candidate_key(
    candidate: Candidate, metadata: Sequence[Reservation], profile: HardwareProfile, pipeline: str
) -> cal.Key:
    """The measurement store's key of a candidate: what the runtime files its peaks under."""
    stage, kind, info, device = candidate.stage, candidate.kind, candidate.info, candidate.device
    kwargs = kind.engine_kwargs(
        stage, info, device, candidate.backend, list(metadata), capacity_of(profile, device)
    )
    return cal.stage_key(
        pipeline=pipeline,
        stage=stage.name,
        kind=stage.kind,
        artifact=artifact_record(info),
        device=device.id,
        backend=candidate.backend,
        route=candidate.route.name,
        engine_kwargs=kwargs,
        profile=profile,
    )


def calibrated(
    candidate: Candidate,
    metadata: tuple[Reservation, ...],
    profile: HardwareProfile,
    calibrating: Calibrating | None,
) -> tuple[tuple[Reservation, ...], cal.Calibration | None]:
    """The candidate's reservations from the measurement store when it holds a match
    (exact: evidence M; near: E from M), else the kind's own, unchanged."""
    if calibrating is None or not metadata or len({r.pool for r in metadata}) != 1:
        return metadata, None
    key = candidate_key(candidate, metadata, profile, calibrating.pipeline)
    found = cal.lookup(calibrating.store, key, list(metadata))
    if found is None:
        path = calibrating.store.path(key)
        trouble = calibrating.store.unusable.get(path)
        if trouble is not None:
            where = (candidate.stage.name, candidate.device.id, candidate.backend)
            calibrating.unusable[where] = (path.name, trouble)
        return metadata, None
    return found


def calibrated_shared(shared: list[Reservation], calibrating: Calibrating) -> list[Reservation]:
    """The pipeline's own costs from their measurements (the Ray runtime), where there are some.
    Ray's on a cluster's node is looked up by that node's own key (``cal.pool_ray_key``: its
    machine, its name), so each node's ``host_ram`` gets what was measured on that node."""
    out = []
    for r in shared:
        if r.purpose == "ray_runtime":
            key = cal.pool_ray_key(calibrating.profile, r.pool)
            r = cal.calibrated_shared(calibrating.store, key, r) or r
        elif r.purpose == "server":
            r = (
                cal.calibrated_shared(calibrating.store, cal.server_key(calibrating.profile), r)
                or r
            )
        out.append(r)
    return out


def calibration_notes(
    stage_plans: Sequence[StagePlan], shared: Sequence[Reservation], calibrating: Calibrating
) -> list[str]:
    used = [s for s in stage_plans if s.calibration is not None]
    notes = list(calibrating.store.problems)
    ray = [r.pool for r in shared if r.purpose == "ray_runtime" and r.evidence == "M"]
    on_nodes = [pool.rpartition("/")[0] for pool in ray if "/" in pool]
    server = any(r.purpose == "server" and r.evidence == "M" for r in shared)
    if used or ray or server:
        parts = [
            f"{s.name} {fmt_bytes(s.calibration['before_bytes'])} → {fmt_bytes(s.calibration['after_bytes'])} "
            f"({s.calibration['match']})"
            for s in used
            if s.calibration is not None
        ]
        if ray:
            parts.append("ray_runtime (M)" + (f" on {', '.join(on_nodes)}" if on_nodes else ""))
        if server:
            parts.append("server (M)")
        notes.append(
            f"calibrated from measured peaks in {calibrating.store.root}: {'; '.join(parts)}; "
            "`--no-calibration` plans from metadata alone"
        )
    unmeasured = []
    for s in stage_plans:
        if not s.admitted or s.calibration is not None:
            continue
        unusable = calibrating.unusable.get((s.name, s.device or "", s.backend or ""))
        if unusable is None:
            unmeasured.append(s.name)
        else:
            notes.append(_unusable_note(s.name, *unusable))
    if used and unmeasured:
        notes.append(
            f"{', '.join(unmeasured)}: no measurement yet, so activations, workspaces, transients and "
            "margins are estimates (E); a run records measured peaks (M) for the next plan"
        )
    return notes


def _unusable_note(stage: str, name: str, trouble: cal.Unusable) -> str:
    """What happened to a stage whose measurements are in an entry the store could not use."""
    if trouble.kind == "newer":
        return (
            f"{stage}: its measurements ({name}) are of a newer format than this omni-edge "
            "reads, so it is budgeted from metadata (E) as if unmeasured; runs of this version "
            "leave that entry as it is (the newer omni-edge plans from it)"
        )
    return (
        f"{stage}: its measurements ({name}) could not be used ({trouble.kind}, see above), so it "
        f"is budgeted from metadata (E); the next run keeps that file aside as "
        f"{name}.corrupt-<time> and starts a new entry"
    )
