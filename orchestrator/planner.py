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
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from orchestrator import calibration as cal
from orchestrator.config import PipelineConfig, StageConfig
from orchestrator.core import errors
from orchestrator.core.backends import BACKENDS as ORT_BACKENDS
from orchestrator.core.errors import RefusalCode
from orchestrator.core.ledger import PIPELINE_HOLDER, Ledger, Reservation
from orchestrator.core.plan import (
    PipelinePlan,
    PoolPlan,
    Refusal,
    ReplicaPlan,
    StagePlan,
    Verification,
)
from orchestrator.core.profile import (
    HOST_RAM,
    Device,
    HardwareProfile,
    Route,
    host_ram_pools,
    node_pool,
    profile_pools,
)
from orchestrator.core.units import GiB, MiB, fmt_bytes
from orchestrator.ort.routes import probe_route, resolve, static_refusal
from orchestrator.planner_threads import with_cpu_threads
from orchestrator.probe import llamacpp
from orchestrator.probe.host import cpu_model, host_os, running_in_wsl
from orchestrator.verify.placement import cached_verdict, node_verification
from stages.base import ArtifactInfo, GateSpec, RestartConfig, StageKind
from stages.registry import get_kind

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


@dataclass(frozen=True)
class Candidate:
    """A (stage, device, backend) the config allows and the profile offers, with the
    route that reaches the device for that backend (reachable or not)."""

    stage: StageConfig
    kind: StageKind
    info: ArtifactInfo
    device: Device
    backend: str
    route: Route


@dataclass(frozen=True)
class Excluded:
    """A device in a stage's list that yields no candidate, and why: ``masked``
    (``--mask``), ``absent`` (the profile has no such device), ``no_backend``
    (none of its backends runs this kind, or the stage allows none of them) or
    ``unavailable`` (a backend the stage names that the device's route has but cannot
    run: ``backend`` and ``reason`` say which and why, e.g. a llama.cpp build for
    instructions this CPU lacks)."""

    stage: str
    device: str
    why: Literal["masked", "absent", "no_backend", "unavailable"]
    backend: str = ""
    reason: str = ""


@dataclass(frozen=True)
class _Option:
    device: Device
    backend: str
    route: Route
    reservations: tuple[Reservation, ...]
    verification: Verification | None
    metadata_reservations: tuple[Reservation, ...] = ()
    """The kind's own reservations before calibration (the engine is configured from these)."""
    calibration: cal.Calibration | None = None


@dataclass(frozen=True)
class _Calibrating:
    """A measurement store the plan reads (``plan_pipeline(calibration=...)``)."""

    store: cal.CalibrationStore
    pipeline: str
    profile: HardwareProfile
    unusable: dict[tuple[str, str, str], tuple[str, cal.Unusable]] = field(default_factory=dict)
    """(stage, device, backend) → its entry's file and why the store could not use it."""


@dataclass
class _StageState:
    """A stage to place, or one replica of it (``replicas: N`` > 1: N states sharing the
    stage's options and refusals, holders ``name#0`` … ``name#N-1``)."""

    stage: StageConfig
    kind: StageKind
    info: ArtifactInfo
    options: list[_Option]
    refusals: list[Refusal]
    holder: str = ""
    """Its ledger holder: the stage's name, or ``name#i`` for replica i of several."""
    replica: int = 0

    def __post_init__(self) -> None:
        self.holder = self.holder or self.stage.name

    @property
    def replicas(self) -> int:
        return self.stage.replicas


DEVICE_KINDS = ("cpu", "gpu", "igpu", "npu")


