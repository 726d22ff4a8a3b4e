"""``export --force`` replaces an earlier artifact and nothing else; what a killed export left
is removed by the next export to that target; the artifact is flushed before it is renamed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.core.errors import ConfigError
from orchestrator.exporter.build import ExportRequest, export
from stages.exported_graph.artifact import load_artifact
from tests.helpers import REPO

pytestmark = [pytest.mark.ort]

MLP = ["export", "--from", "torch", "tests.orchestrator.exporter.tiny:mlp"]


def victim(root: Path) -> dict[str, str]:
    """A directory someone keeps (no artifact in it), and what it holds."""
    files = {"thesis.txt": "three years of work\n", "src/main.py": "print('mine')\n"}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return files


def held(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_force_refuses_a_directory_that_holds_no_artifact_and_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "victim"
    files = victim(target)

    def never(*a: Any, **k: Any) -> None:
        raise AssertionError("the source was exported before -o was checked")

    monkeypatch.setattr("orchestrator.exporter.sources.from_torch", never)
    code = main([*MLP, "-o", str(target), "--force"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.splitlines()
    assert lines[1].strip().startswith(f"-o {target}")
    assert (
        "holds no exported artifact" in lines[1] and "--force replaces only an earlier" in lines[1]
    )
    assert "src/, thesis.txt would be lost" in lines[1]
    assert "remove this one yourself" in err and "Traceback" not in err
    assert held(target) == files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim"]  # nothing else written


def test_a_target_that_stops_being_an_artifact_while_exporting_is_not_replaced(
    tmp_path: Path,
) -> None:
    target = tmp_path / "net"
    assert main([*MLP, "-o", str(target)]) == 0
    files: dict[str, str] = {}

    def meanwhile(phase: str) -> None:  # the user reuses the directory while the export runs
        if phase == "moving the artifact into place":
            for p in target.iterdir():
                if p.is_file():
                    p.unlink()
            files.update(victim(target))

    req = ExportRequest(
        source="torch", location="tests.orchestrator.exporter.tiny:mlp", out=target, force=True
    )
    with pytest.raises(ConfigError) as refused:
        export(req, step=meanwhile)
    assert "holds no exported artifact" in str(refused.value)
    assert held(target) == files  # kept as the user left it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net"]  # the work directory went


def test_force_replaces_an_empty_directory_and_an_earlier_artifact(tmp_path: Path) -> None:
    target = tmp_path / "net"
    target.mkdir()
    assert main([*MLP, "-o", str(target), "--force"]) == 0
    first = (target / "manifest.yaml").read_bytes()
    assert main([*MLP, "-o", str(target), "--force", "--name", "again"]) == 0
    assert load_artifact(target).manifest.name == "again"
    assert (target / "manifest.yaml").read_bytes() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net"]


KILLED = """
import sys
from pathlib import Path
from orchestrator.exporter.place import work_directory
with work_directory(Path(sys.argv[1])) as work:
    (work / "fp32.onnx").write_bytes(b"half an artifact")
    print(work, flush=True)
    sys.stdin.read()
"""


def test_what_a_killed_export_left_is_removed_by_the_next_export_to_that_target(
    tmp_path: Path,
) -> None:
    target = tmp_path / "net"
    other = tmp_path / "other"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", KILLED, str(t)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for t in (target, target, other)
    ]
    works = [Path(p.stdout.readline().strip()) for p in procs]  # type: ignore[union-attr]
    procs[0].kill()  # an export to net, killed
    procs[0].wait(timeout=30)
    procs[2].kill()  # one to another target, killed: not this export's to remove
    procs[2].wait(timeout=30)
    try:
        assert all(w.is_dir() for w in works)
        assert main([*MLP, "-o", str(target)]) == 0
        assert not works[0].exists()  # its writer is gone
        assert works[1].is_dir()  # an export to net still running
        assert works[2].is_dir()  # another target's
    finally:
        procs[1].communicate("", timeout=30)
    assert load_artifact(target).manifest.precisions


def test_the_artifact_is_flushed_to_the_disk_before_it_is_renamed_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "net"
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert main([*MLP, "-o", str(target)]) == 0
    names = sorted(p.name for p in target.iterdir())
    work = next(Path(s) for s in synced if s.endswith(".export"))
    # every file of the artifact, in the work directory (before the rename), its directory,
    # and the parent after the rename
    assert {Path(s).name for s in synced if Path(s).parent == work} >= set(names)
    assert str(work) in synced and synced[-1] == str(tmp_path)
