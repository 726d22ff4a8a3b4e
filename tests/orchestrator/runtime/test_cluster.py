"""The local cluster lives on loopback: nothing of Ray's is reachable from outside."""

from __future__ import annotations

import ipaddress
import json
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
    listening = [
        c
        for c in psutil.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.pid in pids
    ]
    assert listening, "Ray's GCS and raylet listen somewhere"
    exposed = [(c.pid, c.laddr.ip, c.laddr.port) for c in listening if not _is_loopback(c.laddr.ip)]
    assert exposed == []


def _join(address: str, env: dict[str, str], tmp_path: Any) -> subprocess.CompletedProcess[str]:
    code = (
        "import ray\n"
        f"ray.init(address={address!r}, include_dashboard=False, logging_level='ERROR')\n"
        "print('JOINED', ray.get(ray.remote(lambda: 41 + 1).remote()))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


def test_a_process_without_the_token_cannot_join_the_local_cluster(
    ray_cluster: Any, tmp_path: Any
) -> None:
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
    assert stranger.returncode != 0 and "JOINED" not in stranger.stdout, (
        stranger.stdout + stranger.stderr
    )
    assert "token" in stranger.stderr.lower()  # refused for want of the token, not by accident
    # the same join with the token succeeds, so the refusal above is the token's doing
    owner = _join(
        ray_cluster.address,
        {**bare, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token_path},
        tmp_path,
    )
    assert "JOINED 42" in owner.stdout, owner.stdout + owner.stderr


_LIFECYCLE = """
import json, os, stat, sys
from orchestrator.runtime import cluster
address = sys.argv[1] if len(sys.argv) > 1 else None
c = cluster.connect(["cpu"], address=address)
import ray
session = ray._private.worker.global_worker.node.get_session_dir_path()
sockets = os.path.join(session, "sockets")
private = None  # the nearest directory above the session that only its owner can enter
d = os.path.dirname(session)
while d != os.path.dirname(d):
    if stat.S_IMODE(os.stat(d).st_mode) & 0o077 == 0:
        private = d
        break
    d = os.path.dirname(d)
seen = {"session": session, "owned": c.owned, "private": private,
        "private_mode": oct(stat.S_IMODE(os.stat(private).st_mode)) if private else None,
        "temp_dir": getattr(c, "temp_dir", None),
        "longest_socket": max(len(os.path.join(sockets, s)) for s in os.listdir(sockets))}
cluster.release()
seen["session_after_close"] = os.path.exists(session)
seen["private_after_close"] = bool(private) and os.path.exists(private)
print("SEEN " + json.dumps(seen))
"""


def _lifecycle(*args: str) -> dict[str, Any]:
    import json

    done = subprocess.run(
        [sys.executable, "-c", _LIFECYCLE, *args], capture_output=True, text=True, timeout=300
    )
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("SEEN ")), None)
    assert done.returncode == 0 and line, done.stdout[-2000:] + done.stderr[-4000:]
    return dict(json.loads(line[5:]))


def test_the_local_cluster_keeps_its_files_in_a_private_directory_it_removes_at_close(
    ray_cluster: Any,
) -> None:
    """Ray makes its temp directory and everything in it 0777 without the sticky bit
    (by default /tmp/ray, left after each run): a cluster started here puts it in a
    directory of its own, 0700 while it runs, gone after close."""
    seen = _lifecycle()
    assert seen["owned"], seen
    assert seen["private"] is not None and seen["private_mode"] == "0o700", (
        seen
    )  # no other user reaches it
    assert seen["longest_socket"] <= 107, seen  # Ray's Unix sockets still fit sun_path
    assert seen["session_after_close"] is False and seen["private_after_close"] is False, seen