def parse_mask(values: Iterable[str], profile: HardwareProfile | None = None) -> frozenset[str]:
    """``--mask npu,igpu:0`` → device ids or kinds to exclude.

    With ``profile``, every entry must be a device kind (``cpu``, ``gpu``,
    ``igpu``, ``npu``) or the id of a device the profile has: a mask that names
    nothing would silently exclude nothing, so it is a ``ConfigError``."""
    out: set[str] = set()
    for v in values:
        out.update(x.strip() for x in v.split(",") if x.strip())
    if profile is not None:
        have = [d.id for d in profile.devices]
        # a cluster: a node's name masks the node; an unqualified id masks it on every node
        known = {
            *have,
            *profile.node_names,
            *(d.local_id for d in profile.devices if profile.nodes),
        }
        nodes = f"; its nodes: {', '.join(profile.node_names)}" if profile.nodes else ""
        problems = [
            errors.Problem(
                f"--mask {entry}",
                f"names no device of the profile {profile.name!r} (it has {', '.join(have)}{nodes})",
                f"mask one of {', '.join(have)}, or a kind ({', '.join(DEVICE_KINDS)})"
                + (", or a node" if profile.nodes else ""),
            )
            for entry in sorted(out)
            if entry not in DEVICE_KINDS and entry not in known
        ]
        if problems:
            raise errors.ConfigError(problems)
    return frozenset(out)


def _masked(device_id: str, mask: frozenset[str]) -> bool:
    """By id, by kind, and in a cluster also by node (``laptop``) and by the id on any
    node (``gpu:0`` masks every node's gpu:0)."""
    node, _, local = device_id.rpartition("/")
    return (
        device_id in mask
        or local in mask
        or local.split(":")[0] in mask
        or (bool(node) and node in mask)
    )


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
    (``_calibrated``, docs/calibration.md). None plans from metadata alone.

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
        _Calibrating(calibration, config.name, profile) if calibration is not None else None
    )
    ledger, shared = build_ledger(profile, runtime=runtime, server=server)
    if calibrating is not None:
        shared = _calibrated_shared(shared, calibrating)
        ledger.held[PIPELINE_HOLDER] = list(shared)
    states = [
        _stage_state(stage, profile, mask, ledger, refused or {}, calibrating)
        for stage in config.topological()
    ]
    placing = [r for s in states for r in _replica_states(s)]
    _refuse_unplaceable_replicas(placing, ledger)
    chosen = _choose(placing, ledger)
    stage_plans = tuple(
        _stage_plan(s, [chosen.get(r.holder) for r in _replica_states(s, placing)], profile)
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


def _choose(states: list[_StageState], ledger: Ledger) -> dict[str, _Option]:
    """The jointly fitting option per holder (a stage, or a replica of one; none when no
    assignment fits), admitted to ``ledger``; when none fits, ``_explain_joint_failure``
    says why on the states."""
    viable = [s for s in states if s.options]
    choice = _search(viable, ledger)
    chosen: dict[str, _Option] = {}
    if choice is not None:
        chosen = {s.holder: o for s, o in zip(viable, choice, strict=True)}
    elif viable:
        _explain_joint_failure(viable, ledger)
    # the search left the ledger holding only the pipeline's own reservations
    for name, option in chosen.items():
        admission = ledger.admit(name, list(option.reservations))
        assert admission.ok, "the search found this assignment fitting"
    return chosen


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
    calibrating: _Calibrating | None,
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
        _calibration_notes(stage_plans, shared, calibrating) if calibrating is not None else []
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
        if _masked(dev_id, mask):
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
            and (why := backend_unavailable(profile, device, b))
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
    calibrating: _Calibrating | None = None,
) -> _StageState:
    """The stage's artifact described, each candidate tried alone against ``base``:
    the options that fit, and a refusal for every other device and backend."""
    kind = get_kind(stage.kind)
    info = kind.describe(stage)
    state = _StageState(stage, kind, info, [], [])
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
            unavailable_remedy(excluded.backend, stage.name),
        )
    device = profile.device(dev_id)
    assert device is not None
    return Refusal(
        RefusalCode.NO_RUNNABLE_DEVICE,
        dev_id,
        f"{dev_id} offers {', '.join(device.backends) or 'no backend'}; a {stage.kind} stage needs one of {', '.join(b for b in (stage.backends or kind.stage_backends(stage)))}",
        f"install a backend for {dev_id} ({', '.join(kind.stage_backends(stage))}), or place the stage on another device",
    )


