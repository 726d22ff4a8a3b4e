"""The host-process route (WSL2 → a Windows-side python.exe), exercised on Linux.

There is no Windows here. A Linux interpreter stands in for ``python.exe``
(tests/helpers/hostproc.py): a script named ``python.exe`` that runs this environment's Python and, like
Windows, can open only Windows-spelled paths — a ``\\\\wsl.localhost\\<distro>\\...``
path (WSL's share of the Linux files) or a drive path; a raw ``/home/...`` path
fails there as it would on Windows. Path translation is checked against
recorded ``wslpath -w`` output (wslpath_recorded.json). What this cannot show:
WSL interop itself, the Windows file share, and the DirectML/VitisAI EPs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from orchestrator.cli import main
from orchestrator.core.profile import Route, load_profile
from orchestrator.ort import hostproc, wire
from orchestrator.ort.hostproc import PathTranslationError, route_kind_for, translate, windows_path
from orchestrator.ort.routes import resolve
from orchestrator.ort.sessions import ResolvedRoute, RouteError, open_sessions
from tests.helpers import REPO
from tests.helpers.graphs import GRAPHS, cpu_outputs, write_artifact
from tests.helpers.hostproc import (
    DISTRO,
    log_lines,
    standin_profile,
    standin_python,
    trust_standin,
)

RECORDED = json.loads((Path(__file__).parent / "wslpath_recorded.json").read_text())["pairs"]
HOSTPROC = REPO / "configs/profiles/strix-point-rtx5090-wsl-hostproc.json"


@pytest.fixture
def inside_wsl(monkeypatch: pytest.MonkeyPatch) -> None:
    """WSL's environment as far as translation sees it: a distribution name, no wslpath on PATH."""
    monkeypatch.setenv("WSL_DISTRO_NAME", DISTRO)
    monkeypatch.setattr(hostproc.shutil, "which", lambda *a, **k: None)


# ---- path translation ---------------------------------------------------------------


@pytest.mark.parametrize("pair", RECORDED, ids=lambda p: p["path"])
def test_translation_matches_recorded_wslpath_output(pair: dict[str, str]) -> None:
    assert translate(pair["path"], distro=pair["distro"], share=pair["share"]) == pair["windows"]


def test_translation_normalises_and_refuses_relative_paths() -> None:
    assert (
        translate("/home//me/./a/../x.onnx", distro="Ubuntu")
        == "\\\\wsl.localhost\\Ubuntu\\home\\me\\x.onnx"
    )
    assert translate("/mnt/c", distro="Ubuntu") == "C:\\"
    assert (
        translate("/mnt/wsl/x", distro="Ubuntu") == "\\\\wsl.localhost\\Ubuntu\\mnt\\wsl\\x"
    )  # not a drive
    with pytest.raises(PathTranslationError):
        translate("rel/x.onnx", distro="Ubuntu")


