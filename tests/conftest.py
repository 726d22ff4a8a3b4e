"""Fixtures and helpers every test directory can reach.

* ``tiny_checkpoint``: a llama-shaped checkpoint (``tests/helpers/checkpoints.py``);
* ``private_cache`` and ``store``: a private OMNI_EDGE_CACHE_DIR per test, so
  evidence never leaks between tests (not autouse: the directories whose tests
  verify placements turn it on in their own conftest.py);
* ``private_calibration`` (autouse): an empty measurement store
  (OMNI_EDGE_CALIBRATION_DIR) per module and per test, so no plan depends on
  the peaks this machine measured before, nor on another test's run;
* ``ov_host``: one worker in the OpenVINO venv, shared by a module's tests;
* ``ray_cluster``: one local Ray cluster for the whole session;
* ``_no_user_settings`` (autouse): an absent settings file, so the machine's user's own
  (``OMNI_EDGE_SETTINGS``) never changes a test.

Ray's workers import what the tests pickle into actors (a test module's own stage kind,
``tests.helpers...``) by name, and omni-edge never lets Ray put the working directory on
their path (``orchestrator.runtime.cluster``): the repository's root goes on ``PYTHONPATH``
here, before any Ray process starts, which is how the workers find the ``tests`` package.

Helpers that are not fixtures are in ``tests/helpers/``: ``REPO`` in its
``__init__``, tiny checkpoints in ``checkpoints.py``, inline profiles in
``profiles.py``, graphs and artifacts in ``graphs.py``, the echo kind's
hand-written plans in ``echo.py``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.verify.evidence import EvidenceStore
from tests.helpers import REPO
from tests.helpers.checkpoints import llama_config, write_checkpoint
from tests.helpers.graphs import OV_PYTHON

# Ray's workers (started from this process's environment) import the tests package from here
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO), *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])]
)

pytest_plugins = ("tests.helpers.skips",)
"""Skips classified, counted and, under ``--require-assets``, failed (tests/helpers/skips.py)."""

TEST_DEVICES = ["cpu", "igpu:0", "npu:0", "gpu:0"]
"""The devices the test cluster's node declares resources for."""


@pytest.fixture(scope="session", autouse=True)
def _no_user_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """No test reads the settings file of whoever runs the suite (``OMNI_EDGE_SETTINGS``: an
    absent file of the session's own); a test that needs settings writes its own."""
    path = tmp_path_factory.mktemp("user-settings") / "settings.yaml"
    old = os.environ.get("OMNI_EDGE_SETTINGS")
    os.environ["OMNI_EDGE_SETTINGS"] = str(path)
    yield path
    if old is None:
        os.environ.pop("OMNI_EDGE_SETTINGS", None)
    else:
        os.environ["OMNI_EDGE_SETTINGS"] = old


@pytest.fixture
def tiny_checkpoint(tmp_path: Path) -> Path:
    cfg = llama_config()
    tensors = {f"model.layers.{i}.mlp.weight": ("BF16", [64, 256]) for i in range(2)}
    tensors["model.embed_tokens.weight"] = ("BF16", [1000, 64])
    return write_checkpoint(tmp_path / "tiny", cfg, tensors)


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own OMNI_EDGE_CACHE_DIR: evidence never leaks between tests."""
    root = tmp_path / "cache"
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(root))
    return root


@pytest.fixture(scope="module", autouse=True)
def _module_calibration(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An empty measurement store for a module's own fixtures (a pipeline started once per module)."""
    root = tmp_path_factory.mktemp("calibration")
    old = os.environ.get("OMNI_EDGE_CALIBRATION_DIR")
    os.environ["OMNI_EDGE_CALIBRATION_DIR"] = str(root)
    yield root
    if old is None:
        os.environ.pop("OMNI_EDGE_CALIBRATION_DIR", None)
    else:
        os.environ["OMNI_EDGE_CALIBRATION_DIR"] = old


@pytest.fixture(autouse=True)
def private_calibration(
    _module_calibration: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """This test's own empty measurement store (created only when something records)."""
    root = _module_calibration / f"t{abs(hash(request.node.nodeid)):x}"
    monkeypatch.setenv("OMNI_EDGE_CALIBRATION_DIR", str(root))
    return root


@pytest.fixture
def store(private_cache: Path) -> EvidenceStore:
    return EvidenceStore()


@pytest.fixture(scope="module")
def ov_host() -> Iterator[object]:
    """One worker in the OpenVINO venv, shared by a module's tests (one interpreter start)."""
    if not OV_PYTHON.exists():
        pytest.skip(f"the OpenVINO route is missing: {OV_PYTHON} (scripts/bootstrap.sh creates it)")
    from orchestrator.core.profile import Route
    from orchestrator.ort.routes import resolve
    from orchestrator.ort.sessions import open_sessions

    host = open_sessions(resolve(Route(name="openvino", kind="interpreter", python=str(OV_PYTHON))))
    yield host
    host.shutdown()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """One local Ray cluster per test session: starting Ray costs ~5–10 s on a
    2-core box, so every test that needs one shares it
    (``orchestrator.runtime.cluster.connect``, which pipelines in the same process
    join). Its node declares the resources of every device the tests place
    stages on."""
    pytest.importorskip("ray")
    from orchestrator.runtime import cluster

    c = cluster.connect(TEST_DEVICES)
    yield c
    cluster.release()