def backend_unavailable(profile: HardwareProfile, device: Device, backend: str) -> str | None:
    """Why ``device`` does not offer ``backend`` although its route has it, when the profile
    says (a llama.cpp build that cannot run on this CPU, or has no GPU offload); else None."""
    if backend in llamacpp.BACKENDS:
        return llamacpp.unavailable(profile, device, backend)
    return None


def unavailable_remedy(backend: str, stage: str | None = None) -> str:
    """What to do about a llama.cpp build that cannot drive the device."""
    backends = f"stages.{stage}.backends" if stage else "the stage's backends"
    if backend == llamacpp.LLAMACPP_VULKAN:
        return (
            "install a llama-cpp-python built with Vulkan (CMAKE_ARGS=-DGGML_VULKAN=ON) in that interpreter, "
            f"or list llamacpp-cpu in {backends} to run on the CPU"
        )
    return (
        "rebuild llama-cpp-python for this CPU (scripts/bootstrap.sh builds it with GGML_NATIVE=OFF and only the "
        f"extensions this CPU has), or list vllm-cpu in {backends}"
    )


def _llamacpp_route_refusal(
    profile: HardwareProfile, device: Device, backend: str, route: Route
) -> Refusal | None:
    """For a profile that describes this machine: the llama.cpp build installed in the route's
    interpreter (its probe, remembered per interpreter) must drive ``device`` with ``backend``
    — a recorded iGPU profile lists llamacpp-vulkan, and this machine's build may have no GPU
    offload, or none may be installed."""
    report = probe_route(route, cached=True)
    build = report.llama_cpp_build()
    where = (
        f"{_where(device, backend)}: route {route.name!r} ({report.python or 'this interpreter'})"
    )
    if build is None:
        return Refusal(
            RefusalCode.DEVICE_UNREACHABLE,
            device.id,
            f"{where} has no llama-cpp-python installed",
            "install it there (scripts/bootstrap.sh builds llama-cpp-python), or list a vLLM backend in the stage's backends",
        )
    problem = (
        llamacpp.cpu_problem(build, device)
        if backend == llamacpp.LLAMACPP_CPU
        else llamacpp.vulkan_problem(build)
    )
    if problem is None:
        return None
    return Refusal(
        RefusalCode.DEVICE_UNREACHABLE,
        device.id,
        f"{where}: {problem}",
        unavailable_remedy(backend),
    )


def _where(device: Device, backend: str) -> str:
    return f"{device.id} ({backend})"


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
    where = _where(device, backend)
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
    if backend in llamacpp.BACKENDS and describes_this_machine(profile):
        return _llamacpp_route_refusal(profile, device, backend, route)
    return None


def _try(
    candidate: Candidate,
    base: Ledger,
    refusals: list[Refusal],
    profile: HardwareProfile,
    calibrating: _Calibrating | None = None,
) -> _Option | None:
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
    reservations, calibration = _calibrated(candidate, metadata, profile, calibrating)
    shortfalls = base.check({stage.name: list(reservations)})
    if shortfalls:
        sf = shortfalls[0]
        own = sf.contributors.get(stage.name, 0)
        available = sf.capacity - (sf.peak - own)
        refusals.append(
            Refusal(
                RefusalCode.BUDGET_EXCEEDS_DEVICE,
                device.id,
                f"{stage.name} needs {fmt_bytes(own)} on {sf.pool} ({_breakdown(reservations, sf.pool)}) and "
                f"{fmt_bytes(available)} of {fmt_bytes(sf.capacity)} is left after the pipeline's own reservations "
                f"({fmt_bytes(sf.over_by)} short)",
                kind.remedy_for_budget(stage, info, device, backend, sf.pool, available),
            )
        )
        return None
    return _Option(device, backend, route, tuple(reservations), verification, metadata, calibration)


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