def test_wslpath_itself_is_asked_when_it_is_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in wslpath that replays the recorded pairs: its answer is what the route uses."""
    replay = {p["path"]: p["windows"] for p in RECORDED}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "replay.json").write_text(json.dumps(replay))
    fake = bin_dir / "wslpath"
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\nassert sys.argv[1] == '-w'\n"
        f"print(json.load(open({str(bin_dir / 'replay.json')!r}))[sys.argv[2]])\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("WSL_DISTRO_NAME", raising=False)
    hostproc._wslpath.cache_clear()
    for path, expected in replay.items():
        assert windows_path(path) == expected
    route = ResolvedRoute(
        "win", "host-process", "/mnt/c/omni-edge/venv-directml/Scripts/python.exe"
    )
    assert route.path_for_route(RECORDED[2]["path"]) == RECORDED[2]["windows"]
    assert (
        ResolvedRoute("venv", "interpreter", "/opt/venv/bin/python").path_for_route("/home/me/x")
        == "/home/me/x"
    )


def test_without_wslpath_or_a_distribution_the_route_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("WSL_DISTRO_NAME", raising=False)
    monkeypatch.setattr(hostproc.shutil, "which", lambda *a, **k: None)
    route = ResolvedRoute("win", "host-process", "/mnt/c/x/python.exe")
    with pytest.raises(
        RouteError, match="no wslpath on PATH and WSL_DISTRO_NAME is not set"
    ) as info:
        route.path_for_route("/home/me/x.onnx")
    assert "inside WSL2" in info.value.remedy


def test_an_exe_given_from_inside_wsl_is_a_host_process_route() -> None:
    assert (
        route_kind_for("/mnt/c/omni-edge/venv-directml/Scripts/python.exe", wsl=True)
        == "host-process"
    )
    assert (
        route_kind_for("/mnt/c/omni-edge/venv-directml/Scripts/python.exe", wsl=False)
        == "interpreter"
    )
    assert route_kind_for(".venvs/openvino/bin/python", wsl=True) == "interpreter"


# ---- a real session through the stand-in ----------------------------------------------


@pytest.mark.ort
def test_a_session_opens_and_runs_through_the_stand_in_route(
    tmp_path: Path, inside_wsl: None
) -> None:
    exe, log = standin_python(tmp_path)
    art = write_artifact(tmp_path / "art", "full")
    graph = art / "fp32.onnx"
    route = resolve(Route(name="windows-directml", kind="host-process", python=str(exe)))
    sessions = open_sessions(route)
    try:
        info = sessions.probe()
        assert "CPUExecutionProvider" in info["providers"]
        opened = sessions.open(
            {
                "graph": str(graph),
                "providers": ["CPUExecutionProvider"],
                "provider_options": [{}],
                "session_options": {},
                "session_config": {},
            }
        )
        feeds = GRAPHS["full"][1]()
        out = sessions.run(opened["handle"], feeds)["outputs"]
    finally:
        sessions.shutdown()
    expected = cpu_outputs(graph, feeds)
    assert set(out) == set(expected) and all(np.array_equal(out[k], expected[k]) for k in expected)
    lines = log_lines(log)
    assert lines[0]["argv"] == ["-I", "-c", wire.BOOTSTRAP]  # started as every route worker is
    # the worker was handed the Windows spelling of the graph, as wslpath -w writes it
    assert lines[1]["graph"] == f"\\\\wsl.localhost\\{DISTRO}" + str(graph).replace("/", "\\")


@pytest.mark.ort
def test_an_untranslated_path_fails_in_the_stand_in_as_on_windows(
    tmp_path: Path, inside_wsl: None
) -> None:
    """The stand-in is not lenient: a route that skipped translation would fail here."""
    exe, _ = standin_python(tmp_path)
    graph = write_artifact(tmp_path / "art", "full") / "fp32.onnx"
    sessions = open_sessions(
        ResolvedRoute("windows", "interpreter", str(exe))
    )  # an interpreter route: no translation
    try:
        with pytest.raises(Exception, match="cannot find the path specified"):
            sessions.open(
                {
                    "graph": str(graph),
                    "providers": ["CPUExecutionProvider"],
                    "provider_options": [{}],
                }
            )
    finally:
        sessions.shutdown()


@pytest.mark.ort
def test_verify_goes_through_the_host_process_route(
    tmp_path: Path,
    inside_wsl: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(
        "orchestrator.verify.run.running_in_wsl", lambda: True
    )  # the stand-in's premise
    exe, log = standin_python(tmp_path)
    trust_standin(exe, monkeypatch)  # the user's settings name it: verify may start it
    write_artifact(tmp_path / "art", "full")
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "tiny",
                "stages": [
                    {
                        "name": "net",
                        "kind": "exported_graph",
                        "artifact": "art",
                        "devices": ["cpu"],
                        "backends": ["ort-cpu"],
                        "final_output": True,
                    }
                ],
            }
        )
    )
    profile = standin_profile(tmp_path / "profile.json", exe)
    assert main(["verify", str(config), "--profile", str(profile), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(r["backend"], r["status"]) for r in doc["results"]] == [("ort-cpu", "passed")]
    assert doc["plan"]["stages"]["net"] == {
        "device": "cpu",
        "backend": "ort-cpu",
        "verification": "verified",
    }
    graphs = [line["graph"] for line in log_lines(log) if "graph" in line]
    assert graphs and all(g.startswith(f"\\\\wsl.localhost\\{DISTRO}\\") for g in graphs)


# ---- the shipped WSL profile with host-process routes --------------------------------------


def test_the_hostproc_profile_reaches_the_igpu_and_npu_through_windows_python() -> None:
    p = load_profile(HOSTPROC)
    assert p.host.wsl
    for device_id, backend, route_name in (
        ("igpu:0", "ort-dml", "windows-directml"),
        ("npu:0", "ort-vitisai", "windows-ryzen-ai"),
    ):
        device = p.device(device_id)
        assert device is not None
        route = p.route(device.route_for(backend))
        assert route is not None and route.name == route_name
        assert (
            route.kind == "host-process"
            and route.reachable
            and (route.python or "").endswith("python.exe")
        )


def test_plan_puts_the_thinker_on_the_rtx_through_vllm_and_the_voice_on_windows(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path / "cache"))
    code = main(
        ["plan", str(REPO / "configs/voice-assistant.yaml"), "--profile", str(HOSTPROC), "--json"]
    )
    plan = json.loads(capsys.readouterr().out)
    assert code == 0 and plan["admitted"]
    stages = {s["name"]: s for s in plan["stages"]}
    assert (
        stages["thinker"]["device"],
        stages["thinker"]["backend"],
        stages["thinker"]["route"],
    ) == ("gpu:0", "vllm-cuda", "this-process")
    voice = stages["voice"]
    # the NPU is reachable now; it is the voice's fp32-only graph that keeps it off (VitisAI runs int8/bf16)
    assert (voice["device"], voice["backend"], voice["route"]) == (
        "igpu:0",
        "ort-dml",
        "windows-directml",
    )
    assert voice["verification"]["details"]["route"]["kind"] == "host-process"
    npu = [r for r in voice["refusals"] if r["device"] == "npu:0"]
    assert [r["code"] for r in npu] == ["no_exported_graph"]
    # the same laptop without the host-process routes: the voice falls back to the CPU
    code = main(
        [
            "plan",
            str(REPO / "configs/voice-assistant.yaml"),
            "--profile",
            str(REPO / "configs/profiles/strix-point-rtx5090-wsl.json"),
            "--json",
        ]
    )
    wsl = {s["name"]: s for s in json.loads(capsys.readouterr().out)["stages"]}
    assert code == 0 and wsl["voice"]["device"] == "cpu"
    assert {r["code"] for r in wsl["voice"]["refusals"]} == {"device_unreachable_from_this_process"}


def test_the_stand_in_is_started_the_way_wsl_interop_starts_an_exe(tmp_path: Path) -> None:
    """A sanity check of the stand-in itself: it runs as a program named python.exe."""
    exe, log = standin_python(tmp_path)
    proc = subprocess.run(
        [str(exe), "-I", "-c", "x"], input=b"0\n", capture_output=True, timeout=60
    )
    assert proc.returncode != 0  # an empty program has no main(): it fails, after logging its argv
    assert log_lines(log)[0]["argv"] == ["-I", "-c", "x"]


@pytest.mark.ort
def test_probe_route_with_a_windows_exe_from_wsl_declares_a_host_process_route(
    tmp_path: Path,
    inside_wsl: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(
        "orchestrator.probe.host.running_in_wsl", lambda: True
    )  # the stand-in's premise
    exe, _ = standin_python(tmp_path)
    assert (
        main(["probe", "--json", "--no-default-routes", "--route", f"windows-directml={exe}"]) == 0
    )
    routes = {r["name"]: r for r in json.loads(capsys.readouterr().out)["routes"]}
    win = routes["windows-directml"]
    assert (win["kind"], win["python"], win["reachable"]) == ("host-process", str(exe), True)
    assert "CPUExecutionProvider" in win["providers"]


def test_an_exe_that_cannot_be_started_names_wsl_interop(tmp_path: Path) -> None:
    """What a laptop with interop switched off shows: the .exe exists but cannot be executed."""
    from orchestrator.ort.routes import probe_route

    exe = tmp_path / "Scripts" / "python.exe"
    exe.parent.mkdir()
    exe.write_bytes(b"MZ\x90\x00")  # a PE header stub, not executable here
    report = probe_route(
        Route(name="windows-directml", kind="host-process", python=str(exe)), timeout=10
    )
    assert not report.reachable and f"cannot start {exe}" in report.reason
    assert "WSLInterop" in report.remedy and "[interop] enabled=true" in report.remedy
