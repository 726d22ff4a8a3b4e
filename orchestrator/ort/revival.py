"""A route worker that died, replaced: bounded, backed off and said (``sessions.WorkerSessions``).

:class:`Revival` keeps what a session host needs to bring its worker back:

* **its policy** (:class:`RestartPolicy`, plain numbers: the stage's ``restart`` as its runner
  sets it; None for a host that never replaces a dead worker — the gates', and a stage's with
  ``restart: never``);
* **its deaths** within the policy's window: one more than ``max`` is a crash loop, and the
  worker is not replaced again (:meth:`died` says so); otherwise the wait before the
  replacement, doubling with each death in the window;
* **what is said**: ``restarts`` (replacements made), ``restarting`` (one under way: the stage's
  ``health()`` reports it), ``last`` (why the worker last died);
* **a watch** on each worker process (:meth:`watch`): a thread that waits for its exit, so a
  worker killed while idle is replaced at once, not at the next call.

It knows nothing of the sessions themselves: the host reopens them.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestartPolicy:
    """A stage's ``restart`` as a route worker follows it (``stages.base.RestartConfig``'s
    numbers; this layer imports no stage)."""

    max: int = 5
    window_s: float = 600.0
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0

    def backoff(self, deaths: int) -> float:
        """Seconds before the replacement that follows the ``deaths``-th death in the window."""
        return float(min(self.backoff_max_s, self.backoff_s * 2 ** max(0, min(deaths - 1, 30))))


@dataclass
class Revival:
    """One session host's worker deaths and replacements (the module's guarantees)."""

    policy: RestartPolicy | None = None
    restarts: int = 0
    """Workers started in place of one that died."""
    restarting: bool = False
    """A replacement is under way (its back-off, the new worker's start, the sessions reopened)."""
    last: str = ""
    """Why the worker last died."""
    crash_loop: str | None = None
    """Why it is no longer replaced: more deaths in the window than the policy allows."""
    deaths: deque[float] = field(default_factory=deque)
    stopping: threading.Event = field(default_factory=threading.Event)
    """Set when the host shuts down: a back-off under way ends, no watch replaces anything."""

    def died(self, why: str) -> float | None:
        """Count a death (``why``); the seconds to wait before replacing the worker, or None
        when it is not replaced: no policy, the host shutting down, or a crash loop
        (``crash_loop`` then says why)."""
        self.last = why
        if self.policy is None or self.stopping.is_set() or self.crash_loop is not None:
            return None
        now = time.monotonic()
        self.deaths.append(now)
        while self.deaths and now - self.deaths[0] > self.policy.window_s:
            self.deaths.popleft()
        if len(self.deaths) > self.policy.max:
            self.crash_loop = (
                f"its worker died {len(self.deaths)} times within {self.policy.window_s:g} s "
                f"(restart: max {self.policy.max}), a crash loop; the last: {why}"
            )
            return None
        return self.policy.backoff(len(self.deaths))

    def wait(self, seconds: float) -> bool:
        """Wait the back-off; False when the host shut down meanwhile."""
        return not self.stopping.wait(seconds)

    def watch(
        self,
        proc: subprocess.Popen[bytes],
        exited: Callable[[subprocess.Popen[bytes]], None],
        name: str,
    ) -> None:
        """Call ``exited(proc)`` from a thread of its own once ``proc`` exits (whoever ended it:
        ``exited`` tells a death from a stop)."""

        def wait() -> None:
            proc.wait()
            if not self.stopping.is_set():
                try:
                    exited(proc)
                except Exception:  # the next call meets the dead worker and says it
                    log.exception("replacing the route worker %s failed", name)

        threading.Thread(target=wait, daemon=True, name=f"route-{name}-watch").start()