def _breakdown(reservations: Iterable[Reservation], pool: str) -> str:
    return " + ".join(
        f"{r.purpose} {fmt_bytes(r.bytes)}" for r in reservations if r.pool == pool and r.bytes
    )


def _search(states: list[_StageState], ledger: Ledger) -> list[_Option] | None:
    """Depth-first over options in preference order; the first full fit wins. A replica
    tries its options in spread order (``_spread``); replicas are interchangeable, so each
    distinct spread of a stage's replicas (a multiset of options) is tried once."""
    picked: list[tuple[int, _Option]] = []
    tried: dict[str, set[tuple[int, ...]]] = {}

    def go(i: int) -> bool:
        if i == len(states):
            return True
        state = states[i]
        siblings = picked[i - state.replica : i]
        if state.replica == 0:
            tried[state.stage.name] = set()
        for k, option in _spread(state.options, [o for _, o in siblings]):
            if state.replicas > 1:
                spread = tuple(sorted([j for j, _ in siblings] + [k]))
                if spread in tried[state.stage.name]:
                    continue  # the same replicas in another order: that subtree failed
                tried[state.stage.name].add(spread)
            if not ledger.admit(state.holder, list(option.reservations)).ok:
                continue
            picked.append((k, option))
            if go(i + 1):
                return True
            picked.pop()
            ledger.release(state.holder)
        return False

    found = go(0)
    for s in states:
        ledger.release(s.holder)
    return [o for _, o in picked] if found else None


def _spread(options: list[_Option], siblings: Sequence[_Option]) -> list[tuple[int, _Option]]:
    """A replica's options (with their index in the stage's preference order), least used
    by its siblings first: fewest on the device, then fewest on its node, then the config's
    order (stable, so replica 0 keeps the config's preference). A device another replica
    uses comes only after every other."""
    devices = Counter(o.device.id for o in siblings)
    nodes = Counter(o.device.node for o in siblings if o.device.node)
    return sorted(
        enumerate(options),
        key=lambda ko: (
            devices[ko[1].device.id],
            nodes[ko[1].device.node] if ko[1].device.node else 0,
            ko[0],
        ),
    )


def _replica_states(
    state: _StageState, among: Sequence[_StageState] | None = None
) -> list[_StageState]:
    """The stage's states to place: itself for one instance; with ``replicas: N`` > 1, N
    sharing its options and refusals (holders ``name#0`` …). ``among``: those already made."""
    if among is not None:
        return [s for s in among if s.stage.name == state.stage.name]
    if state.replicas == 1:
        return [state]
    return [
        replace(state, holder=f"{state.stage.name}#{i}", replica=i) for i in range(state.replicas)
    ]


def _refuse_unplaceable_replicas(states: list[_StageState], ledger: Ledger) -> None:
    """All or none: a stage whose N replicas cannot all be placed beside the pipeline's own
    reservations (``ledger`` holds only those) is refused whole, naming the first replica
    that fits nowhere once the ones before it are placed, with the numbers."""
    for first in [s for s in states if s.replica == 0 and s.replicas > 1 and s.options]:
        group = _replica_states(first, states)
        if _search(group, ledger) is not None:
            continue
        refusal = _replica_refusal(group, ledger)
        for s in group:
            s.options = []
        first.refusals.append(refusal)


def _holders_on(placed: Iterable[tuple[str, str]]) -> str:
    """``voice#0 on igpu:0, voice#1 on cpu``; more than three on one device counted:
    ``13 replicas on cpu (voice#0, voice#1, …, voice#12)``."""
    by_device: dict[str, list[str]] = {}
    for holder, device in placed:
        by_device.setdefault(device, []).append(holder)
    return ", ".join(
        f"{', '.join(hs)} on {d}"
        if len(hs) <= 3
        else f"{len(hs)} replicas on {d} ({hs[0]}, {hs[1]}, …, {hs[-1]})"
        for d, hs in by_device.items()
    )


