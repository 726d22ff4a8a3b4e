"""Fixtures for the runtime tests: one local Ray cluster per test session.

Starting Ray costs ~5–10 s on this 2-core box, so every runtime test in the
session shares one cluster (``orchestrator.runtime.cluster.connect``, which
pipelines in the same process join). Its node declares the resources of
every device the tests place stages on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

TEST_DEVICES = ["cpu", "igpu:0", "npu:0", "gpu:0"]


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    pytest.importorskip("ray")
    from orchestrator.runtime import cluster

    c = cluster.connect(TEST_DEVICES)
    yield c
    cluster.release()
