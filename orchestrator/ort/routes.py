"""Routes: which interpreter can drive a device, and proof that it can.

A route (``orchestrator.profile.Route``) is this interpreter, another
interpreter or venv on this OS, or a host process across a boundary (from
WSL2, a Windows-side ``python.exe`` reached through interop). Three levels of
knowing, cheapest first:

* :func:`static_refusal` — from the profile alone, no process started: a route
  marked unreachable, an NPU from inside WSL2 without a host-process route, an
  EP the probed route did not offer.
* :func:`runtime_identity` — which onnxruntime build a route has, read from its
  ``*.dist-info`` directories without starting it (evidence keys need it at
  plan time).
* :func:`probe_route` — runs the route worker in the route with a timeout and
  reports its Python, numpy, onnxruntime version and EPs (:class:`RouteReport`).
  Unreachable routes get a reason and a remedy, never an exception.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import settings
from orchestrator.errors import DEVICE_UNREACHABLE
from orchestrator.fileio import write_json_atomic
from orchestrator.ort.backends import backend as backend_row
from orchestrator.ort.worker import ORT_DISTRIBUTIONS
from orchestrator.plan import Refusal
from orchestrator.profile import THIS_PROCESS

if TYPE_CHECKING:
    from orchestrator.profile import Device, HardwareProfile, Route

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedRoute:
    """A route with its interpreter made absolute: what a host needs to start it."""

    name: str
    kind: str
    python: str | None
    """None for this-process; otherwise the interpreter to start."""

    @property
    def in_process(self) -> bool:
        return self.kind == THIS_PROCESS

    def path_for_route(self, path: str | Path) -> str:
        """A local path as the route's interpreter must spell it.

        From WSL2 a Windows ``python.exe`` needs ``\\\\wsl.localhost\\...`` paths
        (``wslpath -w``); every other route shares this file system.
        """
        if self.kind == "host-process" and self.python and self.python.lower().endswith(".exe") and running_in_wsl():
            out = subprocess.run(["wslpath", "-w", str(path)], capture_output=True, text=True, check=True, timeout=10)
            return out.stdout.strip()
        return str(path)


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


@functools.lru_cache(maxsize=1)
def running_in_wsl() -> bool:
    try:
        return "microsoft" in Path("/proc/sys/kernel/osrelease").read_text().lower()
    except OSError:
        return False


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
        return d

    def to_route(self) -> Route:
        """The profile entry a probe writes for this route."""
        from orchestrator.profile import Route

        return Route(
            name=self.name, kind=self.kind, python=self.python,
            reachable=self.reachable,
            reason=self.reason or f"probed {self.probed_at}: {self.runtime or 'no onnxruntime'}",
            remedy=self.remedy, providers=list(self.providers) or None, ort_version=self.ort_version,
        )


def probe_route(route: Route, *, base_dir: Path | None = None, timeout: float | None = None) -> RouteReport:
    """Run a small program in the route (with a timeout) and report what it offers.

    Never raises for an unreachable route: a missing interpreter, one that
    cannot import numpy or onnxruntime, a timeout — each becomes
    ``reachable=False`` with the reason and the remedy. The result is also
    remembered under the cache so plan-time evidence lookups can name the
    route's onnxruntime build when its ``dist-info`` cannot be read directly.
    """
    resolved = resolve(route, base_dir)
    t0 = time.perf_counter()
    report = _probe(resolved, timeout if timeout is not None else settings.PROBE_TIMEOUT_S)
    report = RouteReport(**{**asdict(report), "probe_s": time.perf_counter() - t0})
    if report.reachable:
        _remember(report)
    return report


def _probe(resolved: ResolvedRoute, timeout: float) -> RouteReport:
    from orchestrator.ort.hosts import RouteError, open_host

    base: dict[str, Any] = {"name": resolved.name, "kind": resolved.kind, "python": resolved.python}
    if not resolved.in_process:
        if not resolved.python:
            return RouteReport(**base, reachable=False, reason=f"route {resolved.name!r} names no interpreter",
                               remedy="set routes[].python to the interpreter of the environment that has the EP")
        if not os.path.exists(resolved.python):
            return RouteReport(
                **base, reachable=False,
                reason=f"the interpreter {resolved.python} does not exist",
                remedy=f"create that environment (python -m venv {_env_dir(resolved.python)}) and pip install numpy and the onnxruntime build with the EP you need, or fix routes[].python",
            )
    try:
        host = open_host(resolved)
        try:
            info = host.probe(timeout=timeout)
        finally:
            host.shutdown()
    except RouteError as exc:
        return RouteReport(**base, reachable=False, reason=str(exc), remedy=exc.remedy)
    return report_from_probe(resolved, info)


def report_from_probe(resolved: ResolvedRoute, info: dict[str, Any]) -> RouteReport:
    """A ``RouteReport`` from the route worker's ``probe`` answer."""
    base: dict[str, Any] = {"name": resolved.name, "kind": resolved.kind, "python": resolved.python or info.get("python")}
    common: dict[str, Any] = {
        "ort_distribution": info.get("ort_distribution"),
        "numpy_version": info.get("numpy_version"),
        "python_version": info.get("python_version"),
        "platform": info.get("platform"),
    }
    if info.get("error"):
        return RouteReport(
            **base, **common, reachable=False,
            reason=f"onnxruntime cannot be imported there: {info['error']}",
            remedy=f"install an onnxruntime build into that interpreter ({base['python'] or 'this one'} -m pip install onnxruntime, or the build with your EP)",
        )
    return RouteReport(
        **base, **common, reachable=True,
        ort_version=info.get("ort_version"), providers=tuple(info.get("providers", ())),
        assignment_api=bool(info.get("assignment_api")),
    )


