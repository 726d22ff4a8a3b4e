"""A folder someone else made cannot make omni-edge run its code (docs/reliability.md, "What
omni-edge trusts").

People run omni-edge inside folders they cloned or downloaded. Each test here builds such a
folder as its owner would to attack: a ``.venvs/openvino/bin/python`` (git keeps the
executable bit), modules named like the ones omni-edge's processes import (``numpy.py``,
``onnxruntime.py``, ``json.py``, ``llama_cpp.py``) and a recorded profile whose route is a
script — every piece writes a marker file into the folder when it runs. omni-edge is run
there as a user runs it (the installed ``omni-edge`` script, the folder as working
directory), and each test checks that no marker exists and that the command worked, or said
what it refused (exit 2: where → what → how to fix)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from orchestrator.cli import main
from tests.helpers import REPO
from tests.helpers.graphs import EMBEDDING, OV_PYTHON, write_artifact

SETTINGS_ENV = "OMNI_EDGE_SETTINGS"
"""The user's settings file, as docs/reliability.md names it."""

OMNI_EDGE = Path(sys.executable).with_name("omni-edge")
"""The console script pip installed: what a user runs (``python -m`` would put the working
directory first on sys.path by Python's own rule, before omni-edge runs)."""

MODULES = ("numpy", "onnxruntime", "json", "llama_cpp")

MODULE = """import os
with open(os.path.join({folder!r}, "MARKER-{name}"), "a") as f:
    f.write(str(os.getpid()) + "\\n")
raise ImportError("{name}.py of the folder's owner")
"""

SCRIPT = """#!/bin/sh
echo "$$" >> '{marker}'
exec '{python}' "$@"
"""
"""An interpreter that works (it runs this one) after writing its marker: what an attacker's
route would do to go unnoticed."""


def marker_python(path: Path, folder: Path, name: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SCRIPT.format(marker=folder / f"MARKER-{name}", python=sys.executable))
    path.chmod(0o755)
    return path


def attacker_folder(tmp_path: Path) -> Path:
    """A cloned folder: route environments, modules named like real ones, a script route."""
    folder = tmp_path / "cloned"
    for env in ("openvino", "ep-openvino"):
        marker_python(folder / ".venvs" / env / "bin" / "python", folder, f"venv-{env}")
    for name in MODULES:
        (folder / f"{name}.py").write_text(MODULE.format(folder=str(folder), name=name))
    marker_python(folder / "venv" / "bin" / "python", folder, "profile-route")
    return folder


def markers(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.glob("MARKER-*"))}


def box_profile(folder: Path) -> Path:
    """A recorded profile that describes this machine (Linux, no CPU named) whose route
    ``box-venv`` is the folder's script, named relative to the profile as profiles may."""
    path = folder / "box.json"
    path.write_text(
        json.dumps(
            {
                "format": "omni-edge.profile/1",
                "name": "a shared box",
                "host": {
                    "os": "linux",
                    "wsl": False,
                    "ram_total_bytes": 32 * 2**30,
                    "ram_available_bytes": 16 * 2**30,
                },
                "devices": [
                    {
                        "id": "cpu",
                        "kind": "cpu",
                        "name": "a CPU",
                        "backends": ["llamacpp-cpu", "ort-openvino", "ort-cpu"],
                        "backend_routes": {"llamacpp-cpu": "box-venv", "ort-openvino": "box-venv"},
                    }
                ],
                "routes": [
                    {"name": "this-process"},
                    {"name": "box-venv", "kind": "interpreter", "python": "venv/bin/python"},
                ],
            }
        )
    )
    return path


def graph_config(folder: Path, artifact: Path, backends: list[str]) -> Path:
    path = folder / "pipeline.yaml"
    stage = {
        "name": "net",
        "kind": "exported_graph",
        "artifact": str(artifact),
        "devices": ["cpu"],
        "backends": backends,
        "final_output": True,
        "final_output_type": "tensor",
    }
    path.write_text(yaml.safe_dump({"name": "tiny", "stages": [stage]}))
    return path


