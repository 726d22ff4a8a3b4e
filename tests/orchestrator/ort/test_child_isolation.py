"""Every child interpreter omni-edge starts keeps the working directory off its ``sys.path`` and
starts somewhere private: the route worker of this interpreter (``-P``, its environment kept),
another route's (``-I``) and the llama.cpp check each child starts (``wire.safe_path_flags``).

Each test runs in a folder holding modules named like the ones those children import, each
writing a marker when imported, and checks that the child answered as it should and that no
marker exists."""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
from pathlib import Path

import pytest

from orchestrator.core import engines as engine_table
from orchestrator.core.profile import Route
from orchestrator.ort import wire, worker_probe
from orchestrator.ort.routes import probe_route
from orchestrator.ort.sessions import ResolvedRoute, WorkerSessions, private_cwd

MODULE = """import os
open(os.path.join({folder!r}, "MARKER-{name}"), "a").write(str(os.getpid()) + "\\n")
raise ImportError("{name}.py of the folder's owner")
"""

LLAMACPP = engine_table.row("llamacpp")
assert LLAMACPP is not None


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory: a folder whose numpy.py, onnxruntime.py, json.py and llama_cpp.py
    write markers when imported."""
    folder = tmp_path / "cloned"
    folder.mkdir()
    for name in ("numpy", "onnxruntime", "json", "llama_cpp"):
        (folder / f"{name}.py").write_text(MODULE.format(folder=str(folder), name=name))
    monkeypatch.chdir(folder)
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path / "cache"))
    return folder


def markers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("MARKER-*"))


@pytest.mark.ort
def test_this_interpreters_route_worker_imports_nothing_from_the_working_directory(
    planted: Path,
) -> None:
    """The probe of this interpreter (``probe``, ``plan``) runs it as a route worker: with the
    working directory first on its path it imported the folder's numpy.py and failed."""
    report = probe_route(Route(name="this-process"))
    assert report.reachable, report.reason
    assert "CPUExecutionProvider" in report.providers
    assert markers(planted) == []


@pytest.mark.ort
def test_a_route_worker_starts_in_a_private_empty_directory(planted: Path) -> None:
    sessions = WorkerSessions(ResolvedRoute("worker", "interpreter", sys.executable))
    try:
        assert sessions.probe()["providers"]
        cwd = os.readlink(f"/proc/{sessions.pid}/cwd")
        assert cwd == private_cwd() and cwd != str(planted)
        assert stat.S_IMODE(os.stat(cwd).st_mode) == 0o700
        assert os.listdir(cwd) == []
        with open(f"/proc/{sessions.pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        assert argv[1:3] == [b"-I", b"-c"]  # another route's interpreter: isolated
    finally:
        sessions.shutdown()
    assert markers(planted) == []


@pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed"
)
def test_the_llama_cpp_check_child_imports_the_installed_build(planted: Path) -> None:
    """The child that imports llama_cpp (a build for instructions this CPU lacks dies of SIGILL
    there, not in the worker) imported the folder's llama_cpp.py, and json.py before it."""
    found = worker_probe.engine_build(LLAMACPP.wire())
    assert found is not None and found["error"] is None, found
    assert found["system_info"]  # llama_print_system_info() of the installed build answered
    assert markers(planted) == []


def test_children_of_this_interpreter_are_started_without_the_unsafe_path() -> None:
    flags = wire.safe_path_flags()
    if sys.flags.isolated:
        assert flags == ["-I"]
    elif sys.version_info >= (3, 11):
        assert flags == ["-P"]
    else:  # 3.10 has no -P: the program's first statement drops the working directory
        assert flags == []
    for program in (wire.BOOTSTRAP, worker_probe.engine_build_program(LLAMACPP.wire())):
        assert program.startswith(wire.SAFE_PATH_PRELUDE)
