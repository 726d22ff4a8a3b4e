"""``omni-edge serve configs/examples/qwen3-omni-tiny.yaml`` driven by the real ``openai`` client:
thinker → talker → code2wav (exported, chunked) on a loopback port, one server for the module.

A ``modalities: ["text", "audio"]`` request gets the thinker's text (the transcript) and
code2wav's audio — not the talker's codes, whose final output is ``token_ids`` — whole
(``message.audio``, a WAV at code2wav's 24 kHz) and streamed (``delta.audio``, pcm16, one
chunk per code2wav window). Both are compared with transformers' own ``generate()`` on the same
weights in the same test (greedy, fp32): identical text, audio within the code2wav artifact's
gate tolerance plus half a 16-bit step. ``/v1/audio/speech`` is a 400 naming why an Omni
pipeline has no text-to-speech entry. A streamed request dropped after its first audio chunk —
mid-talker, by construction: the talker makes ``TALKER_CODES`` frames and code2wav's first
window is 4 of them — frees its admission slot, and the next request runs every stage."""

from __future__ import annotations

import base64
import io
import json
import time
import wave
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import yaml

from exports import omni_tiny
from tests.helpers import REPO
from tests.helpers.omni_reference import Reference, reference, torch_threads
from tests.helpers.serve import ServeProcess

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

pytestmark = [pytest.mark.ray, pytest.mark.slow]

CONFIG = REPO / "configs/examples/qwen3-omni-tiny.yaml"
PROMPT = "Hello there"
RATE = (
    24000  # code2wav's output rate (the artifact's produces: audio@24000), and OpenAI's pcm16 rate
)
TALKER_CODES = 280
"""The talker's min_tokens = max_tokens: long by construction, so a request dropped at its first
audio chunk (code2wav's first window: 4 frames) is dropped mid-talker whatever the CPU's speed.
Under 300: transformers' ``generate()`` decodes codes in chunks of 300 frames
(``Qwen3OmniMoeCode2Wav.chunked_decode``), and each seam drops the chunk's last 555 samples
here (the decoder's output is 1920 × frames − 555), where code2wav's windows with left context
give the whole decode's length; one chunk keeps the reference the whole decode."""
FIRST_FRAMES = 4
TOLERANCE = 1e-3 + 1 / 32767
"""code2wav's gate tolerance (the artifact's max_abs) plus half a 16-bit step of rounding each way."""


@pytest.fixture(scope="module")
def ref(serve: ServeProcess) -> Reference:
    """generate()'s output at the served stages' own thread count (the plan the server reports)."""
    omni_tiny.ensure_built()
    stages = yaml.safe_load(CONFIG.read_text())["stages"]
    return reference(
        omni_tiny.QWEN3_OMNI_DIR,
        PROMPT,
        threads=torch_threads(httpx.get(f"{serve.url}/v1/plan", timeout=60).json()["stages"]),
        thinker_max=stages[0]["sampling"]["max_tokens"],
        talker_max=TALKER_CODES,
        talker_min=TALKER_CODES,
    )


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    from exports import qwen3_omni_code2wav

    omni_tiny.ensure_built()
    if not (qwen3_omni_code2wav.ARTIFACT_DIR / "manifest.yaml").is_file():  # bootstrap builds it
        assert qwen3_omni_code2wav.build() == 0
    tmp = tmp_path_factory.mktemp("serve-omni")
    doc = yaml.safe_load(CONFIG.read_text())
    for stage in doc["stages"]:
        for key in ("model", "artifact"):
            if key in stage:
                stage[key] = str((CONFIG.parent / stage[key]).resolve())
        if stage["name"] == "talker":
            stage["sampling"].update(min_tokens=TALKER_CODES, max_tokens=TALKER_CODES)
        if stage["name"] == "code2wav":
            assert stage["chunk"]["first_frames"] == FIRST_FRAMES
    config = tmp / "qwen3-omni-tiny.yaml"
    config.write_text(yaml.safe_dump(doc))
    s = ServeProcess(config, "--no-calibration", cwd=tmp, start_timeout_s=600)
    yield s
    rc = s.stop()
    assert rc == 0, s.output()


def _client(serve: ServeProcess) -> Any:
    return openai.OpenAI(base_url=f"{serve.url}/v1", api_key="unused", max_retries=0, timeout=300)


def _ask() -> list[dict[str, str]]:
    return [{"role": "user", "content": PROMPT}]


def _pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767


def _assert_audio(pcm: np.ndarray, ref: Reference) -> None:
    want = np.clip(np.asarray(ref.waveform, np.float32), -1, 1)
    assert pcm.shape == want.shape and pcm.size > 0, (pcm.shape, want.shape)
    assert float(np.max(np.abs(pcm - want))) <= TOLERANCE


