"""``admit_plan``, the one way to a plan that may run (``run``, ``chat``, ``serve`` and
``Pipeline.from_config``), and ``PipelineOptions``, the options of ``from_config``/``open``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.api import AdmitProgress, PipelineOptions, admit_plan
from orchestrator.core.errors import ConfigError
from orchestrator.probe import probe_profile
from tests.helpers import REPO

CONFIG = REPO / "configs/voice-assistant.yaml"


class Steps(AdmitProgress):
    """Every step ``admit_plan`` tells, in order."""

    def __init__(self) -> None:
        self.said: list[tuple[str, Any]] = []

    def verifying(self, stages: list[str]) -> None:
        self.said.append(("verifying", stages))

    def unverified(self, stages: list[str]) -> None:
        self.said.append(("unverified", stages))

    def run_gates(self, config: Any, profile: Any, mask: frozenset[str]) -> Any:
        self.said.append(("gates", sorted(mask)))
        return super().run_gates(config, profile, mask)


def test_options_take_keyword_overrides_and_refuse_a_misspelt_one() -> None:
    base = PipelineOptions(record=None, verify=False)
    merged = PipelineOptions.of(base, {"mask": (m for m in ["npu"]), "server": True})
    assert (merged.record, merged.verify, merged.mask, merged.server) == (
        None,
        False,
        ("npu",),
        True,
    )
    assert PipelineOptions.of(None, {}) == PipelineOptions()
    with pytest.raises(TypeError, match="recrod"):
        PipelineOptions.of(base, {"recrod": None})


def test_without_verify_the_unverified_stages_are_told_and_no_gate_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path))  # no evidence yet
    steps = Steps()
    admission = admit_plan(
        CONFIG, PipelineOptions(profile=probe_profile(), verify=False, calibration=False), steps
    )
    assert admission.admitted and admission.calibration is None
    assert steps.said == [("unverified", ["voice"])]
    verification = admission.plan.stage("voice").verification
    assert verification is not None and verification.status == "unverified"


@pytest.mark.openvino
@pytest.mark.ort
def test_with_verify_the_gates_run_through_the_progress_and_the_plan_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path))
    steps = Steps()
    admission = admit_plan(CONFIG, PipelineOptions(profile=probe_profile()), steps)
    assert steps.said == [("verifying", ["voice"]), ("gates", [])]
    verification = admission.plan.stage("voice").verification
    assert verification is not None and verification.status == "verified"


def test_a_mask_that_names_no_device_is_refused_before_planning() -> None:
    with pytest.raises(ConfigError) as info:
        admit_plan(CONFIG, PipelineOptions(profile=probe_profile(), mask=("npu:7",)))
    assert info.value.problems[0].where == "--mask npu:7"
