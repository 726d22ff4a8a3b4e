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
(a stage that turns busy during a step takes its share back at the next), nor does the borrower
ever run on more threads than the process's cores (:func:`cores`). Unregistered, a stage lends
nothing.

Three policies, by ``OMNI_EDGE_CPU_SHARE`` in the borrower's environment when it loads
(:func:`policy`):

* ``prefill`` (the default): only a step that reads a prompt (``n_threads_batch``: llama.cpp
  computes a batch of several tokens on it) borrows; a step of one token per sequence stays on
  the plan's share. A prompt step is short, compute-bound and comes when a reply starts, while
  the voice has nothing to speak yet: on the 2-core machine a spoken question's prompt was read
  in 0.67x the time on two threads (docs/benchmarks.md, "The prompt on both cores");
* ``follow``: every step borrows. Not the default: with one request at a time the default
  pipeline's first audio came 0.80-0.87x static's (``prefill``: 0.76-0.82x) and no more
  requests were served; with four at once it served 8-12 % more than static, where ``prefill``
  served 6-7 % less (docs/benchmarks.md, "The CPU split");
* ``static``: nothing is borrowed; every stage stays on its planned threads, the split as the
  plan printed it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from orchestrator.core.cpu_threads import cpu_cores
from orchestrator.core.errors import ConfigError

SHARE_ENV = "OMNI_EDGE_CPU_SHARE"
"""The policy (the module docstring): ``prefill`` (unset or empty), ``follow`` or ``static``."""
POLICIES = ("prefill", "follow", "static")

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class _Lender:
    device: str
    threads: int
    busy: int = 0
    """Calls computing now (several requests may run at once)."""


_lock = threading.Lock()
_lenders: dict[str, _Lender] = {}


def policy() -> str:
    """The policy a borrower in this process follows (``OMNI_EDGE_CPU_SHARE``; unset or empty:
    ``prefill``). ``ConfigError`` for another value, a typo included: the CLI checks it before
    any work starts (exit 2)."""
    value = os.environ.get(SHARE_ENV, "").strip().lower() or "prefill"
    if value not in POLICIES:
        raise ConfigError.single(
            f"the environment's {SHARE_ENV}",
            f"{os.environ.get(SHARE_ENV)!r} is not one of {', '.join(POLICIES)}",
            f"unset it (the default, prefill) or set one of {', '.join(POLICIES)}",
        )
    return value


def follows_work() -> bool:
    """Whether every step of a borrower in this process follows the work (``follow``)."""
    return policy() == "follow"


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


def cores() -> int:
    """The cores this process may run on (its affinity, capped by a cgroup CPU quota: what the
    profile's ``host.cpu_cores`` says): a borrower never asks for more threads than these (a
    config may give its stages more threads than the plan's split, as voice-chat.yaml gives
    Whisper both cores)."""
    return cpu_cores()
