"""The serve process's own memory (the calibration work): only a served pipeline plans a
``server`` shared reservation — E from ``SERVER_BYTES`` until a server run measured it,
M after — and the server exposes what it holds now against it (/v1/plan's ``server``,
/metrics). ``plan`` and ``run`` plans (and their golden files) have none."""

from __future__ import annotations

import asyncio
import os
from types import MethodType, SimpleNamespace

import pytest
from prometheus_client import generate_latest

from orchestrator import calibration as cal
from orchestrator.api import Pipeline
from orchestrator.config import load_config
from orchestrator.core.profile import HardwareProfile, load_profile
from orchestrator.planner import SERVER_BYTES, plan_pipeline
from orchestrator.server.metrics import ServerMetrics
from tests.orchestrator.test_calibration_metrics import StubRuntime
from tests.orchestrator.test_calibration_profile import CONFIG, PROFILE

MiB = 2**20
SERVER_PEAK = 300 * MiB


@pytest.fixture
def profile() -> HardwareProfile:
    return load_profile(str(PROFILE))


def server_reservations(plan: object) -> list:
    return [r for r in plan.shared_reservations if r.purpose == "server"]  # type: ignore[attr-defined]


def test_only_a_served_plan_reserves_the_server_from_a_stated_figure(
    profile: HardwareProfile,
) -> None:
    config = load_config(str(CONFIG))
    assert server_reservations(plan_pipeline(config, profile)) == []  # plan/run: unchanged
    served = plan_pipeline(config, profile, server=True)
    (r,) = server_reservations(served)
    assert (r.pool, r.bytes, r.evidence, r.lifetime) == ("host_ram", SERVER_BYTES, "E", "session")
    assert "SERVER_BYTES" in r.note
    plain = plan_pipeline(config, profile)
    host = {p.id: p.peak_bytes for p in plain.pools}["host_ram"]
    assert {p.id: p.peak_bytes for p in served.pools}[
        "host_ram"
    ] >= host  # counted in the pool (when admitted)


def test_a_measured_server_is_planned_from_its_measurement(
    profile: HardwareProfile, tmp_path: object
) -> None:
    store = cal.CalibrationStore(tmp_path / "calibration")  # type: ignore[operator]
    store.record(
        cal.server_key(profile),
        cal.sample(
            run="served", peak=SERVER_PEAK, budget=SERVER_BYTES, calibrated=False, method="pss"
        ),
    )
    config = load_config(str(CONFIG))
    served = plan_pipeline(
        config, profile, calibration=cal.CalibrationStore(store.root), server=True
    )
    (r,) = server_reservations(served)
    assert (
        r.evidence == "M" and SERVER_PEAK < r.bytes < SERVER_BYTES
    )  # never below the measured peak
    assert "measured: largest 300.0 MiB of 1 run(s)" in r.note
    assert any("server (M)" in n for n in served.notes)
    # the plain plan reads the same store and still has no server reservation
    assert (
        server_reservations(
            plan_pipeline(config, profile, calibration=cal.CalibrationStore(store.root))
        )
        == []
    )


def test_server_memory_is_this_process_against_its_reservation(profile: HardwareProfile) -> None:
    served = plan_pipeline(load_config(str(CONFIG)), profile, server=True)
    m = Pipeline.server_memory(SimpleNamespace(plan=served))  # type: ignore[arg-type]
    assert m is not None and m["measured_bytes"] > 0 and f"pid {os.getpid()}" in m["measure"]
    assert (m["budget_bytes"], m["evidence"], m["pool"]) == (SERVER_BYTES, "E", "host_ram")
    assert (
        Pipeline.server_memory(
            SimpleNamespace(plan=plan_pipeline(load_config(str(CONFIG)), profile))
        )
        is None
    )  # type: ignore[arg-type]


def test_metrics_show_the_server_memory_and_its_budget() -> None:
    metrics = ServerMetrics(StubRuntime())  # type: ignore[arg-type]
    metrics.server_memory = lambda: {
        "measured_bytes": 123 * MiB,
        "budget_bytes": SERVER_BYTES,
        "evidence": "E",
    }
    metrics.runtime.ledger_snapshot = lambda: {"pools": []}  # type: ignore[method-assign]
    lines = dict(
        line.rsplit(" ", 1)
        for line in asyncio.run(metrics.render()).decode().splitlines()
        if not line.startswith("#")
    )
    assert float(lines["omni_edge_server_memory_bytes"]) == 123 * MiB
    assert float(lines['omni_edge_server_budget_bytes{evidence="E"}']) == SERVER_BYTES
    assert (
        "omni_edge_server_memory_bytes"
        in generate_latest(ServerMetrics(StubRuntime()).registry).decode()
    )  # type: ignore[arg-type]


def test_recording_writes_the_server_entry_that_the_next_served_plan_reads(
    profile: HardwareProfile, tmp_path: object
) -> None:
    store = cal.CalibrationStore(tmp_path / "calibration")  # type: ignore[operator]
    served = plan_pipeline(load_config(str(CONFIG)), profile, server=True)
    runtime = SimpleNamespace(
        _closed=False,
        load_results={"thinker": {}},
        stages=[],
        views={},  # no stage measured: only the server's row
        measure=dict,
        ray_memory={},
        cluster=None,
    )
    pipeline = SimpleNamespace(
        calibration=store,
        profile=profile,
        plan=served,
        runtime=runtime,
        results=[],
        run_id="served-1",
    )
    pipeline.server_memory = MethodType(Pipeline.server_memory, pipeline)
    (row,) = Pipeline.record_calibration(pipeline)  # type: ignore[arg-type]
    assert (
        row["stage"] == "(server)" and row["budget_bytes"] == SERVER_BYTES and not row["calibrated"]
    )
    (r,) = server_reservations(
        plan_pipeline(
            load_config(str(CONFIG)),
            profile,
            calibration=cal.CalibrationStore(store.root),
            server=True,
        )
    )
    assert r.evidence == "M" and r.bytes >= row["peak_bytes"]
