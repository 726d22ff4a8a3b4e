"""What the crossing imports note, and the waits that make two loads' imports cross by construction.

``crossing`` (a package whose import imports its submodule ``sub``) and
``crossing.sub`` (which takes a name from its parent) import each other, as
transformers' modules and the packages around it do. Imported by one thread,
from either end, they work. Imported by two loads at once — one importing the
package while the other imports ``sub`` — each thread holds a module the other
needs; Python breaks the cycle by handing the package's importer a partially
initialised ``sub``, and ``from ….sub import thing`` fails. The waits make that
crossing certain instead of likely: the package's body waits until ``sub``'s
importer is blocked on the package (or is held back by the device actor's
load-import lock, when there is one), whatever the machine's speed.
"""

from __future__ import annotations

import importlib._bootstrap as bootstrap  # _blocking_on: which thread waits on a module lock
import threading
import time
from collections.abc import Callable

NOTED: dict[str, int] = {}
"""Mark → the thread that noted it."""
TIMEOUT_S = 120.0
"""A wait that never comes true ends here (the test then fails on what happened, not hangs)."""
GRACE_S = 0.5
"""On a Python without ``importlib._bootstrap._blocking_on``: how long after its note the
other thread is taken to be blocked."""


def note(mark: str) -> None:
    NOTED[mark] = threading.get_ident()


def held_back() -> bool:
    """Whether a load is waiting for another load's import (the device actor's lock)."""
    try:
        from orchestrator.runtime.load_imports import waiting
    except ImportError:  # no such lock: nothing holds a load back
        return False
    return waiting() > 0


def blocked(mark: str) -> bool:
    """Whether the thread that noted ``mark`` now waits on a module lock."""
    tid = NOTED.get(mark)
    if tid is None:
        return False
    table = getattr(bootstrap, "_blocking_on", None)
    if table is None:
        return True  # the caller's grace period stands in
    return bool(table.get(tid))


def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    if getattr(bootstrap, "_blocking_on", None) is None:
        time.sleep(GRACE_S)
