"""The planner: where each stage runs, every byte it reserves, or why not.

Guarantees:

* Nothing is loaded: stage kinds read metadata only; no engine starts, no
  ONNX Runtime session opens (exported placements carry their cached
  verification state or are marked unverified).
* Every candidate device the config allows is either chosen or refused with
  a code, the numbers and a remedy.
* Memory is checked across all stages at once on one ledger: stages on the
  CPU, iGPU and NPU all draw on ``host_ram``, so stages that each fit alone
  can be refused together, naming every contributor.
* The search is deterministic: assignments are tried in the config's
  preference order (first stage's first choice first), and the first one
  whose pools all fit wins.
* Nothing is changed on the user's behalf: no context is shortened, no
  precision swapped, no stage moved outside its ``devices`` list.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

from orchestrator import calibration as cal
from orchestrator.config import PipelineConfig, StageConfig
from orchestrator.core.backends import BACKENDS as ORT_BACKENDS
from orchestrator.core.errors import RefusalCode
from orchestrator.core.ledger import PIPELINE_HOLDER, Ledger, Reservation
from orchestrator.core.plan import (
    PipelinePlan,
    PoolPlan,
    Refusal,
    ReplicaPlan,
    RestartDoc,
    StagePlan,
    Verification,
)
from orchestrator.core.profile import (
    Device,
    HardwareProfile,
    Route,
    host_ram_pools,
    node_pool,
    profile_pools,
)
from orchestrator.core.units import GiB, MiB, fmt_bytes
from orchestrator.ort.routes import resolve, static_refusal
from orchestrator.planner_calibration import (
    calibrated,
    calibrated_shared,
    calibration_notes,
    candidate_key,
)
from orchestrator.planner_options import (
    Calibrating,
    Candidate,
    Excluded,
    Option,
    StageState,
    artifact_record,
    breakdown,
    capacity_of,
    masked,
    parse_mask,
    where_of,
)
from orchestrator.planner_search import choose, refuse_unplaceable_replicas, replica_states
from orchestrator.planner_threads import with_cpu_threads
from orchestrator.probe import engines
from orchestrator.probe.host import cpu_model, host_os, running_in_wsl
from orchestrator.verify.placement import cached_verdict, node_verification
from stages.base import ArtifactInfo, GateSpec, RestartConfig, StageKind
from stages.registry import get_kind

__all__ = [
    "SERVER_BYTES",
    "Candidate",
    "Excluded",
    "build_ledger",
    "candidate_key",
    "describes_this_machine",
    "parse_mask",
    "plan_pipeline",
    "route_refusal",
    "stage_candidates",
    "verification_refusals",
]
"""What the planner offers its callers (the records, the mask and the calibration key live
in ``planner_options`` and ``planner_calibration``, named here too)."""

log = logging.getLogger(__name__)

EXTERNAL_RESERVE_VRAM = 1 * GiB
"""VRAM this pipeline does not control: the compositor and other applications'
contexts on a GPU that also drives a display."""
EXTERNAL_RESERVE_HOST = 512 * MiB
"""Host RAM that other processes may take between planning and loading; the
capacity is already what is *available*, so this covers drift, not the OS."""
SAFETY_MARGIN_BYTES = 512 * MiB
"""Fragmentation and allocator slack per top-level pool."""
ESTIMATES_NOTE = (
    "activations, workspaces, transients and margins are estimates (E); the runtime records "
    "measured peaks (M) against them"
)
RAY_RUNTIME_BYTES = int(0.9 * GiB)
SERVER_BYTES = 384 * MiB
"""The ``serve`` process itself (the HTTP app, the Ray driver, the planner's imports):
a stated figure until a server run measures it (``calibration.server_key``). Here
the process held 96 MiB RSS (78 MiB PSS) with its imports (orchestrator.api and
.server, uvicorn, ray) before ``ray.init``; 384 MiB leaves room for the driver's
Ray core worker, request buffers (audio replies) and the allocator's slack."""
"""A small local Ray cluster plus its actors, as summed RSS: conservative, since RSS
counts shared pages in every process. The runtime replaces it with its own
measurement (M, summed PSS) when it starts; figures in docs/runtime.md, "Ray's own
memory", and docs/benchmarks.md."""


def build_ledger(
    profile: HardwareProfile, *, runtime: bool = True, server: bool = False
) -> tuple[Ledger, list[Reservation]]:
    """Pools from the profile, with the pipeline's own reservations admitted
    (``server``: the ``serve`` process too, on the driver's host RAM)."""
    ledger = Ledger()
    for spec in profile_pools(profile):
        ledger.add_pool(spec.id, spec.capacity, parent=spec.parent, note=spec.note)
    shared = []
    for pool in list(ledger.pools.values()):
        if pool.parent is not None:
            continue
        reserve = (
            EXTERNAL_RESERVE_VRAM
            if pool.id.rpartition("/")[2].startswith("vram:")
            else EXTERNAL_RESERVE_HOST
        )
        shared.append(
            Reservation(
                pool.id,
                "external_reserve",
                reserve,
                "session",
                "E",
                "memory this pipeline does not control",
            )
        )
        shared.append(
            Reservation(
                pool.id,
                "safety_margin",
                SAFETY_MARGIN_BYTES,
                "session",
                "E",
                "fragmentation and allocator slack",
            )
        )
    if runtime:  # in a cluster: Ray's daemons on every node
        shared.extend(
            Reservation(
                pool,
                "ray_runtime",
                RAY_RUNTIME_BYTES,
                "session",
                "E",
                "local Ray cluster and actors (~0.9 GiB measured on a 2-core machine)",
            )
            for pool in host_ram_pools(profile)
        )
    if server and host_ram_pools(profile):  # the driver runs on the first node (the one that plans)
        shared.append(
            Reservation(
                host_ram_pools(profile)[0],
                "server",
                SERVER_BYTES,
                "session",
                "E",
                "the serve process itself (HTTP app, Ray driver): stated figure SERVER_BYTES "
                "until a server run measures it",
            )
        )
    ledger.held[PIPELINE_HOLDER] = list(shared)
    return ledger, shared


def plan_pipeline(
    config: PipelineConfig,
    profile: HardwareProfile,
    *,
    mask: frozenset[str] = frozenset(),
    runtime: bool = True,
    refused: Mapping[tuple[str, str, str], Sequence[Refusal]] | None = None,
    calibration: cal.CalibrationStore | None = None,
    server: bool = False,
    plan_threads: bool = True,
) -> PipelinePlan:
    """Plan every stage of ``config`` on ``profile``; refuse with reasons when impossible.

    ``refused``: verdicts a verification just reached, ``(stage, device,
    backend)`` → its refusals (what ``omni-edge verify`` found that no evidence
    file records, e.g. a route that would not start or lacks the EP); such a
    candidate is never chosen, as if its evidence had failed.

    ``calibration``: a measurement store; where it holds measured peaks for a
    candidate (or a near match), the candidate's reservations come from them
    (``calibrated``, docs/calibration.md). None plans from metadata alone.

    ``server``: the pipeline will be served (``omni-edge serve``): the serve
    process's own memory is a shared reservation (E from ``SERVER_BYTES``, M
    once a server run has measured it). ``plan`` and ``run`` leave it out.

    ``plan_threads``: give each stage placed on the CPU a thread budget, its share of
    the host's cores (``orchestrator.core.cpu_threads``; a config's ``cpu_threads`` is taken
    as it is). False leaves every budget but the config's to the engines' own defaults
    (``bench/threads.py`` compares the two).

    Raises ``ConfigError`` only for unreadable input (a missing checkpoint,
    a malformed manifest); every other outcome is a plan, admitted or not.
    """
    calibrating = (
        Calibrating(calibration, config.name, profile) if calibration is not None else None
    )
    ledger, shared = build_ledger(profile, runtime=runtime, server=server)
    if calibrating is not None:
        shared = calibrated_shared(shared, calibrating)
        ledger.held[PIPELINE_HOLDER] = list(shared)
    states = [
        _stage_state(stage, profile, mask, ledger, refused or {}, calibrating)
        for stage in config.topological()
    ]
    placing = [r for s in states for r in replica_states(s)]
    refuse_unplaceable_replicas(placing, ledger)
    chosen = choose(placing, ledger)
    stage_plans = tuple(
        _stage_plan(s, [chosen.get(r.holder) for r in replica_states(s, placing)], profile)
        for s in states
    )
    stage_plans, thread_notes = with_cpu_threads(
        stage_plans, {s.stage.name: s for s in states}, profile, plan_threads
    )
    pools = _pool_plans(ledger)
    admitted = all(s.admitted for s in stage_plans)
    notes = _evidence_notes(stage_plans, shared, calibrating) + thread_notes
    if profile.nodes:
        stage_plans, cluster_note = _on_nodes(stage_plans, profile)
        notes.append(cluster_note)
    return PipelinePlan(
        pipeline=config.name,
        admitted=admitted,
        profile=profile.name,
        stages=stage_plans,
        pools=pools,
        shared_reservations=tuple(shared),
        config_path=config.source,
        notes=tuple(notes),
    )


def _pool_plans(ledger: Ledger) -> tuple[PoolPlan, ...]:
    """Each pool's capacity beside the peak the admitted reservations reach in it."""
    pools = []
    for pool_id, pool in ledger.pools.items():
        peak, shares = ledger.peak(pool_id)
        pools.append(PoolPlan(pool_id, pool.capacity, peak, shares, pool.parent, pool.note))
    return tuple(pools)


def _evidence_notes(
    stage_plans: tuple[StagePlan, ...],
    shared: list[Reservation],
    calibrating: Calibrating | None,
) -> list[str]:
    """The plan's notes on its evidence: unverified placements, estimates or calibration."""
    notes = []
    if any(
        p.verification and p.verification.status == "unverified"
        for s in stage_plans
        for p in s.placements()
    ):
        notes.append(
            "exported placements marked unverified have no coverage/numeric evidence yet: run `omni-edge verify`"
        )
    calibrated = (
        calibration_notes(stage_plans, shared, calibrating) if calibrating is not None else []
    )
    if not any(s.calibration for s in stage_plans):
        notes.append(ESTIMATES_NOTE)
    return notes + calibrated


def _on_nodes(
    stage_plans: tuple[StagePlan, ...], profile: HardwareProfile
) -> tuple[tuple[StagePlan, ...], str]:
    """On a cluster profile: the stage plans with their nodes, and the note naming the
    edges that cross between nodes."""
    stage_plans, crossing = _with_nodes(stage_plans)
    note = (
        f"cluster of {len(profile.nodes)} nodes ({', '.join(profile.node_names)}); edges between nodes: "
        + (", ".join(crossing) or "none")
        + (
            "; their transfer cost (items, bytes per item) is measured at run time: the run "
            "record's edges[]"
            if crossing
            else ""
        )
    )
    return stage_plans, note


def stage_candidates(
    stage: StageConfig,
    kind: StageKind,
    info: ArtifactInfo,
    profile: HardwareProfile,
    mask: frozenset[str],
) -> list[Candidate | Excluded]:
    """Every device of the stage's list, in its order: the candidates it yields (one
    per backend, in the stage's or else the device's order) or why it yields none.

    The one enumeration of candidates: the planner tries them, ``omni-edge
    verify`` measures the gated ones. Nothing is checked beyond the config and
    the profile (no route reachability, no artifact fit).
    """
    if profile.nodes:
        return _cluster_candidates(stage, kind, info, profile, mask)
    out: list[Candidate | Excluded] = []
    for dev_id in stage.devices:
        device = profile.device(dev_id)
        if masked(dev_id, mask):
            out.append(Excluded(stage.name, dev_id, "masked"))
            continue
        if device is None:
            out.append(Excluded(stage.name, dev_id, "absent"))
            continue
        wanted = stage.backends or list(device.backends)
        backends = [b for b in wanted if b in device.backends and b in kind.stage_backends(stage)]
        named = [
            Excluded(stage.name, dev_id, "unavailable", b, why)
            for b in stage.backends or ()
            if b not in device.backends
            and b in kind.stage_backends(stage)
            and (why := engines.unavailable(profile, device, b))
        ]
        out.extend(named)
        if not backends:
            if not named:
                out.append(Excluded(stage.name, dev_id, "no_backend"))
            continue
        for backend in backends:
            route = profile.route(device.route_for(backend))
            assert route is not None  # the profile validator guarantees it
            out.append(Candidate(stage, kind, info, device, backend, route))
    return out


def _stage_state(
    stage: StageConfig,
    profile: HardwareProfile,
    mask: frozenset[str],
    base: Ledger,
    refused: Mapping[tuple[str, str, str], Sequence[Refusal]],
    calibrating: Calibrating | None = None,
) -> StageState:
    """The stage's artifact described, each candidate tried alone against ``base``:
    the options that fit, and a refusal for every other device and backend."""
    kind = get_kind(stage.kind)
    info = kind.describe(stage)
    state = StageState(stage, kind, info, [], [])
    for found in stage_candidates(stage, kind, info, profile, mask):
        if isinstance(found, Excluded):
            state.refusals.append(_exclusion(found, stage, kind, profile))
            continue
        verdict = refused.get((stage.name, found.device.id, found.backend))
        if verdict:
            state.refusals.extend(verdict)
            continue
        option = _try(found, base, state.refusals, profile, calibrating)
        if option is not None:
            state.options.append(option)
    return state


def _exclusion(
    excluded: Excluded, stage: StageConfig, kind: StageKind, profile: HardwareProfile
) -> Refusal:
    dev_id = excluded.device
    if excluded.why == "masked":
        return Refusal(
            RefusalCode.NO_RUNNABLE_DEVICE,
            dev_id,
            f"{dev_id} is excluded by --mask",
            "drop it from --mask to consider it",
        )
    if excluded.why == "absent" and profile.nodes:
        return Refusal(
            RefusalCode.NO_RUNNABLE_DEVICE,
            dev_id,
            f"no node of the cluster ({profile.name}) has {dev_id} (its devices: {', '.join(d.id for d in profile.devices)})",
            "remove it from the stage's devices, name a device one node has (NODE/ID, or ID for any node's), "
            "or plan with --profile for a cluster that has it",
        )
    if excluded.why == "absent":
        have = ", ".join(d.id for d in profile.devices)
        return Refusal(
            RefusalCode.NO_RUNNABLE_DEVICE,
            dev_id,
            f"this machine ({profile.name}) has no {dev_id} (it has {have})",
            "remove it from the stage's devices, or plan with --profile for a machine that has it",
        )
    if excluded.why == "unavailable":
        return Refusal(
            RefusalCode.DEVICE_UNREACHABLE,
            dev_id,
            f"{dev_id} ({excluded.backend}): {excluded.reason}",
            engines.remedy(excluded.backend, stage.name),
        )
    device = profile.device(dev_id)
    assert device is not None
    return Refusal(
        RefusalCode.NO_RUNNABLE_DEVICE,
        dev_id,
        f"{dev_id} offers {', '.join(device.backends) or 'no backend'}; a {stage.kind} stage needs one of {', '.join(b for b in (stage.backends or kind.stage_backends(stage)))}",
        f"install a backend for {dev_id} ({', '.join(kind.stage_backends(stage))}), or place the stage on another device",
    )


def describes_this_machine(profile: HardwareProfile) -> bool:
    """Whether ``profile`` is this machine (same OS, same side of WSL, and the same
    CPU when it names one): then its routes' interpreters must exist here."""
    if profile.host.os != host_os() or profile.host.wsl != running_in_wsl():
        return False
    if profile.host.cpu_name:
        here = cpu_model()[0]
        if here and profile.host.cpu_name.strip() != here.strip():
            return False
    return True


def verification_refusals(results: Iterable[Any]) -> dict[tuple[str, str, str], list[Refusal]]:
    """``(stage, device, backend)`` → refusals, from a verification's results
    (``orchestrator.verify.placement.PlacementResult``: ``status == "refused"``),
    for :func:`plan_pipeline`'s ``refused``."""
    out: dict[tuple[str, str, str], list[Refusal]] = {}
    for r in results:
        if r.status == "refused" and r.refusals:
            out.setdefault((r.stage, r.device, r.backend), []).extend(r.refusals)
    return out


def route_refusal(
    profile: HardwareProfile, device: Device, backend: str, route: Route
) -> Refusal | None:
    """Why ``route`` cannot drive ``device`` with ``backend``, from what is known without
    starting anything, or None. A refused route is never chosen: the planner takes the
    next candidate, or refuses the stage."""
    where = where_of(device, backend)
    if not route.reachable:
        return Refusal(
            RefusalCode.DEVICE_UNREACHABLE,
            device.id,
            f"{where} exists but route {route.name!r} cannot reach it from this process: {route.reason or 'unreachable'}",
            route.remedy
            or "run omni-edge where the route is reachable, or declare a route (venv or host process) that can drive it",
        )
    if route.kind == "interpreter" and describes_this_machine(profile):
        python = resolve(route).python
        if not python or not os.path.isfile(python) or not os.access(python, os.X_OK):
            state = (
                "is not set"
                if not python
                else ("is not executable" if os.path.isfile(python) else "does not exist")
            )
            return Refusal(
                RefusalCode.DEVICE_UNREACHABLE,
                device.id,
                f"{where}: route {route.name!r} runs through the interpreter {python or '(none)'}, which {state} on this machine",
                f"create that environment (python -m venv {os.path.dirname(os.path.dirname(python)) if python else 'DIR'}, "
                "then install the execution provider's onnxruntime build in it), or correct routes[].python in the profile "
                "(omni-edge probe --save FILE writes a profile whose routes were found here)",
            )
    if backend in ORT_BACKENDS:
        return static_refusal(profile, device, backend)
    if engines.needs_build(backend) and describes_this_machine(profile):
        return engines.route_refusal(device, backend, route)
    return None


def _try(
    candidate: Candidate,
    base: Ledger,
    refusals: list[Refusal],
    profile: HardwareProfile,
    calibrating: Calibrating | None = None,
) -> Option | None:
    if candidate.device.node and profile.nodes:
        return _try_on_node(candidate, refusals, profile)
    stage, kind, info = candidate.stage, candidate.kind, candidate.info
    device, backend, route = candidate.device, candidate.backend, candidate.route
    unreachable = route_refusal(profile, device, backend, route)
    if unreachable is not None:
        refusals.append(unreachable)
        return None
    found = kind.check(stage, info, device, backend)
    if found:
        refusals.extend(found)
        return None
    verification, failed = _verdict(kind.gate_specs(stage, info, device, backend), route)
    if failed:
        refusals.extend(failed)
        return None
    pool = device.pool
    metadata = tuple(kind.reservations(stage, info, device, backend, pool))
    reservations, calibration = calibrated(candidate, metadata, profile, calibrating)
    shortfalls = base.check({stage.name: list(reservations)})
    if shortfalls:
        sf = shortfalls[0]
        own = sf.contributors.get(stage.name, 0)
        available = sf.capacity - (sf.peak - own)
        refusals.append(
            Refusal(
                RefusalCode.BUDGET_EXCEEDS_DEVICE,
                device.id,
                f"{stage.name} needs {fmt_bytes(own)} on {sf.pool} ({breakdown(reservations, sf.pool)}) and "
                f"{fmt_bytes(available)} of {fmt_bytes(sf.capacity)} is left after the pipeline's own reservations "
                f"({fmt_bytes(sf.over_by)} short)",
                kind.remedy_for_budget(stage, info, device, backend, sf.pool, available),
            )
        )
        return None
    return Option(device, backend, route, tuple(reservations), verification, metadata, calibration)


def _verdict(gates: list[GateSpec], route: Route) -> tuple[Verification | None, list[Refusal]]:
    """The placement's verification from its gates' cached verdicts: the first that
    refused it, else the first without evidence, else the first (every one verified);
    None without gates. With several gates, ``details["gates"]`` gives each artifact's status."""
    verdicts = [cached_verdict(gate, route) for gate in gates]
    if not verdicts:
        return None, []
    verification, failed = min(verdicts, key=lambda vf: (not vf[1], vf[0].status == "verified"))
    if len(verdicts) > 1:
        statuses = {g.artifact_name: v.status for g, (v, _) in zip(gates, verdicts, strict=True)}
        verification = replace(verification, details={**verification.details, "gates": statuses})
    return verification, failed


def _stage_plan(
    state: StageState, options: Sequence[Option | None], profile: HardwareProfile
) -> StagePlan:
    """The stage's plan from each instance's chosen option (one per replica, in order):
    refused unless every one has one; replica 0's placement at the top level, and with
    several replicas each one's in ``replicas``."""
    stage, kind, info = state.stage, state.kind, state.info
    artifact = artifact_record(info)
    common: dict[str, Any] = {
        "name": stage.name,
        "kind": stage.kind,
        "artifact": artifact,
        "details": kind.plan_details(stage, info),
        "inputs": tuple(stage.inputs),
        "final_output": stage.final_output,
        "final_output_type": stage.final_output_type,
        "restart": _restart_of(stage),
        "on_device_loss": stage.on_device_loss,
    }
    if not options or any(o is None for o in options):
        refusals = tuple(state.refusals) or (
            Refusal(
                RefusalCode.NO_RUNNABLE_DEVICE,
                "-",
                "no device was considered",
                "list devices for the stage",
            ),
        )
        return StagePlan(
            admitted=False,
            device=None,
            backend=None,
            route=None,
            reservations=(),
            refusals=refusals,
            engine_kwargs={},
            verification=None,
            **common,
        )
    placements = [
        _replica_plan(state, i, option, profile)
        for i, option in enumerate(options)
        if option is not None
    ]
    first = placements[0]
    return StagePlan(
        admitted=True,
        device=first.device,
        backend=first.backend,
        route=first.route,
        reservations=first.reservations,
        refusals=tuple(state.refusals),
        engine_kwargs=first.engine_kwargs,
        verification=first.verification,
        calibration=first.calibration,
        replicas=tuple(placements) if len(placements) > 1 else (),
        **common,
    )


def _restart_of(stage: StageConfig) -> RestartDoc | Literal["never"] | None:
    """The stage's ``restart`` as the plan carries it: None for the default policy."""
    policy = stage.restart_policy()
    if policy is None:
        return "never"
    if policy == RestartConfig():
        return None
    return RestartDoc(
        max=policy.max,
        window_s=policy.window_s,
        backoff_s=policy.backoff_s,
        backoff_max_s=policy.backoff_max_s,
    )


def _replica_plan(
    state: StageState, index: int, option: Option, profile: HardwareProfile
) -> ReplicaPlan:
    """One instance's placement, its engine configured for its own device."""
    # the engine is configured from the kind's own reservations: calibration predicts
    # what it will hold, it never changes what it is asked to allocate
    kwargs = state.kind.engine_kwargs(
        state.stage,
        state.info,
        _local_device(profile, option.device),
        option.backend,
        list(option.metadata_reservations or option.reservations),
        capacity_of(profile, option.device),
    )
    return ReplicaPlan(
        index=index,
        holder=f"{state.stage.name}#{index}" if state.replicas > 1 else state.stage.name,
        device=option.device.id,
        backend=option.backend,
        route=option.route.name,
        reservations=option.reservations,
        engine_kwargs=kwargs,
        verification=option.verification,
        calibration=option.calibration.to_dict() if option.calibration is not None else None,
    )


# -- calibration: reservations from measured peaks (orchestrator/calibration.py) ------------


# -- a cluster profile: candidates on every node, each tried against its node alone -------


def _cluster_candidates(
    stage: StageConfig,
    kind: StageKind,
    info: ArtifactInfo,
    profile: HardwareProfile,
    mask: frozenset[str],
) -> list[Candidate | Excluded]:
    """``stage_candidates`` for a cluster profile: ``desktop/gpu:0`` names one node's
    device; ``gpu:0`` means every node's gpu:0, in the profile's node order (the
    first node's first). A masked node or device is excluded by its qualified id."""
    out: list[Candidate | Excluded] = []
    for entry in stage.devices:
        matching = [
            d
            for d in profile.devices
            if d.id == entry or ("/" not in entry and d.local_id == entry)
        ]
        if not matching:
            out.append(Excluded(stage.name, entry, "masked" if masked(entry, mask) else "absent"))
            continue
        for device in matching:
            if masked(device.id, mask):
                out.append(Excluded(stage.name, device.id, "masked"))
                continue
            wanted = stage.backends or list(device.backends)
            backends = [
                b for b in wanted if b in device.backends and b in kind.stage_backends(stage)
            ]
            if not backends:
                out.append(Excluded(stage.name, device.id, "no_backend"))
                continue
            for backend in backends:
                route = profile.route(device.route_for(backend))
                assert route is not None  # the profile validator guarantees it
                out.append(Candidate(stage, kind, info, device, backend, route))
    return out


def _local_device(profile: HardwareProfile, device: Device) -> Device:
    """A cluster device as its own node sees it (``desktop/gpu:0`` → that node's ``gpu:0``)."""
    if device.node and device.node in profile.nodes:
        return profile.nodes[device.node].profile.device(device.local_id) or device
    return device


def _try_on_node(
    candidate: Candidate, refusals: list[Refusal], profile: HardwareProfile
) -> Option | None:
    """A candidate on one node of a cluster: the same checks as on that machine alone
    (route, kind, gates, memory against the node's own pools and the pipeline's
    reservations there), then pools and devices named for the node. The refusals
    name the node. Calibration is this machine's measurement: not used for nodes."""
    node_name = candidate.device.node
    assert node_name is not None
    node = profile.nodes[node_name].profile
    device = node.device(candidate.device.local_id)
    route = node.route(candidate.route.name.split("/", 1)[1])
    assert (
        device is not None and route is not None
    )  # the cluster was built from this node's profile
    base, _ = build_ledger(node)
    found: list[Refusal] = []
    option = _try(replace(candidate, device=device, route=route), base, found, node)
    verification: Verification | None = None
    failed: list[Refusal] = []
    if option is not None and option.verification is not None:
        # the node's own evidence (verify --address); this machine's counts only if it is one
        gates = candidate.kind.gate_specs(
            candidate.stage, candidate.info, device, candidate.backend
        )
        this_machine = describes_this_machine(node)
        verification, failed = node_verification(
            option.verification, gates, route, node_name, node.host, this_machine=this_machine
        )
        found.extend(failed)
    refusals.extend(
        replace(
            r,
            device=node_pool(node_name, r.device) if r.device not in ("", "-") else r.device,
            message=f"on {node_name}: {r.message}",
        )
        for r in found
    )
    if option is None or failed:
        return None
    return replace(
        option,
        device=candidate.device,
        route=candidate.route,
        verification=verification,
        reservations=tuple(
            replace(r, pool=node_pool(node_name, r.pool)) for r in option.reservations
        ),
        metadata_reservations=tuple(
            replace(r, pool=node_pool(node_name, r.pool)) for r in option.metadata_reservations
        ),
    )


def _with_nodes(stage_plans: tuple[StagePlan, ...]) -> tuple[tuple[StagePlan, ...], list[str]]:
    """Each placed stage's ``node`` (and each replica's), and ``inputs_across_nodes`` (its
    inputs from stages on another node: any replica of theirs to any of its) in the plan
    JSON; the crossing edges as ``a → b (n1 → n2)``, by holder (``thinker → voice#1``)."""
    nodes = {
        s.name: [(p.holder, p.device.split("/", 1)[0]) for p in s.placements() if p.device]
        for s in stage_plans
        if s.device and "/" in s.device
    }
    out, crossing = [], []
    for s in stage_plans:
        mine = nodes.get(s.name)
        if not mine:
            out.append(s)
            continue
        across = []
        for i in s.inputs:
            pairs = [(p, pn, h, n) for p, pn in nodes.get(i, []) for h, n in mine if pn != n]
            across += [i] if pairs else []
            crossing += [f"{p} → {h} ({pn} → {n})" for p, pn, h, n in pairs]
        out.append(
            replace(
                s,
                details={**s.details, "node": mine[0][1], "inputs_across_nodes": across},
                replicas=tuple(
                    replace(r, node=n) for r, (_, n) in zip(s.replicas, mine, strict=False)
                ),
            )
        )
    return tuple(out), crossing
