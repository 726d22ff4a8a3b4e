"""Which stages on a CPU are computing now, in this process: a decoder's threads follow the work.

The plan splits a CPU's cores among the stages placed on it (``StagePlan.cpu_threads``), and one
device actor hosts every stage placed on a device, so those stages run in one process. A split
fixed for the whole session leaves a stage's cores idle whenever it has nothing to do: in the
default pipeline the voice speaks a sentence now and then, and its core sits unused while the
decoder, on its own share, writes the next one. This registry lets a stage lend its share while
it is idle:

* a stage that can lend registers its device and its planned threads (:func:`register`) and
  marks the calls that compute (:func:`busy`: an ONNX Runtime session's ``run``, the route
  worker's included, since the call waits for it);
* a stage that can borrow (the llama.cpp decoder, which sets its context's threads between
  two decode calls) asks before each step how many threads the other registered stages on its
  device lend now (:func:`lent_threads`): the planned threads of each one not computing.

Guarantees: what a stage borrows is never more than the threads the plan gave the stages of its
own device that registered in this process (a stage in another process, a replica in its own,
lends nothing), so the device's planned total is never exceeded for longer than one decode step
(a stage that turns busy during a step takes its share back at the next). Unregistered, a stage
lends nothing.

Off unless ``OMNI_EDGE_CPU_SHARE=follow`` is in the borrower's environment when it loads: on the
2-core machine it was measured on, with other processes on the cores, a decode on both cores
stalled at llama.cpp's per-layer barriers whenever anything else ran, and the default pipeline's
first audio came later, not earlier, in one of two runs (docs/benchmarks.md, "The CPU split").
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

SHARE_ENV = "OMNI_EDGE_CPU_SHARE"
"""``follow``: an idle stage's threads go to a decoder on its device; unset or anything else
(``static``): every stage stays on its planned threads, the split as the plan printed it."""

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class _Lender:
    device: str
    threads: int
    busy: int = 0
    """Calls computing now (several requests may run at once)."""


_lock = threading.Lock()
_lenders: dict[str, _Lender] = {}


def follows_work() -> bool:
    """Whether a borrower in this process follows the work (``OMNI_EDGE_CPU_SHARE=follow``)."""
    return os.environ.get(SHARE_ENV, "").strip().lower() == "follow"


def register(holder: str, device: str, threads: int | None) -> None:
    """``holder`` (a stage, or a replica) on ``device`` lends its planned ``threads`` while it is not
    computing. No planned threads (the engine's default): nothing to lend, nothing registered."""
    if not threads or threads < 1:
        return
    with _lock:
        _lenders[holder] = _Lender(device, int(threads))


def unregister(holder: str) -> None:
    """``holder`` lends no more (it closed)."""
    with _lock:
        _lenders.pop(holder, None)


@contextlib.contextmanager
def busy(holder: str) -> Iterator[None]:
    """``holder`` computes inside: its threads are its own until the block ends."""
    with _lock:
        lender = _lenders.get(holder)
        if lender is not None:
            lender.busy += 1
    try:
        yield
    finally:
        if lender is not None:
            with _lock:
                lender.busy -= 1


def marking_busy(holder: str, call: F) -> F:
    """``call``, each of its calls inside :func:`busy` for ``holder``."""

    def marked(*args: Any, **kwargs: Any) -> Any:
        with busy(holder):
            return call(*args, **kwargs)

    return marked  # type: ignore[return-value]


def lent_threads(device: str, borrower: str) -> int:
    """The threads the stages registered on ``device`` (``borrower`` aside) lend now: the planned
    threads of each one not computing."""
    with _lock:
        return sum(
            lender.threads
            for holder, lender in _lenders.items()
            if holder != borrower and lender.device == device and not lender.busy
        )
