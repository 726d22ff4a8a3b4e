"""The planner's CPU thread step: each CPU stage's share of its host's cores.

One device actor hosts every stage the plan places on a device, so the stages
placed on one CPU share its cores. :func:`with_cpu_threads` groups them into
thread pools (a stage's own, or a process-wide pool its kind names:
``StageKind.cpu_thread_pool``), splits the host's cores among the pools by the
rule in ``orchestrator.core.cpu_threads`` (a config's ``cpu_threads`` taken as it
is), writes each stage's count in ``StagePlan.cpu_threads`` and says how in the
plan's notes. ``plan_pipeline`` calls it once the placements are chosen
(``plan_threads=False`` leaves the counts to the engines but the config's).

A stage with ``replicas: N`` is split per instance (``StagePlan.placements()``, keyed by
holder, ``voice#1``): a second replica of a stage on one device runs in a process of its
own, so it is a thread pool of its own, and the note says so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Protocol

from orchestrator.core import cpu_threads, errors
from orchestrator.core.plan import ReplicaPlan, StagePlan
from orchestrator.core.profile import HardwareProfile, Host
from stages.base import StageConfig, StageKind

Member = tuple[StagePlan, ReplicaPlan]
"""One instance placed on a CPU: its stage's plan and its placement."""


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
                    threads.update(
                        {r.holder: (next(iter(overrides[key])), "config") for _, r in group}
                    )
            notes.append(_unplanned_threads_note(device_id, plan_threads, bool(threads)))
            continue
        planned, note = _split_threads(device_id, cores, pools, overrides, states)
        threads.update(planned)
        notes.append(note + _replicas_note(device_id, members))
    return tuple(_with_threads(s, threads) for s in stage_plans), notes


def _with_threads(s: StagePlan, threads: Mapping[str, tuple[int, str]]) -> StagePlan:
    """The stage plan with its instances' thread counts (the stage's own: replica 0's)."""
    if not s.replicas:
        if s.name not in threads:
            return s
        return replace(s, cpu_threads=threads[s.name][0], cpu_threads_from=threads[s.name][1])
    replicas = tuple(
        replace(r, cpu_threads=threads[r.holder][0], cpu_threads_from=threads[r.holder][1])
        if r.holder in threads
        else r
        for r in s.replicas
    )
    first = replicas[0]
    return replace(
        s,
        replicas=replicas,
        cpu_threads=first.cpu_threads,
        cpu_threads_from=first.cpu_threads_from,
    )


def _replicas_note(device_id: str, members: list[Member]) -> str:
    """``; voice#0, voice#1 are replicas of voice on cpu: each its own process ...``, for
    every stage with several instances on this CPU (else '')."""
    holders: dict[str, list[str]] = {}
    for s, r in members:
        holders.setdefault(s.name, []).append(r.holder)
    return "".join(
        f"; {', '.join(h)} are replicas of {name} on {device_id}: each its own process with its "
        "own threads, so they split the cores"
        for name, h in holders.items()
        if len(h) > 1
    )


def _stages_on_cpu(
    stage_plans: tuple[StagePlan, ...], profile: HardwareProfile
) -> dict[str, list[Member]]:
    """The admitted instances (stages, replicas of stages) placed on each CPU device, by
    device id."""
    on_cpu: dict[str, list[Member]] = {}
    for s in stage_plans:
        for r in s.placements():
            device = profile.device(r.device) if r.device else None
            if device is not None and device.kind == "cpu":
                on_cpu.setdefault(device.id, []).append((s, r))
    return on_cpu


def _thread_pools(
    members: list[Member], states: Mapping[str, PlacedStage]
) -> dict[str, list[Member]]:
    """One device's instances grouped by the thread pool they use: a process-wide pool
    their kinds name (``"torch pool"``; a second replica of a stage on the device is a
    process of its own, ``"torch pool of cpu#1"``), else the instance's own (keyed by its
    holder)."""
    pools: dict[str, list[Member]] = {}
    slots: Counter[str] = Counter()
    for s, r in members:
        slot = slots[s.name]
        slots[s.name] += 1
        shared = states[s.name].kind.cpu_thread_pool(s)
        process = f" of {r.device}#{slot}" if slot else ""
        pools.setdefault(f"{shared} pool{process}" if shared else r.holder, []).append((s, r))
    return pools


def _thread_overrides(
    pools: dict[str, list[Member]], states: Mapping[str, PlacedStage], device_id: str
) -> dict[str, set[int]]:
    """Each pool's ``cpu_threads`` from the configs (empty: none set); a ``ConfigError`` when
    the stages sharing one pool give it different counts."""
    overrides = {
        key: {n for s, _ in group if (n := states[s.name].stage.cpu_threads) is not None}
        for key, group in pools.items()
    }
    for key, given in overrides.items():
        if len(given) > 1:
            names = ", ".join(r.holder for _, r in pools[key])
            raise errors.ConfigError.single(
                f"stages.{pools[key][0][0].name}.cpu_threads",
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
    pools: dict[str, list[Member]],
    overrides: dict[str, set[int]],
    states: Mapping[str, PlacedStage],
) -> tuple[dict[str, tuple[int, str]], str]:
    """One CPU device's cores split among its thread pools: each stage's count and where
    it came from (``config`` or ``plan``), and the note that shows the split."""
    keys = list(pools)
    split = cpu_threads.split_cores(
        cores,
        [
            cpu_threads.Pool(
                max(states[s.name].kind.cpu_thread_weight for s, _ in pools[k]),
                next(iter(overrides[k]), None),
            )
            for k in keys
        ],
    )
    threads: dict[str, tuple[int, str]] = {}
    for key, n in zip(keys, split.threads, strict=True):
        threads.update(
            {r.holder: (n, "config" if overrides[key] else "plan") for _, r in pools[key]}
        )
    shares = ", ".join(
        f"{'+'.join(r.holder for _, r in pools[k])} {n}"
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


def _host_of(profile: HardwareProfile, device_id: str) -> Host:
    """The host a device is on: its node's in a cluster profile."""
    node = device_id.rsplit("/", 1)[0] if "/" in device_id else None
    return profile.nodes[node].profile.host if node in profile.nodes else profile.host
