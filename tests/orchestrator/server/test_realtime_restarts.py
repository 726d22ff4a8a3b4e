"""A live ``/v1/realtime`` session survives a stage's death: the reply it cut ends with an
OpenAI-shaped ``error`` (code ``stage_restarting``) and ``response.done`` ``failed``, the
session stays open with its history, and its next turn is served once the stage is back.

A real server (``create_app`` under uvicorn) over a real pipeline on Ray — Whisper tiny.en
(the audio entry a session needs) → the echo thinker → the echo voice, all on the CPU's
one device actor — and a real WebSocket client speaking the Realtime API's events. The
voice holds each reply's last chunk until its ``gate_file`` exists, so the second turn is
mid-reply by construction when the actor is killed (SIGKILL). The echo thinker counts the
words of every message it is given (its ``prompt_tokens``, the reply's ``input_tokens``), so
the history the third turn carries is read from its usage; the session passes history to
the thinker as it does to a decode stage. Never asserted: what Whisper hears.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import threading
import time
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
REPLY_TIMEOUT_S = 240.0
"""The longest one turn may take on a loaded 2-core machine, a restart included."""


def _pipeline(tmp_path: Path) -> Any:
    from orchestrator.api import Pipeline
    from orchestrator.core.units import GiB
    from tests.helpers.profiles import make_profile

    whisper = {g: REPO / "exports" / f"whisper-tiny-en-{g}" for g in ("encoder", "decoder")}
    if not all((d / "manifest.yaml").is_file() for d in whisper.values()):
        pytest.skip("capability: no Whisper manifests: python -m exports.whisper_asr build")
    gate, waiting = tmp_path / "gate", tmp_path / "waiting"
    (tmp_path / "talk.yaml").write_text(
        "name: realtime-restarts\n"
        "stages:\n"
        f"  - {{name: asr, kind: asr, encoder: {whisper['encoder']},\n"
        f"     decoder: {whisper['decoder']}, inputs: [request], devices: [cpu],\n"
        "     final_output: true, final_output_type: text,\n"
        "     restart: {max: 5, window_s: 600, backoff_s: 0.2, backoff_max_s: 0.5}}\n"
        "  - {name: thinker, kind: echo, mode: words, inputs: [asr], devices: [cpu],\n"
        "     final_output: true, final_output_type: text,\n"
        "     restart: {max: 5, window_s: 600, backoff_s: 0.2, backoff_max_s: 0.5}}\n"
        "  - {name: voice, kind: echo, mode: tone, inputs: [thinker], devices: [cpu],\n"
        f"     gate_file: {gate}, waiting_file: {waiting},\n"
        "     final_output: true, final_output_type: audio,\n"
        "     restart: {max: 5, window_s: 600, backoff_s: 0.2, backoff_max_s: 0.5}}\n"
    )
    (tmp_path / "profile.json").write_text(make_profile(ram_available=8 * GiB).model_dump_json())
    return Pipeline.from_config(
        tmp_path / "talk.yaml", profile=tmp_path / "profile.json", record=None
    )


def _pcm16(samples: np.ndarray) -> str:
    return base64.b64encode((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()).decode()


def _turn(ws: Any, audio: str, on_event: Any = None) -> list[dict[str, Any]]:
    """One turn the client ends itself: append, commit, ask; every event until ``response.done``."""
    ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
    ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    ws.send(json.dumps({"type": "response.create"}))
    events = []
    while True:
        event = json.loads(ws.recv(timeout=REPLY_TIMEOUT_S))
        events.append(event)
        if on_event is not None:
            on_event(event)
        if event["type"] == "response.done":
            return events


def _said(events: list[dict[str, Any]]) -> tuple[str, str]:
    """(the user's transcript, the assistant's reply) of a completed turn."""
    heard = next(
        e["transcript"]
        for e in events
        if e["type"] == "conversation.item.input_audio_transcription.completed"
    )
    reply = "".join(e["delta"] for e in events if e["type"] == "response.audio_transcript.delta")
    return heard, reply


def test_a_session_whose_reply_was_cut_stays_open_keeps_its_history_and_is_served_again(
    ray_cluster: Any, tmp_path: Path
) -> None:
    from starlette.applications import Starlette
    from websockets.sync.client import connect

    from orchestrator.server import create_app
    from tests.helpers.speech import speak

    samples, rate = speak("Hello there. How are you today?")
    audio = _pcm16(resample(samples, rate, RATE))
    p = _pipeline(tmp_path).start()
    app = create_app(p)
    inner: Any = app
    while not isinstance(inner, Starlette):
        inner = inner.app
    inner.state.realtime.decode_stages = ["thinker"]  # the history goes to the echo thinker
    s = _Served(app)
    gate, waiting = tmp_path / "gate", tmp_path / "waiting"
    try:
        url = s.url.replace("http://", "ws://") + "/v1/realtime"
        with connect(url, open_timeout=30) as ws:
            assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
            ws.send(json.dumps({"type": "session.update", "session": {"turn_detection": None}}))
            assert json.loads(ws.recv(timeout=30))["type"] == "session.updated"
            gate.touch()
            first = _turn(ws, audio)
            assert first[-1]["response"]["status"] == "completed", first[-1]
            heard1, reply1 = _said(first)
            gate.unlink()
            waiting.unlink(missing_ok=True)

            heard_audio = threading.Event()

            def note_audio(event: dict[str, Any]) -> None:
                if event["type"] == "response.audio.delta":
                    heard_audio.set()

            def kill_mid_reply() -> None:
                # mid-reply by construction: the client has had audio and the voice holds the
                # reply's last chunk at its gate (killing on any event once the voice waited
                # could beat the first audio to the client)
                deadline = time.monotonic() + REPLY_TIMEOUT_S
                while not (heard_audio.is_set() and waiting.exists()):
                    if time.monotonic() > deadline:
                        return
                    time.sleep(0.01)
                os.kill(int(p.runtime.devices["cpu"].info["pid"]), signal.SIGKILL)

            killer = threading.Thread(target=kill_mid_reply, daemon=True)
            killer.start()
            second = _turn(ws, audio, note_audio)
            killer.join(timeout=REPLY_TIMEOUT_S)
            errors = [e["error"] for e in second if e["type"] == "error"]
            assert [e["code"] for e in errors] == ["stage_restarting"], second
            assert errors[0]["type"] == "server_error" and "is coming back" in errors[0]["message"]
            done = second[-1]["response"]
            assert done["status"] == "failed"
            assert done["status_details"]["error"]["code"] == "stage_restarting"
            assert any(e["type"] == "response.audio.delta" for e in second)  # cut mid-reply
            gate.touch()
            third = _turn(ws, audio)  # waits for the stages to come back, then is served
            assert third[-1]["response"]["status"] == "completed", third[-1]
            heard3, _ = _said(third)
            # the first turn is the history the third carries; the cut one is not
            words = len(heard1.split()) + len(reply1.split()) + len(heard3.split())
            assert third[-1]["response"]["usage"]["input_tokens"] == words, (
                heard1,
                reply1,
                heard3,
                third[-1]["response"]["usage"],
            )
        assert p.runtime.supervisor is not None
        assert p.runtime.supervisor.states["cpu"].revived == 1
    finally:
        s.stop()
        deadline = time.monotonic() + 5
        while p.runtime.admission.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        final = p.close()
    assert not final.get("held_bytes")
