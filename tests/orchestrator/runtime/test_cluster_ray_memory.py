"""Ray's own memory on a node, measured by a task on that node
(``cluster_probe._ray_memory_here``, which ``node_ray_memory`` pins to each named node;
the two-node test measures both nodes of a real cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.runtime.cluster_probe import _ray_memory_here


@pytest.mark.ray
@pytest.mark.slow
def test_the_node_s_ray_processes_are_found_by_its_session_and_measured(ray_cluster: Any) -> None:
    import ray

    m = ray.get(ray.remote(num_cpus=0, max_retries=0)(_ray_memory_here).remote(), timeout=120)
    # the session started for the tests: one node, the head, so its GCS too
    assert {"raylet", "gcs_server"} <= set(m["names"]), m
    assert m["processes"] >= 3 and m["bytes"] > 20 * 2**20, m
    print(
        "Ray on this node:",
        m["bytes"],
        "bytes in",
        m["processes"],
        "processes:",
        ", ".join(m["names"]),
    )
