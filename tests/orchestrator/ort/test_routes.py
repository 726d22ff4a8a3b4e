"""Routes: probing, unreachable routes with their remedies, plan-time runtime identity."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orchestrator.core.errors import RefusalCode
from orchestrator.core.profile import Route, load_profile
from orchestrator.ort.routes import (
    probe_refusal,
    probe_route,
    runtime_identity,
    static_refusal,
)
from tests.helpers.graphs import OV_PYTHON, REPO, machine_profile


def _fake_python(tmp_path: Path, body: str) -> Path:
    exe = tmp_path / "bin" / "python"
    exe.parent.mkdir(parents=True)
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


@pytest.mark.ort
def test_this_interpreter_lacks_the_openvino_ep_and_is_refused_with_its_remedy() -> None:
    profile = machine_profile()
    device = profile.device("cpu")
    assert device is not None
    report = probe_route(Route(name="this-process"))
    assert report.reachable and report.ort_distribution == "onnxruntime"
    assert "CPUExecutionProvider" in report.providers
    refusal = probe_refusal(report, device, "ort-openvino")
    assert refusal is not None
    assert refusal.code == RefusalCode.DEVICE_UNREACHABLE
    assert "not OpenVINOExecutionProvider" in refusal.message
    assert f"onnxruntime=={report.ort_version}" in refusal.message
    assert "python -m venv .venvs/openvino" in refusal.remedy
    assert "pip install onnxruntime-openvino" in refusal.remedy
    assert "backend_routes" in refusal.remedy
    assert probe_refusal(report, device, "ort-cpu") is None


@pytest.mark.openvino
def test_the_openvino_route_offers_its_ep_and_the_plan_time_identity_matches_the_probe() -> None:
    if not OV_PYTHON.exists():
        pytest.skip("no OpenVINO route")
    route = Route(name="openvino", kind="interpreter", python=str(OV_PYTHON))
    report = probe_route(route)
    assert report.reachable, report.reason
    assert report.offers("OpenVINOExecutionProvider")
    assert report.assignment_api
    # Evidence keys are made at plan time without starting the route; they must
    # name the same build the probe (and therefore the gates) saw.
    assert (
        runtime_identity(route) == report.runtime == f"onnxruntime-openvino=={report.ort_version}"
    )


def test_missing_interpreter_is_unreachable_with_the_venv_to_create(tmp_path: Path) -> None:
    missing = tmp_path / "venvs" / "npu" / "bin" / "python"
    report = probe_route(Route(name="npu-env", kind="interpreter", python=str(missing)))
    assert not report.reachable
    assert report.reason == f"the interpreter {missing} does not exist"
    assert f"python -m venv {tmp_path / 'venvs' / 'npu'}" in report.remedy
    profile = machine_profile()
    device = profile.device("cpu")
    assert device is not None
    refusal = probe_refusal(report, device, "ort-openvino")
    assert refusal is not None and refusal.code == RefusalCode.DEVICE_UNREACHABLE
    assert "route 'npu-env' is unreachable" in refusal.message


def test_interpreter_that_cannot_run_the_worker_is_unreachable_with_its_own_words(
    tmp_path: Path,
) -> None:
    exe = _fake_python(
        tmp_path, "echo \"ModuleNotFoundError: No module named 'numpy'\" >&2; exit 1"
    )
    report = probe_route(Route(name="bare", kind="interpreter", python=str(exe)))
    assert not report.reachable
    assert "exited with code 1" in report.reason
    assert "No module named 'numpy'" in report.reason
    assert (
        report.remedy
        == f"{exe} -m pip install numpy (the route worker needs numpy and onnxruntime)"
    )


def test_a_hung_interpreter_is_cut_off_by_the_timeout(tmp_path: Path) -> None:
    exe = _fake_python(tmp_path, "exec sleep 30")
    report = probe_route(Route(name="hung", kind="interpreter", python=str(exe)), timeout=1.0)
    assert not report.reachable
    assert "'probe' did not answer within 1 s; the worker was killed" in report.reason


def test_npu_from_inside_wsl2_is_unreachable_without_a_host_process_route() -> None:
    profile = load_profile(REPO / "configs/profiles/strix-point-rtx5090-wsl.json")
    npu = profile.device("npu:0")
    assert npu is not None
    refusal = static_refusal(profile, npu, "ort-vitisai")
    assert refusal is not None and refusal.code == RefusalCode.DEVICE_UNREACHABLE
    assert "inside WSL2" in refusal.message
    assert "python.exe" in refusal.remedy and "natively on Windows" in refusal.remedy
    # The GPU is reachable from WSL (CUDA on WSL): no refusal.
    gpu = profile.device("gpu:0")
    assert gpu is not None and static_refusal(profile, gpu, "ort-cuda") is None


def test_a_declared_host_process_route_is_how_wsl_reaches_the_npu() -> None:
    doc = load_profile(REPO / "configs/profiles/strix-point-rtx5090-wsl.json").model_dump()
    doc["routes"].append(
        {
            "name": "windows-ryzen-ai",
            "kind": "host-process",
            "python": "/mnt/c/Users/me/ryzen-ai/python.exe",
        }
    )
    for d in doc["devices"]:
        if d["id"] == "npu:0":
            d["route"] = "windows-ryzen-ai"
    from orchestrator.core.profile import parse_profile

    profile = parse_profile(doc)
    npu = profile.device("npu:0")
    assert npu is not None and static_refusal(profile, npu, "ort-vitisai") is None


def test_runtime_identity_reads_dist_info_without_running_the_interpreter(tmp_path: Path) -> None:
    exe = _fake_python(tmp_path, "exit 99")  # would fail if it were run
    site = tmp_path / "lib" / "python3.12" / "site-packages"
    (site / "onnxruntime_directml-1.23.0.dist-info").mkdir(parents=True)
    assert (
        runtime_identity(Route(name="dml", kind="interpreter", python=str(exe)))
        == "onnxruntime-directml==1.23.0"
    )
    assert (
        runtime_identity(
            Route(name="none", kind="interpreter", python=str(tmp_path / "nope" / "python"))
        )
        is None
    )


def test_relative_route_paths_resolve_against_the_given_base(tmp_path: Path) -> None:
    from orchestrator.ort.routes import resolve

    r = resolve(Route(name="v", kind="interpreter", python="venv/bin/python"), tmp_path)
    assert r.python == os.path.join(str(tmp_path), "venv/bin/python")
    assert resolve(Route(name="this-process")).in_process
