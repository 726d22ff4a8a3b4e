"""A run's measured peaks written to the measurement store, for the next plan.

:func:`record_run` takes what a started pipeline measured (:class:`RunMeasurements`: each
instance's measured peak, the Ray runtime's memory, the serving process's) and writes one
sample per key (``orchestrator.calibration``): each admitted, placed stage by what sets its
memory (pipeline, stage, kind, artifact, device, backend, route, engine, profile); replicas of
one stage that share a key record one sample, the larger peak; the Ray runtime once on one
machine and once per node on a cluster; the serving process once. Upper bounds are kept
labelled and never calibrate. Nothing is recorded for what measured nothing.

It reads plain data: the runtime (a layer above) hands it the figures, so recording needs
neither Ray nor the runtime's classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from orchestrator import calibration as cal
from orchestrator.core.documents import JsonObject
from orchestrator.core.ledger import MeasuredPeak
from orchestrator.core.memory import RayMemory
from orchestrator.core.plan import PipelinePlan, StagePlan
from orchestrator.core.profile import HOST_RAM, HardwareProfile, node_pool


class ServerMemory(TypedDict):
    """The serving process's own memory against its plan (``Pipeline.server_memory``; the run
    record's and ``/v1/plan``'s ``server``): PSS (RSS where PSS cannot be read) now, how and
    where it was measured, and the ``server`` reservation's bytes, evidence and pool."""

    measured_bytes: int
    measure: str
    budget_bytes: int
    evidence: str
    pool: str
    within_budget: bool | None


@dataclass(frozen=True)
class RunMeasurements:
    """What one started pipeline measured, for the store."""

    run_id: str
    plan: PipelinePlan
    profile: HardwareProfile
    views: Mapping[str, StagePlan]
    """Ledger holder → the stage's plan as that instance runs it."""
    measured: Mapping[str, MeasuredPeak]
    """Ledger holder → its measured peak (``DeviceActor.measure``'s figures)."""
    ray_memory: RayMemory
    """The Ray runtime's measured memory (its bytes and how, or each node's: ``nodes``)."""
    owns_ray: bool
    """Whether this run started the Ray cluster it ran on (part of the Ray runtime's key)."""
    server: ServerMemory | None
    """The serving process's memory against its plan (``Pipeline.server_memory``), or None."""
    longest_prompt: int | None
    """The longest text prompt of the run, in characters (None: no text prompt)."""


def record_run(store: cal.CalibrationStore, run: RunMeasurements) -> list[JsonObject]:
    """Every sample of ``run`` written to ``store``; one row per sample: what was recorded where."""
    out = _record_stage_peaks(store, run)
    out += _record_ray_peaks(store, run)
    out += [row for row in (_record_server_peak(store, run),) if row]
    return out


def _record_stage_peaks(store: cal.CalibrationStore, run: RunMeasurements) -> list[JsonObject]:
    largest: dict[str, tuple[StagePlan, MeasuredPeak, Any]] = {}
    for holder, s in run.views.items():
        m = run.measured.get(holder)
        if (
            not s.admitted
            or s.device is None
            or s.backend is None
            or not m
            or not m.get("measured_peak_bytes")
        ):
            continue
        key = cal.stage_key(
            pipeline=run.plan.pipeline,
            stage=s.name,
            kind=s.kind,
            artifact=s.artifact,
            device=s.device,
            backend=s.backend,
            route=s.route,
            engine_kwargs=s.engine_kwargs,
            profile=run.profile,
        )
        seen = largest.get(repr(key))
        if seen is None or m["measured_peak_bytes"] > seen[1]["measured_peak_bytes"]:
            largest[repr(key)] = (s, m, key)
    return [_record_stage(store, run, s, m, key) for s, m, key in largest.values()]


