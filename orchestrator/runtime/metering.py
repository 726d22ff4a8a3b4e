"""How much memory a stage on a device actor holds: measured at load and while it serves.

A stage is measured one of two ways (docs/calibration.md):

* a runner that measures itself (``StageRunner.measured_peak_bytes``: vLLM, llama.cpp)
  reports its own figure;
* any other is measured from outside: the RSS of the actor's process tree sampled during its
  load (:class:`LoadMeter`), then, while it has requests in flight, the processes its load
  started (a route worker, followed through a recycle: :class:`RunnerMeter`) or else the
  actor's own process.

A load that overlapped another in the same actor is measured over the processes that are its
own alone; where that cannot be told apart (both grew this process), the figure is an upper
bound: it says so, is not judged against the budget and never calibrates a plan
(:func:`upper_bound`). :func:`measure` is what the actor reports to the ledger.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NotRequired, TypedDict

from orchestrator.core.ledger import MeasuredPeak
from orchestrator.core.memory import RssMeter, descendants, rss_of
from orchestrator.core.plan import StagePlan

if TYPE_CHECKING:
    from stages.base import StageRunner

log = logging.getLogger(__name__)


@dataclass
class Hosted:
    plan: StagePlan
    runner: StageRunner
    load_s: float
    load_info: dict[str, object]
    tree_load_peak: int
    tree_resident: int
    request_meter: RssMeter | None = None
    """For runners that do not measure themselves: the processes the load started
    (a route worker), else this actor's process, sampled while requests run."""
    tree_request_growth: int = 0
    load_note: str = ""
    """Set when the load overlapped another in this actor: how it was measured then."""
    overlapped_with: set[str] = field(default_factory=set)
    """The stages whose loads ran in this actor while this one loaded."""
    holder: str = ""
    """Its ledger holder: the stage's name, or ``voice#1`` for a replica of a stage with
    ``replicas: N`` > 1 (each replica runs in its own actor, so the stage's name is unique here)."""
    in_process: bool = True
    """Whether the load grew this actor's own process (False: it ran in processes it started)."""
    busy: int = 0
    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    measured: MeasuredPeak | None = None


class Verdict(TypedDict):
    """A measured peak judged against its budget: within it or not, or not judged (null) and why."""

    within_budget: bool | None
    within_budget_reason: NotRequired[str]


def upper_bound(h: Hosted, stages: Mapping[str, Hosted]) -> str | None:
    """Why ``h``'s figure is only an upper bound, or None: its load grew this process while
    another load that also grew this process ran beside it (a load measured over the
    processes it started, or beside loads that ran in theirs, is its own)."""
    if not h.in_process or not h.overlapped_with:
        return None
    in_process = [o for o in sorted(h.overlapped_with) if o not in stages or stages[o].in_process]
    if not in_process:
        return None
    return (
        f"{', '.join(in_process)} loaded in this process at the same time and is counted too: "
        "an upper bound"
    )


