"""Coverage and numeric gates against the real OpenVINO EP (the .venvs/openvino route).

The graphs are built here with onnx.helper: one the EP takes fully, three it
takes partly (an fp64 island, a string cast, Det) and one it takes not at all
(fp64 only). Node counts are compared with what ONNX Runtime itself reports
when asked directly in that venv.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.core.errors import RefusalCode
from orchestrator.verify.evidence import EvidenceStore
from orchestrator.verify.placement import verify_placement
from tests.helpers.graphs import cpu_outputs, ort_own_counts, placement, write_artifact

pytestmark = [pytest.mark.openvino, pytest.mark.ort]

OV = "OpenVINOExecutionProvider"
CPU = "CPUExecutionProvider"


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("artifacts")
    return {
        g: write_artifact(root / g, g)
        for g in ("full", "fp64_island", "string_cast", "det", "fp64_only")
    }


@pytest.fixture(scope="module")
def ort_counts(artifacts: dict[str, Path]) -> dict[str, Any]:
    paths = {g: d / "fp32.onnx" for g, d in artifacts.items()}
    own = ort_own_counts(list(paths.values()))
    return {g: own[str(p)] for g, p in paths.items()}


@pytest.mark.parametrize("graph", ["full", "fp64_island", "string_cast", "det", "fp64_only"])
def test_node_counts_equal_onnxruntimes_own_assignment_info(
    graph: str,
    artifacts: dict[str, Path],
    ort_counts: dict[str, Any],
    ov_host: Any,
    store: EvidenceStore,
) -> None:
    result = verify_placement(placement(artifacts[graph]), ov_host, store=store)
    cov = result.record["coverage"]  # type: ignore[index]
    own = ort_counts[graph]["counts"]
    assert cov["taken"] == own.get(OV, 0)
    assert cov["total"] == sum(own.values())
    assert cov["by_ep"] == own
    assert cov["source"] == "ort_assignment_info"


def test_fully_taken_graph_passes_both_gates(
    artifacts: dict[str, Path], ort_counts: dict[str, Any], ov_host: Any, store: EvidenceStore
) -> None:
    result = verify_placement(placement(artifacts["full"]), ov_host, store=store)
    cov = result.record["coverage"]  # type: ignore[index]
    # ORT fuses MatMul+Add into one Gemm before partitioning: 2 nodes (Gemm, Tanh), both on OpenVINO.
    assert (cov["taken"], cov["total"], cov["partitions"]) == (2, 2, 1)
    assert cov["fallback_op_types"] == {}
    assert result.status == "passed", result.refusals
    out = result.record["numeric"]["outputs"]["y"]  # type: ignore[index]
    assert out["rel_l2"] < 1e-4 and out["cosine"] > 0.9999


@pytest.mark.parametrize(
    ("graph", "left_on_cpu"),
    [
        ("fp64_island", {"Cast", "Abs"}),
        ("string_cast", {"Cast"}),
        ("det", {"Det"}),
    ],
)
def test_partly_taken_graph_reports_what_stayed_on_the_cpu(
    graph: str,
    left_on_cpu: set[str],
    artifacts: dict[str, Path],
    ov_host: Any,
    store: EvidenceStore,
) -> None:
    result = verify_placement(placement(artifacts[graph]), ov_host, store=store)
    cov = result.record["coverage"]  # type: ignore[index]
    assert 0 < cov["taken"] < cov["total"]
    assert left_on_cpu <= set(cov["fallback_op_types"])
    assert cov["by_ep"][CPU] == sum(cov["fallback_op_types"].values())
    # The island splits the graph: below the default 0.5 it is refused, with the counts; at or
    # above it, it passes (both, whatever the EP's version takes: det is below it, the test after)
    below = cov["fraction"] < 0.5
    assert (result.status == "refused") is below and bool(result.refusals) is below, (
        result.status,
        cov,
    )
    for refusal in result.refusals:
        assert f"took {cov['taken']} of {cov['total']} nodes" in refusal.message
        assert "Det" in refusal.message or "Cast" in refusal.message


def test_a_partial_offload_below_the_minimum_names_the_minimum_in_the_remedy(
    artifacts: dict[str, Path], ov_host: Any, store: EvidenceStore
) -> None:
    result = verify_placement(placement(artifacts["det"]), ov_host, store=store)
    (refusal,) = result.refusals
    assert refusal.code == RefusalCode.EXECUTION_PROVIDER_DECLINED_GRAPH
    assert "lower min_ep_coverage for this stage (now 0.5)" in refusal.remedy
    # The artifact has only an fp32 graph and the stage never set target_only: neither is offered.
    assert (
        "precision" not in refusal.remedy.split("only, not the model and not fp32 in general.")[1]
    )
    assert "target_only" not in refusal.remedy


def test_lowering_min_coverage_admits_a_partial_offload(
    artifacts: dict[str, Path], ov_host: Any, store: EvidenceStore
) -> None:
    result = verify_placement(
        placement(artifacts["det"], min_ep_coverage=0.2), ov_host, store=store
    )
    assert result.status == "passed", result.refusals


def test_wholly_declined_graph_is_refused_although_get_providers_lists_the_ep(
    artifacts: dict[str, Path], ort_counts: dict[str, Any], ov_host: Any, store: EvidenceStore
) -> None:
    assert OV in ort_counts["fp64_only"]["providers"]  # what get_providers() says ...
    result = verify_placement(placement(artifacts["fp64_only"]), ov_host, store=store)
    assert OV in result.record["session_providers"]  # type: ignore[index]
    assert result.status == "refused"
    (refusal,) = [
        r for r in result.refusals if r.code == RefusalCode.EXECUTION_PROVIDER_DECLINED_GRAPH
    ]
    assert refusal.device == "cpu"
    assert "OpenVINOExecutionProvider took 0 of 2 nodes (0.0%)" in refusal.message
    assert "the minimum is 50%" in refusal.message
    assert "Abs×1" in refusal.message and "Neg×1" in refusal.message
    assert "not the model" in refusal.remedy
    # Nothing was offloaded, so there is no partial offload that lowering the minimum could admit.
    assert "min_ep_coverage" not in refusal.remedy
    assert "ort-cpu" in refusal.remedy and "target_only" not in refusal.remedy
    # ... and the output is the CPU's, bit for bit: no EP ran anything.
    assert result.record["numeric"]["outputs"]["y"]["max_abs"] == 0.0  # type: ignore[index]
    assert not result.record["suspicious"]  # type: ignore[index]


def test_target_only_turns_cpu_fallback_into_a_failed_session(
    artifacts: dict[str, Path], ov_host: Any, store: EvidenceStore
) -> None:
    p = placement(artifacts["det"], target_only=True)
    assert p.spec.providers == [OV]
    assert p.spec.session_config == {"session.disable_cpu_ep_fallback": "1"}
    result = verify_placement(p, ov_host, store=store)
    assert result.status == "refused"
    refusal = result.refusals[0]
    assert refusal.code == RefusalCode.EXECUTION_PROVIDER_DECLINED_GRAPH
    assert "could not build a session" in refusal.message
    assert "target_only: false" in refusal.remedy


def test_perturbed_reference_output_fails_the_numeric_gate_with_its_figures(
    tmp_path: Path, ov_host: Any, store: EvidenceStore
) -> None:
    good = write_artifact(tmp_path / "good", "full")
    feeds = dict(np.load(good / "reference_inputs.npz"))
    expected = cpu_outputs(good / "fp32.onnx", feeds)
    perturbed = {"y": expected["y"] + np.float32(0.05)}
    bad = write_artifact(tmp_path / "bad", "full", reference_outputs=perturbed)
    result = verify_placement(placement(bad), ov_host, store=store)
    assert result.status == "refused"
    (refusal,) = result.refusals
    assert refusal.code == RefusalCode.NUMERIC_GATE_FAILED
    measured = result.record["numeric"]["outputs"]["y"]  # type: ignore[index]
    assert measured["max_abs"] == pytest.approx(0.05, abs=1e-4)
    assert f"max abs {measured['max_abs']:.3g} (max 0.0001)" in refusal.message
    assert f"rel L2 {measured['rel_l2']:.3g} (max 0.0001)" in refusal.message
    assert "recorded outputs" in refusal.message
    assert "full [fp32]" in refusal.message and "OpenVINOExecutionProvider" in refusal.message
    assert "not the model and not fp32 in general" in refusal.remedy
    # coverage passed: only the numbers refuse it
    assert result.record["coverage"]["fraction"] == 1.0  # type: ignore[index]


def test_evidence_is_written_and_reused_until_a_key_part_changes(
    artifacts: dict[str, Path], ov_host: Any, store: EvidenceStore
) -> None:
    p = placement(artifacts["full"])
    first = verify_placement(p, ov_host, store=store)
    assert not first.cached and first.evidence_path and Path(first.evidence_path).is_file()
    again = verify_placement(p, ov_host, store=store)
    assert again.cached and again.record["measured_at"] == first.record["measured_at"]  # type: ignore[index]
    assert again.record["evidence"] == "M" and again.record["machine"]["hostname"]  # type: ignore[index]
    other_runtime = p.with_runtime("onnxruntime-openvino==9.9.9")
    assert not verify_placement(other_runtime, ov_host, store=store).cached
    forced = verify_placement(p, ov_host, store=store, force=True)
    assert not forced.cached


def test_bit_identical_output_while_the_ep_claims_nodes_is_flagged_suspicious(
    tmp_path: Path, ov_host: Any, store: EvidenceStore
) -> None:
    """A lone Relu is exact, so OpenVINO's output equals the CPU's bit for bit while it
    claims the node: reported (a flag and a warning line), not refused."""
    result = verify_placement(
        placement(write_artifact(tmp_path / "relu", "relu")), ov_host, store=store
    )
    assert result.record["coverage"]["taken"] == 1  # type: ignore[index]
    assert result.record["numeric"]["bit_identical_to_cpu"] is True  # type: ignore[index]
    assert result.record["suspicious"] is True  # type: ignore[index]
    assert result.status == "passed"
    (warning,) = result.warnings
    assert warning.startswith(
        "suspicious: OpenVINOExecutionProvider claims 1 of 1 nodes of relu [fp32] on cpu"
    )
    # the full graph's tanh rounds differently on OpenVINO: not flagged
    full = verify_placement(
        placement(write_artifact(tmp_path / "full", "full")), ov_host, store=store
    )
    assert full.record["numeric"]["bit_identical_to_cpu"] is False  # type: ignore[index]
    assert not full.warnings
