"""``omni-edge run CONFIG --audio FILE.wav``: a file that cannot be read, a pipeline that
cannot hear, or a text-only option next to a recording is exit 2 naming it, before Ray
or any engine starts. (The whole run: tests/test_voice_chat_example.py.)"""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from orchestrator.api import audio_request
from orchestrator.cli import main
from orchestrator.core.errors import BadRequest
from orchestrator.runtime.audio import write_wav
from tests.helpers import REPO
from tests.helpers.profiles import make_profile

VOICE_CHAT = REPO / "configs/examples/voice-chat.yaml"


def _profile(tmp_path: Path) -> Path:
    prof = tmp_path / "profile.json"
    prof.write_text(make_profile().model_dump_json())
    return prof


def _wav(tmp_path: Path, seconds: float = 0.5) -> Path:
    return write_wav(tmp_path / "q.wav", np.zeros(int(16000 * seconds), np.float32), 16000)


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (lambda d: d / "missing.wav", "no such file"),
        (
            lambda d: (d / "notes.txt").write_text("hello") and d / "notes.txt",
            "not a readable WAV file",
        ),
        (lambda d: d, "is a directory"),
    ],
)
def test_a_file_that_cannot_be_read_is_exit_2_naming_it(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    make: object,
    what: str,
) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    assert (
        main(["run", str(VOICE_CHAT), "--audio", str(path), "--profile", str(_profile(tmp_path))])
        == 2
    )
    err = " ".join(capsys.readouterr().err.split())
    assert f"--audio {path}" in err and what in err and "Traceback" not in err


def test_a_pipeline_without_an_audio_entry_is_exit_2_naming_its_entry(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        [
            "run",
            str(REPO / "configs/voice-assistant.yaml"),
            "--audio",
            str(_wav(tmp_path)),
            "--profile",
            str(_profile(tmp_path)),
        ]
    )
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2
    assert "has no entry stage that takes audio (the request goes to thinker (ar_decode))" in err
    assert "voice-chat.yaml" in err


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        (["--system", "Be brief."], "--system"),
        (["--temperature", "0.2"], "--temperature"),
    ],
)
def test_text_only_options_next_to_a_recording_are_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    where: str,
) -> None:
    code = main(
        [
            "run",
            str(VOICE_CHAT),
            "--audio",
            str(_wav(tmp_path)),
            *extra,
            "--profile",
            str(_profile(tmp_path)),
        ]
    )
    assert code == 2
    assert where in capsys.readouterr().err


def test_prompt_and_audio_together_are_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", str(VOICE_CHAT), "--audio", str(_wav(tmp_path)), "--prompt", "hi"])
    assert exc.value.code == 2


def test_audio_request_reads_16_bit_mono_and_stereo_and_refuses_the_rest(tmp_path: Path) -> None:
    tone = (0.5 * np.sin(np.arange(800) / 5)).astype(np.float32)
    mono = audio_request(write_wav(tmp_path / "m.wav", tone, 8000))
    assert mono["sample_rate"] == 8000 and mono["audio"].dtype == np.float32
    np.testing.assert_allclose(mono["audio"], tone, atol=1e-4)
    with wave.open(str(tmp_path / "s.wav"), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(44100)
        w.writeframes(np.array([[16384, -16384], [8192, 8192]], dtype="<i2").tobytes())
    np.testing.assert_allclose(audio_request(tmp_path / "s.wav")["audio"], [0.0, 0.25])
    with wave.open(str(tmp_path / "e.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
    with pytest.raises(BadRequest, match="holds no samples"):
        audio_request(tmp_path / "e.wav")
    with pytest.raises(BadRequest, match="no such file"):
        audio_request(tmp_path / "none.wav", where="--audio none.wav")


@pytest.mark.skipif(
    not (REPO / "exports/whisper-tiny-en-encoder/fp32.onnx").is_file(),
    reason="Whisper's graphs are not built",
)
def test_text_to_a_pipeline_that_hears_is_exit_2_before_it_starts(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        [
            "run",
            str(VOICE_CHAT),
            "--prompt",
            "hello",
            "--skip-verify",
            "--profile",
            str(_profile(tmp_path)),
        ]
    )
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2, err
    assert (
        "request (stage vad, kind vad)" in err
        and "the stage takes audio, got text" in err
        and "--audio" in err
    )
