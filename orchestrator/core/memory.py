"""Measuring memory (evidence M): a process's RSS growth and peak, and Ray's own share.

What is measured, exactly:

* :class:`RssMeter` samples the resident set size (RSS, psutil) of one
  process — optionally with its child processes — every ``interval_s`` in a
  daemon thread, and on demand. ``growth`` and ``peak_growth`` are relative to
  the RSS when the meter was started. RSS counts shared library pages mapped
  by the process, so the first stage to import torch in a process is charged
  for torch: that memory exists because the stage runs there.
* :func:`tree_memory` sums the proportional set size (PSS: shared pages split
  between the processes that map them) over a set of processes, so that a
  cluster of workers that all map the same libraries is not counted N times.
  It falls back to RSS where PSS is unavailable (non-Linux).

Nothing here imports Ray, torch or vLLM.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import NotRequired, TypedDict

import psutil

SAMPLE_INTERVAL_S = 0.01
"""10 ms: engine start and a session open take seconds, so a 10 ms sampler sees
their peak; one sample is a /proc read of tens of microseconds."""


class NodeRayMemory(TypedDict):
    """Ray's own memory on one node of a cluster, measured there (``cluster_probe``): the
    summed PSS of its Ray session's processes, how many and which, and how it was measured."""

    bytes: int
    processes: int
    names: list[str]
    session_dir: str
    measure: str


class RayMemory(TypedDict, total=False):
    """Ray's own memory as the runtime measured it before any stage loaded (evidence M;
    ``runtime.cluster.ray_memory``): the bytes, the processes counted, how, which cluster;
    on a cluster, each node's own (``nodes``). Empty until it is measured."""

    bytes: int
    processes: int
    measure: str
    cluster: str
    nodes: NotRequired[dict[str, NodeRayMemory]]


def rss_of(pid: int, *, children: bool = False) -> int:
    """RSS of ``pid`` (and its live descendants when ``children``), in bytes."""
    try:
        proc = psutil.Process(pid)
        total = proc.memory_info().rss
        if children:
            for child in proc.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
        return int(total)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0


def tree_memory(pids: Iterable[int]) -> tuple[int, str]:
    """Summed PSS (or RSS where PSS is unavailable) of ``pids``; returns (bytes, 'pss'|'rss')."""
    total, kind = 0, "pss"
    for pid in set(pids):
        try:
            proc = psutil.Process(pid)
            try:
                total += int(proc.memory_full_info().pss)
            except (AttributeError, psutil.AccessDenied):
                total += int(proc.memory_info().rss)
                kind = "rss"
        except psutil.NoSuchProcess:
            continue
    return total, kind


def descendants(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


class RssMeter:
    """RSS growth of one or more processes (with their children when asked)
    above a baseline, with its peak.

    ``start()`` takes the baseline and starts sampling; ``stop()`` ends the
    sampling thread (``sample()`` still works). ``rebase()`` starts a new
    window: the peak is reset to the current value (used to measure one
    busy period on its own).
    """

    def __init__(
        self,
        pid: int | Iterable[int] | None = None,
        *,
        children: bool = False,
        interval_s: float = SAMPLE_INTERVAL_S,
    ) -> None:
        if pid is None:
            self.pids: tuple[int, ...] = (psutil.Process().pid,)
        elif isinstance(pid, int):
            self.pids = (pid,)
        else:
            self.pids = tuple(pid)
        self.children = children
        self.interval_s = interval_s
        self.baseline = 0
        self.peak = 0
        self.window_start = 0
        self.window_peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def current(self) -> int:
        return sum(rss_of(p, children=self.children) for p in self.pids)

    def sample(self) -> int:
        value = self.current()
        with self._lock:
            self.peak = max(self.peak, value)
            self.window_peak = max(self.window_peak, value)
        return value

    def start(self, *, sampling: bool = True) -> RssMeter:
        value = self.current()
        self.baseline = self.peak = self.window_start = self.window_peak = value
        if sampling:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="rss-meter", daemon=True)
            self._thread.start()
        return self

    def rebase(self) -> int:
        value = self.current()
        with self._lock:
            self.window_start = self.window_peak = value
        return value

    def resume(self) -> None:
        """Sample in the background again (after ``stop``), keeping the figures."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="rss-meter", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None
        self.sample()

    @property
    def growth(self) -> int:
        """Current RSS above the baseline (bytes, never negative)."""
        return max(0, self.current() - self.baseline)

    @property
    def peak_growth(self) -> int:
        return max(0, self.peak - self.baseline)

    @property
    def window_growth(self) -> int:
        """Peak above the start of the current window."""
        return max(0, self.window_peak - self.window_start)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()


def reset_peak_rss(pid: int) -> bool:
    """Reset ``pid``'s peak resident set (Linux: ``/proc/PID/clear_refs`` ← ``5``), so that
    :func:`peak_rss_of` reads the peak since now; False where it cannot (not Linux, not ours)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_of(pid: int) -> int | None:
    """``pid``'s peak resident set since it started or since :func:`reset_peak_rss` (Linux's
    ``VmHWM``), in bytes; None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