def _replica_refusal(group: list[_StageState], ledger: Ledger) -> Refusal:
    """Why the stage's replicas do not all fit: replicas placed one by one in spread order
    until one fits on none of the stage's options; its shortfall on each device it tried."""
    placed: list[_Option] = []
    failing = group[-1]
    for s in group:
        fit = next(
            (
                o
                for _, o in _spread(s.options, placed)
                if ledger.admit(s.holder, list(o.reservations)).ok
            ),
            None,
        )
        if fit is None:
            failing = s
            break
        placed.append(fit)
    shortfalls, seen = [], set()
    for _, option in _spread(failing.options, placed):
        found = ledger.check({failing.holder: list(option.reservations)})
        if found and option.device.id not in seen:
            seen.add(option.device.id)
            sf = found[0]
            own = sf.contributors.get(failing.holder, 0)
            shortfalls.append(
                f"on {option.device.id} it needs {fmt_bytes(own)} of {sf.pool}, and "
                f"{fmt_bytes(sf.capacity - (sf.peak - own))} of {fmt_bytes(sf.capacity)} is left "
                f"({fmt_bytes(sf.over_by)} short)"
            )
    for s in group:
        ledger.release(s.holder)
    name, n, i = failing.stage.name, failing.replicas, failing.replica
    beside = _holders_on((g.holder, o.device.id) for g, o in zip(group, placed, strict=False))
    return Refusal(
        RefusalCode.BUDGET_EXCEEDS_DEVICE,
        placed[0].device.id if placed else failing.options[0].device.id,
        f"replica {i + 1} of {n} ({failing.holder}) fits on none of the stage's devices"
        + (f" beside {beside} and the pipeline's own reservations" if beside else "")
        + ": "
        + "; ".join(shortfalls),
        f"lower replicas (stages.{name}.replicas: {i} fit here) or allow more devices "
        f"(stages.{name}.devices)",
    )


def _explain_joint_failure(states: list[_StageState], ledger: Ledger) -> None:
    """No assignment fits: refuse the stages on the first overflowing pool of the
    most preferred assignment (replicas spread), naming every contributor and its bytes."""
    preferred = _preferred(states)
    found = ledger.check({h: list(o.reservations) for h, o in preferred.items()})
    assert found, "the most preferred assignment fits, so the search would have taken it"
    shortfall = found[0]
    peak, shares = shortfall.peak, shortfall.contributors
    stage_of = {s.holder: s.stage.name for s in states}
    parts = _contributors(shares, stage_of, preferred)
    refused = list(dict.fromkeys(stage_of[h] for h in shares if h in stage_of))
    replicated = [s.stage.name for s in states if s.replica == 1 and s.stage.name in refused]
    replicas = f", fewer replicas of {', '.join(replicated)}" if replicated else ""
    for s in states:
        if s.stage.name not in refused:
            continue
        dev = preferred[s.holder].device.id
        s.options = []
        if s.replica > 0:
            continue  # the replicas of a stage share its refusals: one says it
        s.refusals.append(
            Refusal(
                RefusalCode.BUDGET_EXCEEDS_DEVICE,
                dev,
                f"{shortfall.pool} cannot hold every stage placed on it: {parts} = {fmt_bytes(peak)} > "
                f"{fmt_bytes(shortfall.capacity)} ({fmt_bytes(peak - shortfall.capacity)} short); each fits alone, "
                f"and every other allowed placement overflows too",
                f"free {fmt_bytes(peak - shortfall.capacity)} on {shortfall.pool}: shrink one of {', '.join(refused)} "
                f"(shorter max_model_len, a smaller precision build){replicas}, allow a device with its own memory, "
                "or run fewer stages",
            )
        )


