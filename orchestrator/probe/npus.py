"""NPUs of this machine, from the Linux accel subsystem.

``/sys/class/accel/*/device/driver`` names the kernel driver of each
accelerator; the ones omni-edge recognises (``intel_vpu``, ``amdxdna``) are
listed with their vendor, and the backends that can drive them come from the
ONNX Runtime backend table (``orchestrator.core.backends``), not from here.
Windows NPUs are described in a recorded profile.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SYS_ACCEL = Path("/sys/class/accel")

# Linux accel driver → (vendor, NPU name).
NPU_DRIVERS: dict[str, tuple[str, str]] = {
    "intel_vpu": ("intel", "Intel NPU"),
    "amdxdna": ("amd", "AMD XDNA NPU"),
}


@dataclass(frozen=True)
class NPU:
    """One NPU as its accel driver announced it."""

    vendor: str
    name: str
    source: str


def linux_npus(accel_dir: Path = SYS_ACCEL) -> list[NPU]:
    """One entry per accelerator under ``accel_dir`` whose driver we recognise."""
    out: list[NPU] = []
    if not accel_dir.is_dir():
        return out
    for entry in sorted(accel_dir.iterdir()):
        try:
            driver = os.path.basename(os.readlink(entry / "device" / "driver"))
        except OSError:
            continue
        if driver in NPU_DRIVERS:
            vendor, name = NPU_DRIVERS[driver]
            out.append(NPU(vendor, name, f"{accel_dir} driver {driver}"))
    return out
