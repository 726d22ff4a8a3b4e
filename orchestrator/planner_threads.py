"""The planner's CPU thread step: each CPU stage's share of its host's cores.

One device actor hosts every stage the plan places on a device, so the stages
placed on one CPU share its cores. :func:`with_cpu_threads` groups them into
thread pools (a stage's own, or a process-wide pool its kind names:
``StageKind.cpu_thread_pool``), splits the host's cores among the pools by the
rule in ``orchestrator.cpu_threads`` (a config's ``cpu_threads`` taken as it
is), writes each stage's count in ``StagePlan.cpu_threads`` and says how in the
plan's notes. ``plan_pipeline`` calls it once the placements are chosen
(``plan_threads=False`` leaves the counts to the engines but the config's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Protocol

from orchestrator import cpu_threads, errors
from orchestrator.plan import StagePlan
from orchestrator.profile import HardwareProfile, Host
from stages.base import StageConfig, StageKind


class PlacedStage(Protocol):
    """What the split reads of a planned stage: its config and its kind."""

    stage: StageConfig
    kind: StageKind


def with_cpu_threads(
    stage_plans: tuple[StagePlan, ...],
    states: Mapping[str, PlacedStage],
    profile: HardwareProfile,
    plan_threads: bool,
) -> tuple[tuple[StagePlan, ...], list[str]]:
    """Each admitted stage on a CPU device with its ``cpu_threads`` (and where they came from),
    and the notes that explain the split.

    One device actor hosts every stage placed on a device, so stages on one CPU share its
    cores; stages whose kinds name the same process-wide pool there (torch's) are one
    pool of the split, with the largest weight among them and their config's override."""
    threads: dict[str, tuple[int, str]] = {}
    notes: list[str] = []
    for device_id, members in _stages_on_cpu(stage_plans, profile).items():
        pools = _thread_pools(members, states)
        overrides = _thread_overrides(pools, states, device_id)
        cores = _host_of(profile, device_id).cpu_cores
        if not plan_threads or cores is None:
            for key, group in pools.items():
                if overrides[key]:
                    threads.update({s.name: (next(iter(overrides[key])), "config") for s in group})
            notes.append(_unplanned_threads_note(device_id, plan_threads, bool(threads)))
            continue
        planned, note = _split_threads(device_id, cores, pools, overrides)
        threads.update(planned)
        notes.append(note)
    out = tuple(
        replace(s, cpu_threads=threads[s.name][0], cpu_threads_from=threads[s.name][1])
        if s.name in threads
        else s
        for s in stage_plans
    )
    return out, notes


def _stages_on_cpu(
    stage_plans: tuple[StagePlan, ...], profile: HardwareProfile
) -> dict[str, list[StagePlan]]:
    """The admitted stages placed on each CPU device, by device id."""
    on_cpu: dict[str, list[StagePlan]] = {}
    for s in stage_plans:
        device = profile.device(s.device) if s.admitted and s.device else None
        if device is not None and device.kind == "cpu":
            on_cpu.setdefault(device.id, []).append(s)
    return on_cpu


def _thread_pools(
    members: list[StagePlan], states: Mapping[str, PlacedStage]
) -> dict[str, list[StagePlan]]:
    """One device's stages grouped by the thread pool they use: a process-wide pool their
    kinds name (``"torch pool"``), else the stage's own (keyed by its name)."""
    pools: dict[str, list[StagePlan]] = {}
    for s in members:
        shared = states[s.name].kind.cpu_thread_pool(s)
        pools.setdefault(f"{shared} pool" if shared else s.name, []).append(s)
    return pools


def _thread_overrides(
    pools: dict[str, list[StagePlan]], states: Mapping[str, PlacedStage], device_id: str
) -> dict[str, set[int]]:
    """Each pool's ``cpu_threads`` from the configs (empty: none set); a ``ConfigError`` when
    the stages sharing one pool give it different counts."""
    overrides = {
        key: {n for s in group if (n := states[s.name].stage.cpu_threads) is not None}
        for key, group in pools.items()
    }
    for key, given in overrides.items():
        if len(given) > 1:
            names = ", ".join(s.name for s in pools[key])
            raise errors.ConfigError.single(
                f"stages.{pools[key][0].name}.cpu_threads",
                f"{names} share one {key} in {device_id}'s actor (one thread count per process), and their "
                f"configs give it {', '.join(map(str, sorted(given)))} threads",
                "give them the same cpu_threads, or set it on one of them only",
            )
    return overrides


def _unplanned_threads_note(device_id: str, plan_threads: bool, any_config: bool) -> str:
    """Why a CPU device's stages get no planned thread counts (``any_config``: some stage
    so far has the config's count)."""
    return (
        f"{device_id}: "
        + (
            "CPU thread budgets are off"
            if not plan_threads
            else "the profile does not say how many cores the host has (host.cpu_cores; `omni-edge probe` "
            "records it)"
        )
        + ": engines placed there pick their own thread counts"
        + (" except where the config sets cpu_threads" if any_config else "")
    )


def _split_threads(
    device_id: str,
    cores: int,
    pools: dict[str, list[StagePlan]],
    overrides: dict[str, set[int]],
) -> tuple[dict[str, tuple[int, str]], str]:
    """One CPU device's cores split among its thread pools: each stage's count and where
    it came from (``config`` or ``plan``), and the note that shows the split."""
    keys = list(pools)
    split = cpu_threads.split_cores(
        cores,
        [
            cpu_threads.Pool(
                max(_thread_weight(s) for s in pools[k]), next(iter(overrides[k]), None)
            )
            for k in keys
        ],
    )
    threads: dict[str, tuple[int, str]] = {}
    for key, n in zip(keys, split.threads, strict=True):
        threads.update({s.name: (n, "config" if overrides[key] else "plan") for s in pools[key]})
    shares = ", ".join(
        f"{'+'.join(s.name for s in pools[k])} {n}"
        for k, n in zip(keys, split.threads, strict=True)
    )
    line = (
        f"{device_id}: {cores} logical CPUs, {split.usable} shared by its stages ("
        + ("one left to Ray and the OS; " if split.usable < cores else "")
        + f"decode weighted {cpu_threads.DECODE_WEIGHT}:{cpu_threads.OTHER_WEIGHT}): threads {shares}"
    )
    if split.oversubscribed:
        line += (
            f"; {sum(split.threads)} threads on {split.usable} cores: oversubscribed, the stages take "
            "turns on the cores (fewer CPU stages, a machine with more cores, or smaller cpu_threads "
            "overrides end it)"
        )
    return threads, line


def _thread_weight(stage: StagePlan) -> int:
    return cpu_threads.DECODE_WEIGHT if stage.kind == "ar_decode" else cpu_threads.OTHER_WEIGHT


def _host_of(profile: HardwareProfile, device_id: str) -> Host:
    """The host a device is on: its node's in a cluster profile."""
    node = device_id.rsplit("/", 1)[0] if "/" in device_id else None
    return profile.nodes[node].profile.host if node in profile.nodes else profile.host
