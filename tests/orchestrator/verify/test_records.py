"""The coverage and numeric parts of a measurement are declared once (``gates.Coverage``,
``gates.Numeric``, ``gates.OutputComparison``): every key the gates write is one the records
name, so a reader typed against them (``judge``) reads what was written."""

from __future__ import annotations

import numpy as np

from orchestrator.verify.gates import (
    Coverage,
    Numeric,
    OutputComparison,
    compare,
    coverage_from_assignment,
    coverage_from_report,
    judge,
)
from stages.exported_graph.artifact import Tolerance


def test_the_coverage_the_gates_write_is_the_declared_record() -> None:
    assignment = [
        {"ep": "OpenVINOExecutionProvider", "nodes": [["MatMul", "a"], ["Add", "b"]]},
        {"ep": "CPUExecutionProvider", "nodes": [["Softmax", "c"]]},
    ]
    cov = coverage_from_assignment(assignment, "OpenVINOExecutionProvider")
    assert set(cov) <= set(Coverage.__annotations__)
    assert (cov["taken"], cov["total"], cov["partitions"]) == (2, 3, 1)
    vitis = coverage_from_report(
        {
            "device_stat": {"all": 4, "NPU": 3, "CPU": 1},
            "cpu_op_types": {"Softmax": 1},
            "path": "r.json",
        },
        cov,
        "VitisAIExecutionProvider",
    )
    assert set(vitis) <= set(Coverage.__annotations__) and vitis["ort_assignment"] == cov


def test_each_comparison_the_gates_write_is_the_declared_record() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    for target, reference in [
        (a, a),
        (a, a.T),
        (a.astype(bool), a.astype(bool)),
        (np.full(3, np.nan), np.ones(3)),
        (a[:0], a[:0]),
    ]:
        assert set(compare(target, reference)) <= set(OutputComparison.__annotations__)


def test_judge_reads_the_declared_records() -> None:
    cov = coverage_from_assignment(
        [
            {"ep": "OpenVINOExecutionProvider", "nodes": [["MatMul", "a"]]},
            {"ep": "CPUExecutionProvider", "nodes": [["Softmax", "c"]]},
        ],
        "OpenVINOExecutionProvider",
    )
    num: Numeric = {
        "reference": "CPU EP, fp32 graph",
        "error": None,
        "bit_identical_to_cpu": False,
        "outputs": {"y": compare(np.ones(4), np.ones(4) * 1.5)},
    }
    verdict = judge(
        {"ep": "OpenVINOExecutionProvider", "precision": "fp16", "coverage": cov, "numeric": num},
        artifact_name="g",
        device_id="gpu:0",
        min_coverage=0.9,
        tolerance=Tolerance(),
    )
    assert not verdict.passed
    said = " | ".join(r.message for r in verdict.refusals)
    assert (
        "took 1 of 2 nodes (50.0%)" in said and "Softmax×1" in said
    )  # the coverage record, read by its keys
    assert "output 'y'" in said and "rel L2" in said  # the numeric record, read by its keys