def _contributors(
    shares: Mapping[str, int], stage_of: Mapping[str, str], preferred: Mapping[str, _Option]
) -> str:
    """``(pipeline) 1.90 GiB + thinker 1.50 GiB (cpu)``, largest first; replicas of one stage
    with the same bytes on the same device as one term: ``13 replicas of voice 1.49 GiB each
    (cpu)``."""
    terms: dict[tuple[str, int, str], list[str]] = {}
    for h, b in sorted(shares.items(), key=lambda kv: -kv[1]):
        dev = preferred[h].device.id if h in preferred else ""
        replica = h != stage_of.get(h, h)
        terms.setdefault((stage_of[h] if replica else h, b, dev), []).append(h)
    return " + ".join(
        (
            f"{len(hs)} replicas of {name} {fmt_bytes(b)} each"
            if len(hs) > 1
            else f"{hs[0]} {fmt_bytes(b)}"
        )
        + (f" ({dev})" if dev else "")
        for (name, b, dev), hs in terms.items()
    )


def _preferred(states: list[_StageState]) -> dict[str, _Option]:
    """Each holder's most preferred option: its first, or for a replica the first in spread
    order beside its siblings' (what the search tries first)."""
    out: dict[str, _Option] = {}
    for i, s in enumerate(states):
        siblings = [out[states[j].holder] for j in range(i - s.replica, i)]
        out[s.holder] = _spread(s.options, siblings)[0][1]
    return out


def _artifact(info: ArtifactInfo) -> dict[str, Any]:
    return {
        "kind": info.kind,
        "path": info.path,
        "weight_bytes": info.weight_bytes,
        "weight_format": info.weight_format,
        **info.details,
    }


def _capacity(profile: HardwareProfile, device: Device) -> int:
    if device.node and device.node in profile.nodes:
        node = profile.nodes[device.node].profile
        return _capacity(node, node.device(device.local_id) or device)
    return (
        profile.host_ram_capacity
        if device.pool == HOST_RAM
        else (device.memory_bytes or device.shared_memory_bytes or 0)
    )


def _stage_plan(
    state: _StageState, options: Sequence[_Option | None], profile: HardwareProfile
) -> StagePlan:
    """The stage's plan from each instance's chosen option (one per replica, in order):
    refused unless every one has one; replica 0's placement at the top level, and with
    several replicas each one's in ``replicas``."""
    stage, kind, info = state.stage, state.kind, state.info
    artifact = _artifact(info)
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


def _restart_of(stage: StageConfig) -> dict[str, Any] | str | None:
    """The stage's ``restart`` as the plan carries it: None for the default policy."""
    policy = stage.restart_policy()
    if policy is None:
        return "never"
    return None if policy == RestartConfig() else policy.model_dump()


def _replica_plan(
    state: _StageState, index: int, option: _Option, profile: HardwareProfile
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
        _capacity(profile, option.device),
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


def candidate_key(
    candidate: Candidate, metadata: Sequence[Reservation], profile: HardwareProfile, pipeline: str
) -> cal.Key:
    """The measurement store's key of a candidate: what the runtime files its peaks under."""
    stage, kind, info, device = candidate.stage, candidate.kind, candidate.info, candidate.device
    kwargs = kind.engine_kwargs(
        stage, info, device, candidate.backend, list(metadata), _capacity(profile, device)
    )
    return cal.stage_key(
        pipeline=pipeline,
        stage=stage.name,
        kind=stage.kind,
        artifact=_artifact(info),
        device=device.id,
        backend=candidate.backend,
        route=candidate.route.name,
        engine_kwargs=kwargs,
        profile=profile,
    )


def _calibrated(
    candidate: Candidate,
    metadata: tuple[Reservation, ...],
    profile: HardwareProfile,
    calibrating: _Calibrating | None,
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


def _calibrated_shared(shared: list[Reservation], calibrating: _Calibrating) -> list[Reservation]:
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


def _calibration_notes(
    stage_plans: Sequence[StagePlan], shared: Sequence[Reservation], calibrating: _Calibrating
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
            out.append(Excluded(stage.name, entry, "masked" if _masked(entry, mask) else "absent"))
            continue
        for device in matching:
            if _masked(device.id, mask):
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
) -> _Option | None:
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
