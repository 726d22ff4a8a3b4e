"""One pipeline across the two nodes of a real Ray cluster on this machine.

The module starts ONE cluster (module scope): a head and a second node, each
``ray start --block`` in its own process group with its own temp directory and
its own ``omni_edge_node_<name>`` and device resources, token authentication on
(the cluster is reachable from other hosts: on Linux a multi-node Ray cluster
binds its GCS to every interface and each raylet to the machine's IP, whatever
``--node-ip-address=127.0.0.1`` says — docs/cluster.md), and tears both down
whatever happens. The pipeline's driver runs in a subprocess (Ray allows one
connection per process, and this test process may hold the session's local
cluster): it gathers the cluster profile live (the probe on each node), plans
the default pipeline with the thinker on the second node and the voice on the
head, runs a request end to end, kills the second node in the middle of the
next request, and reports what it saw as JSON. Both nodes and the driver run with
the health-check settings docs/cluster.md gives (``node_death.RECOMMENDED``), so
the node's death is known within their stated bound. Nothing depends on the words the
model says.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from orchestrator.runtime.cluster import auth_problem, node_start_resources
from orchestrator.runtime.node_death import RECOMMENDED
from tests.helpers import REPO
from tests.helpers.waiting import NEVER_HANGS_S

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

RAY = str(Path(sys.executable).parent / "ray")
START_TIMEOUT_S = 120.0
VOICE_RATE = 22050


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports: every socket is held open until all are picked, so the
    kernel cannot hand one port out twice (two of a node's services given one port made
    ``ray start`` fail)."""
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


def _wait_for(log: Path, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        if "Ray runtime started" in text:
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{text[-3000:]}")
        time.sleep(0.5)
    raise RuntimeError(
        f"{what} did not start in {START_TIMEOUT_S:.0f} s:\n{log.read_text(errors='replace')[-3000:]}"
    )


def _kill_node(proc: subprocess.Popen[bytes], temp_dir: Path) -> None:
    """SIGKILL the node's process group, then any process of it that left the group
    (Ray's workers are reparented when the raylet dies), found by the temp dir in
    its command line or among its open files."""
    with _suppress():
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    for p in psutil.process_iter(["cmdline"]):
        with _suppress():
            mine = str(temp_dir) in " ".join(p.info["cmdline"] or []) or any(
                f.path.startswith(str(temp_dir)) for f in p.open_files()
            )
            if mine and p.pid != os.getpid():
                p.kill()


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[dict[str, Any]]:
    base = Path(
        tempfile.mkdtemp(prefix="oe-2n-", dir="/tmp")
    )  # short: Ray's socket paths are bounded
    token = base / "auth" / "token"
    token.parent.mkdir(mode=0o700)
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(token),
        RAY_USAGE_STATS_ENABLED="0",
        RAY_enable_metrics_collection="0",
    )
    env.update(RECOMMENDED.env())  # the health checks docs/cluster.md starts every node with
    ports = iter(_free_ports(11))  # the head's port, 6 of the head's services, 4 of the second's
    port = next(ports)
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(name: str, head: bool) -> subprocess.Popen[bytes]:
        temp = base / name
        log = base / f"{name}.log"
        args = [
            RAY,
            "start",
            "--block",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=2",
            f"--resources={json.dumps(node_start_resources(name, ['cpu']))}",
            f"--temp-dir={temp}",
            "--object-store-memory=150000000",
            "--disable-usage-stats",
            f"--dashboard-agent-listen-port={next(ports)}",
            f"--dashboard-agent-grpc-port={next(ports)}",
            f"--metrics-export-port={next(ports)}",
            f"--runtime-env-agent-port={next(ports)}",
        ]
        if head:
            args += [
                "--head",
                f"--port={port}",
                "--include-dashboard=false",
                f"--ray-client-server-port={next(ports)}",
                f"--dashboard-port={next(ports)}",
            ]
        else:
            args += [f"--address=127.0.0.1:{port}"]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        procs.append((proc, temp))
        _wait_for(log, proc, f"the {name} node")
        return proc

    try:
        start("head", True)
        second = start("second", False)
        yield {
            "address": f"127.0.0.1:{port}",
            "env": env,
            "second_pgid": second.pid,
            "second_temp": str(base / "second"),
            "base": base,
        }
    finally:
        for proc, temp in reversed(procs):
            _kill_node(proc, temp)
        shutil.rmtree(base, ignore_errors=True)


