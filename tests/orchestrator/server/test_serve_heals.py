"""``omni-edge serve`` of the default pipeline (configs/voice-assistant.yaml: SmolLM2 on
llama.cpp and the Piper voice, here both on the CPU's one device actor, the voice in an
OpenVINO route worker) heals what dies, as a user sees it over HTTP.

The serve runs as a user starts it (a subprocess with its own Ray). Its device actor is
killed with SIGKILL (what the OOM killer sends): ``/health`` names it at once (asked of the
actors: 503 ``recovering`` with both stages, the attempt and the time of death), answers 200
again once they are back, the next chat is served with audio, and the ledger holds what it
held before. Then the voice's route worker is killed: the next chat is served with audio on
a fresh worker, counted under its own cause. The time from the kill to 200 is printed (the
soak, bench/soak.py, reports it over many kills); no wall-clock bound is asserted.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.helpers.serve import ServeProcess

httpx = pytest.importorskip("httpx")

pytestmark = [pytest.mark.ray, pytest.mark.ort, pytest.mark.slow]

WAIT_S = 240.0
"""The longest a restart of both stages may take on a loaded 2-core machine."""
CHAT = {
    "messages": [{"role": "user", "content": "Say hello."}],
    "modalities": ["text", "audio"],
    "audio": {"voice": "joe", "format": "pcm16"},
    "max_tokens": 16,
}


def _metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _held(url: str) -> dict[str, float]:
    return {k: v for k, v in _metrics(url).items() if k.startswith("omni_edge_ledger_held_bytes")}


def _chat_with_audio(url: str) -> None:
    r = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=WAIT_S)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["audio"]["data"]


def _until_healthy(url: str) -> float:
    t0 = time.monotonic()
    while httpx.get(f"{url}/health", timeout=30).status_code != 200:
        assert time.monotonic() - t0 < WAIT_S, httpx.get(f"{url}/health", timeout=30).text
        time.sleep(0.2)
    return time.monotonic() - t0


def test_serve_of_the_default_pipeline_heals_a_killed_device_actor_and_route_worker(
    tmp_path: Path,
) -> None:
    s = ServeProcess(REPO / "configs/voice-assistant.yaml", cwd=tmp_path, start_timeout_s=600)
    try:
        _chat_with_audio(s.url)
        before = _held(s.url)
        (actor,) = s.device_actors()  # the CPU hosts both stages: one actor
        (worker,) = s.route_workers()  # the voice's OpenVINO route worker
        os.kill(actor, signal.SIGKILL)
        killed = time.monotonic()
        health = httpx.get(f"{s.url}/health", timeout=30)  # at once: it asks the actors
        assert health.status_code == 503, health.text
        doc = health.json()
        assert doc["status"] == "recovering", doc
        assert {r["stage"] for r in doc["recovering"]} == {"thinker", "voice"}
        assert all(r["attempt"] == 1 and r["died_at"] for r in doc["recovering"])
        _until_healthy(s.url)
        recovered_s = time.monotonic() - killed
        _chat_with_audio(s.url)
        assert _held(s.url) == before  # the ledger holds what it held before the kill
        assert actor not in s.device_actors() and len(s.device_actors()) == 1
        metrics = _metrics(s.url)
        for stage in ("thinker", "voice"):
            key = f'omni_edge_stage_restarts_total{{cause="device_actor_died",stage="{stage}"}}'
            assert metrics[key] == 1, key

        (worker,) = s.route_workers()  # the restarted actor's own
        os.kill(worker, signal.SIGKILL)
        _until_healthy(s.url)
        _chat_with_audio(s.url)
        assert worker not in s.route_workers()
        key = 'omni_edge_stage_restarts_total{cause="route_worker_died",stage="voice"}'
        deadline = time.monotonic() + WAIT_S
        while _metrics(s.url).get(key) != 1:
            assert time.monotonic() < deadline, _metrics(s.url)
            time.sleep(0.2)
        assert _held(s.url) == before
        print(f"device actor killed → /health 200 again in {recovered_s:.1f} s")
    finally:
        rc = s.stop()
    assert rc == 0, s.output()
    assert "ledger holds 0 bytes" in s.output()