def _record_stage(
    store: cal.CalibrationStore,
    run: RunMeasurements,
    s: StagePlan,
    m: MeasuredPeak,
    key: Any,
) -> JsonObject:
    """One stage's (or replica's) measured peak as a sample of the store, under ``key``."""
    peak = int(m["measured_peak_bytes"])
    sample = cal.sample(
        run=run.run_id,
        peak=peak,
        budget=s.budget_bytes(),
        calibrated=s.calibration is not None,
        upper_bound=bool(m.get("upper_bound")),
        load=m.get("load_peak_bytes"),
        steady=m.get("steady_peak_bytes"),
        resident=m.get("resident_bytes"),
        requests=int(m.get("requests") or 0),
        max_in_flight=int(m.get("max_in_flight") or 0),
        max_prompt_chars=run.longest_prompt,
        where=str(m.get("where") or ""),
        method=str(m.get("method") or ""),
        pool=s.pool or "host_ram",
        worker=m.get("worker"),
    )
    # the kind's own reservations, for scaling a near match later (a calibrated plan no longer has them)
    basis = s.reservations if s.calibration is None else ()
    path = store.record(key, sample, basis)
    return recorded(s.name, path, peak, s.budget_bytes(), sample, sample["upper_bound"])


def _record_ray_peaks(store: cal.CalibrationStore, run: RunMeasurements) -> list[JsonObject]:
    """The Ray runtime's measured memory: on one machine one sample (its processes beside
    the actors), keyed by the profile and whether this run owns the cluster; on a
    cluster one sample per node, measured on that node, keyed by the node's own profile
    and name (``cal.ray_key(..., node=)``)."""
    nodes = run.ray_memory.get("nodes")
    measured: dict[str, tuple[int | None, str, str | None]]
    if isinstance(nodes, dict) and run.profile.nodes:
        measured = {
            name: (m.get("bytes"), str(m.get("measure") or ""), name)
            for name, m in nodes.items()
            if name in run.profile.nodes and isinstance(m, dict)
        }
    else:
        memory = run.ray_memory
        measured = {"": (memory.get("bytes"), str(memory.get("measure") or ""), None)}
    out = []
    for name, (ray_bytes, how, node) in measured.items():
        if not isinstance(ray_bytes, int) or ray_bytes <= 0:
            continue
        pool = node_pool(node, HOST_RAM)
        planned = next(
            (
                r
                for r in run.plan.shared_reservations
                if r.purpose == "ray_runtime" and r.pool == pool
            ),
            None,
        )
        key = (
            cal.ray_key(run.profile.nodes[name].profile, node=name)
            if node
            else cal.ray_key(run.profile, owned=run.owns_ray)
        )
        sample = cal.sample(
            run=run.run_id,
            peak=ray_bytes,
            budget=planned.bytes if planned else None,
            calibrated=planned is not None and planned.evidence == "M",
            method=how,
        )
        path = store.record(key, sample)
        label = f"(ray_runtime) on {node}" if node else "(ray_runtime)"
        out.append(recorded(label, path, ray_bytes, sample["budget_bytes"], sample))
    return out


def _record_server_peak(store: cal.CalibrationStore, run: RunMeasurements) -> JsonObject | None:
    """The serving process's own measured memory; None when the plan has no server
    reservation or nothing was measured."""
    server = run.server
    if server is None or not server["measured_bytes"]:
        return None
    key = cal.server_key(run.profile)
    sample = cal.sample(
        run=run.run_id,
        peak=server["measured_bytes"],
        budget=server["budget_bytes"],
        calibrated=server["evidence"] == "M",
        method=server["measure"],
    )
    path = store.record(key, sample)
    return recorded("(server)", path, server["measured_bytes"], sample["budget_bytes"], sample)


def recorded(
    stage: str,
    entry: Path | None,
    peak: int,
    budget: int | None,
    sample: Mapping[str, Any],
    upper_bound: bool = False,
) -> JsonObject:
    """One row of ``record_run``'s answer: what was recorded where (``entry`` None: nothing,
    its entry being of a newer format, which is never written over: ``not_recorded``)."""
    return {
        "stage": stage,
        "entry": str(entry) if entry is not None else None,
        **({} if entry is not None else {"not_recorded": "its entry is of a newer format"}),
        "peak_bytes": peak,
        "budget_bytes": budget,
        "upper_bound": upper_bound,
        "over_budget": sample["over_budget"],
        "calibrated": sample["calibrated"],
    }
