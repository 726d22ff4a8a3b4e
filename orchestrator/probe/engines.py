"""The decode engines on this machine: which backends the probe offers, and why one is not.

Every answer reads the engine table (``orchestrator.core.engines``) and what the routes
reported, and none names an engine: an engine found by its distributions is offered on the
devices its backends drive wherever they are installed; one found by its build (llama.cpp) where
the build the route's probe recorded can drive the device (:mod:`.llamacpp` judges a recorded
build: the instructions it was built for, its GPU offload); one found in this process where
this interpreter has it. The planner asks here why a device does not offer a backend its route
has, and what to do about it.
"""

from __future__ import annotations

import logging

from orchestrator.core import engines
from orchestrator.core.errors import RefusalCode
from orchestrator.core.plan import Refusal
from orchestrator.core.profile import Device, HardwareProfile, LlamaCppBuild, Route
from orchestrator.ort.routes import RouteReport, remembered_probe
from orchestrator.probe import llamacpp

Offer = tuple[str, str, tuple[str, ...]]
"""(backend, device kind, vendors: empty for any) — one thing a route offers."""


log = logging.getLogger(__name__)


def _drives(backend: engines.EngineBackend, device: Device) -> bool:
    return backend.probed and backend.drives_device(device.kind, device.vendor)


def built_for(device: Device, reports: list[RouteReport]) -> list[tuple[str, str]]:
    """(backend, route) for each backend of an engine found by its build that drives ``device``:
    through the first route whose build runs on it (its start survived, and it was built for no
    instruction the CPU lacks: :func:`build_problem`)."""
    out = []
    for row in engines.rows():
        if row.found != "build":
            continue
        for backend in row.backends:
            if not _drives(backend, device):
                continue
            for report in reports:
                build = report.build(row.engine)
                if build is not None and build_problem(build, device) is None:
                    out.append((backend.name, report.name))
                    break
    return out


def from_route(report: RouteReport) -> list[Offer]:
    """What one route offers of the engines found by their distributions: each backend whose
    distribution the route has installed, with the devices it drives."""
    out: list[Offer] = []
    for row in engines.rows():
        if row.found != "route":
            continue
        for backend in row.backends:
            wanted = (backend.distribution,) if backend.distribution else row.distributions
            if backend.probed and any(d in report.engine_distributions for d in wanted):
                out += [(backend.name, kind, vendors) for kind, vendors in backend.drives.items()]
    return out


def found_here(device: Device) -> list[str]:
    """The backends of the engines found in this process that this interpreter offers for ``device``."""
    return [
        b.name
        for row in engines.rows()
        if row.found == "this-process"
        for b in engines.offered_here(row)
        if _drives(b, device)
    ]


def build_problem(build: LlamaCppBuild, device: Device) -> str | None:
    """Why a recorded ``build`` cannot drive ``device`` (a CPU: its instructions; another
    device: its GPU offload), or None when it can."""
    return (
        llamacpp.cpu_problem(build, device)
        if device.kind == "cpu"
        else llamacpp.vulkan_problem(build)
    )


def with_build_verdict(route: Route, cpu: Device) -> Route:
    """``route`` with its recorded build's ``error`` saying why it cannot run on this CPU, when it
    was built for instructions the CPU lacks (the profile then says why the engine's CPU backend
    is not offered; ``omni-edge probe`` shows it)."""
    build = route.llama_cpp
    if build is None or build.error:
        return route
    why = llamacpp.isa_problem(build, cpu)
    if why is None:
        return route
    return route.model_copy(update={"llama_cpp": build.model_copy(update={"error": why})})


def _by_build(backend: str) -> engines.DecodeEngineRow | None:
    row = engines.row_of(backend)
    return row if row is not None and row.found == "build" else None


def needs_build(backend: str) -> bool:
    """Whether ``backend``'s engine runs only where the route's build can drive the device."""
    return _by_build(backend) is not None


def unavailable(profile: HardwareProfile, device: Device, backend: str) -> str | None:
    """Why the profile does not offer ``backend`` on ``device`` although its route has the
    engine: the build its probe recorded cannot drive it. None when no build is recorded there
    (not installed, or a profile recorded before builds were probed), the build can, or the
    engine is not one found by its build."""
    if _by_build(backend) is None:
        return None
    route = profile.route(device.route_for(backend))
    build = route.llama_cpp if route is not None else None
    if route is None or build is None:
        return None
    problem = build_problem(build, device)
    return (
        f"route {route.name!r} ({route.python or 'this interpreter'}): {problem}"
        if problem
        else None
    )


def remedy(backend: str, stage: str | None = None) -> str:
    """What to do about a recorded build that cannot drive the device with ``backend``."""
    row = engines.row_of(backend)
    found = row.backend(backend) if row is not None else None
    where = f"stages.{stage}.backends" if stage else "the stage's backends"
    return found.remedy.format(backends=where) if found is not None and found.remedy else ""


def route_refusal(device: Device, backend: str, route: Route) -> Refusal | None:
    """For a profile that describes this machine, an engine found by its build: the build of
    the route must drive ``device`` with ``backend`` — a recorded iGPU profile lists
    llamacpp-vulkan, and this machine's build may have no GPU offload, or none may be
    installed. None for other engines.

    Planning starts no process: the build is the one the profile records for the route (what
    ``omni-edge probe`` wrote), else the route's last probe on this machine while its
    interpreter is unchanged (``routes.remembered_probe``: ``omni-edge probe``, a plan
    without ``--profile``, or ``run`` asked it). Neither: it is not known here, so nothing
    is refused (a warning says so); ``run`` asks the route before it plans."""
    row = _by_build(backend)
    if row is None:
        return None
    build = route.llama_cpp
    python = "this interpreter"
    if build is None:
        report = remembered_probe(route)
        if report is None:
            _warn_unknown_build(route, row)
            return None
        build, python = report.build(row.engine), report.python or python
    where = f"{device.id} ({backend}): route {route.name!r} ({route.python or python})"
    if build is None:
        return Refusal(
            RefusalCode.DEVICE_UNREACHABLE,
            device.id,
            f"{where} has no {row.distributions[0]} installed",
            row.install.format(backends="the stage's backends"),
        )
    problem = build_problem(build, device)
    if problem is None:
        return None
    return Refusal(
        RefusalCode.DEVICE_UNREACHABLE, device.id, f"{where}: {problem}", remedy(backend)
    )


_unknown_builds: set[str] = set()


def _warn_unknown_build(route: Route, row: engines.DecodeEngineRow) -> None:
    if route.name in _unknown_builds:
        return
    _unknown_builds.add(route.name)
    log.warning(
        "route %r: its %s build is neither recorded in the profile nor probed on this "
        "machine, so it is not checked here (planning starts no process; `omni-edge probe` asks it)",
        route.name,
        row.title,
    )


def build_rows(profile: HardwareProfile) -> list[tuple[str, LlamaCppBuild, str | None, str]]:
    """(route, build, why it cannot run on this CPU or None, the CPU backend it offers) for each
    route's recorded engine build, as ``omni-edge probe`` shows them."""
    cpu = next((d for d in profile.devices if d.kind == "cpu"), None)
    cpu_backends = [
        b.name
        for r in engines.rows()
        if r.found == "build"
        for b in r.backends
        if "cpu" in b.drives
    ]
    out = []
    for r in profile.routes:
        build = r.llama_cpp
        if build is None:
            continue
        problem = build.error or (llamacpp.isa_problem(build, cpu) if cpu is not None else None)
        out.append((r.name, build, problem, ", ".join(cpu_backends)))
    return out
