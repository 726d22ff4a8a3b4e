"""What ``omni-edge serve`` measures: Prometheus metrics, the last requests, peaks.

:class:`ServerMetrics` belongs to one app (its own ``CollectorRegistry``, so two
apps in one process never share a series). The app feeds it:

* every request's events through a :class:`Trace` (``trace.see(event)``, then
  ``metrics.finish(trace, code)``): per-stage time to first output and to done,
  time to first token and to first audio, tokens per second of each decode stage;
* every refused request (``metrics.refused(endpoint, status)``).

At scrape time (``await metrics.render()``) it reads what changes without a
request: requests in flight and waiting (the runtime's admission), bytes held
per pool (the ledger actor, asked in a worker thread, never on the event loop),
and each stage's measured peak (cached; ``runtime.measure()`` runs in a worker
thread after requests, one refresh at a time). Metric names are listed in
docs/serving.md.

Drift (docs/calibration.md): after each measurement, a stage whose measured peak
is above its budget (a judged measurement, not an upper bound) sets
``omni_edge_stage_over_budget`` and counts once in
``omni_edge_stage_budget_overruns_total``; ``omni_edge_stage_budget_over_measured``
is the ratio. With a ``recorder`` (the pipeline's ``record_calibration``), the
peaks are written to the measurement store at most every ``RECORD_EVERY_S``
while serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter as Counter_
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric

from orchestrator.calibration_record import ServerMemory
from orchestrator.core.documents import JsonObject
from orchestrator.core.ledger import MeasuredPeak
from orchestrator.runtime.events import AudioChunk, Event, StageEvent, TextDelta
from orchestrator.runtime.ledger_actor import ActorSnapshot
from orchestrator.runtime.runtime import Runtime

log = logging.getLogger(__name__)

MEASURE_EVERY_S = 2.0
"""Peaks are re-measured after requests at most this often (each is an actor call per stage)."""
RECORD_EVERY_S = 300.0
"""While serving, measured peaks go to the measurement store at most this often (and at close)."""
RECENT = 20
"""Requests kept for ``/v1/status``'s ``recent``."""
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
PREFIX = "omni_edge_"


class StageTrace(TypedDict):
    """One stage of a traced request: when its first output came and when it was done (seconds
    since the request was submitted), and its figures once done."""

    time_to_first_output_s: float | None
    done_s: float | None
    stats: NotRequired[dict[str, object]]
    restarted: NotRequired[object]
    """Set when a restarted (or moved) stage served it: what ``Supervisor.served_by`` said."""


def _count(value: object) -> int:
    return int(value) if isinstance(value, int | float) else 0


@dataclass
class Trace:
    """One request's timings, as its events arrive (seconds since it was submitted)."""

    request_id: str
    endpoint: str
    started: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    first_audio: float | None = None
    stages: dict[str, StageTrace] = field(default_factory=dict)

    def see(self, event: Event) -> None:
        if isinstance(event, TextDelta) and self.first_token is None:
            self.first_token = event.t
        elif isinstance(event, AudioChunk) and self.first_audio is None:
            self.first_audio = event.t
        elif isinstance(event, StageEvent):
            entry = self.stages.setdefault(
                event.stage, StageTrace(time_to_first_output_s=None, done_s=None)
            )
            if event.kind == "first_output":
                entry["time_to_first_output_s"] = round(event.t, 4)
            else:
                entry["done_s"] = round(event.t, 4)
                entry["stats"] = event.stats
                restarted = (event.stats or {}).get("restarted")
                if restarted:  # served by a restarted (or moved) stage
                    entry["restarted"] = restarted

    def usage(self) -> dict[str, int] | None:
        """OpenAI's ``usage`` from the decode stages' figures, when a stage counted tokens."""
        counted = [
            s["stats"] for s in self.stages.values() if "prompt_tokens" in s.get("stats", {})
        ]
        if not counted:
            return None
        prompt = sum(_count(s.get("prompt_tokens")) for s in counted)
        completion = sum(_count(s.get("tokens")) for s in counted)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def summary(self, total_s: float) -> JsonObject:
        return {
            "request_id": self.request_id,
            "endpoint": self.endpoint,
            "time_to_first_token_s": _r(self.first_token),
            "time_to_first_audio_s": _r(self.first_audio),
            "total_s": _r(total_s),
            "stages": {
                name: {k: v for k, v in s.items() if k != "stats"}
                for name, s in self.stages.items()
            },
        }


