"""``export --from torch module:factory`` finds the user's own module in the working directory,
as ``python -m`` would, but never lets that directory replace an installed package, and
leaves nothing of it on ``sys.path`` afterwards.

The folder holds the factory's module and modules named like ones the export imports after
it (``onnxruntime.py`` for the gates, ``onnxscript.py``), each writing a marker if imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import main

pytestmark = [pytest.mark.ort]

FACTORY = """import torch


def mlp():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    return module, {"x": torch.randn(2, 4)}
"""

MODULE = """import os
open(os.path.join({folder!r}, "MARKER-{name}"), "a").write(str(os.getpid()))
raise ImportError("{name}.py of the folder")
"""


def folder(tmp_path: Path) -> Path:
    here = tmp_path / "project"
    here.mkdir()
    (here / "mymodels.py").write_text(FACTORY)
    for name in ("onnxruntime", "onnxscript"):
        (here / f"{name}.py").write_text(MODULE.format(folder=str(here), name=name))
    return here


def test_the_factory_is_found_in_the_working_directory_and_nothing_else_is(
    tmp_path: Path,
) -> None:
    here = folder(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMNI_EDGE_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("omni-edge")),
            "export",
            "--from",
            "torch",
            "mymodels:mlp",
            "-o",
            str(tmp_path / "out"),
            "--json",
        ],
        cwd=here,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["precisions"], done.stdout
    assert (tmp_path / "out" / "manifest.yaml").is_file()
    assert sorted(p.name for p in here.glob("MARKER-*")) == []


def test_the_working_directory_is_off_sys_path_after_the_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    here = folder(tmp_path)
    monkeypatch.chdir(here)
    monkeypatch.setattr(sys, "path", list(sys.path))  # this test's own, restored after
    assert str(here) not in sys.path
    assert main(["export", "--from", "torch", "mymodels:mlp", "-o", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    assert str(here) not in sys.path and "" not in sys.path
    assert sorted(p.name for p in here.glob("MARKER-*")) == []
