"""CPU cores as a planned resource: how many threads each CPU stage's engine may run.

Stages placed on the CPU share its cores: the decode engine's threads (vLLM's
OpenMP team, llama.cpp's ``n_threads``, torch's intra-op pool), ONNX Runtime's
intra-op threads for the voice, VAD and ASR, and Ray's own processes. Left to
themselves, every engine sizes its pool to the whole machine, so on a 2-core
machine three engines run six busy threads on two cores and the voice waits for
the decoder's threads to be descheduled (docs/runtime.md, "CPU threads").

:func:`split_cores` is the rule, a pure function over numbers: the host's usable
cores (:func:`usable_cores`) split among the CPU thread pools in proportion to
their weights (the decode stage first, :data:`DECODE_WEIGHT`), every pool at
least one thread, the total never above the usable cores unless there are more
pools than cores (then one thread each, and the split says it oversubscribes).
A pool whose stage's config names ``cpu_threads`` gets exactly that many and the
others share what is left. The planner (``orchestrator.planner_threads``) decides which
stages are pools and writes the result in each ``StagePlan.cpu_threads``.

:func:`cpu_cores` reads the cores this process may use (its affinity, capped by a cgroup CPU
quota): the probe's ``host.cpu_cores`` in a profile, and the cap a device actor's llama.cpp
engine never borrows past (``stages.cpu_share``).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

DECODE_WEIGHT = 2
"""A decode stage's (``ar_decode``) share of the cores against another stage's
:data:`OTHER_WEIGHT`: the decoder is the stage users wait on (every sentence the
voice speaks waits for its tokens, and it runs for the whole reply while the voice
runs once a sentence), so it gets twice a voice's or an ASR's share."""
OTHER_WEIGHT = 1
"""Every other CPU stage's weight (the voice, VAD, ASR, graphs)."""
RESERVE_ABOVE_CORES = 4
"""On a host with more usable cores than this, one core is left out of the split
for what is not a stage: Ray's raylet and workers, the driver's event loop that
moves items between stages, the OS. On 4 cores or fewer, keeping one back would
halve the decoder or oversubscribe the rest; those processes are mostly idle
while a reply streams, so there they share the cores."""


@dataclass(frozen=True)
class Pool:
    """One CPU thread pool the split serves: a stage, or stages sharing one
    process-wide pool (torch's, in one device actor)."""

    weight: int
    override: int | None = None
    """Threads the config fixes (``cpu_threads``); None: the split decides."""


@dataclass(frozen=True)
class Split:
    threads: tuple[int, ...]
    """Threads per pool, in the order given."""
    usable: int
    """The cores the split shared out (:func:`usable_cores`)."""
    oversubscribed: bool
    """More threads than usable cores: more pools than cores, or overrides that ask for more."""


def usable_cores(cores: int) -> int:
    """The cores the stages share: all of them up to :data:`RESERVE_ABOVE_CORES`, one fewer above."""
    return cores - 1 if cores > RESERVE_ABOVE_CORES else max(cores, 1)


def split_cores(cores: int, pools: Sequence[Pool]) -> Split:
    """Threads for each of ``pools`` on a host with ``cores`` logical CPUs (see the module
    docstring for the rule). Deterministic: equal remainders go to the heavier pool, then
    to the earlier one."""
    usable = usable_cores(cores)
    threads = [p.override or 0 for p in pools]
    free_idx = [i for i, p in enumerate(pools) if p.override is None]
    left = usable - sum(threads)
    if len(free_idx) > left:  # not one core each: one thread each, and say so
        for i in free_idx:
            threads[i] = 1
        return Split(tuple(threads), usable, sum(threads) > usable)
    # proportional shares with a floor of one: a pool whose share is below one gets
    # one, and the rest is shared again among the others (water-filling)
    shares: dict[int, float] = {}
    todo, budget = list(free_idx), float(left)
    while todo:
        weight = sum(pools[i].weight for i in todo)
        small = [i for i in todo if budget * pools[i].weight / weight < 1]
        if not small:
            shares.update({i: budget * pools[i].weight / weight for i in todo})
            break
        for i in small:
            shares[i] = 1.0
            budget -= 1
            todo.remove(i)
    for i, share in shares.items():
        threads[i] = max(1, math.floor(share))
    spare = left - sum(threads[i] for i in free_idx)
    order = sorted(
        free_idx, key=lambda i: (-(shares[i] - math.floor(shares[i])), -pools[i].weight, i)
    )
    for i in order[: max(spare, 0)]:
        threads[i] += 1
    return Split(tuple(threads), usable, sum(threads) > usable)


# ---- the cores this process may use (the probe's host.cpu_cores; a device actor's cap) ----

CGROUP_CPU_FILES = (
    (Path("/sys/fs/cgroup/cpu.max"), None),  # cgroup v2: "QUOTA PERIOD" or "max PERIOD"
    (
        Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
        Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
    ),  # cgroup v1
)


def parse_cpu_quota(quota: str, period: str | None = None) -> float | None:
    """A cgroup CPU quota in CPUs: cgroup v2's ``cpu.max`` ("QUOTA PERIOD", "max PERIOD")
    or v1's ``cpu.cfs_quota_us`` with ``period`` (``cpu.cfs_period_us``); None for no
    limit ("max", -1) or garbage."""
    fields = quota.split()
    if period is not None:
        fields = fields[:1] + period.split()[:1]
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        q, p = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    if q <= 0 or p <= 0:
        return None
    return q / p


def usable_cpus(affinity: int, quota: float | None) -> int:
    """Logical CPUs a process can keep busy: its affinity mask, capped by a CPU quota
    rounded down (a 1.5-CPU quota throttles a second busy thread half the time), at least one."""
    if quota is None:
        return max(affinity, 1)
    return max(1, min(affinity, math.floor(quota)))


def cgroup_cpu_quota(files: Iterable[tuple[Path, Path | None]] = CGROUP_CPU_FILES) -> float | None:
    """The first CPU quota among ``files`` (cgroup v2 first, then v1), in CPUs."""
    for quota_path, period_path in files:
        try:
            quota = quota_path.read_text(encoding="utf-8")
            period = period_path.read_text(encoding="utf-8") if period_path is not None else None
        except OSError:
            continue
        found = parse_cpu_quota(quota, period)
        if found is not None:
            log.debug("cgroup CPU quota %.2f CPUs from %s", found, quota_path)
            return found
    return None


def cpu_cores() -> int:
    """Logical CPUs this process may run on: ``sched_getaffinity`` (``os.cpu_count`` where
    there is none), capped by a cgroup CPU quota."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS and Windows have no sched_getaffinity
        affinity = os.cpu_count() or 1
    return usable_cpus(affinity, cgroup_cpu_quota())
