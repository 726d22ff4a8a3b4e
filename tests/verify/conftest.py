"""Fixtures for the verification tests: a private evidence cache, the OpenVINO route."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.verify.evidence import EvidenceStore
from tests.verify.helpers import OV_PYTHON


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own OMNI_EDGE_CACHE_DIR: evidence never leaks between tests."""
    root = tmp_path / "cache"
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(root))
    return root


@pytest.fixture
def store(private_cache: Path) -> EvidenceStore:
    return EvidenceStore()


@pytest.fixture(scope="module")
def ov_host() -> Iterator[object]:
    """One worker in the OpenVINO venv, shared by a module's tests (one interpreter start)."""
    if not OV_PYTHON.exists():
        pytest.skip(f"the OpenVINO route is missing: {OV_PYTHON} (scripts/bootstrap.sh creates it)")
    from orchestrator.ort.routes import resolve
    from orchestrator.ort.sessions import open_sessions
    from orchestrator.profile import Route

    host = open_sessions(resolve(Route(name="openvino", kind="interpreter", python=str(OV_PYTHON))))
    yield host
    host.shutdown()
