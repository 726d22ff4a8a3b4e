"""A run never starts an exported placement on "the EP is listed": placements
without gate evidence are verified first, and the plan is made again with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.api import unverified_stages, verify_then_replan
from orchestrator.config import load_config
from orchestrator.planner import plan_pipeline
from orchestrator.probe import probe_profile
from tests.helpers import REPO

pytestmark = [pytest.mark.openvino, pytest.mark.ort]


def test_unverified_placements_are_verified_then_replanned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path))  # no evidence yet
    config = load_config(REPO / "configs/voice-assistant.yaml")
    profile = probe_profile()
    before = plan_pipeline(config, profile)
    assert before.admitted
    assert unverified_stages(before) == ["voice"]
    assert before.stage("voice").verification.status == "unverified"

    after = verify_then_replan(config, profile, frozenset())
    voice = after.stage("voice")
    assert after.admitted and unverified_stages(after) == []
    assert voice.verification.status == "verified"
    assert voice.verification.evidence.startswith("M")
    assert (voice.device, voice.backend) == (
        before.stage("voice").device,
        before.stage("voice").backend,
    )
    assert list((tmp_path / "evidence").glob("*.json"))  # the evidence was written
