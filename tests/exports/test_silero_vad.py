"""Silero VAD (``exports/silero-vad-op18``) verifies on the OpenVINO route, 0-d ``sr`` and all;
the plain graph (``exports/silero-vad``) is shipped too, for the CPU EP.

The graph has a scalar input (``sr``, int64, shape ``[]``) that the OpenVINO EP
checks strictly: a route that reshaped it to (1,) made the EP refuse the tensor
and the placement fail as ``numeric_gate_failed``. The package's plain
``silero_vad.onnx`` does not compile on OpenVINO's CPU plugin at all; that is a
named refusal, not a traceback.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from exports import silero_vad
from orchestrator.core.errors import RefusalCode
from orchestrator.ort.sessions import RemoteError
from orchestrator.verify.evidence import EvidenceStore
from orchestrator.verify.placement import verify_placement
from stages.exported_graph.artifact import load_artifact, save_npz
from stages.exported_graph.graph_stats import check_against_graph, describe_graph
from tests.helpers.graphs import REPO, placement

ARTIFACT = REPO / "exports" / "silero-vad-op18"
PLAIN = REPO / "exports" / "silero-vad"
OV = "OpenVINOExecutionProvider"

needs_silero = pytest.mark.skipif(
    importlib.util.find_spec("silero_vad") is None,
    reason="silero-vad is not installed (scripts/bootstrap.sh installs it with --no-deps)",
)


def test_the_reference_inputs_are_the_ones_the_code_makes() -> None:
    feeds = silero_vad.reference_feeds()
    with np.load(ARTIFACT / "reference_inputs.npz") as saved:
        assert sorted(saved.files) == ["input", "sr", "state"]
        for name, value in feeds.items():
            assert saved[name].dtype == value.dtype and saved[name].shape == value.shape, name
            assert np.array_equal(saved[name], value), name
    assert feeds["sr"].shape == () and feeds["sr"].dtype == np.int64 and int(feeds["sr"]) == 16000
    assert feeds["input"].shape == (1, 64 + 512) and not feeds["input"][0, :64].any()
    assert feeds["state"].shape == (2, 1, 128) and not feeds["state"].any()
    assert 0.49 < float(np.abs(feeds["input"]).max()) <= 0.5


def test_both_artifacts_hold_the_same_reference_inputs() -> None:
    assert (PLAIN / "reference_inputs.npz").read_bytes() == (
        ARTIFACT / "reference_inputs.npz"
    ).read_bytes()


@needs_silero
@pytest.mark.ort
def test_the_plain_artifact_matches_its_graph_and_its_recorded_outputs() -> None:
    """The wheel's silero_vad.onnx: input, state, sr in that order, the weights inside its If's
    branches (counted), and the recorded outputs its CPU EP's answer — within 1e-6 of op18's."""
    artifact = load_artifact(PLAIN)
    stats = describe_graph(artifact.graph_path("fp32"), use_cache=False)
    assert check_against_graph(artifact, "fp32", stats) == []
    assert [i["name"] for i in stats.inputs] == ["input", "state", "sr"]
    assert stats.opset == {"ai.onnx": 16} and stats.subgraph_node_count > 0
    assert 2_100_000 < stats.initializer_bytes < 2_300_000
    assert silero_vad.manifest_graph(PLAIN) == str(artifact.graph_path("fp32"))
    got = silero_vad.cpu_outputs(artifact.graph_path("fp32"), silero_vad.reference_feeds())
    recorded, op18 = artifact.reference_outputs(), load_artifact(ARTIFACT).reference_outputs()
    assert recorded is not None and op18 is not None
    for name, value in recorded.items():
        np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-6)
        np.testing.assert_allclose(value, op18[name], rtol=0, atol=1e-6)


def test_writing_the_same_arrays_twice_gives_the_same_bytes(tmp_path: Path) -> None:
    feeds = silero_vad.reference_feeds()
    a = save_npz(
        tmp_path / "a.npz", feeds, deflate=False
    ).read_bytes()  # as silero_vad.write_reference does
    b = save_npz(tmp_path / "b.npz", feeds, deflate=False).read_bytes()
    assert a == b  # the file's sha256 keys the evidence: no timestamps inside
    assert (ARTIFACT / "reference_inputs.npz").read_bytes() == a


@needs_silero
def test_the_manifest_matches_the_packaged_graph() -> None:
    artifact = load_artifact(ARTIFACT)
    stats = describe_graph(artifact.graph_path("fp32"), use_cache=False)
    assert check_against_graph(artifact, "fp32", stats) == []
    assert [i["name"] for i in stats.inputs] == ["input", "sr", "state"]
    assert stats.inputs[1] == {"name": "sr", "dtype": "int64", "shape": []}
    assert stats.opset == {"ai.onnx": 18}


@needs_silero
@pytest.mark.ort
def test_the_recorded_outputs_are_the_cpu_eps_answer() -> None:
    artifact = load_artifact(ARTIFACT)
    got = silero_vad.cpu_outputs(artifact.graph_path("fp32"), silero_vad.reference_feeds())
    recorded = artifact.reference_outputs()
    assert recorded is not None and set(recorded) == {"output", "stateN"}
    for name, value in recorded.items():
        assert got[name].shape == value.shape
        np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-6)
    assert 0.5 < float(recorded["output"][0, 0]) < 0.75  # the vowel-like chunk reads as speech


@needs_silero
@pytest.mark.ort
def test_the_cpu_ep_in_this_interpreter_passes(store: EvidenceStore) -> None:
    from orchestrator.ort.sessions import open_sessions, this_process

    result = verify_placement(
        placement(ARTIFACT, backend="ort-cpu"), open_sessions(this_process()), store=store
    )
    assert result.status == "passed", result.refusals


@needs_silero
@pytest.mark.openvino
@pytest.mark.ort
def test_the_openvino_route_passes_coverage_and_numerics(
    ov_host: Any, store: EvidenceStore
) -> None:
    p = placement(ARTIFACT)
    assert (p.backend, p.ep, p.route.name) == ("ort-openvino", OV, "openvino")
    result = verify_placement(p, ov_host, store=store)
    assert result.status == "passed", [r.message for r in result.refusals]
    record: dict[str, Any] = result.record  # type: ignore[assignment]
    cov = record["coverage"]
    # ORT hands OpenVINO the whole graph: the top-level Reshape, Gather, Equal and the If
    # (whose branches OpenVINO compiles itself), as one partition.
    assert (cov["taken"], cov["total"], cov["partitions"]) == (4, 4, 1)
    assert cov["fallback_op_types"] == {}
    numeric = record["numeric"]
    assert numeric["reference"] == "recorded outputs" and numeric["error"] is None
    assert numeric["outputs"]["output"]["shape"] == [1, 1]
    assert numeric["outputs"]["stateN"]["shape"] == [2, 1, 128]
    for m in numeric["outputs"].values():
        assert m["rel_l2"] < 1e-5 and m["max_abs"] < 1e-5 and m["cosine"] > 0.99999


@needs_silero
@pytest.mark.openvino
@pytest.mark.ort
def test_the_openvino_ep_tells_a_scalar_from_a_one_element_vector(ov_host: Any) -> None:
    """Why the wire format matters: fed ``sr`` as shape (1,), this EP refuses the tensor,
    so the passing gate above shows the 0-d scalar arrived as a 0-d scalar."""
    artifact = load_artifact(ARTIFACT)
    opened = ov_host.open(
        {
            "graph": str(artifact.graph_path("fp32")),
            "providers": [OV, "CPUExecutionProvider"],
            "provider_options": [{"device_type": "CPU"}, {}],
            "session_options": {},
            "session_config": {},
        }
    )
    try:
        feeds = silero_vad.reference_feeds()
        out = ov_host.run(opened["handle"], feeds)["outputs"]
        assert out["output"].shape == (1, 1)
        with pytest.raises(
            RemoteError,
            match=r"model input \(shape=\[\]\) and the tensor \(shape=\(1\)\) are incompatible",
        ):
            ov_host.run(opened["handle"], {**feeds, "sr": feeds["sr"].reshape(1)})
    finally:
        ov_host.close(opened["handle"])


@needs_silero
@pytest.mark.openvino
@pytest.mark.ort
def test_the_plain_graph_is_a_named_refusal_on_openvino(
    tmp_path: Path, ov_host: Any, store: EvidenceStore
) -> None:
    """silero_vad.onnx wraps the model in an If with dynamic-rank branch outputs, which
    OpenVINO's CPU plugin cannot compile: refused with a code and the reason."""
    doc = yaml.safe_load((ARTIFACT / "manifest.yaml").read_text())
    doc.update(
        name="silero-vad-plain",
        precisions={"fp32": "package://silero_vad/data/silero_vad.onnx"},
        inputs=[
            doc["inputs"][0],
            doc["inputs"][2],
            doc["inputs"][1],
        ],  # input, state, sr in this graph
        reference={"inputs": "reference_inputs.npz"},  # the CPU EP in the route is the reference
    )
    d = tmp_path / "plain"
    d.mkdir()
    (d / "manifest.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (d / "reference_inputs.npz").write_bytes((ARTIFACT / "reference_inputs.npz").read_bytes())
    result = verify_placement(placement(d), ov_host, store=store)
    assert result.status == "refused" and result.error is None
    (refusal,) = result.refusals
    assert refusal.code == RefusalCode.EXECUTION_PROVIDER_DECLINED_GRAPH
    assert refusal.message.startswith(
        "OpenVINOExecutionProvider could not build a session for silero-vad-plain [fp32] on cpu"
    )
    assert "CPU plug-in doesn't support Parameter operation with dynamic rank" in refusal.message
    assert "target_only" not in refusal.remedy and "failed to compile" in refusal.remedy
    assert result.record["coverage"]["source"] == "session_error"  # type: ignore[index]
