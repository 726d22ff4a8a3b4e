"""An exported stage verified in the OpenVINO route runs there, item by item."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.core.errors import StageFailed
from orchestrator.planner import plan_pipeline
from orchestrator.verify.run import verify_pipeline
from stages.exported_graph.kind import ExportedGraphKind
from tests.helpers.graphs import OV_PYTHON, K, cpu_outputs, machine_profile, write_artifact

pytestmark = [pytest.mark.openvino, pytest.mark.ort]


async def _items(*values: Any) -> AsyncIterator[Any]:
    for v in values:
        yield v


async def _collect(stream: AsyncIterator[Any]) -> list[Any]:
    return [x async for x in stream]


def _config(artifact: Path, tmp_path: Path, backends: list[str]) -> Any:
    from orchestrator.config import parse_config

    return parse_config(
        {
            "name": "p",
            "stages": [
                {
                    "name": "net",
                    "kind": "exported_graph",
                    "artifact": str(artifact),
                    "devices": ["cpu"],
                    "backends": backends,
                    "final_output": True,
                    "final_output_type": "tensor",
                }
            ],
        },
        where="t.yaml",
        base_dir=tmp_path,
    )


def test_a_stage_verified_in_the_openvino_route_runs_there_and_matches_the_cpu(
    tmp_path: Path,
) -> None:
    if not OV_PYTHON.exists():
        pytest.skip("no OpenVINO route")
    artifact = write_artifact(tmp_path / "full", "full")
    config = _config(artifact, tmp_path, ["ort-openvino"])
    profile = machine_profile()
    report = verify_pipeline(config, profile)
    assert [r.status for r in report.results] == ["passed"]

    plan = plan_pipeline(config, profile, runtime=False)
    stage_plan = plan.stage("net")
    assert (stage_plan.device, stage_plan.backend, stage_plan.route) == (
        "cpu",
        "ort-openvino",
        "openvino",
    )
    assert stage_plan.verification is not None and stage_plan.verification.status == "verified"

    runner = ExportedGraphKind().runner(stage_plan, config.stage("net"))
    runner.load()
    try:
        host = runner._host  # the worker of the route
        assert host.pid != os.getpid()
        assert runner.load_info["providers"][0] == "OpenVINOExecutionProvider"
        inputs = [
            {"x": np.random.RandomState(i).randn(3 + i, K).astype(np.float32)} for i in range(3)
        ]
        outputs = asyncio.run(_collect(runner.stream("r1", _items(*inputs))))
    finally:
        runner.close()
    tol = stage_plan.artifact["tolerance"]
    assert len(outputs) == 3
    for feeds, out in zip(inputs, outputs, strict=True):
        ref = cpu_outputs(artifact / "fp32.onnx", feeds)["y"]
        got = out["y"]
        assert got.shape == ref.shape
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= tol["rel_l2"]
        assert np.max(np.abs(got - ref)) <= tol["max_abs"]


def test_a_failed_request_names_the_stage_and_the_device(tmp_path: Path) -> None:
    # Two lengths that do not broadcast: the item fits the graph's inputs, and the
    # session itself fails (a mismatched item is a BadRequest before it: test_tensor_inputs.py).
    artifact = write_artifact(tmp_path / "add", "add_two")
    config = _config(artifact, tmp_path, ["ort-cpu"])
    plan = plan_pipeline(config, machine_profile(), runtime=False)
    runner = ExportedGraphKind().runner(plan.stage("net"), config.stage("net"))
    runner.load()
    try:
        with pytest.raises(StageFailed) as info:
            item = {"a": np.zeros(2, np.float32), "b": np.zeros(5, np.float32)}
            asyncio.run(_collect(runner.stream("r2", _items(item))))
    finally:
        runner.close()
    assert info.value.stage == "net" and info.value.device == "cpu"
    assert "request r2" in info.value.cause
