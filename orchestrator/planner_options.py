"""The planner's records and small rules: a candidate placement and why one was excluded (Candidate, Excluded), the state of one stage while the joint search runs (StageState, its options and its calibration), the device mask (parse_mask), and how an artifact, a capacity and a breakdown are said."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator import calibration as cal
from orchestrator.config import StageConfig
from orchestrator.core import errors
from orchestrator.core.ledger import Reservation
from orchestrator.core.plan import (
    Refusal,
    Verification,
)
from orchestrator.core.profile import (
    HOST_RAM,
    Device,
    HardwareProfile,
    Route,
)
from orchestrator.core.units import fmt_bytes
from stages.base import ArtifactInfo, StageKind


@dataclass(frozen=True)
class Candidate:
    """A (stage, device, backend) the config allows and the profile offers, with the
    route that reaches the device for that backend (reachable or not)."""

    stage: StageConfig
    kind: StageKind
    info: ArtifactInfo
    device: Device
    backend: str
    route: Route


@dataclass(frozen=True)
class Excluded:
    """A device in a stage's list that yields no candidate, and why: ``masked``
    (``--mask``), ``absent`` (the profile has no such device), ``no_backend``
    (none of its backends runs this kind, or the stage allows none of them) or
    ``unavailable`` (a backend the stage names that the device's route has but cannot
    run: ``backend`` and ``reason`` say which and why, e.g. a llama.cpp build for
    instructions this CPU lacks)."""

    stage: str
    device: str
    why: Literal["masked", "absent", "no_backend", "unavailable"]
    backend: str = ""
    reason: str = ""


@dataclass(frozen=True)
class Option:
    device: Device
    backend: str
    route: Route
    reservations: tuple[Reservation, ...]
    verification: Verification | None
    metadata_reservations: tuple[Reservation, ...] = ()
    """The kind's own reservations before calibration (the engine is configured from these)."""
    calibration: cal.Calibration | None = None


@dataclass(frozen=True)
class Calibrating:
    """A measurement store the plan reads (``plan_pipeline(calibration=...)``)."""

    store: cal.CalibrationStore
    pipeline: str
    profile: HardwareProfile
    unusable: dict[tuple[str, str, str], tuple[str, cal.Unusable]] = field(default_factory=dict)
    """(stage, device, backend) → its entry's file and why the store could not use it."""


@dataclass
class StageState:
    """A stage to place, or one replica of it (``replicas: N`` > 1: N states sharing the
    stage's options and refusals, holders ``name#0`` … ``name#N-1``)."""

    stage: StageConfig
    kind: StageKind
    info: ArtifactInfo
    options: list[Option]
    refusals: list[Refusal]
    holder: str = ""
    """Its ledger holder: the stage's name, or ``name#i`` for replica i of several."""
    replica: int = 0

    def __post_init__(self) -> None:
        self.holder = self.holder or self.stage.name

    @property
    def replicas(self) -> int:
        return self.stage.replicas


DEVICE_KINDS = ("cpu", "gpu", "igpu", "npu")


def parse_mask(values: Iterable[str], profile: HardwareProfile | None = None) -> frozenset[str]:
    """``--mask npu,igpu:0`` → device ids or kinds to exclude.

    With ``profile``, every entry must be a device kind (``cpu``, ``gpu``,
    ``igpu``, ``npu``) or the id of a device the profile has: a mask that names
    nothing would silently exclude nothing, so it is a ``ConfigError``."""
    out: set[str] = set()
    for v in values:
        out.update(x.strip() for x in v.split(",") if x.strip())
    if profile is not None:
        have = [d.id for d in profile.devices]
        # a cluster: a node's name masks the node; an unqualified id masks it on every node
        known = {
            *have,
            *profile.node_names,
            *(d.local_id for d in profile.devices if profile.nodes),
        }
        nodes = f"; its nodes: {', '.join(profile.node_names)}" if profile.nodes else ""
        problems = [
            errors.Problem(
                f"--mask {entry}",
                f"names no device of the profile {profile.name!r} (it has {', '.join(have)}{nodes})",
                f"mask one of {', '.join(have)}, or a kind ({', '.join(DEVICE_KINDS)})"
                + (", or a node" if profile.nodes else ""),
            )
            for entry in sorted(out)
            if entry not in DEVICE_KINDS and entry not in known
        ]
        if problems:
            raise errors.ConfigError(problems)
    return frozenset(out)


def masked(device_id: str, mask: frozenset[str]) -> bool:
    """By id, by kind, and in a cluster also by node (``laptop``) and by the id on any
    node (``gpu:0`` masks every node's gpu:0)."""
    node, _, local = device_id.rpartition("/")
    return (
        device_id in mask
        or local in mask
        or local.split(":")[0] in mask
        or (bool(node) and node in mask)
    )


def where_of(device: Device, backend: str) -> str:
    return f"{device.id} ({backend})"


def breakdown(reservations: Iterable[Reservation], pool: str) -> str:
    return " + ".join(
        f"{r.purpose} {fmt_bytes(r.bytes)}" for r in reservations if r.pool == pool and r.bytes
    )


def artifact_record(info: ArtifactInfo) -> dict[str, Any]:
    return {
        "kind": info.kind,
        "path": info.path,
        "weight_bytes": info.weight_bytes,
        "weight_format": info.weight_format,
        **info.details,
    }


def capacity_of(profile: HardwareProfile, device: Device) -> int:
    if device.node and device.node in profile.nodes:
        node = profile.nodes[device.node].profile
        return capacity_of(node, node.device(device.local_id) or device)
    return (
        profile.host_ram_capacity
        if device.pool == HOST_RAM
        else (device.memory_bytes or device.shared_memory_bytes or 0)
    )