def measure(h: Hosted, stages: Mapping[str, Hosted], device: str) -> MeasuredPeak:
    """The stage's measured peak now, next to its budget: the runner's own figure when it
    measures itself, else the RSS growth of the actor's process tree (the load's peak, the
    resident after it, and the highest rise while it had requests in flight)."""
    own = h.runner.measured_peak_bytes()
    load: int | None
    steady: int | None
    if own is not None:
        peak, method = int(own), f"{type(h.runner).__name__}.measured_peak_bytes()"
        lp, rg = (
            h.load_info.get("load_peak_growth_bytes"),
            h.load_info.get("resident_growth_bytes"),
        )
        load = min(int(lp), peak) if isinstance(lp, int) else None
        steady = peak if load is not None and peak > load else None
        resident = min(int(rg), peak) if isinstance(rg, int) else None
    else:
        growth = h.tree_request_growth
        if h.busy and h.request_meter is not None:
            growth = max(growth, h.request_meter.window_growth)
        if not h.in_process and h.request_meter is not None:
            # processes of its own (a route worker): all they hold is this stage's, so their
            # highest RSS since the load counts, memory kept between requests included
            growth = max(growth, h.request_meter.peak_growth)
        load, steady = h.tree_load_peak, h.tree_resident + growth
        peak = max(load, steady)
        resident = min(h.tree_resident, peak)
        method = (
            "RSS growth of the device actor's process tree: max(peak during load, resident after "
            "load + the highest RSS above it while this stage had requests in flight, sampled every "
            "10 ms in the processes its load started (memory they kept between requests counts), "
            "else the largest rise of one busy period in the actor's own process)"
        )
    bound = upper_bound(h, stages)
    for note in (h.load_note, bound):
        if note:
            method += f"; {note}"
    budget = h.plan.budget_bytes()
    verdict: Verdict = {"within_budget": peak <= budget}
    if bound and peak > budget:
        # not this stage's peak: another load in this process is in the figure (a bound
        # within the budget still shows the stage within it)
        verdict = {"within_budget": None, "within_budget_reason": f"not judged: {bound}"}
    return {
        "measured_peak_bytes": peak,
        "load_peak_bytes": load,
        "steady_peak_bytes": steady,
        "resident_bytes": resident,
        "upper_bound": bound is not None,
        "budget_bytes": budget,
        "budget_over_measured": round(budget / peak, 3) if peak else None,
        **verdict,
        "evidence": "M",
        "method": method,
        "where": f"{socket.gethostname()}:{device} pid {os.getpid()}",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "requests": h.requests,
        "max_in_flight": h.max_in_flight,
        # a worker the runtime recycles at a limit: what calibration budgets it from
        "worker": worker_stats(h.runner),
    }


class LoadMeter(RssMeter):
    """RSS of this process and its descendants (``RssMeter(children=True)``) and,
    from the same samples, of the processes started since ``before`` was taken
    (``new_now``, ``new_peak``, and each one's peak, ``pid_peak``) and of this
    process alone (``root_growth``, ``root_peak_growth``): what one load's route
    worker holds while another load grows the actor's own process, and what an
    in-process load grew while other loads started workers."""

    def __init__(self, before: set[int]) -> None:
        super().__init__(children=True)
        self.before = before
        self.new_now = self.new_peak = 0
        self.pid_peak: dict[int, int] = {}
        self.root_base: int | None = None
        self.root_now = self.root_peak = 0

    def current(self) -> int:
        root = self.pids[0]
        children = [(p, rss_of(p)) for p in descendants(root)]
        new = [(p, rss) for p, rss in children if p not in self.before]
        self.new_now = sum(rss for _, rss in new)
        self.new_peak = max(self.new_peak, self.new_now)
        for p, rss in new:
            self.pid_peak[p] = max(self.pid_peak.get(p, 0), rss)
        self.root_now = rss_of(root)
        if self.root_base is None:
            self.root_base = self.root_now
        self.root_peak = max(self.root_peak, self.root_now)
        return self.root_now + sum(rss for _, rss in children)

    @property
    def root_growth(self) -> int:
        return max(0, self.root_now - (self.root_base or 0))

    @property
    def root_peak_growth(self) -> int:
        return max(0, self.root_peak - (self.root_base or 0))


class RunnerMeter(RssMeter):
    """``RssMeter`` over the processes the runner says are its own, asked again at
    each sample: a runner that replaces its route worker (a recycle,
    ``WorkerSessions.recycle_limit``) is followed to the new one."""

    def __init__(self, pids: list[int], runner: StageRunner) -> None:
        super().__init__(pids)
        self.runner = runner

    def current(self) -> int:
        ids = runner_processes(self.runner)
        if ids:
            self.pids = tuple(ids)
        return super().current()


