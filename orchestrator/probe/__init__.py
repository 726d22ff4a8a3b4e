"""Describe this machine as a hardware profile (contract ``omni-edge.profile/1``).

:func:`probe_profile` composes what the parts of this package read — the host
(:mod:`.host`: OS, WSL, CPU, RAM and its limit), NVIDIA GPUs (:mod:`.gpus`),
NPUs (:mod:`.npus`) — with what each route's interpreter says it has
(``orchestrator.ort.routes.probe_route``: its onnxruntime EPs and decode engines),
and gives each device the backends that drive it (the ONNX Runtime backend
table for EPs; the decode engine table for engines: :mod:`.engines`).

It guarantees a valid :class:`HardwareProfile` with a ``cpu`` device on any
machine it can start on: every optional source (NVIDIA's management library,
onnxruntime, vLLM, cgroup and sysfs files) that is missing or fails only
removes what it would have added, and says so in the log. Nothing heavy is
imported here: interpreters, this one included, are asked in a short
subprocess, so a crashing or slow build cannot take this process down.

Integrated GPUs are not detected yet (no reliable sysfs signal separates an
iGPU from a discrete card of the same vendor); describe them in a recorded
profile.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.core import settings
from orchestrator.core.backends import BACKENDS, EP_BACKENDS, rows
from orchestrator.core.ort_builds import require_one_ort_flavour
from orchestrator.core.profile import (
    PROFILE_FORMAT,
    THIS_PROCESS,
    Device,
    HardwareProfile,
    Route,
    load_profile,
)
from orchestrator.ort.hostproc import route_kind_for
from orchestrator.ort.routes import RouteReport, probe_route
from orchestrator.probe import engines
from orchestrator.probe.gpus import nvidia_gpus
from orchestrator.probe.host import (
    PROC_CPUINFO,
    cpu_model,
    cpu_vendor,
    host_os,
    running_in_wsl,
    this_host,
)
from orchestrator.probe.npus import linux_npus


def default_route_candidates() -> tuple[tuple[str, Path], ...]:
    """The interpreter routes that ``probe`` looks for by default, inside each route directory
    (``settings.route_dirs``: the user's ``routes_dir``, then ``.venvs`` next to the
    installation; never the working directory): each backend row's ``route_venvs``, as
    ``(route name, <directory>/bin/python)``. An EP whose build replaces the ``onnxruntime``
    module lives in a venv of its own (docs/design.md, known facts); a plugin EP's venv (the
    plain onnxruntime and the plugin package, docs/plugin-eps.md) is probed when someone
    made it."""
    return tuple(
        (name, Path(directory) / "bin" / "python")
        for row in rows()
        for name, directory in row.route_venvs
    )


def resolve_profile(profile: str | Path | HardwareProfile | None) -> HardwareProfile:
    """The profile to plan against: a profile file's path, a profile, or None —
    this machine, probed (routes from the probe cache while their interpreters
    are unchanged)."""
    if isinstance(profile, HardwareProfile):
        return profile
    if profile is not None:
        return load_profile(profile)
    return probe_profile(cached_routes=True)


def default_routes(search_dirs: Iterable[Path] | None = None) -> list[Route]:
    """Interpreter routes that exist on this machine and that the user set up: each
    :func:`default_route_candidates` found in a route directory (``search_dirs``, default
    ``settings.route_dirs()``: the user's ``routes_dir``, then ``.venvs`` next to the
    installation), then the ``routes`` the user's settings name. Never the working
    directory: a folder someone else made cannot put an interpreter here."""
    dirs = list(search_dirs) if search_dirs is not None else settings.route_dirs()
    routes: list[Route] = []
    for name, rel in default_route_candidates():
        for d in dirs:
            candidate = d / rel
            if candidate.exists():
                routes.append(
                    Route(name=name, kind="interpreter", python=str(candidate.absolute()))
                )
                break
    wsl = running_in_wsl()
    taken = {r.name for r in routes}
    for name, python in settings.user_settings().routes.items():
        if name not in taken:
            routes.append(Route(name=name, kind=route_kind_for(python, wsl=wsl), python=python))
    return routes


def ask_build_routes(profile: HardwareProfile) -> None:
    """Probe (``cached``: nothing starts while an interpreter is unchanged) the routes through
    which ``profile`` offers a backend of an engine found by its build (llama.cpp's) and whose
    build it does not record, so that the
    planner, which starts nothing, finds their build remembered. For a profile of this machine
    about to be run (``api.admit_plan``), only interpreters omni-edge may start: call it after
    ``routes.require_startable_routes``."""
    names = {d.route_for(b) for d in profile.devices for b in d.backends if engines.needs_build(b)}
    for route in profile.routes:
        if route.name in names and route.llama_cpp is None:
            probe_route(route, cached=True)


def probe_profile(
    extra_routes: list[Route] | None = None,
    *,
    use_default_routes: bool = True,
    timeout_s: float | None = None,
    cached_routes: bool = False,
) -> HardwareProfile:
    """A profile of this machine: host RAM, devices, and the routes that reach them.

    RAM, cgroup limits and devices are read live every time. With
    ``cached_routes`` the routes' answers come from the probe cache while each
    interpreter and its installed packages are unchanged (``omni-edge plan``
    uses this; ``omni-edge probe`` asks afresh and refreshes the cache).

    ``extra_routes`` are interpreter routes to probe besides this interpreter (the
    command line's ``--route``: the user's own choice). Unless ``use_default_routes`` is
    False, :func:`default_routes` are added (the route environments next to the
    installation or in the user's ``routes_dir``, and the user's configured ``routes``)
    when no route of that name was given.
    """
    require_one_ort_flavour()  # two onnxruntime builds in this environment: exit 2, naming both
    routes_in = [Route(name=THIS_PROCESS), *(extra_routes or [])]
    if use_default_routes:
        given = {r.name for r in routes_in}
        routes_in += [r for r in default_routes() if r.name not in given]
    # Every route at once: each is a cold `import onnxruntime`, seconds apiece.
    with ThreadPoolExecutor(max_workers=len(routes_in)) as pool:
        futures = [
            pool.submit(probe_route, r, timeout=timeout_s, cached=cached_routes) for r in routes_in
        ]
        host = this_host()
        cpu_name, isa = cpu_model()
        gpus = nvidia_gpus()
        npus = linux_npus() if host_os() == "linux" else []
        reports = [f.result() for f in futures]

    devices = [
        Device(
            id="cpu",
            kind="cpu",
            name=cpu_name,
            vendor=cpu_vendor(cpu_name),
            isa=isa,
            source=f"{PROC_CPUINFO}; {host.cpu_cores} logical CPUs usable (affinity, cgroup quota)",
        ),
        *(
            Device(
                id=f"gpu:{i}",
                kind="gpu",
                name=g.name,
                vendor="nvidia",
                memory_bytes=g.memory_bytes,
                compute_capability=g.compute_capability,
                source=g.source,
            )
            for i, g in enumerate(gpus)
        ),
        *(
            Device(id=f"npu:{i}", kind="npu", name=n.name, vendor=n.vendor, source=n.source)
            for i, n in enumerate(npus)
        ),
    ]
    devices += ep_discovered_devices(reports, devices)
    hostname = socket.gethostname()
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    notes = (
        ["WSL2 detected: RAM is the WSL VM's (its .wslconfig quota is not visible inside)"]
        if host.wsl
        else []
    )
    return HardwareProfile(
        format=PROFILE_FORMAT,
        name=hostname,
        source="; ".join([f"omni-edge probe {when} on {hostname}", *notes]),
        host=host,
        devices=[_with_backends(d, reports) for d in devices],
        routes=[engines.with_build_verdict(r.to_route(), devices[0]) for r in reports],
    )


VENDOR_IDS = {
    0x8086: "intel",
    0x1002: "amd",
    0x1022: "amd",
    0x10DE: "nvidia",
    0x17CB: "qualcomm",
    0x4D4F4351: "qualcomm",
}
"""PCI vendor ids (and Qualcomm's ACPI 'QCOM') → the profile's vendor names."""


def ep_vendor(vendor: str, vendor_id: int) -> str:
    """The profile's vendor name for what ``get_ep_devices()`` says."""
    if vendor_id in VENDOR_IDS:
        return VENDOR_IDS[vendor_id]
    words = vendor.lower().replace(",", " ").split()
    if not words:
        return ""
    return {"advanced": "amd", "qualcomm(r)": "qualcomm", "qcom": "qualcomm"}.get(
        words[0], words[0]
    )


def ep_discovered_devices(reports: list[RouteReport], known: list[Device]) -> list[Device]:
    """NPUs and GPUs that only ``get_ep_devices()`` shows (every OS: the way to find an
    NPU on Windows, or an Intel or AMD GPU): one device per (type, vendor, device id)
    across routes, skipping kinds and vendors the other probes already found.

    A GPU that is not NVIDIA's becomes an ``igpu`` (its memory is not known here; a
    discrete one belongs in a recorded profile with its VRAM).
    """
    seen = {(d.kind, d.vendor) for d in known}
    counts = {kind: sum(1 for d in known if d.kind == kind) for kind in ("igpu", "npu")}
    out: list[Device] = []
    keys: set[tuple[str, int, int]] = set()
    for report in reports:
        if not report.reachable:
            continue
        for e in report.ep_devices:
            kind = {"NPU": "npu", "GPU": "igpu"}.get(str(e.get("device_type")))
            vendor = ep_vendor(str(e.get("vendor", "")), int(e.get("vendor_id", 0)))
            key = (
                str(e.get("device_type")),
                int(e.get("vendor_id", 0)),
                int(e.get("device_id", 0)),
            )
            if kind is None or vendor == "nvidia" or key in keys or (kind, vendor) in seen:
                continue
            keys.add(key)
            meta = e.get("device_metadata") or {}
            name = str(
                meta.get("Description")
                or f"{e.get('vendor') or vendor} {e.get('device_type')} 0x{key[2]:04x}"
            )
            out.append(
                Device(
                    id=f"{kind}:{counts[kind]}",
                    kind=kind,
                    name=name,
                    vendor=vendor,
                    source=f"onnxruntime.get_ep_devices() in route {report.name!r}: {e.get('ep_name')} on "
                    f"{e.get('device_type')} (vendor 0x{key[1]:04x}, device 0x{key[2]:04x})",
                )
            )
            counts[kind] += 1
    return out


def _offered(report: RouteReport) -> list[engines.Offer]:
    """(backend, device kind, vendors) for what one route offers: its decode engines first
    (``engines.from_route``), then its EPs in its order."""
    out = engines.from_route(report)
    for ep in report.providers:
        if ep in EP_BACKENDS:
            row = BACKENDS[EP_BACKENDS[ep]]
            out += [(EP_BACKENDS[ep], kind, vendors) for kind, vendors in row.drives.items()]
    return out


def _with_backends(device: Device, reports: list[RouteReport]) -> Device:
    """``device`` with the backends the routes offer for it, in route order, and the route of
    each one that is not this process. The engines found by their build come first (llama.cpp's
    on the CPU: the engine for a GGUF there — a stage that names no backends gets it; a
    checkpoint directory, which llama.cpp cannot load, still gets vLLM:
    ``ArDecodeKind.stage_backends``); those found in this process last (the order among
    different kinds' backends changes no plan: each kind tries only its own)."""
    backends: list[str] = []
    via: dict[str, str] = {}

    def add(backend: str, route: str) -> None:
        if backend not in backends:
            backends.append(backend)
            if route != THIS_PROCESS:
                via[backend] = route

    for backend, route in engines.built_for(device, reports):
        add(backend, route)
    for report in reports:
        for backend, kind, vendors in _offered(report):
            if kind == device.kind and (not vendors or device.vendor in vendors):
                add(backend, report.name)
    for backend in engines.found_here(device):
        add(backend, THIS_PROCESS)
    return device.model_copy(update={"backends": backends, "backend_routes": via})
