"""A served pipeline heals itself, as its clients see it: ``/health``, ``/metrics``, ``/v1/plan``,
``/v1/status``, a chat and a streamed chat while a stage's device actor dies and comes back.

A real server (``create_app`` under uvicorn) over a real echo pipeline on Ray; the voice runs
alone in its actor (``igpu:0``) and is killed with SIGKILL. The supervisor's ``actor_ready``
hook holds a restart while the test looks at the server (so "while it restarts" is a state, not
a moment); the voice's ``gate_file`` holds a streamed reply mid-way; its ``crash_file`` makes
every load crash. Waits poll with generous deadlines.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.echo import echo_pipeline
from tests.orchestrator.server.test_server import _samples, _Served

httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.ray

WAIT_S = 90.0
FAST = {"backoff_s": 0.2, "backoff_max_s": 0.5}
CHAT = {
    "messages": [{"role": "user", "content": "hi there"}],
    "modalities": ["text", "audio"],
    "audio": {"voice": "v", "format": "pcm16"},
}


def _until(what: str, ok: Any) -> Any:
    deadline = time.monotonic() + WAIT_S
    while True:
        found = ok()
        if found:
            return found
        assert time.monotonic() < deadline, f"not within {WAIT_S:g} s: {what}"
        time.sleep(0.05)


def _serve(tmp_path: Path, **voice: Any) -> tuple[Any, _Served]:
    from orchestrator.api import Pipeline
    from orchestrator.core.units import GiB
    from orchestrator.server import create_app
    from tests.helpers.profiles import make_profile

    plan, config = echo_pipeline(
        tmp_path,
        voice={"restart": {"max": 5, "window_s": 600, **FAST}, **voice},
        voice_device="igpu:0",
    )
    p = Pipeline(plan, config, profile=make_profile(ram_available=8 * GiB), record=None).start()
    return p, _Served(create_app(p))


def _kill_voice(p: Any) -> None:
    os.kill(int(p.runtime.devices["igpu:0"].info["pid"]), signal.SIGKILL)


def test_health_names_the_restart_at_once_requests_wait_or_get_retry_after_then_it_serves(
    ray_cluster: Any, tmp_path: Path
) -> None:
    p, s = _serve(tmp_path)
    held, release = threading.Event(), threading.Event()

    def hold(key: str, info: dict[str, Any]) -> None:
        held.set()
        assert release.wait(WAIT_S)

    p.runtime.supervisor.hooks["actor_ready"] = hold
    try:
        assert httpx.get(f"{s.url}/health").json()["status"] == "ok"
        before = p.ledger_snapshot()["held_bytes"]
        _kill_voice(p)
        health = httpx.get(f"{s.url}/health", timeout=30)  # asks the actors: no cache
        assert health.status_code == 503, health.text
        doc = health.json()
        assert doc["status"] == "recovering"
        (recovering,) = doc["recovering"]
        assert (recovering["stage"], recovering["device"], recovering["code"]) == (
            "voice",
            "igpu:0",
            "stage_restarting",
        )
        assert recovering["attempt"] == 1 and recovering["died_at"].endswith("Z")
        assert "died" in recovering["cause"]
        assert doc["failed"] == [{"stage": "voice", "device": "igpu:0", "code": "stage_restarting"}]
        assert held.wait(WAIT_S)
        p.runtime.admission.wait_timeout_s = 0.5  # past the admission's wait: a 503 to retry
        chat = httpx.post(f"{s.url}/v1/chat/completions", json=CHAT, timeout=30)
        assert chat.status_code == 503 and chat.headers["retry-after"] == "5"
        assert chat.json()["error"]["code"] == "stage_restarting"
        p.runtime.admission.wait_timeout_s = WAIT_S
        status = httpx.get(f"{s.url}/v1/status").json()
        assert status["queue"]["in_flight"] == 0 and status["queue"]["waiting_for_restart"] == 0
        release.set()
        _until("200 again", lambda: httpx.get(f"{s.url}/health").status_code == 200)
        chat = httpx.post(f"{s.url}/v1/chat/completions", json=CHAT, timeout=60)
        assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["audio"]["data"]
        assert p.ledger_snapshot()["held_bytes"] == before
        metrics = _samples(httpx.get(f"{s.url}/metrics").text)
        assert (
            metrics['omni_edge_stage_restarts_total{cause="device_actor_died",stage="voice"}'] == 1
        )
        (recent,) = [r for r in httpx.get(f"{s.url}/v1/status").json()["recent"] if r["stages"]][
            -1:
        ]
        assert recent["stages"]["voice"]["restarted"]["restarts"] == 1
        assert "restarted" not in recent["stages"]["thinker"]
    finally:
        release.set()
        s.stop()
        final = p.close()
    assert not final.get("held_bytes")


def test_a_streamed_chat_cut_by_the_death_ends_with_an_sse_error_event(
    ray_cluster: Any, tmp_path: Path
) -> None:
    gate, waiting = tmp_path / "gate", tmp_path / "waiting"
    p, s = _serve(tmp_path, gate_file=str(gate), waiting_file=str(waiting))
    killed = threading.Event()

    def kill_when_held() -> None:
        # The voice holds its last chunk (the gate is never opened before the kill), so the
        # reply is mid-way when it dies; watched apart from the stream, which sends nothing
        # while the chunk is held.
        _until("the voice holding its last chunk", waiting.exists)
        _kill_voice(p)
        killed.set()

    try:
        events = []
        watcher = threading.Thread(target=kill_when_held, daemon=True)
        with httpx.stream(
            "POST", f"{s.url}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=60
        ) as r:
            assert r.status_code == 200
            watcher.start()
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
        watcher.join(WAIT_S)
        assert killed.is_set()
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == "stage_restarting" and error["param"] == "voice"
        assert any('"audio"' in e for e in events[:-2])  # some of the reply went out first
        assert p.runtime.admission.in_flight == 0
        gate.touch()
        chat = httpx.post(f"{s.url}/v1/chat/completions", json=CHAT, timeout=WAIT_S)
        assert chat.status_code == 200  # waited for the voice to come back
    finally:
        s.stop()
        p.close()


def test_a_crash_loop_is_named_on_health_and_the_server_answers_on(
    ray_cluster: Any, tmp_path: Path
) -> None:
    crash = tmp_path / "crash"
    p, s = _serve(tmp_path, restart={"max": 1, "window_s": 600, **FAST}, crash_file=str(crash))
    try:
        crash.touch()
        _kill_voice(p)
        doc = _until(
            "the crash loop on /health",
            lambda: (d := httpx.get(f"{s.url}/health").json())["status"] == "unavailable" and d,
        )
        assert doc["failed"] == [{"stage": "voice", "device": "igpu:0", "code": "crash_loop"}]
        voice = next(x for x in doc["stages"] if x["name"] == "voice")
        assert voice["restart"]["state"] == "crash_loop" and voice["restart"]["restarts"] == 1
        assert "restart attempt 1 failed" in voice["restart"]["cause"]
        chat = httpx.post(f"{s.url}/v1/chat/completions", json=CHAT, timeout=30)
        assert chat.status_code == 503 and chat.json()["error"]["code"] == "crash_loop"
        assert "retry-after" not in chat.headers
        for path in ("/v1/models", "/v1/plan", "/v1/status", "/metrics"):
            assert httpx.get(f"{s.url}{path}").status_code == 200, path
    finally:
        s.stop()
        final = p.close()
    assert not final.get("held_bytes")


def test_a_stage_moved_to_its_fallback_is_said_on_health_plan_and_metrics(
    ray_cluster: Any, tmp_path: Path
) -> None:
    p, s = _serve(tmp_path, devices=["igpu:0", "cpu"], on_device_loss="fallback")
    try:
        assert httpx.get(f"{s.url}/v1/plan").json()["stages"][1]["device"] == "igpu:0"
        p.runtime.lose_device("igpu:0", "masked away after load")
        _kill_voice(p)
        doc = _until(
            "the move on /health",
            lambda: (d := httpx.get(f"{s.url}/health").json()).get("moved") and d,
        )
        assert doc["status"] == "degraded"
        (moved,) = doc["moved"]
        assert (moved["stage"], moved["from"], moved["to"]) == ("voice", "igpu:0", "cpu")
        assert "masked away after load" in moved["why"]
        plan = httpx.get(f"{s.url}/v1/plan").json()
        voice = next(x for x in plan["stages"] if x["name"] == "voice")
        assert voice["device"] == "cpu" and voice["measured"]["measured_peak_bytes"]
        metrics = _samples(httpx.get(f"{s.url}/metrics").text)
        key = 'omni_edge_stage_moves_total{from_device="igpu:0",stage="voice",to_device="cpu"}'
        assert metrics[key] == 1
        chat = httpx.post(f"{s.url}/v1/chat/completions", json=CHAT, timeout=60)
        assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["audio"]["data"]
    finally:
        s.stop()
        final = p.close()
    assert not final.get("held_bytes")
