"""``input_audio`` content parts on ``POST /v1/chat/completions``: OpenAI's shape in, the
recording as the pipeline's request out — and every way a body is refused (400, where →
what → fix) when the recording cannot be heard as sent. No Ray: ``chat_request`` alone;
the served path through a real vad → asr pipeline is the slow test at the end."""

from __future__ import annotations

import base64
import importlib.util
import io
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.core.errors import BadRequest
from orchestrator.server import chat_request

RATE = 16000


def wav_bytes(samples: Any, rate: int = RATE, channels: int = 1, width: int = 2) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        pcm = (
            (np.clip(np.asarray(samples, dtype=np.float64), -1, 1) * 32767).astype("<i2").tobytes()
            if width == 2
            else bytes(len(samples) * width)
        )
        w.writeframes(pcm)
    return buf.getvalue()


def part(data: bytes | str, fmt: str = "wav") -> dict[str, Any]:
    encoded = data if isinstance(data, str) else base64.b64encode(data).decode()
    return {"type": "input_audio", "input_audio": {"data": encoded, "format": fmt}}


def body(*parts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": list(parts)}], **extra}


TONE = 0.5 * np.sin(2 * np.pi * 220 * np.arange(RATE // 2) / RATE)


def test_an_input_audio_part_becomes_the_recording() -> None:
    request = chat_request(body(part(wav_bytes(TONE))), audio_entry=True)
    assert set(request) == {"audio", "sample_rate"} and request["sample_rate"] == RATE
    assert request["audio"].dtype == np.float32 and request["audio"].shape == (RATE // 2,)
    np.testing.assert_allclose(request["audio"], TONE, atol=1e-4)


def test_stereo_is_averaged_to_mono_at_its_own_rate() -> None:
    left_right = np.stack([TONE, -TONE * 0 + 0.25], axis=1).reshape(-1)
    request = chat_request(
        body(part(wav_bytes(left_right, rate=22050, channels=2))), audio_entry=True
    )
    assert request["sample_rate"] == 22050 and request["audio"].shape == (RATE // 2,)
    np.testing.assert_allclose(request["audio"], (TONE + 0.25) / 2, atol=1e-4)


def test_empty_text_next_to_the_recording_is_fine_and_a_text_request_is_unchanged() -> None:
    request = chat_request(
        body(part(wav_bytes(TONE)), {"type": "text", "text": "  "}), audio_entry=True
    )
    assert "audio" in request
    assert chat_request({"messages": [{"role": "user", "content": "hi"}]}, audio_entry=True) == {
        "messages": [{"role": "user", "content": "hi"}]
    }


@pytest.mark.parametrize(
    ("b", "entry", "where", "what"),
    [
        (
            body(part(wav_bytes(TONE))),
            False,
            "messages[0].content[0]",
            "this pipeline has no entry stage that takes audio",
        ),
        (
            body(part(wav_bytes(TONE)), part(wav_bytes(TONE))),
            True,
            "messages[0].content[1]",
            "a request carries one recording",
        ),
        (
            {"messages": [{"role": "assistant", "content": [part(wav_bytes(TONE))]}]},
            True,
            "messages[0].role",
            "audio is heard from the user only",
        ),
        (
            body(part(wav_bytes(TONE), fmt="mp3")),
            True,
            "messages[0].content[0].input_audio.format",
            "'mp3' is not read",
        ),
        (
            body({"type": "input_audio", "input_audio": "abc"}),
            True,
            "messages[0].content[0].input_audio",
            "must be a JSON object",
        ),
        (
            body(part("not base64!")),
            True,
            "messages[0].content[0].input_audio.data",
            "is not base64",
        ),
        (
            body(part(b"RIFF....nonsense")),
            True,
            "messages[0].content[0].input_audio.data",
            "not a readable WAV file",
        ),
        (
            body(part(wav_bytes([0.0] * 10, width=1))),
            True,
            "messages[0].content[0].input_audio.data",
            "8-bit samples",
        ),
        (
            body(
                part(wav_bytes([])),
            ),
            True,
            "messages[0].content[0].input_audio.data",
            "holds no samples",
        ),
        (
            body(part(wav_bytes(TONE)), {"type": "text", "text": "what is this?"}),
            True,
            "messages[0].content[1]",
            "only the audio reaches the pipeline's audio entry stage",
        ),
        (
            {
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": [part(wav_bytes(TONE))]},
                ]
            },
            True,
            "messages[0].content",
            "would be ignored",
        ),
        (
            body(part(wav_bytes(TONE)), temperature=0.2),
            True,
            "temperature",
            "with audio that stage takes none",
        ),
    ],
)
def test_a_recording_that_cannot_be_heard_as_sent_is_a_400_naming_where(
    b: dict[str, Any],
    entry: bool,
    where: str,
    what: str,
) -> None:
    with pytest.raises(BadRequest) as err:
        chat_request(b, audio_entry=entry)
    assert err.value.problems[0].where == where, str(err.value)
    assert what in str(err.value)


# -- served: a vad → asr pipeline answers an input_audio request with the transcript -------
@pytest.fixture(scope="module")
def served(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from orchestrator.api import Pipeline
    from orchestrator.server import create_app
    from tests.helpers import REPO
    from tests.orchestrator.server.test_server import _Served

    if importlib.util.find_spec("silero_vad") is None:
        pytest.skip("silero-vad is not installed")
    if not (REPO / "exports/whisper-tiny-en-encoder/fp32.onnx").is_file():
        pytest.skip("Whisper's graphs are not built: python -m exports.whisper_asr build")
    tmp = tmp_path_factory.mktemp("serve-audio")
    config = tmp / "hear.yaml"
    config.write_text(f"""name: hear
stages:
  - {{name: vad, kind: vad, artifact: {REPO}/exports/silero-vad, devices: [cpu], backends: [ort-cpu]}}
  - {{name: asr, kind: asr, encoder: {REPO}/exports/whisper-tiny-en-encoder, decoder: {REPO}/exports/whisper-tiny-en-decoder,
     inputs: [vad], devices: [cpu], backends: [ort-cpu], final_output: true, final_output_type: text}}
""")
    pipeline = Pipeline.from_config(config, record=None)
    server = _Served(create_app(pipeline))
    yield server
    server.stop()
    pipeline.close()


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.ort
def test_the_openai_client_sends_input_audio_and_gets_the_transcript(
    served: Any, tmp_path: Path
) -> None:
    openai = pytest.importorskip("openai")
    from exports.whisper_asr import word_error_rate
    from tests.helpers.speech import speak

    sentence = "Please turn off the lights in the kitchen."
    said, rate = speak(sentence)
    silence = np.zeros(rate, dtype=np.float32)
    data = base64.b64encode(wav_bytes(np.concatenate([silence, said, silence]), rate=rate)).decode()
    client = openai.OpenAI(
        base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=120
    )
    reply = client.chat.completions.create(
        model="hear",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
                ],
            }
        ],
    )
    assert word_error_rate(sentence, reply.choices[0].message.content) <= 0.35, reply.choices[
        0
    ].message.content
    quiet = base64.b64encode(wav_bytes(np.zeros(RATE, dtype=np.float32))).decode()
    with pytest.raises(openai.BadRequestError) as err:  # silence: refused by the vad stage, named
        client.chat.completions.create(
            model="hear",
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_audio", "input_audio": {"data": quiet, "format": "wav"}}
                    ],
                }
            ],
        )
    assert "no speech was heard in 1.00 s of audio" in str(err.value)
    with pytest.raises(openai.BadRequestError) as err:  # text to a pipeline that hears only audio
        client.chat.completions.create(
            model="hear", messages=[{"role": "user", "content": "hello"}]
        )
    assert "the stage takes audio" in str(err.value)
