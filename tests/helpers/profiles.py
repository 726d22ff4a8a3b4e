"""Inline hardware profiles: a test machine with a CPU and the devices a test names."""

from __future__ import annotations

from typing import Any

from orchestrator.core.profile import HardwareProfile, parse_profile
from orchestrator.core.units import GiB


def make_profile(
    *devices: dict[str, Any],
    ram_available: int = 16 * GiB,
    ram_total: int = 32 * GiB,
    ram_limit: int | None = None,
    routes: list[dict[str, Any]] | None = None,
    name: str = "test machine",
) -> HardwareProfile:
    cpu = {"id": "cpu", "kind": "cpu", "name": "test CPU", "backends": ["vllm-cpu", "ort-cpu"]}
    doc = {
        "format": "omni-edge.profile/1",
        "name": name,
        "host": {
            "os": "linux",
            "ram_total_bytes": ram_total,
            "ram_available_bytes": ram_available,
            "ram_limit_bytes": ram_limit,
        },
        "devices": [cpu, *devices],
        "routes": routes or [{"name": "this-process"}],
    }
    return parse_profile(doc)
