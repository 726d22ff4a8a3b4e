"""A fallback the user named, across the two nodes of a real Ray cluster on this machine: the
second node dies, and the stage it ran comes back on the head node, because its ``devices``
list allows it and its ``on_device_loss`` says ``fallback``.

The cluster is ``test_cluster_nodes``'s (a head and a second node, each ``ray start`` in its
own process group, token authentication, the health checks docs/cluster.md gives); this
module starts its own. The driver runs in a subprocess (Ray allows one connection per
process): it probes the live cluster, plans the echo pipeline with the thinker on
``head/cpu`` and the voice on ``second/cpu`` (its list: ``[second/cpu, head/cpu]``), serves a
request, says it is ready, and waits for a gate file while the test kills the second node's
process group with SIGKILL; then it waits for the move, serves again, and reports what it saw
as JSON. Ordered by the ready and gate files; polled with generous deadlines.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.helpers import REPO
from tests.orchestrator.runtime.test_cluster_nodes import two_nodes  # noqa: F401 - the fixture

pytestmark = [pytest.mark.ray, pytest.mark.slow]

WAIT_S = 240.0
"""The node's death known (within the health checks' bound), the voice planned again and
loaded on the head: minutes at most on a loaded 2-core machine."""
ECHO = """\
name: echo-two-nodes
stages:
  - {name: thinker, kind: echo, mode: words, devices: [head/cpu], final_output: true,
     final_output_type: text}
  - {name: voice, kind: echo, mode: tone, inputs: [thinker], devices: [second/cpu, head/cpu],
     on_device_loss: fallback, final_output: true, final_output_type: audio,
     restart: {max: 5, window_s: 600, backoff_s: 0.2, backoff_max_s: 0.5}}
"""


def drive(address: str, config_path: str, base: str) -> None:
    """The driver (its own process): the echo pipeline planned on the live cluster, a request
    before and after the second node dies; what it saw to ``base``/fallback.json."""
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
    pipeline = Pipeline(
        plan_pipeline(config, profile), config, profile=profile, address=address, record=None
    )
    doc: dict[str, Any] = {}
    root = Path(base)

    def ask(prompt: str) -> dict[str, Any]:
        result = asyncio.run(pipeline.arun(prompt))
        voice = result.stages["voice"]
        return {
            "samples": int(result.audio.size) if result.audio is not None else 0,
            "device": voice.get("device"),
            "restarted": voice.get("restarted"),
        }

    def held() -> dict[str, Any]:
        snap = pipeline.ledger_snapshot()
        return {
            "held_bytes": snap["held_bytes"],
            "holders": {
                h: [(r["pool"], r["bytes"]) for r in rs] for h, rs in snap["holders"].items()
            },
        }

    try:
        pipeline.start()
        doc["placed"] = {s.name: s.device for s in pipeline.plan.stages}
        doc["before"] = ask("before")
        doc["held_before"] = held()
        (root / "ready").touch()
        deadline = time.monotonic() + WAIT_S
        while not (root / "killed").exists():
            assert time.monotonic() < deadline, "the test never killed the second node"
            time.sleep(0.1)
        supervisor = pipeline.runtime.supervisor
        assert supervisor is not None
        while not supervisor.moves:
            assert time.monotonic() < deadline, "the voice never moved"
            time.sleep(0.1)
        doc["moves"] = list(supervisor.moves)
        doc["plan_voice"] = pipeline.plan.stage("voice").device
        doc["after"] = ask("after")
        doc["held_after"] = held()
        doc["states"] = {k: st.state for k, st in supervisor.states.items()}
    except BaseException as exc:
        import traceback

        doc["driver_error"] = "".join(traceback.format_exception(exc))[-4000:]
        raise
    finally:
        doc["final_ledger"] = pipeline.close()
        (root / "fallback.json").write_text(json.dumps(doc, default=str))


def _kill_second(two_nodes: dict[str, Any]) -> None:  # noqa: F811 - the fixture's value
    """SIGKILL the second node's process group, then any process of it that left the group."""
    os.killpg(two_nodes["second_pgid"], signal.SIGKILL)
    temp = str(two_nodes["second_temp"])
    for p in psutil.process_iter(["cmdline"]):
        try:
            if temp in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid():
                p.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue


def test_the_second_node_dies_and_its_stage_comes_back_on_the_head_node(
    two_nodes: dict[str, Any],  # noqa: F811 - the fixture
) -> None:
    base = Path(two_nodes["base"]) / "fallback"
    base.mkdir()
    config = base / "echo.yaml"
    config.write_text(ECHO)
    code = (
        "import sys; from tests.orchestrator.runtime.test_cluster_fallback import drive; "
        "drive(sys.argv[1], sys.argv[2], sys.argv[3])"
    )
    driver = subprocess.Popen(
        [sys.executable, "-c", code, two_nodes["address"], str(config), str(base)],
        env=two_nodes["env"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while not (base / "ready").exists():
            assert driver.poll() is None, driver.communicate()[0][-6000:]
            assert time.monotonic() < deadline, "the driver never got ready"
            time.sleep(0.2)
        _kill_second(two_nodes)
        (base / "killed").touch()
        output, _ = driver.communicate(timeout=WAIT_S + 120)
    finally:
        if driver.poll() is None:
            driver.kill()
    doc = json.loads((base / "fallback.json").read_text())
    assert driver.returncode == 0 and "driver_error" not in doc, output[-6000:]
    assert doc["placed"] == {"thinker": "head/cpu", "voice": "second/cpu"}
    assert doc["before"]["samples"] > 0 and doc["before"]["device"] == "second/cpu"
    (moved,) = doc["moves"]
    assert (moved["stage"], moved["from"], moved["to"]) == ("voice", "second/cpu", "head/cpu")
    assert "second" in moved["why"] and "died" in moved["why"]
    assert doc["plan_voice"] == "head/cpu"
    assert doc["after"]["samples"] > 0 and doc["after"]["device"] == "head/cpu"
    assert doc["after"]["restarted"] == {"moved_from": "second/cpu"}
    before, after = doc["held_before"], doc["held_after"]
    assert sorted(after["holders"]) == sorted(before["holders"])  # nobody counted twice
    assert after["held_bytes"] == before["held_bytes"]
    assert {pool for pool, _ in after["holders"]["voice"]} == {"head/host_ram"}
    assert sorted(b for _, b in after["holders"]["voice"]) == sorted(
        b for _, b in before["holders"]["voice"]
    )
    # the second node's actor is lost (never restarted there); the voice's new one serves
    assert doc["states"] == {"head/cpu": "up", "second/cpu": "lost", "head/cpu#1": "up"}
    assert doc["final_ledger"]["held_bytes"] == 0
    print("voice moved from second/cpu to head/cpu in", moved["seconds"], "s:", moved["why"][:200])
