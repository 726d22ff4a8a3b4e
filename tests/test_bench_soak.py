"""bench/soak.py: what its clients send is what the server serves (a chat asked aloud is a
recording the audio entry takes, never refused for sampling beside it), and bad arguments
are exit 2 before any slow work."""

from __future__ import annotations

import base64
import io
import subprocess
import sys
import wave
from types import ModuleType

import pytest

from orchestrator.core.errors import BadRequest
from orchestrator.server.protocol import chat_request
from tests.helpers import REPO
from tests.helpers.bench import load_bench


@pytest.fixture(scope="module")
def soak() -> ModuleType:
    return load_bench("soak")


def _wav(seconds: float = 0.5, rate: int = 16000) -> str:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\x00\x10" * int(seconds * rate))
    return base64.b64encode(out.getvalue()).decode()


def test_a_chat_asked_aloud_is_the_recording_the_audio_entry_takes(soak: ModuleType) -> None:
    for extra in ({}, {"stream": True}):
        body = soak.chat_body("What is the tallest mountain?", _wav(), 24, **extra)
        assert "max_tokens" not in body
        item = chat_request(body, audio_entry=True)
        assert isinstance(item, dict) and item["sample_rate"] == 16000
        assert len(item["audio"]) == 8000  # the half second the WAV holds


def test_a_chat_asked_in_words_keeps_its_max_tokens(soak: ModuleType) -> None:
    body = soak.chat_body("Tell me one fact about the Moon.", None, 24)
    assert body["max_tokens"] == 24
    assert chat_request(body) == {
        "messages": [{"role": "user", "content": "Tell me one fact about the Moon."}],
        "sampling": {"max_tokens": 24},
    }


def test_sampling_beside_a_recording_is_what_the_server_refuses(soak: ModuleType) -> None:
    """The soak's first voice-chat run sent this and had every chat refused: the reason the
    body leaves it out."""
    body = {**soak.chat_body("Hi", _wav(), 24), "max_tokens": 24}
    with pytest.raises(BadRequest, match="sampling goes to the stage that takes the request"):
        chat_request(body, audio_entry=True)


@pytest.mark.parametrize(
    "args, named",
    [
        (["--minutes", "0"], "--minutes must be positive"),
        (["--kill-every", "50", "10"], "--kill-every MIN MAX"),
        (["--kill-every", "0", "10"], "--kill-every MIN MAX"),
    ],
)
def test_bad_arguments_are_exit_2_naming_them_before_any_work(args: list[str], named: str) -> None:
    r = subprocess.run(
        [sys.executable, str(REPO / "bench" / "soak.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert named in r.stderr and "Traceback" not in r.stderr
    assert "soaking" not in r.stdout
