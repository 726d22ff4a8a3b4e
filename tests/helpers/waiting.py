"""Waiting for a state instead of sleeping for it: what keeps the suite's verdicts
independent of the CPU's speed (docs/testing.md, "Speed").

``wait_until`` polls a condition until it holds and returns what it returned; past
its deadline it fails naming what never came true. The deadline is only there so a
broken implementation fails instead of hanging: a fast machine returns at the first
poll that sees the state, a slow one later, and neither changes the verdict.
``await_until`` is the same for a coroutine that must not block its event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

NEVER_HANGS_S = 60.0
"""The default deadline: long enough for a loaded 2-core machine to reach any state the
suite waits for (they take milliseconds), short enough that a broken one fails the run."""

LOOP_CLOCK_S = 0.001
"""How early by ``time.monotonic()`` an event loop's deadline may fire: uvloop (what uvicorn
runs on when it is installed) counts its timers in whole milliseconds of a clock it reads
once per turn, so a 1 s deadline armed at 12.3459 s fires at 13.345 s. A test that a
deadline did not fire early allows this much, and no more."""


def wait_until(
    condition: Callable[[], T],
    what: str,
    *,
    timeout_s: float = NEVER_HANGS_S,
    every_s: float = 0.01,
) -> T:
    """``condition()``'s first truthy value, polled every ``every_s``; an ``AssertionError``
    naming ``what`` (the state that was awaited) when none came within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(every_s)


async def await_until(
    condition: Callable[[], T],
    what: str,
    *,
    timeout_s: float = NEVER_HANGS_S,
    every_s: float = 0.01,
) -> T:
    """``wait_until`` inside an event loop: polls with ``asyncio.sleep``, so the loop's other
    tasks (the ones that make the state come true) keep running."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        await asyncio.sleep(every_s)
