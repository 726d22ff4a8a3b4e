"""``configs/examples/voice-chat.yaml`` end to end, as a user runs it: a question spoken by
the project's Piper voice (noise 0) with silence around it, written to a WAV, then
``omni-edge run CONFIG --audio q.wav --out reply.wav --json`` in a fresh interpreter.

Asserted: exit 0; the asr stage heard the question (WER ≤ 0.35 against the text we
synthesised: a bound on speech we built, loose enough for another CPU's near-tie tokens);
the VAD cut one segment and trimmed the silence; the reply has text and audio (duration,
loudness). Never what the thinker says."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from exports.whisper_asr import word_error_rate
from orchestrator.runtime.audio import read_wav, rms_dbfs, write_wav
from tests.helpers import REPO

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow, pytest.mark.ort]

CONFIG = REPO / "configs/examples/voice-chat.yaml"
QUESTION = "What is the tallest mountain in the world?"
WER_BOUND = 0.35
SILENCE_S = (1.0, 1.5)


def test_a_spoken_question_is_heard_answered_and_spoken(tmp_path: Path) -> None:
    if not (REPO / "exports/whisper-tiny-en-encoder/fp32.onnx").is_file():
        pytest.skip("Whisper's graphs are not built: python -m exports.whisper_asr build")
    if importlib.util.find_spec("silero_vad") is None:
        pytest.skip("silero-vad is not installed")
    from tests.helpers.speech import speak

    said, rate = speak(QUESTION)
    before, after = (np.zeros(int(s * rate), dtype=np.float32) for s in SILENCE_S)
    question = write_wav(tmp_path / "q.wav", np.concatenate([before, said, after]), rate)
    reply = tmp_path / "reply.wav"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "run",
            str(CONFIG),
            "--audio",
            str(question),
            "--out",
            str(reply),
            "--record",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=540,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout)
    heard = doc["texts"]["asr"]
    assert word_error_rate(QUESTION, heard) <= WER_BOUND, heard
    assert doc["texts"]["thinker"].strip()
    assert "asr: " in proc.stderr and "thinker: " in proc.stderr  # each stage's text under its name
    stages = {s["stage"]: s for s in doc["stages"]}
    assert list(stages) == ["vad", "asr", "thinker", "voice"]
    record = json.loads(Path(doc["record"]).read_text())
    vad = record["requests"][0]["stages"]["vad"]
    assert vad["segments"] == 1
    assert vad["heard_s"] == pytest.approx((said.size + before.size + after.size) / rate, abs=0.01)
    assert vad["speech_s"] < vad["heard_s"] - 0.8 * sum(SILENCE_S)  # silence trimmed
    assert doc["wav"] == str(reply)
    audio, out_rate = read_wav(reply)
    assert out_rate == 22050 and audio.size / out_rate > 0.5
    assert rms_dbfs(audio) > -40