def runner_processes(runner: StageRunner) -> list[int] | None:
    """The processes a runner's work runs in, when it says (``StageRunner.process_ids``: an ONNX
    Runtime route worker and its children; ``[]`` in this process); None when unknown."""
    ids = runner.process_ids()
    return None if ids is None else [int(p) for p in ids]


def meter_requests(hosted: Hosted, meter: LoadMeter, before: set[int], overlapped: bool) -> None:
    """For a runner that does not measure itself: the meter its requests are sampled with (the
    processes its load started, else this actor's process), and, when its load overlapped
    another in this actor, its load figures from the processes that are its own alone."""
    runner = hosted.runner
    known = runner_processes(runner)
    own = [p for p in descendants(os.getpid()) if p not in before] if known is None else known
    hosted.in_process = not own
    request_meter = (
        RunnerMeter(own, runner) if known else RssMeter(own or os.getpid(), children=False)
    )
    hosted.request_meter = request_meter.start(sampling=False)
    if known and overlapped:
        # the processes the runner says are its own (its route worker): their whole RSS,
        # never another load's worker started meanwhile
        hosted.tree_load_peak = sum(meter.pid_peak.get(p, 0) for p in own)
        hosted.tree_resident = sum(rss_of(p) for p in own)
        hosted.tree_load_peak = max(hosted.tree_load_peak, hosted.tree_resident)
        hosted.load_note = (
            "another stage loaded in this actor at the same time: the load is measured "
            "over the processes the runner started"
        )
    elif overlapped and own:
        hosted.tree_load_peak, hosted.tree_resident = meter.new_peak, meter.new_now
        hosted.load_note = (
            "another stage loaded in this actor at the same time: the load is measured "
            "over the processes started during it"
        )
    elif overlapped:
        # in this process: its growth only, not the workers other loads started meanwhile
        hosted.tree_load_peak, hosted.tree_resident = (
            meter.root_peak_growth,
            meter.root_growth,
        )


def begin_request(h: Hosted) -> None:
    """Count a request in on ``h``; the first of a busy period starts sampling its memory."""
    h.requests += 1
    h.in_flight += 1
    h.max_in_flight = max(h.max_in_flight, h.in_flight)
    if h.request_meter is not None:
        if h.busy == 0:
            h.request_meter.rebase()
            h.request_meter.resume()
        h.busy += 1


def end_request(h: Hosted) -> None:
    """A request's stream on ``h`` is over: the last of a busy period stops sampling and keeps
    the period's rise as the stage's request figure."""
    if h.request_meter is not None:
        h.busy -= 1
        if h.busy == 0:
            h.request_meter.stop()
            h.tree_request_growth = max(h.tree_request_growth, h.request_meter.window_growth)


def summarize(info: Mapping[str, object]) -> dict[str, object]:
    """A runner's load_info, small enough for a run record: scalars kept, the EP
    node assignment reduced to nodes per EP, other large values to their size."""
    out: dict[str, object] = {}
    for key, value in info.items():
        if key == "assignment" and isinstance(value, list):
            out["nodes_per_ep"] = {
                a.get("ep", "?"): len(a.get("nodes", [])) for a in value if isinstance(a, dict)
            }
        elif isinstance(value, (str, int, float, bool)) or value is None:
            out[key] = value
        elif isinstance(value, (list, tuple)) and len(str(value)) <= 400:
            out[key] = list(value)
        elif isinstance(value, dict) and len(str(value)) <= 400:
            out[key] = value
        else:
            out[key] = (
                f"<{type(value).__name__} of {len(value) if hasattr(value, '__len__') else '?'}>"
            )
    return out


def worker_stats(runner: StageRunner) -> dict[str, int] | None:
    """The runner's ``worker_stats()`` (a recycled route worker's figures), or None."""
    try:
        return runner.worker_stats()
    except Exception:  # a figure that cannot be read is no figure, never a failed measure
        log.debug("worker_stats() raised", exc_info=True)
        return None
