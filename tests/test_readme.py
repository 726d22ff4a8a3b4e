"""Every code block in README.md runs as written.

* ```` ```bash ```` blocks run in ``bash -euo pipefail``, ```` ```python ````
  blocks as a script with the main environment's interpreter; both from a
  sandbox that mirrors the repository's root (a symlink per top-level entry),
  so the relative paths of the README resolve as they do for a user while
  what the blocks write (``reply.wav``, ``runs/``) lands in the sandbox, not
  in the checkout.
* ```` ```yaml title="PATH" ```` blocks are complete pipeline configs: they are
  validated by the config loader as if saved at PATH. A yaml block without a
  title is an error: mark it ``title=...`` or make it another kind of block.
* After a block, every ``record: PATH`` and ``audio: PATH`` line it printed
  (what a user reads to find the outputs) must name a run record and a WAV
  that exist; blocks that run a request must print a ``record:`` line.

What the model says is never checked: it depends on the CPU's numerics.
Blocks that start the pipeline (Ray and a vLLM engine, about half a minute
each) are marked slow, ray and vllm.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from orchestrator.config import parse_config
from orchestrator.runtime.audio import read_wav
from tests.helpers import REPO

README = REPO / "README.md"
TIMEOUT_S = 600

EXCLUDED = {
    "scripts/test.sh": "runs lint, types and the whole test suite, this test included: it would run itself",
}
"""Blocks not run, by a line they contain, with the reason."""
STARTS_PIPELINE = (
    "scripts/demo.sh",
    "omni-edge run",
    "omni-edge serve",
    "Pipeline.from_config",
    "Pipeline.open",
)
RUNS_A_REQUEST_WITH_RECORD = ("scripts/demo.sh", "omni-edge run", "pipeline.run(")
NOT_MIRRORED = {".git", "runs", ".pytest_cache", ".mypy_cache", ".ruff_cache", "__pycache__"}


@dataclass(frozen=True)
class Block:
    lang: str
    info: str
    code: str
    line: int

    @property
    def title(self) -> str | None:
        m = re.search(r'title="([^"]+)"', self.info)
        return m.group(1) if m else None


def blocks(text: str) -> list[Block]:
    out: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*(.*)$", lines[i])
        if not m:
            i += 1
            continue
        start = i
        i += 1
        body = []
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"README.md:{start + 1}: code block never closed")
        out.append(Block(m.group(1), m.group(2), "\n".join(body) + "\n", start + 1))
        i += 1
    return out


BLOCKS = blocks(README.read_text())


def _param(b: Block) -> object:
    marks = (
        [pytest.mark.slow, pytest.mark.ray, pytest.mark.vllm]
        if any(s in b.code for s in STARTS_PIPELINE)
        else []
    )
    return pytest.param(b, id=f"{b.lang}-line{b.line}", marks=marks)


def test_every_block_is_one_this_test_knows_how_to_check() -> None:
    assert BLOCKS
    for b in BLOCKS:
        assert b.lang in ("bash", "python", "yaml"), (
            f"README.md:{b.line}: a ```{b.lang} block: run it here or drop it"
        )
        assert b.lang != "yaml" or b.title, (
            f'README.md:{b.line}: a yaml block without title="PATH" cannot be checked'
        )


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.lang == "yaml"], ids=lambda b: f"yaml-line{b.line}"
)
def test_yaml_block_is_a_valid_pipeline_config(block: Block) -> None:
    assert block.title is not None
    where = REPO / block.title
    config = parse_config(
        yaml.safe_load(block.code),
        where=f"README.md:{block.line} ({block.title})",
        base_dir=where.parent,
    )
    assert config.stages


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in NOT_MIRRORED and entry.suffix != ".wav":
            (root / entry.name).symlink_to(entry)
    return root


@pytest.fixture(scope="module")
def bootstrapped() -> None:
    """What ``scripts/demo.sh`` would install, installed in the checkout itself: its
    bootstrap is then a no-op in the sandbox, which must never become the
    location of an editable install."""
    proc = subprocess.run(
        ["scripts/bootstrap.sh"], cwd=REPO, capture_output=True, text=True, timeout=3600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def _python() -> str:
    venv = REPO / ".venv/bin/python"
    return str(venv) if venv.exists() else sys.executable


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS if b.lang in ("bash", "python")])
def test_block_runs_as_written(
    block: Block, sandbox: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    excluded = next((why for line, why in EXCLUDED.items() if line in block.code), None)
    if excluded:
        pytest.skip(f"excluded: README.md:{block.line}: {excluded}")
    if "scripts/demo.sh" in block.code:
        request.getfixturevalue("bootstrapped")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if block.lang == "bash":
        cmd = ["bash", "-euo", "pipefail", "-c", block.code]
    else:
        # Outside the sandbox: a script's own directory comes first on sys.path,
        # and the sandbox's symlinked packages must not shadow the installed ones.
        script = tmp_path / f"readme_line{block.line}.py"
        script.write_text(block.code)
        cmd = [_python(), str(script)]
    proc = subprocess.run(
        cmd, cwd=sandbox, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, (
        f"README.md:{block.line} exited {proc.returncode}:\n{output[-4000:]}"
    )
    assert "Traceback (most recent call last)" not in output, output[-4000:]

    records = re.findall(r"^record: (\S+)\s*$", output, flags=re.MULTILINE)
    if any(s in block.code for s in RUNS_A_REQUEST_WITH_RECORD):
        assert records, (
            f"README.md:{block.line} ran a request but printed no 'record: PATH' line:\n{output[-2000:]}"
        )
    for path in records:
        doc = json.loads((sandbox / path).read_text())
        assert doc["format"] == "omni-edge.run/1"
        assert (
            (sandbox / path).resolve().is_relative_to(sandbox.resolve())
        )  # inside the sandbox: cwd-relative
    for path, seconds in re.findall(r"^audio: (\S+) \((\d+\.\d+) s\b", output, flags=re.MULTILINE):
        audio, rate = read_wav(sandbox / path)
        assert audio.size / rate == pytest.approx(float(seconds), abs=0.006)