def _env_dir(python: str) -> str:
    p = Path(python)
    return str(p.parent.parent) if p.parent.name in ("bin", "Scripts") else str(p.parent)


# ---- refusals --------------------------------------------------------------------


def probe_refusal(report: RouteReport, device: Device, backend_name: str) -> Refusal | None:
    """The refusal a probe implies for driving ``device`` with ``backend_name``, or None."""
    row = backend_row(backend_name)
    where = f"{device.id} ({device.name}) with {backend_name}"
    if not report.reachable:
        return Refusal(
            DEVICE_UNREACHABLE, device.id,
            f"{where}: route {report.name!r} is unreachable: {report.reason}",
            report.remedy or row.install,
        )
    if row.ep not in report.providers:
        return Refusal(
            DEVICE_UNREACHABLE, device.id,
            f"{where}: route {report.name!r} ({report.python or sys.executable}; {report.runtime}) "
            f"offers {', '.join(report.providers) or 'no EP'}, not {row.ep}",
            f"{row.install}; then name that interpreter as the route of {backend_name} on {device.id} "
            f"(devices[].backend_routes in the profile)",
        )
    return None


def static_refusal(profile: HardwareProfile, device: Device, backend_name: str) -> Refusal | None:
    """Unreachability the profile already shows, without starting anything."""
    row = backend_row(backend_name)
    name = device.route_for(backend_name)
    route = profile.route(name)
    where = f"{device.id} ({device.name}) with {backend_name}"
    if route is None:
        return Refusal(DEVICE_UNREACHABLE, device.id, f"{where}: the profile defines no route {name!r}", "add it to routes[]")
    if profile.host.wsl and device.kind == "npu" and route.kind != "host-process":
        return Refusal(
            DEVICE_UNREACHABLE, device.id,
            f"{where}: this process runs inside WSL2, where no NPU is exposed (Intel and AMD alike); "
            f"route {name!r} is a {route.kind} route on the Linux side",
            f"declare a host-process route whose python is a Windows-side python.exe with the EP "
            f"({row.install}), e.g. /mnt/c/Users/<you>/npu-env/Scripts/python.exe, or run omni-edge natively on Windows",
        )
    if not route.reachable:
        return Refusal(
            DEVICE_UNREACHABLE, device.id,
            f"{where}: route {name!r} is unreachable: {route.reason or 'marked unreachable in the profile'}",
            route.remedy or row.install,
        )
    if route.providers is not None and row.ep not in route.providers:
        return Refusal(
            DEVICE_UNREACHABLE, device.id,
            f"{where}: route {name!r} (onnxruntime {route.ort_version or '?'}) offers "
            f"{', '.join(route.providers) or 'no EP'}, not {row.ep}",
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
    return found or _remembered(resolved.python)


@functools.lru_cache(maxsize=1)
def _this_process_identity() -> str | None:
    from orchestrator.ort.worker import runtime_identity as here

    dist, version = here()
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
                        version = Path(hits[-1]).name[len(normal) + 1: -len(".dist-info")]
                        return f"{dist}=={version}"
    return None


def _memory_path(python: str) -> Path:
    return settings.cache_root() / "routes" / f"{hashlib.sha256(python.encode()).hexdigest()[:24]}.json"


def _remember(report: RouteReport) -> None:
    if report.python is None or report.kind == THIS_PROCESS:
        return
    path = _memory_path(report.python)
    try:
        write_json_atomic(path, report.to_dict(), indent=1)
    except OSError as exc:
        log.info("cannot remember the probe of %s: %s", report.python, exc)


def _remembered(python: str) -> str | None:
    try:
        data = json.loads(_memory_path(python).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if data.get("ort_version"):
        return f"{data.get('ort_distribution') or 'onnxruntime'}=={data['ort_version']}"
    return None