def test_probe_saves_the_live_cluster_profile_that_plan_reads(two_nodes: dict[str, Any]) -> None:
    """Runs before the second node is killed (the report fixture below kills it)."""
    saved = two_nodes["base"] / "cluster.json"
    cli = str(Path(sys.executable).parent / "omni-edge")
    probe = subprocess.run(
        [cli, "probe", "--address", two_nodes["address"], "--save", str(saved)],
        env=two_nodes["env"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert probe.returncode == 0, probe.stdout[-2000:] + probe.stderr[-4000:]
    doc = json.loads(saved.read_text())
    assert doc["format"] == "omni-edge.cluster/1" and [n["name"] for n in doc["nodes"]] == [
        "head",
        "second",
    ]
    plan = subprocess.run(
        [
            cli,
            "plan",
            str(REPO / "configs/voice-assistant.yaml"),
            "--profile",
            str(saved),
            "--json",
        ],
        env=two_nodes["env"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    stages = {s["name"]: s for s in json.loads(plan.stdout)["stages"]}
    assert plan.returncode == 0 and stages["thinker"]["device"] == "head/cpu", plan.stdout[-2000:]
    assert {p["id"] for p in json.loads(plan.stdout)["pools"]} >= {
        "head/host_ram",
        "second/host_ram",
    }


VOICE_ONLY = """\
name: voice-only
stages:
  - name: voice
    kind: exported_graph
    artifact: {repo}/exports/piper-en-us-joe-medium
    inputs: [request]
    devices: [second/cpu]
    backends: [ort-cpu]
    final_output: true
    final_output_type: audio
"""


def test_run_with_an_address_and_no_profile_plans_on_the_nodes_probed_live(
    two_nodes: dict[str, Any],
) -> None:
    """``omni-edge run --address`` without ``--profile``: the probe runs on each node, the
    nodes found are said, and the plan is the cluster's (a stage on ``second/cpu`` runs
    there; a one-machine profile has no such device). Runs before the second node is killed."""
    base = two_nodes["base"]
    config = base / "voice-only.yaml"
    config.write_text(VOICE_ONLY.format(repo=REPO))
    record = base / "voice-only-run.json"
    cli = str(Path(sys.executable).parent / "omni-edge")
    done = subprocess.run(
        [
            cli,
            "run",
            str(config),
            "--address",
            two_nodes["address"],
            "--prompt",
            "Hello from the second node.",
            "--skip-verify",
            "--no-calibration",
            "--record",
            str(record),
            "--json",
        ],
        env=two_nodes["env"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    said = " ".join(done.stderr.split())
    assert f"planning on the cluster at {two_nodes['address']}: 2 nodes: head" in said, said[-2000:]
    assert "; second at " in said, said[-2000:]
    doc = json.loads(record.read_text())
    assert doc["plan"]["profile"] == f"Ray cluster at {two_nodes['address']}"
    assert doc["stages"][0]["device"] == "second/cpu" and doc["edges"] == []
    assert doc["requests"][0]["audio_seconds"] > 0


VOICE_ON_SECOND = """\
name: voice-on-second
stages:
  - name: voice
    kind: exported_graph
    artifact: {repo}/exports/piper-en-us-joe-medium
    inputs: [request]
    devices: [second/cpu]
    backends: [ort-cpu]
    final_output: true
    final_output_type: audio
"""


def test_verify_with_an_address_verifies_the_placement_on_the_second_node_there(
    two_nodes: dict[str, Any], tmp_path: Path
) -> None:
    """``plan --address``: the voice on ``second/cpu`` is unverified (a fresh evidence
    cache); ``verify --address`` runs its gates in a task on the second node (the Ray node
    id it ran on is the second node's), keeps the record keyed by that node's machine in
    this cache; ``plan --address`` then counts it as verified. Runs before the second node
    is killed."""
    config = tmp_path / "voice-on-second.yaml"
    config.write_text(VOICE_ON_SECOND.format(repo=REPO))
    env = {**two_nodes["env"], "OMNI_EDGE_CACHE_DIR": str(tmp_path / "cache")}
    cli = str(Path(sys.executable).parent / "omni-edge")

    def omni_edge(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [cli, *args, str(config), "--address", two_nodes["address"]],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )

    def voice(plan: subprocess.CompletedProcess[str]) -> dict[str, Any]:
        assert plan.returncode == 0, plan.stdout[-2000:] + plan.stderr[-4000:]
        (stage,) = json.loads(plan.stdout)["stages"]
        assert stage["device"] == "second/cpu", stage
        return dict(stage["verification"])

    print(omni_edge("plan").stdout)  # the human form before, for the report
    before = voice(omni_edge("plan", "--json"))
    assert before["status"] == "unverified", before
    done = omni_edge("verify", "--json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    doc = json.loads(done.stdout)
    said = " ".join(done.stderr.split())
    assert "second: 1 placement(s), verified on that node" in said, said[-2000:]
    (result,) = doc["results"]
    assert (result["device"], result["backend"], result["status"]) == (
        "second/cpu",
        "ort-cpu",
        "passed",
    ), result
    assert result["route"] == "second/this-process" and not result["cached"]
    probed = subprocess.run(
        [cli, "probe", "--address", two_nodes["address"], "--json"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    ids = {n["name"]: n["ray_node_id"] for n in json.loads(probed.stdout)["nodes"]}
    assert doc["nodes"] == {"second": ids["second"]} and ids["second"] != ids["head"], doc["nodes"]
    evidence = json.loads(Path(result["evidence"]).read_text())
    assert Path(result["evidence"]).parent == tmp_path / "cache" / "evidence"
    assert (
        evidence["key"]["machine"] and evidence["machine"]["identity"] == evidence["key"]["machine"]
    )
    assert doc["plan"]["stages"]["voice"]["verification"] == "verified", doc["plan"]
    after = voice(omni_edge("plan", "--json"))
    assert after["status"] == "verified", after
    assert after["details"]["node"] == "second"
    assert after["details"]["evidence_file"] == result["evidence"]
    # the human forms after, for docs/cluster.md: verify again (cached), the plan
    print(done.stderr, omni_edge("verify").stdout, omni_edge("plan").stdout, sep="\n")


def test_a_run_records_ray_s_memory_once_per_node_and_the_next_plan_reserves_each_its_own(
    two_nodes: dict[str, Any], tmp_path: Path
) -> None:
    """``run --address`` with a measurement store: Ray's memory measured on each node at the
    start (``cluster_probe.node_ray_memory``) is one sample per node, keyed by that node's
    machine and name; ``plan --address`` then reserves each node's ``host_ram`` from its own
    sample (M). Runs before the second node is killed."""
    config = tmp_path / "voice-only.yaml"
    config.write_text(VOICE_ONLY.format(repo=REPO))
    store = tmp_path / "calibration"
    env = {**two_nodes["env"], "OMNI_EDGE_CALIBRATION_DIR": str(store)}
    record = tmp_path / "run.json"
    cli = str(Path(sys.executable).parent / "omni-edge")
    address = ["--address", two_nodes["address"]]
    done = subprocess.run(
        [
            cli,
            "run",
            str(config),
            *address,
            "--prompt",
            "Hello.",
            "--skip-verify",
            "--record",
            str(record),
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    measured = json.loads(record.read_text())["runtime"]["ray"]["memory"]["nodes"]
    entries = [json.loads(f.read_text()) for f in store.glob("*.json")]
    ray = {e["key"]["parts"]["node"]: e for e in entries if e["key"]["subject"] == "ray_runtime"}
    assert set(ray) == set(measured) == {"head", "second"}, (sorted(ray), measured)
    peaks = {}
    for name, entry in ray.items():
        (sample,) = entry["samples"]
        assert sample["peak_bytes"] == measured[name]["bytes"] > 20 * 2**20
        assert entry["key"]["parts"]["cluster"] == "node" and entry["key"]["parts"]["machine"]
        peaks[name] = sample["peak_bytes"]
    plan = subprocess.run(
        [cli, "plan", str(config), *address, "--json"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert plan.returncode == 0, plan.stdout[-2000:] + plan.stderr[-4000:]
    reserved = {
        r["pool"]: r
        for r in json.loads(plan.stdout)["shared_reservations"]
        if r["purpose"] == "ray_runtime"
    }
    print(
        "Ray per node, measured → reserved:",
        {n: (peaks[n], reserved[f"{n}/host_ram"]["bytes"]) for n in peaks},
    )
    for name, peak in peaks.items():
        r = reserved[f"{name}/host_ram"]
        margin = max(
            0.05 * peak, 8 * 2**20
        )  # calibration's floor for one run (FLOOR_FRACTION, MIN_MARGIN_BYTES)
        assert r["evidence"] == "M" and peak < r["bytes"] <= peak + margin + 1, (name, peak, r)


def _streaming(two_nodes: dict[str, Any], thinker: str, voice: str) -> dict[str, Any]:
    """bench/streaming.py on the two nodes (its driver in a process of its own, on the head):
    the echo pipeline's figures under the relay and the direct mode."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.streaming",
            "--address",
            two_nodes["address"],
            "--thinker",
            thinker,
            "--voice",
            voice,
            "--requests",
            "2",
            "--json",
        ],
        env=two_nodes["env"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return {m["mode"]: m for m in json.loads(done.stdout.strip().splitlines()[-1])}


def test_items_cross_nodes_once_and_the_driver_reads_only_final_outputs(
    two_nodes: dict[str, Any],
) -> None:
    """Thinker and voice both on the second node, the driver on the head: in the direct mode
    the sentences never leave the second node (0 crossings per item), in the relay each goes
    to the head and back (2); the edge's items and bytes are the same. The thinker on the
    second node and the voice on the head: 1 crossing either way. Runs before the second
    node is killed."""
    both = _streaming(two_nodes, "second/cpu", "second/cpu")
    relay, direct = both["relay"], both["direct"]
    (r_edge,), (d_edge,) = relay["streaming_edges"], direct["streaming_edges"]
    assert d_edge["from_node"] == d_edge["to_node"] != direct["driver_node"]
    assert (d_edge["path"], d_edge["crossings_per_item"]) == ("direct", 0)
    assert (r_edge["path"], r_edge["crossings_per_item"]) == ("driver", 2)
    items = relay["edges"][0]["items"]
    assert items > 0 and r_edge["node_crossings"] == 2 * items and d_edge["node_crossings"] == 0
    assert [(e["items"], e["bytes"]) for e in direct["edges"]] == [
        (e["items"], e["bytes"]) for e in relay["edges"]
    ]
    assert direct["driver"]["feeds_sent"] == 0 and relay["driver"]["feeds_sent"] == items
    print(
        "driver CPU s per request, relay vs direct:",
        relay["driver_cpu_s_per_request"],
        direct["driver_cpu_s_per_request"],
    )
    split = _streaming(two_nodes, "second/cpu", "head/cpu")
    for m in split.values():
        (edge,) = m["streaming_edges"]
        assert edge["from_node"] != edge["to_node"] == m["driver_node"]
        assert edge["crossings_per_item"] == 1, m["mode"]
    assert split["direct"]["edges"] == split["relay"]["edges"]  # byte for byte


VOICE_REPLICAS = """\
name: voice-replicas-two-nodes
stages:
  - name: voice
    kind: exported_graph
    artifact: {repo}/exports/piper-en-us-joe-medium
    inputs: [request]
    devices: [head/cpu, second/cpu]
    replicas: 2
    backends: [ort-cpu]
    final_output: true
    final_output_type: audio
"""
REPLICA_REQUESTS = 8
REPLICA_TEXT = "The first node speaks. The second node answers. Both of them share the load."


def drive_replicas(address: str, config_path: str, out: str) -> None:
    """The driver (in its own process): the real Piper voice with ``replicas: 2`` planned by
    the real planner on the live cluster's profile, 8 concurrent requests entering at it."""
    from orchestrator.api import Pipeline
    from orchestrator.config import load_config
    from orchestrator.planner import plan_pipeline
    from orchestrator.runtime import cluster
    from orchestrator.runtime.cluster_probe import gather_profile

    cluster.connect([], address=address)
    import ray

    deadline = time.monotonic() + 60
    while len([n for n in ray.nodes() if n.get("Alive")]) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    profile = gather_profile("two nodes on loopback")
    config = load_config(Path(config_path))
    plan = plan_pipeline(config, profile)
    doc: dict[str, Any] = {
        "placements": [(r.holder, r.device, r.node) for r in plan.stage("voice").placements()]
    }
    pipeline = Pipeline(plan, config, profile=profile, address=address, record=None)
    try:
        pipeline.start()
        doc["actor_keys"] = pipeline.runtime.actor_keys()
        names = cluster.node_names()  # Ray node id → its name
        doc["actor_nodes"] = {  # the node each replica's actor said it runs on
            k: names.get(dev.info.get("node_id") or "")
            for k, dev in pipeline.runtime.devices.items()
        }

        async def load() -> list[Any]:
            return list(
                await asyncio.gather(
                    *(
                        pipeline.arun(REPLICA_TEXT, request_id=f"r{i}", entry="voice")
                        for i in range(REPLICA_REQUESTS)
                    )
                )
            )

        t0 = time.perf_counter()
        results = asyncio.run(load())
        doc["wall_s"] = round(time.perf_counter() - t0, 2)
        doc["results"] = [
            {
                "samples": int(r.audio.size) if r.audio is not None else 0,
                "sample_rate": r.sample_rate,
                "seconds": round(r.total_s, 2),
                "holder": r.stages["voice"].get("holder"),
                "device": r.stages["voice"].get("device"),
            }
            for r in results
        ]
        doc["served"] = dict(pipeline.runtime.balancer.served)
        record = pipeline.build_record(results)
        doc["rows"] = [r for r in record["stages"] if r["stage"] == "voice"]
        snap = pipeline.ledger_snapshot()
        doc["holders"] = list(snap.get("holders", []))
        doc["pools"] = {p["id"]: sorted(p.get("contributors", {})) for p in snap.get("pools", [])}
    except BaseException as exc:
        import traceback

        doc["driver_error"] = "".join(traceback.format_exception(exc))[-4000:]
        raise
    finally:
        doc["final_ledger"] = pipeline.close()
        Path(out).write_text(json.dumps(doc, default=str))


def test_the_real_voice_with_a_replica_on_each_node_answers_8_concurrent_requests(
    two_nodes: dict[str, Any],
) -> None:
    """The Piper voice with ``replicas: 2`` over ``[head/cpu, second/cpu]``, planned by the
    real planner on the live cluster: one replica on each node, 8 concurrent requests entering
    at the voice all return audio, each replica serves some, the record's rows and the ledger
    name each replica on its node. Nothing depends on the audio's content or the CPU's speed.
    Runs before the second node is killed."""
    base = two_nodes["base"]
    config = base / "voice-replicas.yaml"
    config.write_text(VOICE_REPLICAS.format(repo=REPO))
    out = base / "replicas.json"
    code = (
        "import sys; from tests.orchestrator.runtime.test_cluster_nodes import drive_replicas; "
        "drive_replicas(sys.argv[1], sys.argv[2], sys.argv[3])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, two_nodes["address"], str(config), str(out)],
        env=two_nodes["env"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.exists() and done.returncode == 0, (
        f"exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    )
    doc = json.loads(out.read_text())
    print(
        "replicas across nodes: 8 requests in",
        doc["wall_s"],
        "s; per request s:",
        [r["seconds"] for r in doc["results"]],
        "; served:",
        {r["holder"]: (r["device"], r["requests"]) for r in doc["rows"]},
    )
    assert [tuple(p) for p in doc["placements"]] == [
        ("voice#0", "head/cpu", "head"),
        ("voice#1", "second/cpu", "second"),
    ]
    assert doc["actor_keys"] == ["head/cpu", "second/cpu"]
    assert doc["actor_nodes"] == {"head/cpu": "head", "second/cpu": "second"}
    assert len(doc["results"]) == REPLICA_REQUESTS
    for r in doc["results"]:
        assert r["samples"] > 0 and r["sample_rate"] == VOICE_RATE, r
    rows = doc["rows"]
    assert [(r["replica"], r["holder"], r["device"]) for r in rows] == [
        (1, "voice#0", "head/cpu"),
        (2, "voice#1", "second/cpu"),
    ]
    assert all(r["requests"] > 0 for r in rows), rows  # each replica served some
    assert sum(r["requests"] for r in rows) == REPLICA_REQUESTS
    assert doc["served"] == {r["holder"]: r["requests"] for r in rows}
    # each request's figures name the replica that served it, on its node
    assert {(r["holder"], r["device"]) for r in doc["results"]} == {
        ("voice#0", "head/cpu"),
        ("voice#1", "second/cpu"),
    }
    # the ledger as a user reads it: each replica holds on its own node's memory
    assert {"voice#0", "voice#1"} <= set(doc["holders"])
    assert "voice#0" in doc["pools"]["head/host_ram"], doc["pools"]
    assert "voice#1" in doc["pools"]["second/host_ram"], doc["pools"]
    assert "voice#1" not in doc["pools"]["head/host_ram"], doc["pools"]
    pools = doc["final_ledger"].get("pools", [])
    assert pools and all(p.get("held_bytes", 0) == 0 for p in pools), pools


@pytest.fixture(scope="module")
def report(two_nodes: dict[str, Any]) -> dict[str, Any]:
    out = two_nodes["base"] / "report.json"
    code = (
        "import sys; from tests.orchestrator.runtime.test_cluster_nodes import drive; "
        "drive(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            two_nodes["address"],
            str(two_nodes["second_pgid"]),
            two_nodes["second_temp"],
            str(out),
        ],
        env=two_nodes["env"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.exists(), (
        f"the driver wrote no report (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    )
    return dict(json.loads(out.read_text()))


KILLED_REQUEST_TOKENS = 1000
"""Tokens the thinker must decode for the request the second node's death interrupts:
about 20 s at this machine's ~50 tokens/s, against the 3-4 s the runtime takes to notice."""


def drive(address: str, second_pgid: int, second_temp: str, out: str) -> None:
    """The driver (in its own process): plan on the live cluster, run, kill the second node mid-request."""
    from orchestrator.api import Pipeline
    from orchestrator.config import load_config
    from orchestrator.core.errors import StageFailed
    from orchestrator.planner import plan_pipeline
    from orchestrator.runtime import cluster
    from orchestrator.runtime.cluster_probe import gather_profile, node_ray_memory
    from orchestrator.runtime.events import TextDelta
    from orchestrator.runtime.node_death import health_check

    doc: dict[str, Any] = {}

    def save() -> None:
        Path(out).write_text(json.dumps(doc, default=str))

    c = cluster.connect([], address=address)
    doc["listening"] = c.listening
    deadline = time.monotonic() + 60
    import ray

    while len([n for n in ray.nodes() if n.get("Alive")]) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    profile = gather_profile("two nodes on loopback")
    doc["devices"] = [d.id for d in profile.devices]
    doc["nodes"] = profile.node_names
    doc["ray_memory"] = node_ray_memory()  # each node's own Ray processes, before any stage loads
    text = (REPO / "configs/voice-assistant.yaml").read_text()
    text = text.replace("devices: [gpu:0, cpu]", "devices: [second/cpu]")
    text = text.replace("devices: [npu:0, igpu:0, cpu]", "devices: [head/cpu]")
    text = text.replace("artifact: ../exports", f"artifact: {REPO}/exports")
    # The request killed mid-way must still be decoding when the node's death is noticed
    # (seconds): with the default 96 tokens a fast CPU could finish the reply first.
    assert "max_tokens: 96" in text
    text = text.replace("max_tokens: 96", f"max_tokens: {KILLED_REQUEST_TOKENS}")
    cfg = Path(second_temp).parent / "voice-two-nodes.yaml"
    cfg.write_text(text)
    config = load_config(cfg)
    plan = plan_pipeline(config, profile)
    doc["plan"] = {
        s.name: {
            "device": s.device,
            "node": s.details.get("node"),
            "across": s.details.get("inputs_across_nodes"),
            "admitted": s.admitted,
            "refusals": [r.message for r in s.refusals],
        }
        for s in plan.stages
    }
    doc["pools"] = [p.id for p in plan.pools]
    save()
    pipeline = Pipeline(plan, config, profile=profile, address=address, record=None)
    try:
        pipeline.start()
        r = pipeline.run(
            {"prompt": "Tell me one fact about the Moon.", "sampling": {"min_tokens": 16}},
            record=False,
        )
        doc["reply"] = {
            "text": bool(r.text.strip()),
            "chunks": len(r.chunks),
            "stages": sorted(r.stages),
            "voice_items": r.stages["voice"].get("items"),
            "sample_rate": r.sample_rate,
            "audio_samples": int(r.audio.size) if r.audio is not None else 0,
            "devices": {k: v.get("device") for k, v in r.stages.items()},
            "listens_on": pipeline.runtime.startup.get("cluster_listens_on"),
            "chunk_bytes": sum(len(c.encode()) for c in r.chunks),
        }
        doc["edges"] = pipeline.build_record([r])[
            "edges"
        ]  # the run record's transfer cost per edge
        save()

        async def killed_mid_request() -> dict[str, Any]:
            seen: dict[str, Any] = {"deltas_before_kill": 0}
            t0 = 0.0
            try:
                async for e in pipeline.stream(
                    {
                        "prompt": "Tell me a long story about the sea.",
                        "sampling": {"min_tokens": KILLED_REQUEST_TOKENS},
                    }
                ):
                    if isinstance(e, TextDelta) and e.stage == "thinker" and not t0:
                        seen["deltas_before_kill"] += 1
                        os.killpg(
                            second_pgid, signal.SIGKILL
                        )  # the second node leaves: raylet, workers, all
                        t0 = time.perf_counter()
                seen["error"] = None
            except StageFailed as exc:
                seen.update(
                    error="StageFailed",
                    stage=exc.stage,
                    device=exc.device,
                    cause=exc.cause,
                    code=exc.code,
                    noticed_s=round(time.perf_counter() - t0, 2),
                    bound_s=health_check().bound_s(),  # the driver's, from its environment
                )
            except Exception as exc:
                seen.update(error=type(exc).__name__, cause=str(exc)[:500])
            return seen

        lp = pipeline.runtime.ledger_pid
        doc["placement"] = {
            "driver_node": ray.get_runtime_context().get_node_id(),
            "names": cluster.node_names(),
            "ledger_pid": lp,
            "ledger_pgid": os.getpgid(lp) if psutil.pid_exists(lp) else None,
            "second_pgid": second_pgid,
            "actor_nodes": {
                a.get("ActorClassName"): (a.get("Address") or {}).get("NodeID")
                for a in ray._private.state.actors().values()
            },
            "actors": {
                d: (dev.info.get("node_id"), dev.info.get("pid"))
                for d, dev in pipeline.runtime.devices.items()
            },
        }
        save()
        doc["kill"] = asyncio.run(killed_mid_request())
        save()

        def holders() -> Any:
            snap = pipeline.ledger_snapshot()
            return (
                {p["id"]: sorted(p.get("contributors", {})) for p in snap.get("pools", [])}
                if isinstance(snap.get("pools"), list)
                else snap
            )

        # the released reservations reach the ledger actor: polled for (the test asserts on what
        # was there when they came, or at the deadline), not slept for
        deadline = time.monotonic() + NEVER_HANGS_S
        doc["ledger_after_kill"] = holders()
        while "thinker" in doc["ledger_after_kill"].get("second/host_ram", []):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
            doc["ledger_after_kill"] = holders()
        doc["dead"] = {d: dev.dead for d, dev in pipeline.runtime.devices.items()}
        doc["health"] = [
            {
                "name": s.name,
                "device": s.device,
                "alive": not pipeline.runtime.devices[s.device or "?"].dead,
                "error": pipeline.runtime.devices[s.device or "?"].dead,
            }
            for s in pipeline.runtime.stages
        ]
        spoken = pipeline.run("The first node still speaks.", entry="voice", record=False)
        doc["after_kill_voice"] = {
            "audio_samples": int(spoken.audio.size) if spoken.audio is not None else 0,
            "sample_rate": spoken.sample_rate,
        }
        save()
    except BaseException as exc:
        import traceback

        doc["driver_error"] = "".join(traceback.format_exception(exc))[-4000:]
        raise
    finally:
        final = pipeline.close()
        doc["final_ledger"] = final
        save()


def test_plan_places_each_stage_on_its_node(report: dict[str, Any]) -> None:
    assert report["nodes"] == ["head", "second"]
    assert {"head/cpu", "second/cpu"} <= set(report["devices"])
    plan = report["plan"]
    assert plan["thinker"]["device"] == "second/cpu" and plan["thinker"]["node"] == "second"
    assert plan["voice"]["device"] == "head/cpu" and plan["voice"]["across"] == ["thinker"]
    assert {"head/host_ram", "second/host_ram"} <= set(report["pools"])
    assert report["listening"], "joining says where the cluster listens"


def test_ray_s_memory_is_measured_on_each_node(report: dict[str, Any]) -> None:
    m = report["ray_memory"]
    print("Ray per node:", {n: (v["bytes"], v["processes"], v["names"]) for n, v in m.items()})
    assert set(m) == {"head", "second"}
    assert (
        "gcs_server" in m["head"]["names"] and "gcs_server" not in m["second"]["names"]
    )  # the GCS is the head's
    assert all("raylet" in v["names"] and v["bytes"] > 20 * 2**20 for v in m.values()), m
    assert m["head"]["session_dir"] != m["second"]["session_dir"]


def test_the_reply_across_nodes_has_the_single_node_form(report: dict[str, Any]) -> None:
    reply = report["reply"]
    assert reply["stages"] == ["thinker", "voice"]
    assert reply["devices"] == {"thinker": "second/cpu", "voice": "head/cpu"}
    assert reply["text"] and reply["chunks"] >= 1
    assert reply["voice_items"] == reply["chunks"]
    assert reply["sample_rate"] == VOICE_RATE and reply["audio_samples"] > 0
    assert (
        reply["listens_on"] == report["listening"]
    )  # where the joined cluster listens, in the run's record
    # the edge between the nodes and its transfer cost: each sentence handed to the voice, in UTF-8 bytes
    assert report["edges"] == [
        {
            "from": "thinker",
            "to": "voice",
            "from_node": "second",
            "to_node": "head",
            "crosses_nodes": True,
            "requests": 1,
            "items": reply["chunks"],
            "bytes": reply["chunk_bytes"],
            "bytes_per_item": round(reply["chunk_bytes"] / reply["chunks"], 1),
        }
    ]


def test_the_second_node_leaving_fails_the_request_naming_it(report: dict[str, Any]) -> None:
    assert "driver_error" not in report, (report.get("placement"), report["driver_error"])
    kill = report["kill"]
    print("killed mid-request:", kill)
    assert kill["error"] == "StageFailed", kill
    assert kill["device"].startswith("second/") and "node second" in kill["cause"], kill
    # its stage's reservations are released; the first node's stage still holds its own and serves
    holders = report["ledger_after_kill"]
    assert "thinker" not in holders.get("second/host_ram", []), holders
    assert "voice" in holders.get("head/host_ram", []), holders
    health = {h["name"]: h for h in report["health"]}
    assert not health["thinker"]["alive"] and "node second" in health["thinker"]["error"]
    assert health["voice"]["alive"]
    after = report["after_kill_voice"]
    assert after["audio_samples"] > 0 and after["sample_rate"] == VOICE_RATE
    # closed: every pool the ledger still knows holds nothing
    pools = report["final_ledger"].get("pools", [])
    assert pools and all(p.get("held_bytes", 0) == 0 for p in pools), pools


def test_a_cluster_reachable_from_other_hosts_needs_token_auth() -> None:
    assert auth_problem(["127.0.0.1", "::1"], {}) is None  # loopback only
    assert auth_problem(["127.0.0.1", "192.0.2.2"], {"RAY_AUTH_MODE": "token"}) is None
    problem = auth_problem(["127.0.0.1", "192.0.2.2"], {})
    assert problem is not None and "192.0.2.2" in problem and "RAY_AUTH_MODE=token" in problem
    assert "RAY_AUTH_TOKEN_PATH" in problem


def test_the_second_node_s_death_is_said_truly_and_within_the_health_check_bound(
    report: dict[str, Any],
) -> None:
    """The request the second node's death interrupts fails naming what happened: the node
    (its name and Ray node id) died, and the thinker's actor with it while serving the
    request — not "did not start" — with a remedy; and the driver knows it within the
    bound docs/cluster.md states for the health-check settings every node runs with."""
    kill = report["kill"]
    second_id, _pid = report["placement"]["actors"]["second/cpu"]  # the node ready() said
    assert kill["error"] == "StageFailed" and kill["code"] == "device_actor_died", kill
    assert (kill["stage"], kill["device"]) == ("thinker", "second/cpu"), kill
    cause = kill["cause"]
    assert f"node second (Ray node {second_id[:12]} at " in cause, cause
    assert "died and the device actor for second/cpu died with it" in cause, cause
    assert "while serving request " in cause and "did not start" not in cause, cause
    assert "how to fix: start node second again" in cause and "--mask second" in cause, cause
    assert kill["bound_s"] == RECOMMENDED.bound_s() == 3 * (1.0 + 2.0) + 2.0
    assert kill["noticed_s"] <= kill["bound_s"], kill
