"""Drift on the server's /metrics (orchestrator/server/metrics.py), with a stub runtime:
a stage measured above its budget is flagged and counted once per excursion, an upper
bound is not judged, and the recorder writes the measurement store while serving."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import generate_latest

from orchestrator.core.ledger import Reservation
from orchestrator.core.plan import StagePlan
from orchestrator.runtime.runtime import replica_refs
from orchestrator.server import metrics as server_metrics
from orchestrator.server.metrics import ServerMetrics

MiB = 2**20


def stage(name: str, calibrated: bool) -> StagePlan:
    return StagePlan(
        name=name,
        kind="echo",
        admitted=True,
        device="cpu",
        backend="ort-cpu",
        route="this-process",
        reservations=(Reservation("host_ram", "weights", 100 * MiB, "session", "D"),),
        refusals=(),
        engine_kwargs={},
        artifact={},
        calibration={"match": "exact"} if calibrated else None,
    )


class StubRuntime:
    def __init__(self) -> None:
        self.stages = [stage("thinker", True), stage("vad", False)]
        self.replicas = replica_refs(self.stages)  # one instance per stage
        self.admission = SimpleNamespace(limit=4, in_flight=0, waiting=0)
        self.plan = SimpleNamespace(
            pools=[], stage=lambda n: next(s for s in self.stages if s.name == n)
        )
        self.devices: dict[str, Any] = {}
        self._closed = False
        self.figures: dict[str, dict[str, Any]] = {}

    def measure(self) -> dict[str, dict[str, Any]]:
        return self.figures


def value(metrics: ServerMetrics, line_start: str) -> float:
    text = generate_latest(metrics.registry).decode()
    return float(
        next(line.split()[-1] for line in text.splitlines() if line.startswith(line_start))
    )


def test_drift_is_flagged_and_counted_once_per_excursion_and_upper_bounds_are_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rt = StubRuntime()
    metrics = ServerMetrics(rt)  # type: ignore[arg-type]
    recorded: list[int] = []
    metrics.recorder = lambda: recorded.append(1)
    over = {"measured_peak_bytes": 120 * MiB, "budget_bytes": 100 * MiB, "within_budget": False}
    bound = {
        "measured_peak_bytes": 231 * MiB,
        "budget_bytes": 98 * MiB,
        "within_budget": None,
        "upper_bound": True,
    }
    rt.figures = {"thinker": over, "vad": bound}
    asyncio.run(metrics._measure())
    asyncio.run(metrics._measure())  # still over: the same excursion
    assert value(metrics, 'omni_edge_stage_over_budget{stage="thinker"}') == 1
    assert value(metrics, 'omni_edge_stage_budget_overruns_total{stage="thinker"}') == 1
    assert (
        value(metrics, 'omni_edge_stage_over_budget{stage="vad"}') == 0
    )  # an upper bound: not judged
    assert value(metrics, 'omni_edge_stage_calibrated{stage="thinker"}') == 1
    assert value(metrics, 'omni_edge_stage_budget_over_measured{stage="thinker"}') == pytest.approx(
        100 / 120, 1e-3
    )
    assert not recorded  # not yet: at most every RECORD_EVERY_S
    monkeypatch.setattr(server_metrics, "RECORD_EVERY_S", 0.0)
    rt.figures = {"thinker": {**over, "measured_peak_bytes": 90 * MiB, "within_budget": True}}
    asyncio.run(metrics._measure())
    assert recorded == [1] and value(metrics, "omni_edge_calibration_recordings_total") == 1
    assert value(metrics, 'omni_edge_stage_over_budget{stage="thinker"}') == 0
    rt.figures = {"thinker": over}
    asyncio.run(metrics._measure())  # a second excursion
    assert value(metrics, 'omni_edge_stage_budget_overruns_total{stage="thinker"}') == 2
