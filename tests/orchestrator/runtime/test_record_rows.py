"""The run record's stage rows (orchestrator/runtime/record.py): what a route worker's recycling
and an upper-bound figure look like to a reader of the record. No Ray: the runtime's
plan, load results and per-request stats are given as data."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from orchestrator.core.ledger import Reservation
from orchestrator.core.plan import StagePlan
from orchestrator.core.units import MiB
from orchestrator.runtime.record import stage_rows


def _stage(name: str, budget: int) -> StagePlan:
    return StagePlan(
        name=name,
        kind="exported_graph",
        admitted=True,
        device="cpu",
        backend="ort-openvino",
        route="openvino-venv",
        reservations=(Reservation("host_ram", "weights", budget, "session", "D"),),
        refusals=(),
        engine_kwargs={},
        artifact={},
    )


def _rows(stats: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    runtime = SimpleNamespace(
        stages=[_stage("voice", 1000 * MiB)], load_results={"voice": {"load_s": 1.5}}
    )
    results = [SimpleNamespace(stages={"voice": stats})]
    return stage_rows(runtime, results, {"voice": measured})[0]


def test_a_route_workers_recycles_reach_the_record() -> None:
    row = _rows(
        {"worker_recycles": 2, "throughput": {"audio_s_per_s": 12.0}},
        {"measured_peak_bytes": 900 * MiB, "method": "route worker RSS"},
    )
    assert row["worker_recycles"] == 2
    assert row["within_budget"] is True and row["budget_over_measured"] == round(1000 / 900, 3)


def test_a_stage_without_a_worker_has_no_recycle_count() -> None:
    row = _rows({"throughput": None}, {"measured_peak_bytes": 900 * MiB})
    assert "worker_recycles" not in row


def test_an_upper_bound_within_the_budget_is_within_it() -> None:
    row = _rows({}, {"measured_peak_bytes": 900 * MiB, "upper_bound": True})
    assert row["within_budget"] is True and not row.get("within_budget_reason")


def test_an_upper_bound_above_the_budget_is_not_judged() -> None:
    row = _rows({}, {"measured_peak_bytes": 1200 * MiB, "upper_bound": True})
    assert row["within_budget"] is None and "upper bound" in row["within_budget_reason"]
    assert row["drift"] is None
