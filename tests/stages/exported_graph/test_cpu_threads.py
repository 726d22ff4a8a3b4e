"""An exported stage's ONNX Runtime session runs the plan's CPU threads, in a route worker too."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import parse_config
from orchestrator.core.backends import with_cpu_threads
from orchestrator.core.profile import Route
from orchestrator.planner import plan_pipeline
from stages.exported_graph.kind import ExportedGraphKind
from tests.helpers.graphs import OV_PYTHON, machine_profile, write_artifact

pytestmark = [pytest.mark.ort]


def _config(artifact: Path, tmp_path: Path, backends: list[str], threads: int | None = None) -> Any:
    stage: dict[str, Any] = {
        "name": "net",
        "kind": "exported_graph",
        "artifact": str(artifact),
        "devices": ["cpu"],
        "backends": backends,
        "final_output": True,
        "final_output_type": "tensor",
    }
    if threads is not None:
        stage["cpu_threads"] = threads
    return parse_config({"name": "p", "stages": [stage]}, where="t.yaml", base_dir=tmp_path)


def _threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_the_session_spec_carries_the_threads_and_the_original_is_unchanged() -> None:
    spec = {
        "graph": "g.onnx",
        "providers": ["OpenVINOExecutionProvider", "CPUExecutionProvider"],
        "provider_options": [{"device_type": "CPU"}, {}],
        "session_options": {"enable_mem_pattern": False},
        "session_config": {},
    }
    out = with_cpu_threads(spec, 3)
    assert out["session_options"] == {
        "enable_mem_pattern": False,
        "intra_op_num_threads": 3,
        "inter_op_num_threads": 1,
    }
    assert out["provider_options"] == [{"device_type": "CPU", "num_of_threads": "3"}, {}]
    # the cores are shared: the thread pools sleep between calls instead of spinning
    assert out["session_config"] == {
        "session.intra_op.allow_spinning": "0",
        "session.inter_op.allow_spinning": "0",
    }
    assert spec["session_options"] == {"enable_mem_pattern": False} and spec["provider_options"][
        0
    ] == {"device_type": "CPU"}
    assert spec["session_config"] == {}
    assert with_cpu_threads(spec, None) is spec  # no budget: ONNX Runtime's own default


def test_spinning_is_kept_on_request_and_a_spec_s_own_entry_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = {
        "graph": "g.onnx",
        "providers": ["CPUExecutionProvider"],
        "provider_options": [{}],
        "session_options": {},
        "session_config": {"session.intra_op.allow_spinning": "1"},
    }
    assert with_cpu_threads(spec, 2)["session_config"] == {
        "session.intra_op.allow_spinning": "1",
        "session.inter_op.allow_spinning": "0",
    }
    monkeypatch.setenv("OMNI_EDGE_ORT_SPINNING", "1")
    spec["session_config"] = {}
    assert with_cpu_threads(spec, 2)["session_config"] == {}


@pytest.mark.skipif(
    not Path("/proc/self/task").is_dir(), reason="platform: counts threads in /proc"
)
def test_a_route_worker_opens_the_session_with_the_plans_intra_op_threads(tmp_path: Path) -> None:
    """ONNX Runtime's intra-op pool of k threads is the caller and k-1 workers it starts when
    the session opens: two route workers alike but for cpu_threads (1 and 4) differ by three
    threads, and a planned budget reaches the worker the same way."""
    artifact = write_artifact(tmp_path / "full", "full")
    worker = Route(name="worker", kind="interpreter", python=sys.executable)
    counts = {}
    for threads in (1, 4):
        config = _config(artifact, tmp_path, ["ort-cpu"], threads)
        stage_plan = plan_pipeline(config, machine_profile(), runtime=False).stage("net")
        assert (stage_plan.cpu_threads, stage_plan.cpu_threads_from) == (threads, "config")
        runner = ExportedGraphKind().runner(stage_plan, config.stage("net"), worker)
        runner.load()
        try:
            pid = runner._host.pid  # type: ignore[attr-defined]
            assert pid != os.getpid()
            counts[threads] = _threads_of(pid)
        finally:
            runner.close()
    assert counts[4] - counts[1] == 3

    profile = machine_profile()
    profile = profile.model_copy(update={"host": profile.host.model_copy(update={"cpu_cores": 4})})
    config = _config(artifact, tmp_path, ["ort-cpu"])
    stage_plan = plan_pipeline(config, profile, runtime=False).stage("net")
    assert (stage_plan.cpu_threads, stage_plan.cpu_threads_from) == (
        4,
        "plan",
    )  # one stage: every core
    runner = ExportedGraphKind().runner(stage_plan, config.stage("net"), worker)
    runner.load()
    try:
        assert _threads_of(runner._host.pid) == counts[4]  # type: ignore[attr-defined]
    finally:
        runner.close()


@pytest.mark.openvino
def test_the_openvino_ep_on_the_cpu_takes_the_threads_as_its_own_option(tmp_path: Path) -> None:
    if not OV_PYTHON.exists():
        pytest.skip("no OpenVINO route")
    artifact = write_artifact(tmp_path / "full", "full")
    config = _config(artifact, tmp_path, ["ort-openvino"], 2)
    stage_plan = plan_pipeline(config, machine_profile(), runtime=False).stage("net")
    assert stage_plan.backend == "ort-openvino"
    runner = ExportedGraphKind().runner(stage_plan, config.stage("net"))
    runner.load()
    try:
        assert runner.load_info["providers"][0] == "OpenVINOExecutionProvider"
        assert runner.load_info["ep_options"]["given"]["num_of_threads"] == "2"
    finally:
        runner.close()