def omni_edge(args: list[str], cwd: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``omni-edge ARGS`` in ``cwd`` with a cold cache of its own and no settings file."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        OMNI_EDGE_CACHE_DIR=str(tmp_path / "cache"),
        **{SETTINGS_ENV: str(tmp_path / "no-settings.yaml")},
    )
    return subprocess.run(
        [str(OMNI_EDGE), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture
def no_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own (absent) settings file and a cold cache: nothing the machine's user set."""
    monkeypatch.setenv(SETTINGS_ENV, str(tmp_path / "no-settings.yaml"))
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "no-settings.yaml"


# ---- the working directory: route environments and modules ------------------------------------


@pytest.mark.ort
def test_probe_and_plan_in_a_cloned_folder_run_none_of_its_code(tmp_path: Path) -> None:
    """Route environments are looked for next to the installation, never in the working
    directory; every interpreter probe starts (this one's worker, a route's, the llama.cpp
    check) runs with the working directory off sys.path, in a private directory."""
    folder = attacker_folder(tmp_path)
    artifact = write_artifact(tmp_path / "art", "projection")
    config = graph_config(folder, artifact, ["ort-openvino", "ort-cpu"])

    probe = omni_edge(["probe", "--json"], folder, tmp_path)
    assert probe.returncode == 0, probe.stderr
    routes = {r["name"]: r for r in json.loads(probe.stdout)["routes"]}
    assert all(str(folder) not in (r.get("python") or "") for r in routes.values()), routes
    here = routes["this-process"]
    assert here["reachable"] and "CPUExecutionProvider" in here["providers"], here
    if OV_PYTHON.exists():  # the installation's own route is still found (scripts/bootstrap.sh)
        ov = routes["openvino-venv"]
        assert ov["python"] == str(OV_PYTHON)
        assert "OpenVINOExecutionProvider" in ov["providers"], ov

    plan = omni_edge(["plan", str(config), "--json"], folder, tmp_path)
    assert plan.returncode == 0, plan.stderr
    (net,) = json.loads(plan.stdout)["stages"]
    assert net["admitted"], net
    assert markers(folder) == {}


@pytest.mark.ray
@pytest.mark.ort
def test_run_in_a_cloned_folder_imports_none_of_its_modules_in_ray_workers(tmp_path: Path) -> None:
    """The graph runs in the device actor (a Ray worker, this-process route): Ray ships the
    driver's working directory to its workers and puts it first on their sys.path unless
    told otherwise, and the worker imports numpy and onnxruntime."""
    folder = attacker_folder(tmp_path)
    artifact = write_artifact(tmp_path / "art", "projection")
    config = graph_config(folder, artifact, ["ort-cpu"])
    profile = folder / "profile.json"
    profile.write_text(
        json.dumps(
            {
                "format": "omni-edge.profile/1",
                "name": "test box",
                "host": {"os": "linux", "ram_total_bytes": 2**34, "ram_available_bytes": 2**33},
                "devices": [{"id": "cpu", "kind": "cpu", "name": "c", "backends": ["ort-cpu"]}],
                "routes": [{"name": "this-process"}],
            }
        )
    )
    request = tmp_path / "x.npy"
    np.save(request, np.random.RandomState(3).randn(EMBEDDING).astype(np.float32))
    run = omni_edge(
        [
            "run",
            str(config),
            "--profile",
            str(profile),
            "--input",
            str(request),
            "--json",
            "--record",
            str(tmp_path / "record.json"),
        ],
        folder,
        tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert list(json.loads(run.stdout)["outputs"]) == ["net"]
    assert markers(folder) == {}


# ---- a recorded profile ----------------------------------------------------------------------


def _count_children(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every process this one starts from now on (subprocess, fork, spawn, system, exec)."""
    started: list[Any] = []
    original = subprocess.Popen.__init__

    def popen(self: Any, *args: Any, **kwargs: Any) -> None:
        started.append(args[0] if args else kwargs.get("args"))
        original(self, *args, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve"):
        if hasattr(os, name):
            real = getattr(os, name)

            def wrapped(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
                started.append((_name, args[:1]))
                return _real(*args, **kwargs)

            monkeypatch.setattr(os, name, wrapped)
    return started


def test_plan_against_a_recorded_profile_starts_no_process(
    tmp_path: Path,
    no_settings: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The profile describes this machine and routes llama.cpp and OpenVINO through its own
    script: planning reads the profile (the build it does not record is not checked, and a
    warning says so) and starts nothing — nor for any shipped profile."""
    folder = attacker_folder(tmp_path)
    profile = box_profile(folder)
    default = REPO / "configs" / "voice-assistant.yaml"
    monkeypatch.chdir(folder)
    started = _count_children(monkeypatch)
    code = main(["plan", str(default), "--profile", str(profile), "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    stages = {s["name"]: s for s in json.loads(out.out)["stages"]}
    assert stages["thinker"]["backend"] == "llamacpp-cpu"
    assert (
        "route 'box-venv': its llama.cpp build is neither recorded in the profile nor probed"
        in (caplog.text)
    )
    for shipped in sorted((REPO / "configs" / "profiles").glob("*.json")):
        assert main(["plan", str(default), "--profile", str(shipped), "--json"]) in (0, 3)
    capsys.readouterr()
    assert started == []
    assert markers(folder) == {}


@pytest.mark.ort
def test_verify_and_run_refuse_a_profile_route_the_user_did_not_set_up(
    tmp_path: Path,
    no_settings: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Verify and run start the routes' interpreters: one a profile names is started only when
    it is this environment's, a route directory's or named in the user's settings. Otherwise
    exit 2 before anything starts, naming the profile's route, why and the fix."""
    folder = attacker_folder(tmp_path)
    profile = box_profile(folder)
    artifact = write_artifact(tmp_path / "art", "projection")
    config = graph_config(folder, artifact, ["ort-openvino", "ort-cpu"])
    request = tmp_path / "x.npy"
    np.save(request, np.zeros(EMBEDDING, dtype=np.float32))
    monkeypatch.chdir(folder)
    script = folder / "venv" / "bin" / "python"
    for args in (
        ["verify", str(config), "--profile", str(profile)],
        ["run", str(config), "--profile", str(profile), "--input", str(request)],
    ):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert f"{profile}: routes[1].python: route 'box-venv': {script} is not an interpreter" in (
            err.replace("\n", " ")
        ), err
        assert "a profile describes a machine" in err
        assert "how to fix:" in err and str(no_settings) in err and "routes:" in err
    assert markers(folder) == {}

    # the user names it in their settings: now it is theirs to run, and verify starts it
    no_settings.write_text(yaml.safe_dump({"routes": {"box-venv": str(script)}}))
    assert main(["verify", str(config), "--profile", str(profile), "--json"]) in (0, 3)
    capsys.readouterr()
    assert list(markers(folder)) == ["MARKER-profile-route"]