class ServerMetrics:
    """The app's metrics and recent requests (see the module docstring)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.registry = CollectorRegistry()
        self.recent: deque[JsonObject] = deque(maxlen=RECENT)
        self.measured: dict[str, MeasuredPeak] = {}
        self._measuring: asyncio.Task[None] | None = None
        self._measured_at = 0.0
        self.recorder: Callable[[], Any] | None = None
        """Writes the measured peaks to the measurement store (``Pipeline.record_calibration``)."""
        self._recorded_at = time.monotonic()
        self.server_memory: Callable[[], ServerMemory | None] | None = None
        """The serve process's own memory and its reservation (``Pipeline.server_memory``)."""
        self._over: set[str] = set()
        # Declared in this order, which is the order of the exposition.
        self._declare_request_metrics()
        self._declare_admission_metrics()
        self._declare_memory_metrics()
        self._declare_drift_metrics()
        self._declare_server_metrics()
        self._declare_realtime_metrics()
        self.ledger_up = Gauge(
            f"{PREFIX}ledger_up",
            "1 when the ledger actor answered the last scrape",
            registry=self.registry,
        )
        self._seed_from_plan()
        self.registry.register(_Restarts(runtime))

    def _declare_request_metrics(self) -> None:
        """Per request, fed by :meth:`finish`: counts, latencies, decode rates."""
        r, b = self.registry, LATENCY_BUCKETS
        self.requests = Counter(
            f"{PREFIX}requests",
            "Requests answered, by endpoint and HTTP status",
            ["endpoint", "code"],
            registry=r,
        )
        self.refused_total = Counter(
            f"{PREFIX}requests_refused",
            "Requests refused (400, 429, 503), by status",
            ["code"],
            registry=r,
        )
        self.request_s = Histogram(
            f"{PREFIX}request_seconds", "Request duration", ["endpoint"], buckets=b, registry=r
        )
        self.ttft = Histogram(
            f"{PREFIX}time_to_first_token_seconds",
            "Submission to the first text delta",
            buckets=b,
            registry=r,
        )
        self.ttfa = Histogram(
            f"{PREFIX}time_to_first_audio_seconds",
            "Submission to the first audio chunk",
            buckets=b,
            registry=r,
        )
        self.stage_first = Histogram(
            f"{PREFIX}stage_first_output_seconds",
            "Submission to a stage's first output",
            ["stage"],
            buckets=b,
            registry=r,
        )
        self.stage_done = Histogram(
            f"{PREFIX}stage_done_seconds",
            "Submission to a stage's end",
            ["stage"],
            buckets=b,
            registry=r,
        )
        self.tokens_per_s = Gauge(
            f"{PREFIX}decode_tokens_per_second",
            "Decode rate of a stage's last request",
            ["stage"],
            registry=r,
        )
        self.tokens = Counter(
            f"{PREFIX}generated_tokens", "Tokens generated", ["stage"], registry=r
        )

    def _declare_admission_metrics(self) -> None:
        """The runtime's admission, read at scrape time: slots held, waiting, the limit."""
        r = self.registry
        self.in_flight = Gauge(f"{PREFIX}requests_in_flight", "Requests holding a slot", registry=r)
        self.waiting = Gauge(f"{PREFIX}requests_waiting", "Requests waiting for a slot", registry=r)
        self.in_flight_limit = Gauge(f"{PREFIX}requests_in_flight_limit", "Slots", registry=r)

    def _declare_memory_metrics(self) -> None:
        """Bytes per pool and per stage (held, capacity, planned, measured), and stage liveness."""
        r = self.registry
        self.pool_held = Gauge(
            f"{PREFIX}ledger_held_bytes", "Bytes the ledger holds in a pool", ["pool"], registry=r
        )
        self.pool_capacity = Gauge(
            f"{PREFIX}pool_capacity_bytes", "A pool's capacity", ["pool"], registry=r
        )
        self.pool_budget = Gauge(
            f"{PREFIX}pool_budget_bytes", "A pool's planned peak", ["pool"], registry=r
        )
        self.stage_peak = Gauge(
            f"{PREFIX}stage_measured_peak_bytes",
            "A stage's measured peak",
            ["stage", "pool"],
            registry=r,
        )
        self.stage_budget = Gauge(
            f"{PREFIX}stage_budget_bytes", "A stage's planned peak", ["stage", "pool"], registry=r
        )
        self.stage_alive = Gauge(
            f"{PREFIX}stage_alive",
            "1 when a stage's device actor is alive (one of its replicas')",
            ["stage", "device"],
            registry=r,
        )
        self.replica_alive = Gauge(
            f"{PREFIX}replica_alive",
            "1 when the device actor of a stage's replica is alive (stages with replicas: N > 1)",
            ["stage", "replica", "device"],
            registry=r,
        )

    def _declare_drift_metrics(self) -> None:
        """Drift (docs/calibration.md): measured peaks judged against the budgets."""
        r = self.registry
        self.over_budget = Gauge(
            f"{PREFIX}stage_over_budget",
            "1 when a stage's measured peak is above its (calibrated) budget",
            ["stage"],
            registry=r,
        )
        self.overruns = Counter(
            f"{PREFIX}stage_budget_overruns",
            "Times a stage's measured peak went above its budget",
            ["stage"],
            registry=r,
        )
        self.ratio = Gauge(
            f"{PREFIX}stage_budget_over_measured",
            "A stage's budget over its measured peak",
            ["stage"],
            registry=r,
        )
        self.calibrated = Gauge(
            f"{PREFIX}stage_calibrated",
            "1 when a stage's budget came from measured peaks",
            ["stage"],
            registry=r,
        )
        self.recordings = Counter(
            f"{PREFIX}calibration_recordings",
            "Times the measured peaks were written to the measurement store",
            registry=r,
        )

    def _declare_server_metrics(self) -> None:
        """The serve process's own memory beside its reservation in the plan."""
        r = self.registry
        self.server_bytes = Gauge(
            f"{PREFIX}server_memory_bytes",
            "The serve process's own memory (PSS, else RSS)",
            registry=r,
        )
        self.server_budget = Gauge(
            f"{PREFIX}server_budget_bytes",
            "The serve process's shared reservation in the plan",
            ["evidence"],
            registry=r,
        )

    def _declare_realtime_metrics(self) -> None:
        """The realtime endpoint's turns: early replies and voice-to-voice latency."""
        r, b = self.registry, LATENCY_BUCKETS
        self.early_responses = Counter(
            f"{PREFIX}realtime_early_responses",
            "Realtime replies started in a pause before it closed the turn, by outcome: adopted (the pause was "
            "the turn's end), dropped (speech went on, or the turn ended otherwise), failed (e.g. no free slot)",
            ["outcome"],
            registry=r,
        )
        self.voice_to_voice = Histogram(
            f"{PREFIX}realtime_voice_to_voice_seconds",
            "Realtime: the end of the user's speech to the reply's first audio sent",
            buckets=b,
            registry=r,
        )

    def _seed_from_plan(self) -> None:
        """Set what the plan fixes: the slot limit, each stage's budget and calibration."""
        self.in_flight_limit.set(self.runtime.admission.limit)
        for s in self.runtime.stages:
            self.stage_budget.labels(s.name, s.pool or "?").set(s.budget_bytes())
            self.calibrated.labels(s.name).set(int(s.calibration is not None))
            self.over_budget.labels(s.name).set(0)

    # -- fed by the app ------------------------------------------------------------
    def refused(self, endpoint: str, status: int) -> None:
        self.refused_total.labels(str(status)).inc()
        self.requests.labels(endpoint, str(status)).inc()

    def finish(self, trace: Trace, status: int = 200) -> None:
        """Record a request that ran (completed, failed or cancelled)."""
        total = time.perf_counter() - trace.started
        self.requests.labels(trace.endpoint, str(status)).inc()
        self.request_s.labels(trace.endpoint).observe(total)
        if trace.first_token is not None:
            self.ttft.observe(trace.first_token)
        if trace.first_audio is not None:
            self.ttfa.observe(trace.first_audio)
        for name, s in trace.stages.items():
            if s["time_to_first_output_s"] is not None:
                self.stage_first.labels(name).observe(s["time_to_first_output_s"])
            if s["done_s"] is not None:
                self.stage_done.labels(name).observe(s["done_s"])
            stats = s.get("stats") or {}
            rate = stats.get("decode_tokens_per_s")
            if isinstance(rate, int | float) and rate:
                self.tokens_per_s.labels(name).set(rate)
            if _count(stats.get("tokens")):
                self.tokens.labels(name).inc(_count(stats.get("tokens")))
        self.recent.append(trace.summary(total))
        self.refresh_measured()

    # -- read at scrape time -------------------------------------------------------
    def refresh_measured(self, *, now: bool = False) -> None:
        """Re-measure every stage's peak in a worker thread, unless a refresh is running
        or (without ``now``) one ran less than ``MEASURE_EVERY_S`` ago."""
        if self._measuring is not None and not self._measuring.done():
            return
        if not now and time.monotonic() - self._measured_at < MEASURE_EVERY_S:
            return
        self._measured_at = time.monotonic()
        with contextlib.suppress(RuntimeError):  # no running loop: nothing to schedule on
            self._measuring = asyncio.get_running_loop().create_task(self._measure())

    async def _measure(self) -> None:
        if self.runtime._closed:
            return
        try:
            self.measured = await asyncio.to_thread(self.runtime.measure)
        except Exception as exc:  # a peak is a figure, not a reason to fail a request
            log.warning("measuring the stages failed: %s", exc)
            return
        self.judge(self.measured)
        if self.recorder is not None and time.monotonic() - self._recorded_at >= RECORD_EVERY_S:
            self._recorded_at = time.monotonic()
            try:
                await asyncio.to_thread(self.recorder)
                self.recordings.inc()
            except Exception as exc:  # the next plan loses a sample; the server goes on
                log.warning("recording the measured peaks failed: %s", exc)

    def judge(self, measured: dict[str, MeasuredPeak]) -> None:
        """Drift: flag each stage measured above its budget (upper bounds are not judged)."""
        for name, m in measured.items():
            peak, budget = m.get("measured_peak_bytes"), m.get("budget_bytes")
            if peak and budget:
                self.ratio.labels(name).set(round(budget / peak, 4))
            over = m.get("within_budget") is False
            self.over_budget.labels(name).set(int(over))
            if over and name not in self._over:
                self.overruns.labels(name).inc()
                log.warning(
                    "stage %s measured %s bytes, above its budget of %s bytes", name, peak, budget
                )
            if over:
                self._over.add(name)
            else:
                self._over.discard(name)

    async def measured_now(self) -> dict[str, MeasuredPeak]:
        """The cached peaks, measured first when nothing has been yet."""
        if not self.measured:
            self.refresh_measured(now=True)
            if self._measuring is not None:
                await asyncio.shield(self._measuring)
        return self.measured

    async def ledger(self) -> ActorSnapshot | None:
        """The ledger's snapshot (asked off the event loop); None when it cannot answer."""
        try:
            return await asyncio.to_thread(self.runtime.ledger_snapshot)
        except Exception as exc:
            log.warning("the ledger did not answer: %s", exc)
            return None

    async def render(self) -> bytes:
        """The Prometheus text exposition, with the gauges read now (the actors asked how their
        stages are, so a route worker's restart is counted)."""
        if not self.runtime._closed:
            with contextlib.suppress(Exception):  # a figure, never a reason to fail a scrape
                await self.runtime.stage_failures(2.0)
        admission = self.runtime.admission
        self.in_flight.set(admission.in_flight)
        self.waiting.set(admission.waiting)
        for s in self.runtime.stages:
            refs = self.runtime.replicas[s.name]
            alive = {r.holder: _alive(self.runtime.devices.get(r.key)) for r in refs}
            self.stage_alive.labels(s.name, s.device or "?").set(int(any(alive.values())))
            for r in refs if len(refs) > 1 else ():
                self.replica_alive.labels(s.name, str(r.index + 1), r.device).set(
                    int(alive[r.holder])
                )
        snapshot = await self.ledger()
        self.ledger_up.set(int(snapshot is not None))
        for row in (snapshot or {}).get("pools", []):
            self.pool_held.labels(row["id"]).set(row["held_bytes"])
            self.pool_capacity.labels(row["id"]).set(row["capacity_bytes"])
        for p in self.runtime.plan.pools:
            self.pool_budget.labels(p.id).set(p.peak_bytes)
        for holder, m in (await self.measured_now()).items():
            if m.get("measured_peak_bytes") is not None:
                view = self.runtime.views[holder]
                self.stage_peak.labels(holder, view.pool or "?").set(m["measured_peak_bytes"])
        server = (
            await asyncio.to_thread(self.server_memory) if self.server_memory is not None else None
        )
        if server is not None:
            self.server_bytes.set(server["measured_bytes"])
            self.server_budget.labels(server["evidence"]).set(server["budget_bytes"])
        return generate_latest(self.registry)


