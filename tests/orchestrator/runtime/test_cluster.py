"""The local cluster lives on loopback: nothing of Ray's is reachable from outside."""

from __future__ import annotations

import ipaddress
import os
import stat
import subprocess
import sys
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


def _join(address: str, env: dict[str, str], tmp_path: Any) -> subprocess.CompletedProcess[str]:
    code = ("import ray\n"
            f"ray.init(address={address!r}, include_dashboard=False, logging_level='ERROR')\n"
            "print('JOINED', ray.get(ray.remote(lambda: 41 + 1).remote()))\n")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_a_process_without_the_token_cannot_join_the_local_cluster(ray_cluster: Any, tmp_path: Any) -> None:
    """Loopback is no boundary between the users and processes of one machine: the
    cluster started here requires its own fresh token, kept in a file only its
    owner can read."""
    token_path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    assert os.environ.get("RAY_AUTH_MODE") == "token" and token_path
    assert stat.S_IMODE(os.stat(token_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(token_path)).st_mode) == 0o700
    # a stranger: same machine, no credentials (and a home without ~/.ray/auth_token)
    # (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: it reaches the loopback GCS, as this project does)
    bare = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    bare.update(HOME=str(tmp_path), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    stranger = _join(ray_cluster.address, bare, tmp_path)
    assert stranger.returncode != 0 and "JOINED" not in stranger.stdout, stranger.stdout + stranger.stderr
    assert "token" in stranger.stderr.lower()  # refused for want of the token, not by accident
    # the same join with the token succeeds, so the refusal above is the token's doing
    owner = _join(ray_cluster.address, {**bare, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token_path}, tmp_path)
    assert "JOINED 42" in owner.stdout, owner.stdout + owner.stderr
