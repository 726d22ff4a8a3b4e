"""`omni-edge stages`: the kinds (built in, or which distribution's entry point), the exported
artifacts found (shipped, or under --path), and broken plugins listed by name with their error."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from tests.helpers import REPO

pytest.importorskip(
    "omni_edge_testkinds", reason="the test kinds' plugin is missing: run scripts/bootstrap.sh"
)
BROKEN_INSTALLED = any(
    ep.name == "broken_import" for ep in entry_points(group="omni_edge.stage_kinds")
)


def _listing(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, Any]]:
    code = main(["stages", "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def test_kinds_say_where_they_came_from_and_what_they_consume_and_produce(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, doc = _listing(capsys)
    assert code == 0
    assert doc["format"] == "omni-edge.stages/1"
    kinds = {k["name"]: k for k in doc["kinds"]}
    echo = kinds["echo"]
    assert (echo["source"], echo["target"], echo["distribution"]) == (
        "entry point",
        "omni_edge_testkinds.echo:EchoKind",
        "omni-edge-testkinds 0.1.0",
    )
    assert kinds["vad"]["source"] == "built in" and kinds["vad"]["distribution"] is None
    assert (kinds["vad"]["consumes"], kinds["vad"]["produces"]) == (["audio"], ["audio"])
    assert (kinds["asr"]["consumes"], kinds["asr"]["produces"]) == (["audio"], ["text"])
    assert (
        "ort-cpu" in kinds["exported_graph"]["backends"] and kinds["exported_graph"]["needs_gates"]
    )


def test_shipped_artifacts_are_listed_with_their_ports_precisions_and_origin(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _code, doc = _listing(capsys)
    arts = {a["name"]: a for a in doc["artifacts"] if a["ok"]}
    vad = arts["silero-vad"]
    assert (
        vad["dir"] == os.path.relpath(REPO / "exports" / "silero-vad")
        and vad["found_in"] == "shipped"
    )
    assert list(vad["precisions"]) == ["fp32"]
    assert [t["name"] for t in vad["inputs"]] == ["input", "state", "sr"]
    assert [t["name"] for t in vad["outputs"]] == ["output", "stateN"]
    assert vad["origin"].startswith("PyPI silero-vad 6.2.3")
    assert arts["qwen2.5-omni-token2wav"]["not_exported"] is True


def test_path_adds_artifacts_and_a_broken_manifest_is_listed_not_fatal(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    shutil.copytree(REPO / "exports" / "silero-vad-op18", tmp_path / "mine" / "vad-copy")
    (tmp_path / "mine" / "bad").mkdir()
    (tmp_path / "mine" / "bad" / "manifest.yaml").write_text(
        "format: omni-edge.export/1\nname: bad\nversion: '1'\n"
    )
    (tmp_path / "mine" / "checkpoint").mkdir()  # another kind of manifest: not an export, skipped
    (tmp_path / "mine" / "checkpoint" / "manifest.yaml").write_text("format: something-else/1\n")
    code, doc = _listing(capsys, "--path", str(tmp_path / "mine"))
    assert code == 0
    mine = [a for a in doc["artifacts"] if a["found_in"] == "path"]
    assert sorted((Path(a["dir"]).name, a["ok"]) for a in mine) == [
        ("bad", False),
        ("vad-copy", True),
    ]
    bad = next(a for a in mine if not a["ok"])
    assert bad["name"] == "bad" and "manifest.yaml" in bad["error"]
    assert main(["stages", "--json", "--strict", "--path", str(tmp_path / "mine")]) == 2
    capsys.readouterr()


def test_a_path_that_is_not_a_directory_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["stages", "--path", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "--path #1" in err and "not a directory" in err


@pytest.mark.skipif(
    not BROKEN_INSTALLED, reason="the broken test plugin is missing: run scripts/bootstrap.sh"
)
def test_broken_plugins_are_listed_by_name_exit_0_and_2_with_strict() -> None:
    """In a fresh interpreter, as a user runs it: the table fits 80 columns and marks them."""
    env = {**os.environ, "COLUMNS": "80"}
    cmd = [sys.executable, "-m", "orchestrator.cli", "stages"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
    out = " ".join(done.stdout.split())
    assert "BROKEN plugins" in out
    assert "broken_import" in out and "No module named 'omni_edge_no_such_dependency'" in out
    assert "not_a_kind" in out and "broken_hook" in out and "omni-edge-brokenplugin 0.1.0" in out
    assert "echo" in out and "omni-edge-testkinds 0.1.0" in out
    strict = subprocess.run(
        [*cmd, "--json", "--strict"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert strict.returncode == 2
    doc = json.loads(strict.stdout)
    failed = {(f["group"], f["name"]): f for f in doc["broken_plugins"]}
    assert set(failed) == {
        ("omni_edge.stage_kinds", "broken_import"),
        ("omni_edge.stage_kinds", "not_a_kind"),
        ("omni_edge.hooks", "broken_hook"),
    }
    assert failed[("omni_edge.stage_kinds", "broken_import")]["error"] == (
        "ModuleNotFoundError: No module named 'omni_edge_no_such_dependency'"
    )
