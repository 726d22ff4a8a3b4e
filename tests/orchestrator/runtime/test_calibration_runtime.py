"""Measured peaks feed the next plan, end to end on Ray (the echo kind): a run's close
records each stage's peak and Ray's; the next plan budgets from them (evidence M, never
below the peak); an overlapped in-process load is an upper bound — labelled, not judged
over budget, and never calibrating."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator import calibration as cal
from orchestrator.api import Pipeline
from orchestrator.core.units import GiB, MiB
from orchestrator.runtime import record as rec
from tests.helpers.profiles import make_profile

pytestmark = [pytest.mark.slow, pytest.mark.ray]

IGPU = {
    "id": "igpu:0",
    "kind": "igpu",
    "name": "test iGPU",
    "backends": ["ort-cpu"],
    "shared_memory_bytes": 4 * GiB,
}


def write(tmp_path: Path, voice_device: str, load_s: float = 0.0) -> tuple[Path, Path]:
    cfg = tmp_path / "echo.yaml"
    cfg.write_text(
        "name: echo-calibration\n"
        "stages:\n"
        f"  - {{name: thinker, kind: echo, mode: words, devices: [cpu], hold_bytes: {64 * MiB}, load_s: {load_s},"
        " final_output: true, final_output_type: text}\n"
        f"  - {{name: voice, kind: echo, mode: tone, inputs: [thinker], devices: [{voice_device}], load_s: {load_s},"
        " final_output: true, final_output_type: audio}\n"
    )
    prof = tmp_path / "profile.json"
    prof.write_text(make_profile(IGPU, ram_available=8 * GiB).model_dump_json())
    return cfg, prof


def test_a_run_calibrates_the_next_plan(ray_cluster: Any, tmp_path: Path) -> None:
    cfg, prof = write(tmp_path, "igpu:0")  # one actor per device: no load shares a process
    store = cal.CalibrationStore(tmp_path / "cal")
    first = Pipeline.from_config(cfg, profile=prof, record=None, calibration=store)
    try:
        assert all(s.calibration is None for s in first.plan.stages)
        first.run("one two three", record=None)
    finally:
        first.close()
    recorded = {r["stage"]: r for r in first.runtime.calibration_recorded}  # type: ignore[attr-defined]
    assert {"thinker", "voice"} <= set(recorded)
    assert not recorded["thinker"]["upper_bound"] and Path(recorded["thinker"]["entry"]).exists()
    doc = rec.build(first.runtime, first.results)
    assert doc["calibration"]["recorded"] and doc["calibration"]["calibrated_stages"] == []

    second = Pipeline.from_config(
        cfg, profile=prof, record=None, calibration=cal.CalibrationStore(store.root)
    )
    try:
        thinker = second.plan.stage("thinker")
        c = thinker.calibration
        assert c is not None and c["match"] == "exact" and c["evidence"] == "M"
        assert c["largest_peak_bytes"] == recorded["thinker"]["peak_bytes"]
        assert thinker.budget_bytes() == c["after_bytes"] > c["largest_peak_bytes"]
        # Ray's own memory was measured and recorded beside the stages', and the next plan
        # reserves what was measured
        assert "(ray_runtime)" in recorded, sorted(recorded)
        ray = next(r for r in second.plan.shared_reservations if r.purpose == "ray_runtime")
        assert ray.evidence == "M"
        second.run("one two three", record=None)
        row = next(
            r
            for r in rec.build(second.runtime, second.results)["stages"]
            if r["stage"] == "thinker"
        )
        assert row["calibration"]["match"] == "exact"
        assert row["drift"] is None or row["drift"]["over_by_bytes"] > 0
    finally:
        second.close()
    entry = cal.CalibrationStore(store.root).load(
        cal.stage_key(
            pipeline=second.plan.pipeline,
            stage="thinker",
            kind="echo",
            artifact=thinker.artifact,
            device="cpu",
            backend=str(thinker.backend),
            route=thinker.route,
            engine_kwargs=thinker.engine_kwargs,
            profile=second.profile,
        )
    )  # type: ignore[arg-type]
    assert entry is not None and len(entry.samples) == 2 and entry.samples[1]["calibrated"]


def test_an_overlapped_in_process_load_is_an_upper_bound_and_never_calibrates(
    ray_cluster: Any, tmp_path: Path
) -> None:
    # Both on the CPU actor, loading together, by construction: the thinker's load allocates its
    # 64 MiB only once the voice's load has begun, and the voice's load ends only after that. The
    # voice's figure (its process's growth while it loaded) then holds the thinker's 64 MiB: over
    # its own budget (1 MiB + 16 MiB of load transient), an upper bound that is not judged.
    began, allocated = tmp_path / "voice-began", tmp_path / "thinker-allocated"
    cfg, prof = write(tmp_path, "cpu")
    cfg.write_text(
        cfg.read_text()
        .replace("load_s: 0.0,", f"load_gate_file: {began}, loaded_file: {allocated},", 1)
        .replace("load_s: 0.0,", f"loading_file: {began}, load_gate_file: {allocated},", 1)
    )
    store = cal.CalibrationStore(tmp_path / "cal")
    p = Pipeline.from_config(cfg, profile=prof, record=None, calibration=store)
    try:
        assert p.runtime.load_results["thinker"]["overlapped"]
        assert p.runtime.load_results["voice"]["load_info"]["gate"] == "opened"
        p.run("one two", record=None)
        rows = {r["stage"]: r for r in rec.build(p.runtime, p.results)["stages"]}
    finally:
        p.close()
    voice = rows["voice"]
    assert voice["measured_peak_bytes"] >= 64 * MiB > voice["budget_bytes"], voice
    for name in ("thinker", "voice"):
        row = rows[name]
        assert row["upper_bound"] is True
        # a bound above the budget is not judged; one within it is within (each case: the
        # voice here, and tests/orchestrator/runtime/test_record_rows.py)
        above = row["measured_peak_bytes"] > row["budget_bytes"]
        assert row["within_budget"] is (None if above else True), row
        assert ("upper bound" in (row.get("within_budget_reason") or "")) is above, row
    again = Pipeline.from_config(
        cfg, profile=prof, record=None, calibration=cal.CalibrationStore(store.root), start=False
    )
    assert all(
        s.calibration is None for s in again.plan.stages
    )  # upper bounds never tighten a budget
