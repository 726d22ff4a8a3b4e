"""The local cluster lives on loopback: nothing of Ray's is reachable from outside."""

from __future__ import annotations

import ipaddress
from typing import Any

import psutil
import pytest

pytestmark = [pytest.mark.ray]


def _is_loopback(host: str) -> bool:
    ip = ipaddress.ip_address(host)
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def test_every_ray_socket_listens_on_loopback(ray_cluster: Any) -> None:
    from orchestrator.runtime.cluster import descendants

    assert ray_cluster.address.startswith("127.0.0.1:")
    pids = set(ray_cluster.node_pids)
    for root in ray_cluster.node_pids:
        pids.update(descendants(root))
    assert pids, "the cluster was started here, so its processes are known"
    listening = [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid in pids]
    assert listening, "Ray's GCS and raylet listen somewhere"
    exposed = [(c.pid, c.laddr.ip, c.laddr.port) for c in listening if not _is_loopback(c.laddr.ip)]
    assert exposed == []
