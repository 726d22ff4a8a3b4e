"""The skip classes and ``--require-assets`` (tests/helpers/skips.py), in a real pytest run.

A pytest subprocess with the plugin runs a generated module with one skip of each class and
one collection-time ``importorskip``: without the switch all stay skips and the run ends with
them counted by class and reason; with it (as scripts/test.sh runs), each missing one fails
naming what is missing, and the platform, capability and excluded ones stay skips. The int8
voice's refusal record is classified from the exporter's own refusal text.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np

from orchestrator.core.errors import ConfigError
from orchestrator.exporter import build
from tests.helpers import REPO
from tests.helpers.generated import over_ceiling
from tests.helpers.skips import OPTION, classify

MODULE = """
from pathlib import Path
import pytest
from tests.helpers.skips import needs_path, only_where, skip_capability, skip_platform

@pytest.fixture(scope="module")
def graphs():
    pytest.skip("the graphs are not built: python -m exports.nothing build")

def test_uses_graphs_a(graphs): pass
def test_uses_graphs_b(graphs): pass

@needs_path(Path("/nonexistent/omni-edge/model.onnx"), "python -m exports.model build")
def test_needs_a_file(): pass

def test_needs_a_package():
    pytest.importorskip("omni_edge_no_such_package")

@only_where(False, "needs an OS this is not")
def test_on_another_os(): pass

def test_on_other_hardware():
    skip_capability("no such device here")

def test_excluded():
    pytest.skip("excluded: would run the suite inside itself")

def test_runs(): assert True is not False
"""


def _run(
    tmp_path: Path, *args: str, collect_skip: bool = False
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_generated.py").write_text(MODULE)
    if collect_skip:
        (tmp_path / "test_module_skip.py").write_text(
            'import pytest\npytest.importorskip("omni_edge_no_such_module")\ndef test_x(): pass\n'
        )
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.helpers.skips", "-p", "no:cacheprovider"]
    return subprocess.run(
        [*cmd, "-q", "-rA", "--rootdir", str(tmp_path), str(tmp_path), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _summary(out: str) -> list[str]:
    tail = out.split("skips by reason", 1)[1].splitlines()[1:]
    return [line.strip() for line in tail[: tail.index(next(x for x in tail if "==" in x))]]


def test_without_the_switch_every_skip_stays_a_skip_and_is_counted_by_class(
    tmp_path: Path,
) -> None:
    done = _run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 7 skipped" in done.stdout
    lines = _summary(done.stdout)
    assert lines[0] == "7 skipped: 1 platform, 1 capability, 1 excluded, 4 missing"
    rows = [re.split(r"\s+", line, maxsplit=2) for line in lines[1:]]
    assert rows == [
        ["1", "missing", "/nonexistent/omni-edge/model.onnx (python -m exports.model build)"],
        [
            "1",
            "missing",
            "could not import 'omni_edge_no_such_package': No module named "
            "'omni_edge_no_such_package'",
        ],
        ["2", "missing", "the graphs are not built: python -m exports.nothing build"],
        ["1", "platform", "needs an OS this is not"],
        ["1", "capability", "no such device here"],
        ["1", "excluded", "would run the suite inside itself"],
    ]


def test_with_the_switch_a_skip_for_something_missing_fails_naming_it(tmp_path: Path) -> None:
    done = _run(tmp_path, OPTION)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "1 failed, 1 passed, 3 skipped, 3 errors" in out
    failed = dict(re.findall(r"^(?:FAILED|ERROR) \S+::(\w+) - (.*)$", out, flags=re.MULTILINE))
    assert failed == {
        "test_uses_graphs_a": "missing: the graphs are not built: python -m exports.nothing build",
        "test_uses_graphs_b": "missing: the graphs are not built: python -m exports.nothing build",
        "test_needs_a_file": "missing: /nonexistent/omni-edge/model.onnx (python -m exports.model "
        "build)",
        "test_needs_a_package": "missing: could not import 'omni_edge_no_such_package': No module "
        "named 'omni_edge_no_such_package'",
    }
    skipped = re.findall(r"^SKIPPED \[1\] \S+:\d+: (\w+):", out, flags=re.MULTILINE)
    assert sorted(skipped) == ["capability", "excluded", "platform"]
    assert _summary(out)[0] == (
        f"7 skipped: 1 platform, 1 capability, 1 excluded, 4 missing (missing ones failed: {OPTION})"
    )
    assert "make it (scripts/bootstrap.sh)" in out


def test_with_the_switch_a_module_skipped_at_collection_fails_the_run(tmp_path: Path) -> None:
    assert _run(tmp_path, collect_skip=True).returncode == 0
    done = _run(tmp_path, OPTION, collect_skip=True)
    assert done.returncode != 0
    assert re.search(
        r"^ERROR \S*test_module_skip.py - missing: could not import 'omni_edge_no_such_module'",
        done.stdout,
        flags=re.MULTILINE,
    ), done.stdout


def test_the_readme_test_command_sets_the_switch_and_no_test_reads_ci() -> None:
    command = (REPO / "scripts/test.sh").read_text()
    (pytest_line,) = [line for line in command.splitlines() if "python -m pytest" in line]
    assert OPTION in pytest_line.split()
    assert "scripts/test.sh" in (REPO / "README.md").read_text()
    assert "scripts/test.sh" in (REPO / ".ci/run").read_text()
    reads_ci = re.compile(r"""environ(\.get\(|\[)\s*["']CI["']|getenv\(\s*["']CI["']""")
    readers = [
        str(p.relative_to(REPO))
        for p in (REPO / "tests").rglob("*.py")
        if reads_ci.search(p.read_text(errors="replace"))
    ]
    assert readers == [], f"one switch decides what a skip does ({OPTION}), not CI: {readers}"


def test_an_unprefixed_reason_is_missing() -> None:
    assert classify("Skipped: no Whisper manifests") == ("missing", "no Whisper manifests")
    assert classify("platform: no fcntl") == ("platform", "no fcntl")
    assert classify("Platform: no fcntl") == ("missing", "Platform: no fcntl")
    assert classify("something: else") == ("missing", "something: else")


def _exporter_refusal(got: float) -> str:
    """The exporter's int8 refusal as its command line prints it, from its own check."""
    want = {"y": np.array([1.0, 0.0, 0.0], dtype=np.float32)}
    cpu = types.SimpleNamespace(run=lambda *_: {"y": np.array([1.0, got, 0.0], np.float32)})
    exported = types.SimpleNamespace(calibration=[{"x": np.zeros(1)}])
    try:
        build._measure(cpu, Path("int8.onnx"), "int8", exported, [want], want)
    except ConfigError as err:
        return "error: the input cannot be used:\n" + "\n".join(
            f"  {p.where}: {p.what}\n    how to fix: {p.fix}" for p in err.problems
        )
    return "exported"


def test_the_int8_voice_refusal_is_a_capability_only_when_the_exporter_measured_it_over() -> None:
    record = _exporter_refusal(got=0.5)
    assert record != "exported"
    found = over_ceiling("some build output\n" + record)
    assert found is not None and found.startswith("the int8 graph loses too much: worst rel L2")
    assert _exporter_refusal(got=0.001) == "exported"  # within the ceiling: nothing to refuse
    assert over_ceiling("Traceback (most recent call last):\nMemoryError") is None
    within = (
        "the int8 graph loses too much: worst rel L2 0.01 (at most 0.05) and cosine 0.9990 "
        "(at least 0.995)"
    )
    assert over_ceiling(within) is None  # figures within the ceiling: not this refusal
