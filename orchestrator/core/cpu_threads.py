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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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
