"""VitisAI's own report (vitisai_ep_report.json) is read where the EP wrote it: its row's
``coverage_report`` names the file, travels to the worker with the session spec
(``sessions.with_plugins``) and says which devices are the accelerator.

No VitisAI here: the report below has the shape AMD documents (``deviceStat``
with per-device ``nodeNum``, ``nodeStat`` per node) and the numbers of a graph
the EP claims wholly but runs mostly on its own CPU path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.ort.sessions import with_plugins
from orchestrator.ort.worker import check_spec, ep_report
from orchestrator.verify.gates import coverage_from_assignment, coverage_from_report, judge
from stages.exported_graph.artifact import Tolerance

REPORT = {
    "deviceStat": [
        {"name": "all", "nodeNum": 10, "supportedOpType": ["Conv", "Relu", "Softmax"]},
        {"name": "CPU", "nodeNum": 1, "supportedOpType": ["Softmax"]},
        {"name": "VITIS_EP_CPU", "nodeNum": 6, "supportedOpType": ["Conv"]},
        {"name": "NPU", "nodeNum": 3, "supportedOpType": ["Conv", "Relu"]},
    ],
    "nodeStat": [
        *({"name": f"conv{i}", "opType": "Conv", "device": "VITIS_EP_CPU"} for i in range(6)),
        {"name": "sm", "opType": "Softmax", "device": "CPU"},
        *({"name": f"n{i}", "opType": "Relu", "device": "NPU"} for i in range(3)),
    ],
}


def _vitisai_report(spec: dict[str, Any]) -> dict[str, Any] | None:
    """What the worker reads of a VitisAI session's spec, as the client sends it."""
    providers = ["VitisAIExecutionProvider", "CPUExecutionProvider"]
    sent = with_plugins(
        {"graph": "g.onnx", "providers": providers[: len(spec["provider_options"])]} | spec
    )
    return ep_report(check_spec(sent))


def test_the_report_in_cache_dir_slash_cache_key_is_read_and_summarised(tmp_path: Path) -> None:
    (tmp_path / "voice-int8-abc").mkdir()
    (tmp_path / "voice-int8-abc" / "vitisai_ep_report.json").write_text(json.dumps(REPORT))
    spec = {"provider_options": [{"cache_dir": str(tmp_path), "cache_key": "voice-int8-abc"}, {}]}
    summary = _vitisai_report(spec)
    assert summary is not None
    assert summary["device_stat"] == {"all": 10, "CPU": 1, "VITIS_EP_CPU": 6, "NPU": 3}
    assert summary["cpu_op_types"] == {"Conv": 6, "Softmax": 1}
    assert (
        _vitisai_report({"provider_options": [{"cache_dir": str(tmp_path), "cache_key": "other"}]})
        is None
    )


def test_the_reports_npu_count_is_the_coverage_not_what_ort_assigned(tmp_path: Path) -> None:
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "vitisai_ep_report.json").write_text(json.dumps(REPORT))
    summary = _vitisai_report(
        {"provider_options": [{"cache_dir": str(tmp_path), "cache_key": "k"}]}
    )
    assert summary is not None
    # ORT saw the VitisAI EP take 9 of 10 nodes in one partition ...
    ort = coverage_from_assignment(
        [
            {"ep": "VitisAIExecutionProvider", "nodes": [["Conv", ""]] * 6 + [["Relu", ""]] * 3},
            {"ep": "CPUExecutionProvider", "nodes": [["Softmax", ""]]},
        ],
        "VitisAIExecutionProvider",
    )
    assert (ort["taken"], ort["total"], ort["partitions"]) == (9, 10, 1)
    # ... but the NPU ran 3: the report is the evidence.
    cov = coverage_from_report(summary, ort, "VitisAIExecutionProvider")
    assert (cov["taken"], cov["total"]) == (3, 10)
    assert cov["source"].startswith("vitisai_ep_report")
    verdict = judge(
        {
            "ep": "VitisAIExecutionProvider",
            "precision": "int8",
            "coverage": cov,
            "numeric": {"outputs": {}},
        },
        artifact_name="voice",
        device_id="npu:0",
        min_coverage=0.5,
        tolerance=Tolerance(),
    )
    (refusal,) = verdict.refusals
    assert refusal.code == "execution_provider_declined_graph"
    assert (
        "VitisAIExecutionProvider took 3 of 10 nodes (30.0%) in 1 partition(s) of voice [int8] on npu:0"
        in refusal.message
    )
    assert "Conv×6" in refusal.message
