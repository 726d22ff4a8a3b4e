"""A refusal's remedy names only what this user can change.

No ``target_only`` advice for a stage that never set it, no "another precision"
for an artifact that has one graph, no "lower min_ep_coverage" when nothing was
offloaded; and a runtime's C++ error is quoted by its reason, not its template
signatures.
"""

from __future__ import annotations

from typing import Any

from orchestrator.verify.gates import brief_error, compare, judge
from stages.exported_graph.artifact import Tolerance

OV = "OpenVINOExecutionProvider"

# What the OpenVINO EP (onnxruntime-openvino 1.24.1) raised opening silero_vad.onnx,
# abridged in the middle only.
OV_COMPILE_ERROR = (
    "Fail: [ONNXRuntimeError] : 1 : FAIL : Exception during initialization: "
    "/onnxruntime/onnxruntime/core/providers/openvino/backends/basic_backend.cc:136 "
    "onnxruntime::openvino_ep::BasicBackend::BasicBackend(std::unique_ptr<onnx::ModelProto>&, "
    + "onnxruntime::openvino_ep::SessionContext&, "
    * 20
    + ") [OpenVINO-EP] Exception while Loading Network for graph OpenVINOExecutionProvider_OpenVINO-EP-subgraph_1_0: "
    "Exception from src/inference/src/cpp/core.cpp:114:\n"
    "Exception from src/inference/src/dev/plugin.cpp:53:\n"
    "Check '!shape.rank().is_dynamic()' failed at src/plugins/intel_cpu/src/node.cpp:106:\n"
    "Unexpected: CPU plug-in doesn't support Parameter operation with dynamic rank. "
    "Operation name: If_0_else_branch__Inline_0__/decoder/If_output_0\n\n\n\n"
)


def _session_error_record() -> dict[str, Any]:
    return {
        "ep": OV,
        "precision": "fp32",
        "coverage": {
            "ep": OV,
            "taken": 0,
            "total": None,
            "fraction": 0.0,
            "source": "session_error",
            "session_error": OV_COMPILE_ERROR,
        },
        "numeric": {"outputs": {}, "error": None},
    }


def _judge(record: dict[str, Any], **kw: Any) -> Any:
    return judge(
        record, artifact_name="vad", device_id="cpu", min_coverage=0.5, tolerance=Tolerance(), **kw
    )


def test_a_failed_compile_without_target_only_does_not_mention_target_only() -> None:
    (refusal,) = _judge(_session_error_record()).refusals
    assert refusal.code == "execution_provider_declined_graph"
    assert "target_only" not in refusal.remedy
    assert "failed to compile" in refusal.remedy and "ort-cpu" in refusal.remedy
    # The reason, not the C++ signatures.
    assert refusal.message.endswith(
        "Unexpected: CPU plug-in doesn't support Parameter operation with dynamic rank. "
        "Operation name: If_0_else_branch__Inline_0__/decoder/If_output_0"
    )
    assert "std::unique_ptr" not in refusal.message
    assert refusal.message.startswith(
        "OpenVINOExecutionProvider could not build a session for vad [fp32] on cpu: "
        "Fail: [ONNXRuntimeError] : 1 : FAIL : Exception during initialization: …"
    )


def test_a_failed_session_under_target_only_offers_to_allow_cpu_fallback() -> None:
    (refusal,) = _judge(_session_error_record(), target_only=True).refusals
    assert "allow CPU fallback (target_only: false)" in refusal.remedy


def test_a_target_that_fails_on_the_reference_inputs_points_at_the_inputs() -> None:
    record = {
        "ep": OV,
        "precision": "fp32",
        "coverage": {"ep": OV, "taken": 4, "total": 4, "fraction": 1.0, "partitions": 1},
        "numeric": {
            "outputs": {},
            "error": "the target session failed on the reference inputs: Fail: "
            "Can't set the input tensor with index: 1, because the model input (shape=[]) and "
            "the tensor (shape=(1)) are incompatible",
        },
    }
    (refusal,) = _judge(record).refusals
    assert refusal.code == "numeric_gate_failed"
    assert "(shape=[]) and the tensor (shape=(1)) are incompatible" in refusal.message
    assert "compare their shapes and dtypes with the graph's inputs" in refusal.remedy
    assert (
        "target_only" not in refusal.remedy and "precision of this artifact" not in refusal.remedy
    )


def _out_of_tolerance(precision: str) -> dict[str, Any]:
    return {
        "ep": OV,
        "precision": precision,
        "coverage": {"ep": OV, "taken": 4, "total": 4, "fraction": 1.0, "partitions": 1},
        "numeric": {
            "reference": "CPU EP, fp32 graph",
            "outputs": {"y": compare([1.0, 2.0], [1.0, 2.5])},
        },
    }


def test_another_precision_is_offered_only_when_the_artifact_has_one() -> None:
    (alone,) = _judge(_out_of_tolerance("fp32"), precisions=("fp32",)).refusals
    assert "precision of this artifact" not in alone.remedy
    assert alone.remedy.split(". ", 1)[1].startswith(
        "Place the stage on another backend or device (e.g. the CPU EP, ort-cpu)"
    )
    assert (
        "widen `tolerance` in the stage config only if this difference is acceptable for 'y'"
        in alone.remedy
    )
    (two,) = _judge(_out_of_tolerance("int8"), precisions=("fp32", "int8")).refusals
    assert (
        "Use another precision of this artifact (fp32) or place the stage on another backend"
        in two.remedy
    )


def test_lowering_the_minimum_is_offered_only_for_a_partial_offload() -> None:
    def record(taken: int) -> dict[str, Any]:
        return {
            "ep": OV,
            "precision": "fp32",
            "coverage": {
                "ep": OV,
                "taken": taken,
                "total": 4,
                "fraction": taken / 4,
                "partitions": 1 if taken else 0,
                "fallback_op_types": {"Det": 4 - taken},
            },
            "numeric": {"outputs": {}},
        }

    (none,) = _judge(record(0)).refusals
    assert "min_ep_coverage" not in none.remedy
    (some,) = _judge(record(1)).refusals
    assert (
        "lower min_ep_coverage for this stage (now 0.5) if a partial offload is what you want"
        in some.remedy
    )


def test_short_errors_are_quoted_whole() -> None:
    assert brief_error("  Fail: bad input\n") == "Fail: bad input"
