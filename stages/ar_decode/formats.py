"""What a decode engine's backends can execute, with the reason for every entry.

Each engine declares its rules (``DecodeEngine.format_rules``: one row per backend ×
format, in ``stages/ar_decode/engines/<engine>.py``); the planner asks
:func:`format_refusal` over them before any memory arithmetic: a checkpoint whose
format the device's backend cannot execute is refused while planning, not after the
engine's start-up and a stack trace. Entries are data, not branches per vendor.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.core.profile import Device


@dataclass(frozen=True)
class FormatRule:
    backend: str
    weight_format: str
    supported: bool
    reason: str
    min_cc: float | None = None
    """Lowest NVIDIA compute capability that has the kernel (inclusive)."""
    max_cc: float | None = None
    """Compute capability from which the kernel is missing (exclusive)."""


def _cc(device: Device) -> float | None:
    return float(device.compute_capability) if device.compute_capability else None


def format_refusal(
    rules: tuple[FormatRule, ...], backend: str, device: Device, weight_format: str
) -> str | None:
    """None when ``backend`` on ``device`` executes ``weight_format`` by ``rules``, else the reason."""
    found = [r for r in rules if r.backend == backend and r.weight_format == weight_format]
    if not found:
        known = sorted({r.weight_format for r in rules if r.backend == backend and r.supported})
        return f"{backend} has no kernel path for {weight_format} weights (it executes {', '.join(known)})"
    rule = found[0]
    if not rule.supported:
        return rule.reason
    cc = _cc(device)
    if cc is not None and rule.min_cc is not None and cc < rule.min_cc:
        return f"{rule.reason}; {device.id} has compute capability {device.compute_capability}"
    if cc is not None and rule.max_cc is not None and cc >= rule.max_cc:
        return f"{rule.reason}; {device.id} ({device.name}) has compute capability {device.compute_capability}"
    return None


def supported_formats(rules: tuple[FormatRule, ...], backend: str, device: Device) -> list[str]:
    """The formats ``backend`` executes on ``device`` by ``rules``."""
    return sorted(
        r.weight_format
        for r in rules
        if r.backend == backend and format_refusal(rules, backend, device, r.weight_format) is None
    )
