"""Per-precision tolerance (``tolerances`` in the manifest): each graph is judged by its
precision's own tolerance, falling back field by field to ``tolerance``.

The artifact: the MatMul + Add + Tanh graph at fp32 and its QDQ int8 quantization
(onnxruntime's quantizer, a few milliseconds), with reference outputs a hair off the
fp32 graph's (as a framework's outputs are), so both precisions have a measurable
error: fp32 ~1e-6, int8 ~1e-2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from orchestrator.core.errors import ConfigError
from orchestrator.ort.sessions import open_sessions, this_process
from orchestrator.verify.evidence import EvidenceStore
from orchestrator.verify.gates import judge
from orchestrator.verify.placement import verify_placement
from stages.exported_graph.artifact import Tolerance, load_artifact
from stages.exported_graph.kind import ExportedGraphConfig, ExportedGraphKind
from tests.helpers.graphs import cpu_outputs, machine_profile, placement, write_artifact

pytestmark = [pytest.mark.ort]

LOOSE = {"rel_l2": 0.05, "max_abs": 0.5, "cosine_min": 0.99}
TIGHT = {"rel_l2": 1e-7, "max_abs": 1e-7, "cosine_min": 0.9999}


class _Feeds:
    def __init__(self, feeds: list[dict[str, Any]]) -> None:
        self._it = iter(feeds)

    def get_next(self) -> dict[str, Any] | None:
        return next(self._it, None)


def _artifact(
    directory: Path, *, tolerance: dict[str, float], tolerances: dict[str, Any] | None
) -> Path:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    write_artifact(directory, "full")
    with np.load(directory / "reference_inputs.npz") as data:
        feeds = {k: data[k] for k in data.files}
    quantize_static(
        str(directory / "fp32.onnx"),
        str(directory / "int8.onnx"),
        _Feeds([feeds]),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    outs = cpu_outputs(directory / "fp32.onnx", feeds)
    np.savez(
        directory / "reference_outputs.npz",
        **{k: v * np.float32(1 + 3e-6) for k, v in outs.items()},
    )
    doc = yaml.safe_load((directory / "manifest.yaml").read_text())
    doc["precisions"] = {"fp32": "fp32.onnx", "int8": "int8.onnx"}
    doc["reference"]["outputs"] = "reference_outputs.npz"
    doc["tolerance"] = tolerance
    if tolerances is not None:
        doc["tolerances"] = tolerances
    (directory / "manifest.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return directory


def _gate(artifact: Path, precision: str, store: EvidenceStore) -> tuple[Any, Any]:
    p = placement(artifact, backend="ort-cpu", precision=[precision])
    assert p.precision == precision
    return p, verify_placement(p, open_sessions(this_process()), store=store)


def test_fp32_is_judged_by_its_own_tighter_tolerance(tmp_path: Path, store: EvidenceStore) -> None:
    """Under the loose ``tolerance`` (int8's) fp32 would pass; its own entry refuses it."""
    art = _artifact(tmp_path / "a", tolerance=LOOSE, tolerances={"fp32": TIGHT})
    p, result = _gate(art, "fp32", store)
    assert p.tolerance == Tolerance(**TIGHT)
    assert result.status == "refused"
    assert any(
        r.code == "numeric_gate_failed" and "(max 1e-07)" in r.message for r in result.refusals
    ), result.refusals
    # the same measurement judged by the loosest tolerance would have passed
    assert judge(
        result.record,
        artifact_name="full",
        device_id="cpu",
        min_coverage=0.5,
        tolerance=Tolerance(**LOOSE),
    ).passed
    # int8 has no entry: it falls back to `tolerance` and passes
    p8, result8 = _gate(art, "int8", store)
    assert p8.tolerance == Tolerance(**LOOSE) and result8.status == "passed", result8.refusals


def test_int8_is_judged_by_its_own_looser_tolerance(tmp_path: Path, store: EvidenceStore) -> None:
    """The converse: the fallback is tight, int8's own entry admits what int8 costs."""
    art = _artifact(
        tmp_path / "a",
        tolerance=TIGHT | {"rel_l2": 1e-4, "max_abs": 1e-4},
        tolerances={"int8": LOOSE},
    )
    p, result = _gate(art, "int8", store)
    assert p.tolerance == Tolerance(**LOOSE)
    assert result.status == "passed", result.refusals
    # judged by the fallback instead, the same measurement is refused
    assert not judge(
        result.record,
        artifact_name="full",
        device_id="cpu",
        min_coverage=0.5,
        tolerance=Tolerance(rel_l2=1e-4, max_abs=1e-4, cosine_min=0.9999),
    ).passed
    _, result32 = _gate(art, "fp32", store)  # no entry: `tolerance` (1e-4 holds 3e-6)
    assert result32.status == "passed", result32.refusals


def test_an_entry_falls_back_field_by_field_and_the_stage_overrides_it(tmp_path: Path) -> None:
    art = _artifact(tmp_path / "a", tolerance=LOOSE, tolerances={"int8": {"rel_l2": 0.02}})
    m = load_artifact(art).manifest
    assert m.tolerance_for("int8") == Tolerance(rel_l2=0.02, max_abs=0.5, cosine_min=0.99)
    assert m.tolerance_for("fp32") == Tolerance(**LOOSE)
    # a stage's `tolerance` field applies over every precision's own
    kind = ExportedGraphKind()
    cfg = ExportedGraphConfig(
        name="s",
        kind="exported_graph",
        devices=["cpu"],
        artifact=str(art),
        precision=["int8"],
        tolerance={"max_abs": 0.25},
    )
    info = kind.describe(cfg)
    device = machine_profile().device("cpu")
    assert device is not None
    gate = kind.gate_spec(cfg, info, device, "ort-cpu")
    assert gate is not None and gate.precision == "int8"
    assert gate.tolerance == {"rel_l2": 0.02, "max_abs": 0.25, "cosine_min": 0.99}


def test_a_manifest_without_tolerances_means_what_it_meant(tmp_path: Path) -> None:
    """Old manifests: one tolerance for every graph, and nothing new in the plan's details."""
    art = _artifact(tmp_path / "a", tolerance=LOOSE, tolerances=None)
    kind = ExportedGraphKind()
    cfg = ExportedGraphConfig(
        name="s", kind="exported_graph", devices=["cpu"], artifact=str(art), precision=["int8"]
    )
    info = kind.describe(cfg)
    assert "tolerances" not in info.details and info.details["tolerance"] == LOOSE
    device = machine_profile().device("cpu")
    assert device is not None
    gate = kind.gate_spec(cfg, info, device, "ort-cpu")
    assert gate is not None and gate.tolerance == LOOSE


def test_a_tolerance_for_a_graph_the_artifact_lacks_is_refused(tmp_path: Path) -> None:
    art = _artifact(tmp_path / "a", tolerance=LOOSE, tolerances={"fp16": TIGHT})
    with pytest.raises(ConfigError) as err:
        load_artifact(art)
    text = str(err.value)
    assert "tolerances" in text and "fp16" in text and "precisions does not list" in text