def test_chat_with_audio_gives_the_thinkers_text_and_code2wavs_audio(
    serve: ServeProcess, ref: Reference
) -> None:
    client = _client(serve)
    text_only = client.chat.completions.create(model="qwen3-omni-tiny", messages=_ask())
    assert text_only.choices[0].message.content == ref.text
    whole = client.chat.completions.create(
        model="qwen3-omni-tiny",
        messages=_ask(),
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "wav"},
    )
    message = whole.choices[0].message
    assert message.content is None and message.audio is not None
    assert message.audio.transcript == ref.text
    with wave.open(io.BytesIO(base64.b64decode(message.audio.data))) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (RATE, 1, 2)
        pcm = _pcm(w.readframes(w.getnframes()))
    _assert_audio(pcm, ref)
    print(
        f"{len(ref.codes)} frames of codes, {pcm.size / RATE:.2f} s of audio, as transformers' generate() makes them"
    )


def test_streamed_audio_comes_in_code2wavs_windows_with_the_transcript(
    serve: ServeProcess, ref: Reference
) -> None:
    stream = _client(serve).chat.completions.create(
        model="qwen3-omni-tiny",
        messages=_ask(),
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "pcm16"},
        stream=True,
    )
    transcript, audio = [], []
    for chunk in stream:
        delta = chunk.choices[0].delta.audio if chunk.choices else None
        if delta is not None and delta.transcript:
            transcript.append(delta.transcript)
        if delta is not None and delta.data:
            audio.append(_pcm(base64.b64decode(delta.data)))
    assert "".join(transcript) == ref.text
    # one chunk per code2wav window: the first of 4 frames, then 25 each (the config's chunk)
    assert len(audio) == 1 + -(-(len(ref.codes) - FIRST_FRAMES) // 25)
    # every window but the last (the codes' end) brings 25 frames' samples, sent as it is decoded
    from exports import qwen3_omni_code2wav

    spf = yaml.safe_load((qwen3_omni_code2wav.ARTIFACT_DIR / "manifest.yaml").read_text())[
        "metadata"
    ]["samples_per_frame"]
    assert {a.size for a in audio[1:-1]} == {25 * spf}
    print(f"streamed: {len(audio)} audio chunks for {len(ref.codes)} frames")
    _assert_audio(np.concatenate(audio), ref)


def test_speech_on_an_omni_pipeline_is_a_400_naming_why(serve: ServeProcess) -> None:
    """Before: code2wav was taken for the speech stage (the exported_graph kind takes any payload;
    its manifest takes token_ids), and the request failed in it: a 503."""
    r = httpx.post(
        f"{serve.url}/v1/audio/speech",
        json={"model": "qwen3-omni-tiny", "input": "Hi.", "voice": "a"},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "model" and err["code"] == "bad_request"
    assert (
        "pipeline 'qwen3-omni-tiny' has no speech stage (an audio output stage that takes text, to speak the "
        "input as it is): code2wav (exported_graph) takes token_ids"
    ) in err["message"], err
    assert "modalities ['text', 'audio']" in err["message"]


def test_a_request_dropped_mid_talker_frees_every_stage(
    serve: ServeProcess, ref: Reference
) -> None:
    client = _client(serve)
    with client.chat.completions.with_streaming_response.create(
        model="qwen3-omni-tiny",
        messages=_ask(),
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "pcm16"},
        stream=True,
    ) as response:
        rid = None
        for line in response.iter_lines():
            if line.startswith("data: {"):
                rid = rid or json.loads(line[len("data: ") :])["id"].removeprefix("chatcmpl-")
            if '"data": "' in line:  # the first audio chunk: code2wav's first window of 4 frames
                break
    assert rid is not None
    left = time.perf_counter()
    while True:
        status = httpx.get(f"{serve.url}/v1/status", timeout=30).json()
        mine = [r for r in status["recent"] if r["request_id"] == rid]
        if status["queue"]["in_flight"] == 0 and mine:
            break
        assert time.perf_counter() - left < 30, (
            f"the request still held its slot 30 s after it was dropped: {status}"
        )
        time.sleep(0.05)
    dropped = mine[0]["stages"]
    assert (
        dropped["talker"]["time_to_first_output_s"] is not None
        and dropped["talker"]["done_s"] is None
    ), f"dropped mid-talker: {dropped}"
    metrics = httpx.get(f"{serve.url}/metrics", timeout=30).text.splitlines()
    assert any(
        line.startswith("omni_edge_requests_total{")
        and 'code="499"' in line
        and 'endpoint="chat"' in line
        for line in metrics
    ), [line for line in metrics if "requests_total" in line]
    print(
        f"dropped after the first audio chunk: slot free {time.perf_counter() - left:.2f} s later; {dropped}"
    )
    # the next request runs every stage, as if nothing had been dropped
    after = (
        client.chat.completions.create(
            model="qwen3-omni-tiny",
            messages=_ask(),
            modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "wav"},
        )
        .choices[0]
        .message
    )
    assert after.audio is not None and after.audio.transcript == ref.text
    with wave.open(io.BytesIO(base64.b64decode(after.audio.data))) as w:
        _assert_audio(_pcm(w.readframes(w.getnframes())), ref)