def test_a_joined_cluster_gets_no_private_directory_and_its_own_is_left_alone(
    ray_cluster: Any,
) -> None:
    """--address: the cluster's directories belong to whoever started it (here: this
    test session's cluster, 0700 too); leaving it removes nothing."""
    seen = _lifecycle(ray_cluster.address)
    assert seen["owned"] is False and seen["temp_dir"] is None, seen
    assert seen["private"] == ray_cluster.temp_dir, seen
    assert seen["session_after_close"] and os.path.isdir(ray_cluster.temp_dir), seen


WHERE_AM_I = """
import json, os, sys
from orchestrator.runtime import cluster
cluster.connect(["cpu"])
import ray

@ray.remote
def where():
    import numpy
    return {"cwd": os.getcwd(), "path": sys.path, "numpy": numpy.__file__}

print("WORKER", json.dumps(ray.get(where.remote())))
cluster.release()
"""

NUMPY_MARKER = """import os
open(os.path.join({folder!r}, "MARKER-numpy"), "a").write(str(os.getpid()))
raise ImportError("numpy.py of the folder's owner")
"""


def test_ray_workers_never_see_the_drivers_working_directory(tmp_path: Any) -> None:
    """A driver started in a folder holding numpy.py: Ray ships the working directory to its
    workers and puts it first on their sys.path unless the job names a working_dir, so
    ``connect`` names an empty private one. The worker starts elsewhere, has the folder
    nowhere on its path, and imports the installed numpy."""
    folder = tmp_path / "cloned"
    folder.mkdir()
    (folder / "numpy.py").write_text(NUMPY_MARKER.format(folder=str(folder)))
    env = {
        k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("RAY_AUTH")
    }
    # -I: the driver itself does not import the folder (what the omni-edge script does too)
    done = subprocess.run(
        [sys.executable, "-I", "-c", WHERE_AM_I],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("WORKER ")]
    assert done.returncode == 0 and lines, done.stdout + done.stderr
    seen = json.loads(lines[0].removeprefix("WORKER "))
    here = os.path.realpath(folder)
    assert os.path.realpath(seen["cwd"]) != here
    assert here not in {os.path.realpath(p) for p in seen["path"] if p}, seen["path"]
    assert "" not in seen["path"]
    assert "site-packages" in seen["numpy"]
    assert not (folder / "MARKER-numpy").exists()


IDLE_WORKERS = """
import json, os
import psutil
from orchestrator.core.memory import descendants
from orchestrator.runtime import cluster
c = cluster.connect(["cpu"])
import ray

@ray.remote(num_cpus=0)
class Stage:
    def pid(self):
        return os.getpid()

stage = Stage.remote()
actor = ray.get(stage.pid.remote(), timeout=120)  # the driver registered long before this
others = []
for pid in {p for root in c.node_pids for p in descendants(root)} - {actor}:
    try:
        cmd = psutil.Process(pid).cmdline()
    except psutil.NoSuchProcess:
        continue
    agent = cmd and cmd[0].split()[0].endswith("Agent")  # ray::DashboardAgent, ::RuntimeEnvAgent
    if cmd and not agent and (cmd[0].startswith("ray::") or any("default_worker.py" in a for a in cmd)):
        others.append(" ".join(cmd)[:60])
print("WORKERS", json.dumps({"actor": actor, "others": others}))
cluster.release()
"""


def test_the_local_cluster_starts_no_worker_that_no_actor_uses() -> None:
    """Ray starts a worker per CPU for the first driver, in the job's environment; no actor of
    the project runs in them (each has its own), and each idle one held ~40 MiB (PSS) and took
    CPU beside the stages. Once an actor is up (the driver registered long before), the actor's
    is the cluster's only worker process."""
    done = subprocess.run(
        [sys.executable, "-c", IDLE_WORKERS], capture_output=True, text=True, timeout=300
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("WORKERS ")]
    assert done.returncode == 0 and lines, done.stdout + done.stderr
    seen = json.loads(lines[0].removeprefix("WORKERS "))
    assert seen["actor"] > 0 and seen["others"] == [], seen
