"""The evidence cache: where it lives, what its key holds, and judging old records anew."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.verify.evidence import EVIDENCE_FORMAT, EvidenceKey, EvidenceStore
from orchestrator.verify.gates import compare, judge
from stages.exported_graph.artifact import Tolerance
from tests.helpers import REPO

KEY = EvidenceKey(
    artifact="voice",
    graph_sha256="a" * 64,
    reference_sha256="b" * 64,
    precision="fp32",
    backend="ort-openvino",
    ep="OpenVINOExecutionProvider",
    runtime="onnxruntime-openvino==1.24.1",
    device_id="cpu",
    device_name="x86",
    options={"providers": ["OpenVINOExecutionProvider", "CPUExecutionProvider"]},
)

MEASUREMENT = {
    "ep": KEY.ep,
    "precision": KEY.precision,
    "coverage": {
        "ep": KEY.ep,
        "taken": 1,
        "total": 1,
        "fraction": 1.0,
        "source": "ort_assignment_info",
    },
    "numeric": {
        "outputs": {"y": {"shape_match": True, "rel_l2": 0.0, "max_abs": 0.0, "cosine": 1.0}}
    },
}


def test_the_cache_lives_under_omni_edge_cache_dir(private_cache: Path) -> None:
    store = EvidenceStore()
    path = store.save(KEY, MEASUREMENT)
    assert path.parent == private_cache / "evidence"
    record = store.load(KEY)
    assert record is not None and record["format"] == EVIDENCE_FORMAT and record["evidence"] == "M"
    assert record["machine"]["hostname"] and record["measured_at"]
    assert record["key"]["runtime"] == "onnxruntime-openvino==1.24.1"


@pytest.mark.parametrize(
    "change",
    [
        {"graph_sha256": "c" * 64},
        {"reference_sha256": "d" * 64},
        {"precision": "int8"},
        {"runtime": "onnxruntime-openvino==1.25.0"},
        {"device_id": "npu:0"},
        {"device_name": "other"},
        {"options": {"providers": ["OpenVINOExecutionProvider"]}},
        {"backend": "ort-cpu"},
    ],
)
def test_any_change_to_a_key_part_misses_the_cache(
    store: EvidenceStore, change: dict[str, object]
) -> None:
    store.save(KEY, MEASUREMENT)
    other = EvidenceKey(**{**KEY.to_dict(), **change})
    assert store.load(other) is None
    assert store.load(KEY) is not None


def test_a_record_is_judged_against_todays_thresholds() -> None:
    record = {
        "ep": "OpenVINOExecutionProvider",
        "precision": "fp32",
        "coverage": {
            "ep": "OpenVINOExecutionProvider",
            "taken": 3,
            "total": 4,
            "fraction": 0.75,
            "partitions": 1,
            "fallback_op_types": {"Det": 1},
        },
        "numeric": {
            "reference": "CPU EP, fp32 graph",
            "outputs": {"y": compare([1.0, 2.0, 3.0], [1.0, 2.0, 3.01])},
        },
    }
    strict = judge(
        record,
        artifact_name="a",
        device_id="cpu",
        min_coverage=0.8,
        tolerance=Tolerance(rel_l2=1e-4, max_abs=1e-4, cosine_min=0.9999),
    )
    assert not strict.passed
    assert [r.code for r in strict.refusals] == [
        "execution_provider_declined_graph",
        "numeric_gate_failed",
    ]
    assert (
        "took 3 of 4 nodes (75.0%) in 1 partition(s) of a [fp32] on cpu; the minimum is 80%. Left to the CPU EP: Det×1"
        in strict.refusals[0].message
    )
    assert "max abs 0.01 (max 0.0001)" in strict.refusals[1].message
    loose = judge(
        record,
        artifact_name="a",
        device_id="cpu",
        min_coverage=0.5,
        tolerance=Tolerance(rel_l2=0.01, max_abs=0.02, cosine_min=0.999),
    )
    assert loose.passed and loose.refusals == []


def test_bit_identical_output_while_the_ep_claims_nodes_is_flagged() -> None:
    record = {
        "ep": "VitisAIExecutionProvider",
        "precision": "int8",
        "suspicious": True,
        "coverage": {
            "ep": "VitisAIExecutionProvider",
            "taken": 40,
            "total": 40,
            "fraction": 1.0,
            "partitions": 1,
        },
        "numeric": {"outputs": {"y": compare([1.0], [1.0])}},
    }
    verdict = judge(
        record, artifact_name="a", device_id="npu:0", min_coverage=0.5, tolerance=Tolerance()
    )
    assert verdict.passed
    (warning,) = verdict.warnings
    assert warning.startswith(
        "suspicious: VitisAIExecutionProvider claims 40 of 40 nodes of a [int8] on npu:0"
    )
    assert "bit-identical to the CPU EP's" in warning


def test_a_shape_mismatch_fails_with_both_shapes() -> None:
    record = {
        "ep": "X",
        "precision": "fp16",
        "coverage": {"ep": "X", "taken": 1, "total": 1, "fraction": 1.0},
        "numeric": {
            "reference": "recorded outputs",
            "outputs": {"audio": compare([[0.0] * 4], [[0.0] * 5])},
        },
    }
    (refusal,) = judge(
        record, artifact_name="a", device_id="igpu:0", min_coverage=0.5, tolerance=Tolerance()
    ).refusals
    assert refusal.code == "numeric_gate_failed"
    assert "has shape [1, 4] but the reference (recorded outputs) has [1, 5]" in refusal.message


def test_planning_an_exported_stage_imports_neither_onnxruntime_nor_onnx_when_warm(
    tmp_path: Path,
) -> None:
    """Plan-time evidence lookup opens nothing: no onnxruntime import, and with the
    graph statistics memoised, not even onnx."""
    code = f"""
import os, sys
os.environ["OMNI_EDGE_CACHE_DIR"] = {str(tmp_path)!r}
from orchestrator.config import load_config
from orchestrator.planner import plan_pipeline
from tests.helpers.graphs import machine_profile
config = load_config("configs/voice-assistant.yaml")
for _ in range(2):
    sys.modules.pop("onnx", None)
    plan = plan_pipeline(config, machine_profile(), mask=frozenset({{"gpu:0"}}))
print(plan.stage("voice").verification.status, "onnxruntime" in sys.modules, "onnx" in sys.modules)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["unverified", "False", "False"]
