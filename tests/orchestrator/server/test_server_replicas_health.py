"""``/health`` and ``/metrics`` for a stage with replicas (``replicas: N``): a dead replica
whose sibling serves leaves the server answering (200, ``status: degraded`` naming that
replica, its device and the code; the speech still spoken); every replica dead is today's
503 naming the stage. Echo kinds, the voice's two replicas on ``igpu:0`` and ``npu:0``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.orchestrator.server.test_server import _samples, _Served

httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.ray

SPEECH = {"model": "m", "input": "Still here. And still speaking.", "voice": "v"}
WAIT_S = 20.0
"""The longest the test waits for the runtime to notice a dead actor (milliseconds here)."""


def _speak_until_noticed(url: str, ok: Any) -> httpx.Response:
    """Speech requests until one answers as ``ok`` says (the runtime notices a dead actor
    through the next call that touches it; the balancer alternates the replicas)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        r = httpx.post(f"{url}/v1/audio/speech", json=SPEECH, timeout=30)
        if ok(r) or time.monotonic() > deadline:
            return r


@pytest.mark.slow
def test_a_dead_replica_is_degraded_named_and_every_replica_dead_is_503(
    ray_cluster: Any, tmp_path: Path
) -> None:
    from orchestrator.api import Pipeline
    from orchestrator.server import create_app
    from tests.helpers.echo import echo_pipeline

    plan, config = echo_pipeline(
        tmp_path, voice={"restart": "never"}, voice_replicas=("igpu:0", "npu:0")
    )
    p = Pipeline(plan, config, record=None).start()
    s = _Served(create_app(p))
    try:
        health = httpx.get(f"{s.url}/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        voice = health.json()["stages"][1]
        assert voice["replicas"] == [
            {"replica": 1, "device": "igpu:0", "alive": True},
            {"replica": 2, "device": "npu:0", "alive": True},
        ]
        plan = httpx.get(f"{s.url}/v1/plan").json()
        replicas = next(x for x in plan["stages"] if x["name"] == "voice")["replicas"]
        assert [r["holder"] for r in replicas] == ["voice#0", "voice#1"]
        for r in replicas:  # each replica's own measured peak beside its own budget
            assert r["measured"]["measured_peak_bytes"] > 0
            assert r["measured"]["budget_bytes"] == r["budget_bytes"]
        p.runtime.kill_replica("voice", 1)
        _speak_until_noticed(s.url, lambda r: r.status_code != 200)
        health = httpx.get(f"{s.url}/health")
        assert health.status_code == 200
        doc = health.json()
        assert doc["status"] == "degraded"
        assert doc["degraded"] == [
            {"stage": "voice", "replica": 2, "device": "npu:0", "code": "device_actor_died"}
        ]
        assert doc["stages"][1]["alive"] is True and "code" not in doc["stages"][1]
        assert doc["stages"][1]["replicas"][1] == {
            "replica": 2,
            "device": "npu:0",
            "alive": False,
            "code": "device_actor_died",
        }
        for _ in range(2):  # the live replica answers every later request
            speech = httpx.post(f"{s.url}/v1/audio/speech", json=SPEECH, timeout=30)
            assert speech.status_code == 200 and len(speech.content) > 44
        metrics = _samples(httpx.get(f"{s.url}/metrics").text)
        assert metrics['omni_edge_replica_alive{device="npu:0",replica="2",stage="voice"}'] == 0
        assert metrics['omni_edge_replica_alive{device="igpu:0",replica="1",stage="voice"}'] == 1
        assert metrics['omni_edge_stage_alive{device="igpu:0",stage="voice"}'] == 1

        p.runtime.kill_replica("voice", 0)
        _speak_until_noticed(s.url, lambda r: r.status_code == 503)
        health = httpx.get(f"{s.url}/health")
        assert health.status_code == 503
        doc = health.json()
        assert doc["status"] == "unavailable" and "degraded" not in doc
        assert doc["failed"] == [
            {"stage": "voice", "device": "igpu:0", "code": "device_actor_died"}
        ]
    finally:
        s.stop()
        final = p.close()
    assert not final.get("held_bytes")


@pytest.mark.slow
def test_a_replica_whose_engine_stopped_is_degraded_with_its_code(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """An engine that stopped inside a living actor (``StageRunner.health``, as the vLLM
    runner says it) is said per replica: the stage serves on its sibling."""
    import ray

    from orchestrator.api import Pipeline
    from orchestrator.server import create_app
    from tests.helpers.echo import echo_pipeline

    plan, config = echo_pipeline(tmp_path, voice_replicas=("igpu:0", "npu:0"))
    p = Pipeline(plan, config, record=None).start()
    s = _Served(create_app(p))

    def stop_engine(actor: Any) -> None:  # runs in replica 2's device actor
        actor.stages["voice"].runner.health = lambda: {
            "code": "engine_failed",
            "message": "the engine thread ended",
        }

    try:
        ray.get(p.runtime.devices["npu:0"].actor.__ray_call__.remote(stop_engine))
        health = httpx.get(f"{s.url}/health")
        assert health.status_code == 200
        doc = health.json()
        assert doc["status"] == "degraded"
        assert doc["degraded"] == [
            {"stage": "voice", "replica": 2, "device": "npu:0", "code": "engine_failed"}
        ]
        assert doc["stages"][1]["alive"] is True
    finally:
        s.stop()
        p.close()
