"""Seconds from killing the second node of a two-node Ray cluster to (a) the driver's
streaming call on an actor there failing, (b) ``node_death.verdict`` saying the node died,
(c) Ray listing the node dead — under Ray's default health checks or the settings
docs/cluster.md gives (``node_death.RECOMMENDED``).

    python bench/node_death.py defaults 5
    python bench/node_death.py recommended 3

Each run starts its own head and second node (``ray start --block``, as the two-node
test does, token authentication, own temp directories), streams from an actor pinned to
the second node, kills the second node's process group and prints one JSON line. The
figures in docs/cluster.md ("A node's death") come from these two commands.
"""

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo, for tests.*

from orchestrator.runtime.cluster import node_start_resources
from orchestrator.runtime.node_death import RECOMMENDED
from tests.orchestrator.runtime.test_cluster_nodes import RAY, _free_port, _kill_node, _wait_for

DRIVER = r"""
import os, signal, sys, time, json, ray
from orchestrator.runtime import node_death
ray.init(address=sys.argv[1], logging_level="ERROR", include_dashboard=False)
while len([n for n in ray.nodes() if n["Alive"]]) < 2: time.sleep(0.2)
@ray.remote(num_cpus=0, resources={"omni_edge_node_second": 0.001}, max_restarts=0)
class A:
    def node(self): return ray.get_runtime_context().get_node_id()
    def gen(self):
        i = 0
        while True:
            time.sleep(0.05); i += 1; yield i
a = A.remote(); nid = ray.get(a.node.remote())
g = a.gen.options(num_returns="streaming").remote()
ray.get(next(g))
os.killpg(int(sys.argv[2]), signal.SIGKILL); t0 = time.perf_counter()
err = None
try:
    for r in g: ray.get(r)
except Exception as e: err = type(e).__name__
ta = time.perf_counter() - t0
v = node_death.verdict("second", nid, node_death.health_check().bound_s())
tc = time.perf_counter() - t0
while any(n["NodeID"] == nid and n["Alive"] for n in ray.nodes()): time.sleep(0.05)
tb = time.perf_counter() - t0
print(json.dumps({"call_failed_s": round(ta,2), "error": err, "verdict_s": round(tc,2), "verdict_dead": v.dead, "ray_marked_dead_s": round(tb,2), "bound_s": node_death.health_check().bound_s()}))
"""


def _node(base: Path, env: dict[str, str], port: int, name: str, head: bool) -> Any:
    """One ``ray start --block`` node, as the two-node test starts it; returns its process."""
    temp, log = base / name, base / f"{name}.log"
    args = [
        RAY,
        "start",
        "--block",
        "--node-ip-address=127.0.0.1",
        "--num-cpus=1",
        f"--resources={json.dumps(node_start_resources(name, ['cpu']))}",
        f"--temp-dir={temp}",
        "--object-store-memory=100000000",
        "--disable-usage-stats",
        f"--dashboard-agent-listen-port={_free_port()}",
        f"--dashboard-agent-grpc-port={_free_port()}",
        f"--metrics-export-port={_free_port()}",
        f"--runtime-env-agent-port={_free_port()}",
    ]
    if head:
        args += [
            "--head",
            f"--port={port}",
            "--include-dashboard=false",
            f"--ray-client-server-port={_free_port()}",
            f"--dashboard-port={_free_port()}",
        ]
    else:
        args.append(f"--address=127.0.0.1:{port}")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    _wait_for(log, proc, name)
    return proc


def _one_run(mode: str) -> str:
    base = Path(tempfile.mkdtemp(prefix="oe-nd-", dir="/tmp"))
    token = base / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(token),
        RAY_USAGE_STATS_ENABLED="0",
        RAY_enable_metrics_collection="0",
    )
    if mode == "recommended":
        env.update(RECOMMENDED.env())
    port = _free_port()
    procs: list[tuple[Any, Path]] = []
    try:
        for name in ("head", "second"):
            procs.append((_node(base, env, port, name, name == "head"), base / name))
        second = procs[-1][0]
        cmd = [sys.executable, "-c", DRIVER, f"127.0.0.1:{port}", str(second.pid)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        lines = out.stdout.strip().splitlines()
        return lines[-1] if lines else out.stderr[-1500:]
    except Exception as exc:
        return f"failed: {str(exc)[:200]}"
    finally:
        for proc, temp in reversed(procs):
            _kill_node(proc, temp)
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] not in ("defaults", "recommended"):
        sys.exit("usage: python bench/node_death.py defaults|recommended RUNS")
    mode, runs = sys.argv[1], int(sys.argv[2])
    for run in range(runs):
        print(mode, run, _one_run(mode), flush=True)


if __name__ == "__main__":
    main()
