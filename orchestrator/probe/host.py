"""This machine's host: its OS, whether it is WSL2, its CPU, its RAM and the limit on it.

Plain readers of ``/proc``, ``/sys/fs/cgroup`` and ``psutil``; the parsers are
pure functions over text, tested on recorded output. Nothing here starts a
process or imports anything heavy.

* RAM: ``psutil`` (total, available); a cgroup v2 (``memory.max``) or v1
  (``memory.limit_in_bytes``) limit below physical RAM becomes
  ``ram_limit_bytes``. WSL2's own VM size is what ``psutil`` reports inside
  WSL; the ``.wslconfig`` quota cannot be seen from inside the VM.
* WSL: ``/proc/version`` mentions "microsoft" (:func:`running_in_wsl`, the one
  check every part of omni-edge uses).
* CPU: model name and ISA flags from ``/proc/cpuinfo``; the logical CPUs this
  process may use (``sched_getaffinity``, capped by a cgroup v2 ``cpu.max`` or v1
  CFS quota).
"""

from __future__ import annotations

import logging
import platform
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import psutil

# the cores this process may use are read in orchestrator.core.cpu_threads (a device actor reads
# them too, and stages may not import the probe); re-exported for the profile and its tests
from orchestrator.core.cpu_threads import CGROUP_CPU_FILES as CGROUP_CPU_FILES
from orchestrator.core.cpu_threads import cgroup_cpu_quota as cgroup_cpu_quota
from orchestrator.core.cpu_threads import cpu_cores
from orchestrator.core.cpu_threads import parse_cpu_quota as parse_cpu_quota
from orchestrator.core.cpu_threads import usable_cpus as usable_cpus
from orchestrator.core.profile import Host

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

# ISA extensions worth planning on (CPU kernels in vLLM, ONNX Runtime and llama.cpp
# pick code paths by them; a llama.cpp build compiled for one runs only where the CPU
# has it: orchestrator/probe/llamacpp.py). Keys are /proc/cpuinfo flags, values the names we report.
ISA_FLAGS = {
    "pni": "sse3",
    "ssse3": "ssse3",
    "sse4_2": "sse4_2",
    "bmi2": "bmi2",
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "avx_vnni": "avx_vnni",
    "avx512f": "avx512f",
    "avx512bw": "avx512bw",
    "avx512vl": "avx512vl",
    "avx512vbmi": "avx512vbmi",
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


# ---- parsers (pure functions, tested on their own) -------------------------------------


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


def cpu_vendor(name: str) -> str:
    """The vendor a CPU model name names (``amd``, ``intel``, ``qualcomm``, ``apple``), or ""."""
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


# ---- this machine -------------------------------------------------------------------


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def host_os() -> Literal["linux", "windows", "macos"]:
    """The operating system this process runs on, as a profile names it."""
    if sys.platform.startswith("win"):
        return "windows"
    if sys.platform == "darwin":
        return "macos"
    return "linux"


def running_in_wsl() -> bool:
    """Whether this process runs inside WSL (its kernel says so in /proc/version)."""
    return is_wsl(_read(PROC_VERSION))


def cpu_model() -> tuple[str, list[str]]:
    """This CPU's model name (``platform``'s answer where /proc/cpuinfo has none) and ISA extensions."""
    name, isa = parse_cpuinfo(_read(PROC_CPUINFO))
    return name or platform.processor() or platform.machine(), isa


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


def this_host() -> Host:
    """The profile's ``host`` for this machine, read now (available RAM changes)."""
    vm = psutil.virtual_memory()
    limit = cgroup_memory_limit()
    if limit is not None and limit >= vm.total:
        limit = None  # a limit at or above physical RAM constrains nothing
    return Host(
        os=host_os(),
        wsl=running_in_wsl(),
        cpu_name=cpu_model()[0],
        ram_total_bytes=int(vm.total),
        ram_available_bytes=int(vm.available),
        ram_limit_bytes=limit,
        cpu_cores=cpu_cores(),
    )
