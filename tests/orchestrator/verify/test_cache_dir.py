"""An unwritable cache directory: plan works without its optional caches (one
warning), verify — whose product is the evidence — refuses before measuring."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.core import settings
from tests.helpers.graphs import one_stage_cli_args, write_artifact


@pytest.fixture
def blocked_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """OMNI_EDGE_CACHE_DIR below a regular file: unwritable even for root."""
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory should be")
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(settings, "_warned", set())
    return blocker / "cache"


def _argv(tmp_path: Path, command: str) -> list[str]:
    return one_stage_cli_args(tmp_path, write_artifact(tmp_path / "art", "full"), command)


def test_plan_works_without_a_writable_cache_and_warns_once(
    tmp_path: Path,
    blocked_cache: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    argv = _argv(tmp_path, "plan")
    with caplog.at_level(logging.WARNING):
        assert main(argv) == 0
        assert main(argv) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "unverified" in out.out
    warnings = [m for m in caplog.messages if "cannot cache" in m]
    assert warnings == [
        f"cannot cache graph statistics in {blocked_cache / 'graphs'} (Not a directory); continuing without caching. "
        f"To cache: set OMNI_EDGE_CACHE_DIR to a directory you can write (now {blocked_cache}), "
        f"or make {blocked_cache / 'graphs'} a writable directory"
    ]


def test_verify_with_an_unwritable_evidence_cache_exits_2_before_measuring(
    tmp_path: Path,
    blocked_cache: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import orchestrator.verify.placement as placement_module

    monkeypatch.setattr(
        placement_module,
        "measure",
        lambda *a, **k: pytest.fail("measured without a place for the evidence"),
    )
    assert main(_argv(tmp_path, "verify")) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines() == [
        "error: the input cannot be used:",
        f"  {blocked_cache / 'evidence'}: the omni-edge cache directory for gate evidence cannot be written: "
        f"Not a directory ({blocked_cache / 'evidence'})",
        f"    how to fix: set OMNI_EDGE_CACHE_DIR to a directory you can write (now {blocked_cache}), "
        f"or make {blocked_cache / 'evidence'} a writable directory",
    ]
