"""A realtime session's turns on one replica of a sticky stage: ``/v1/realtime`` passes its
session id as the request's ``conversation`` (``realtime.Session._run_response``), and the
runtime's balancer keeps a conversation on one replica of a stage whose state lives across
turns (``StageKind.replica_affinity`` "conversation", an Omni talker's KV).

The smallest real setup that shows it: a real server (``create_app`` under uvicorn) over a
real pipeline on Ray — Whisper tiny.en (the audio entry a session needs) → the echo voice
as two replicas — and a real WebSocket client speaking the Realtime API's events. The echo
voice keeps no state itself, so the test marks it sticky, as a talker is (the balancer's
``sticky``). With the session id dropped, the turns alternate between the replicas (the
least-loaded, ties in turn). Never asserted: what Whisper hears."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.runtime.audio import resample
from tests.helpers.graphs import REPO
from tests.orchestrator.server.test_server import _Served

websockets = pytest.importorskip("websockets")

pytestmark = [pytest.mark.ray, pytest.mark.ort, pytest.mark.slow]

RATE = 24000
"""The Realtime API's pcm16 rate."""
TURNS = 3
REPLY_TIMEOUT_S = 240.0
"""The longest one turn's reply may take on a loaded 2-core machine (Whisper tiny: seconds)."""


def _pipeline(tmp_path: Path) -> Any:
    """Whisper tiny.en → the echo voice with ``replicas: 2``, planned by the real planner (the
    echo kind runs on the CPU only: two processes there, ``cpu`` and ``cpu#1``)."""
    from orchestrator.api import Pipeline
    from orchestrator.core.units import GiB
    from tests.helpers.profiles import make_profile

    whisper = {g: REPO / "exports" / f"whisper-tiny-en-{g}" for g in ("encoder", "decoder")}
    if not all((d / "manifest.yaml").is_file() for d in whisper.values()):
        pytest.skip("no Whisper manifests: python -m exports.whisper_asr build")
    (tmp_path / "talk.yaml").write_text(
        "name: realtime-replicas\n"
        "stages:\n"
        f"  - {{name: asr, kind: asr, encoder: {whisper['encoder']},\n"
        f"     decoder: {whisper['decoder']}, inputs: [request], devices: [cpu],\n"
        "     final_output: true, final_output_type: text}\n"
        "  - {name: voice, kind: echo, mode: tone, inputs: [asr], devices: [cpu], replicas: 2,\n"
        "     final_output: true, final_output_type: audio}\n"
    )
    (tmp_path / "profile.json").write_text(make_profile(ram_available=8 * GiB).model_dump_json())
    return Pipeline.from_config(
        tmp_path / "talk.yaml", profile=tmp_path / "profile.json", record=None
    )


def _pcm16(samples: np.ndarray) -> str:
    return base64.b64encode((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()).decode()


def _turn(ws: Any, audio: str) -> dict[str, Any]:
    """One spoken turn the client ends itself (no turn detection): append, commit, ask for
    the response; the ``response.done`` event."""
    ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
    ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    ws.send(json.dumps({"type": "response.create"}))
    while True:
        event = json.loads(ws.recv(timeout=REPLY_TIMEOUT_S))
        assert event["type"] != "error", event
        if event["type"] == "response.done":
            return dict(event)


def test_the_turns_of_one_realtime_session_stay_on_one_replica_of_a_sticky_stage(
    ray_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from websockets.sync.client import connect

    from orchestrator.server import create_app
    from tests.helpers.speech import speak

    samples, rate = speak("Hello there. How are you today?")
    audio = _pcm16(resample(samples, rate, RATE))
    p = _pipeline(tmp_path).start()
    s = _Served(create_app(p))
    try:
        assert p.runtime.actor_keys() == ["cpu", "cpu#1"]
        monkeypatch.setattr(p.runtime.balancer, "sticky", frozenset({"voice"}))
        url = s.url.replace("http://", "ws://") + "/v1/realtime"
        with connect(url, open_timeout=30) as ws:
            created = json.loads(ws.recv(timeout=30))
            assert created["type"] == "session.created", created
            ws.send(json.dumps({"type": "session.update", "session": {"turn_detection": None}}))
            done = [_turn(ws, audio) for _ in range(TURNS)]
        assert [d["response"]["status"] for d in done] == ["completed"] * TURNS, done
        served = dict(p.runtime.balancer.served)
        # every turn of the one session on one replica; the other served none
        assert sorted(served.get(h, 0) for h in ("voice#0", "voice#1")) == [0, TURNS], served
        # a second session is balanced on its own: to the replica the first left idle
        with connect(url, open_timeout=30) as ws:
            json.loads(ws.recv(timeout=30))
            ws.send(json.dumps({"type": "session.update", "session": {"turn_detection": None}}))
            _turn(ws, audio)
        after = dict(p.runtime.balancer.served)
        assert sorted(after.get(h, 0) for h in ("voice#0", "voice#1")) == [1, TURNS], after
    finally:
        monkeypatch.undo()
        s.stop()
        p.close()