class _Restarts:
    """Read from the runtime's supervisor at scrape time (``runtime.supervisor``):
    ``stage_restarts_total{stage,cause}`` — each restart of a stage's device actor
    (``device_actor_died``) or route worker (``route_worker_died``) — and
    ``stage_moves_total{stage,from_device,to_device}`` — each move to a fallback device."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self) -> list[Metric]:
        supervisor = getattr(self.runtime, "supervisor", None)
        restarts = CounterMetricFamily(
            f"{PREFIX}stage_restarts",
            "Restarts of a stage's device actor or route worker after it died, by cause",
            labels=["stage", "cause"],
        )
        moves = CounterMetricFamily(
            f"{PREFIX}stage_moves",
            "Stages moved to the next device of their list (on_device_loss: fallback)",
            labels=["stage", "from_device", "to_device"],
        )
        if supervisor is not None:
            for (stage, cause), n in sorted(dict(supervisor.counts).items()):
                restarts.add_metric([stage, cause], n)
            moved = Counter_((m["stage"], m["from"], m["to"]) for m in list(supervisor.moves))
            for labels, n in sorted(moved.items()):
                moves.add_metric(list(labels), n)
        return [restarts, moves]


def _alive(dev: Any) -> bool:
    return dev is not None and not dev.dead


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)
