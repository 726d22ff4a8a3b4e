"""``omni-edge serve``'s app: the real ``openai`` client against a real uvicorn server
on loopback, in front of a started echo pipeline (words → tone; its reply is
deterministic: ``You said <last user message>. <REPLY>``; the tone stage makes
20 ms of a 220 Hz sine per character of each sentence, at 16 kHz)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.core.units import GiB
from tests.helpers.echo import REPLY
from tests.helpers.profiles import make_profile
from tests.helpers.waiting import NEVER_HANGS_S, wait_until

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

ECHO = """name: echo-serve
stages:
  - {name: thinker, kind: echo, mode: words, delay_s: 0.005, devices: [cpu], final_output: true, final_output_type: text}
  - {name: voice, kind: echo, mode: tone, inputs: [thinker], devices: [cpu], final_output: true, final_output_type: audio}
"""
KEY = "s3cret-key"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Served:
    def __init__(self, app: Any) -> None:
        self.port = _free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(
                app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
            )
        )
        self.thread = threading.Thread(target=self.server.run, name="test-uvicorn", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


@pytest.fixture(scope="module")
def pipeline(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from orchestrator.api import Pipeline

    tmp = tmp_path_factory.mktemp("serve")
    cfg = tmp / "echo.yaml"
    cfg.write_text(ECHO)
    prof = tmp / "profile.json"
    prof.write_text(make_profile(ram_available=8 * GiB).model_dump_json())
    p = Pipeline.from_config(cfg, profile=prof, record=None)
    yield p
    final = p.close()
    assert not final.get("held_bytes")


@pytest.fixture(scope="module")
def served(pipeline: Any) -> Iterator[_Served]:
    from orchestrator.server import create_app

    s = _Served(create_app(pipeline))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def served_with_key(pipeline: Any) -> Iterator[_Served]:
    from orchestrator.server import create_app

    s = _Served(create_app(pipeline, api_key=KEY))
    yield s
    s.stop()


VOICE_DELAY_S = 0.1
"""The slow-voice pipeline's pause before each audio chunk."""


@pytest.fixture(scope="module")
def served_slow_voice(
    ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[_Served]:
    """A second echo pipeline whose voice pauses before each chunk, behind its own server."""
    from orchestrator.api import Pipeline
    from orchestrator.server import create_app
    from tests.helpers.echo import echo_pipeline

    plan, config = echo_pipeline(
        tmp_path_factory.mktemp("slow-voice"), voice={"delay_s": VOICE_DELAY_S}
    )
    p = Pipeline(plan, config, record=None).start()
    s = _Served(create_app(p))
    yield s
    s.stop()
    p.close()


@pytest.fixture
def one_slot(pipeline: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The module pipeline with one request in flight and none waiting."""
    admission = pipeline.runtime.admission
    # an earlier test's request may still be ending
    wait_until(lambda: admission.in_flight == 0, "no request in flight")
    monkeypatch.setattr(admission, "limit", 1)
    monkeypatch.setattr(admission, "max_waiting", 0)
    return admission


def _client(s: _Served, key: str = "unused") -> Any:
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key=key, max_retries=0, timeout=30)


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]
EXPECTED = f"You said hi there. {REPLY}"


@pytest.mark.ray
def test_chat_completion_replies_what_the_pipeline_says(served: _Served) -> None:
    reply = _client(served).chat.completions.create(
        model="echo-serve", messages=MESSAGES, max_tokens=64, temperature=0.0
    )
    assert reply.object == "chat.completion" and reply.model == "echo-serve"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == EXPECTED
    assert reply.choices[0].finish_reason == "stop"


@pytest.mark.ray
def test_streamed_chunks_join_to_the_same_reply(served: _Served) -> None:
    client = _client(served)
    whole = (
        client.chat.completions.create(model="echo-serve", messages=MESSAGES)
        .choices[0]
        .message.content
    )
    chunks = list(
        client.chat.completions.create(model="echo-serve", messages=MESSAGES, stream=True)
    )
    assert len(chunks) > 3 and all(c.object == "chat.completion.chunk" for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole == EXPECTED
    assert chunks[-1].choices[0].finish_reason == "stop"
    with httpx.stream(
        "POST",
        f"{served.url}/v1/chat/completions",
        json={"model": "echo-serve", "messages": MESSAGES, "stream": True},
    ) as raw:
        lines = [line for line in raw.iter_lines() if line]
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)


@pytest.mark.ray
def test_models_lists_the_pipeline(served: _Served) -> None:
    models = _client(served).models.list()
    assert [m.id for m in models.data] == ["echo-serve"]


@pytest.mark.ray
def test_health_names_every_stage_with_its_device(served: _Served) -> None:
    doc = httpx.get(f"{served.url}/health").json()
    assert doc["status"] == "ok"
    assert [(s["name"], s["device"], s["alive"]) for s in doc["stages"]] == [
        ("thinker", "cpu", True),
        ("voice", "cpu", True),
    ]


TOOLS_REQUIRED: dict[str, Any] = {
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ],
    "tool_choice": "required",
}


@pytest.mark.ray
@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
        # tools to a pipeline whose entry stage does not decode (the echo kind): never free
        # text with a 200
        ({"messages": [{"role": "user", "content": "hi"}], **TOOLS_REQUIRED}, "tools"),
        # log-probabilities from a pipeline whose entry stage does not decode (the echo kind)
        ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True}, "logprobs"),
        # a stop string to a pipeline whose entry stage does not decode (the echo kind)
        ({"messages": [{"role": "user", "content": "hi"}], "stop": "said"}, "stop"),
        (
            {
                "messages": [{"role": "user", "content": "hi"}],
                "response_format": {"type": "json_object"},
            },
            "response_format",
        ),
    ],
)
def test_a_bad_request_is_a_400_in_openais_shape(
    served: _Served, kwargs: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _client(served).chat.completions.create(model="echo-serve", **kwargs)
    assert info.value.status_code == 400
    body = info.value.body
    assert (
        isinstance(body, dict)
        and body["param"] == param
        and body["type"] == "invalid_request_error"
    )
    assert param in body["message"]


@pytest.mark.ray
def test_a_key_is_required_when_set(served_with_key: _Served) -> None:
    with pytest.raises(openai.AuthenticationError) as info:
        _client(served_with_key, "wrong").models.list()
    assert info.value.status_code == 401
    missing = httpx.post(f"{served_with_key.url}/v1/chat/completions", json={"messages": MESSAGES})
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{served_with_key.url}/health").status_code == 401
    assert httpx.get(f"{served_with_key.url}/v1/status").status_code == 401
    page = httpx.get(
        f"{served_with_key.url}/"
    )  # the page itself holds no data; it asks for the key
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    reply = _client(served_with_key, KEY).chat.completions.create(
        model="echo-serve", messages=MESSAGES
    )
    assert reply.choices[0].message.content == EXPECTED


def test_a_stages_bad_request_names_the_openai_field() -> None:
    import json

    from orchestrator.core.errors import BadRequest
    from orchestrator.server import error_for

    for where, param in (("request.sampling.temperature", "temperature"), ("prompt", "messages")):
        response = error_for(BadRequest.single(where, "out of range", "use another value"))
        doc = json.loads(bytes(response.body))["error"]
        assert response.status_code == 400 and doc["param"] == param and where in doc["message"]


def test_the_error_shapes_of_busy_and_failed() -> None:
    import json

    from orchestrator.core.errors import PipelineBusy, StageFailed
    from orchestrator.server import error_for

    busy = error_for(PipelineBusy(1, 1, 1, 1))
    assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
    assert json.loads(bytes(busy.body))["error"]["code"] == "pipeline_busy"
    failed = error_for(StageFailed("voice", "npu", "the actor died"))
    doc = json.loads(bytes(failed.body))["error"]
    assert (
        failed.status_code == 503 and "'voice' on npu" in doc["message"] and doc["param"] == "voice"
    )
    assert doc["code"] == "stage_failed" and "(code stage_failed)" in doc["message"]


def test_a_stage_failures_cause_goes_to_the_log_not_to_the_client(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A route worker's failure carries its interpreter's path and a stderr tail: the server logs
    them, and the client reads the stage, the device and the code only."""
    import json

    from orchestrator.core.errors import StageFailed
    from orchestrator.server import error_for

    cause = (
        "route worker /home/alice/.venvs/openvino/bin/python exited 1: Traceback ... "
        'File "/home/alice/secret/model.py", line 3'
    )
    with caplog.at_level("WARNING"):
        failed = error_for(StageFailed("asr", "npu", cause, "engine_failed"))
    doc = json.loads(bytes(failed.body))["error"]
    assert failed.status_code == 503 and doc["param"] == "asr"
    assert (
        doc["message"]
        == "stage 'asr' on npu failed (code engine_failed); the cause is in the server's log"
    )
    assert (
        "/home/alice" not in bytes(failed.body).decode()
        and "Traceback" not in bytes(failed.body).decode()
    )
    assert (
        "/home/alice/.venvs/openvino/bin/python" in caplog.text
    )  # kept for whoever runs the server


def test_a_non_loopback_bind_without_a_key_exits_2_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.api import Pipeline

    def refuse(*a: Any, **k: Any) -> None:
        raise AssertionError("the pipeline was started for a bind that is refused")

    monkeypatch.setattr(Pipeline, "from_config", refuse)
    monkeypatch.delenv("OMNI_EDGE_API_KEY", raising=False)
    rc = main(["serve", str(tmp_path / "never-read.yaml"), "--host", "0.0.0.0"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "0.0.0.0 is not a loopback address" in err and "--api-key" in err


# -- audio ------------------------------------------------------------------------------------------
SENTENCES = [
    "You said hi there.",
    *[s.strip() for s in REPLY.replace("! ", "!|").replace(". ", ".|").split("|")],
]
"""What the voice is fed for MESSAGES: the reply cut into sentences."""
TONE_S = sum(len(s) for s in SENTENCES) * 0.02


def _wav(data: bytes) -> tuple[Any, int]:
    import io
    import wave

    import numpy as np

    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth()) == (1, 2)
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(
            np.float32
        ) / 32767, w.getframerate()


def _pcm(data: bytes) -> Any:
    import numpy as np

    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767


@pytest.mark.ray
def test_chat_with_audio_returns_the_spoken_reply_as_wav_and_as_24khz_pcm(served: _Served) -> None:
    import base64

    from orchestrator.runtime.audio import rms_dbfs

    client = _client(served)
    wav = client.chat.completions.create(
        model="echo-serve",
        messages=MESSAGES,
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "wav"},
    )
    message = wav.choices[0].message
    assert message.content is None and message.audio is not None
    assert (
        message.audio.transcript == EXPECTED
        and message.audio.id
        and message.audio.expires_at > time.time()
    )
    samples, rate = _wav(base64.b64decode(message.audio.data))
    assert rate == 16000 and abs(len(samples) / rate - TONE_S) < 0.01
    assert rms_dbfs(samples) > -20
    pcm = (
        client.chat.completions.create(
            model="echo-serve",
            messages=MESSAGES,
            modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "pcm16"},
        )
        .choices[0]
        .message.audio
    )
    assert pcm is not None and abs(len(_pcm(base64.b64decode(pcm.data))) / 24000 - TONE_S) < 0.01


@pytest.mark.ray
def test_streamed_audio_deltas_carry_the_transcript_and_each_chunk_as_it_is_made(
    served_slow_voice: _Served,
) -> None:
    import base64

    stream = _client(served_slow_voice).chat.completions.create(
        model="echo-serve",
        messages=MESSAGES,
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "pcm16"},
        stream=True,
    )
    transcript, audio, arrived = [], [], []
    for chunk in stream:
        delta = chunk.choices[0].delta.audio if chunk.choices else None
        if delta is not None and delta.transcript is not None:
            transcript.append(delta.transcript)
        if delta is not None and delta.data is not None:
            audio.append(_pcm(base64.b64decode(delta.data)))
            arrived.append(time.monotonic())
    ended = time.monotonic()
    assert "".join(transcript) == EXPECTED
    assert len(audio) == len(SENTENCES)  # one chunk per sentence
    assert abs(sum(len(a) for a in audio) / 24000 - TONE_S) < 0.01
    # the voice waits VOICE_DELAY_S before each chunk: sent as made, they arrive spread out
    assert arrived[-1] - arrived[0] >= (len(SENTENCES) - 1) * VOICE_DELAY_S * 0.8
    assert ended - arrived[0] >= 0 and arrived[0] < ended - (len(SENTENCES) - 2) * VOICE_DELAY_S


@pytest.mark.ray
def test_chat_audio_format_errors_name_the_served_ones(served: _Served) -> None:
    for audio, stream, fix in (
        ({"voice": "x", "format": "mp3"}, False, "wav, pcm16"),
        ({"voice": "x", "format": "wav"}, True, "pcm16"),
    ):
        r = httpx.post(
            f"{served.url}/v1/chat/completions",
            json={
                "model": "m",
                "messages": MESSAGES,
                "modalities": ["text", "audio"],
                "audio": audio,
                "stream": stream,
            },
        )
        assert (
            r.status_code == 400
            and r.json()["error"]["param"] == "audio.format"
            and fix in r.json()["error"]["message"]
        )


@pytest.mark.ray
@pytest.mark.parametrize("fmt", ["wav", "pcm"])
def test_speech_streams_the_voice_alone(served: _Served, fmt: str) -> None:
    import struct

    from orchestrator.runtime.audio import rms_dbfs

    text = "Read this aloud. Then this second sentence!"
    spoken = (len("Read this aloud.") + len("Then this second sentence!")) * 0.02
    with _client(served).audio.speech.with_streaming_response.create(
        model="echo-serve", voice="alloy", input=text, response_format=fmt
    ) as response:  # type: ignore[arg-type]
        data = response.read()
        headers = response.headers
    if fmt == "wav":
        assert headers["content-type"] == "audio/wav" and headers["x-sample-rate"] == "16000"
        assert (
            data[:4] == b"RIFF" and struct.unpack("<I", data[40:44])[0] == 0xFFFFFFFF
        )  # streamed: length unknown
        samples, rate = _pcm(data[44:]), 16000
    else:
        assert headers["content-type"] == "audio/pcm" and headers["x-sample-rate"] == "24000"
        samples, rate = _pcm(data), 24000
    assert abs(len(samples) / rate - spoken) < 0.01 and rms_dbfs(samples) > -20
    recent = httpx.get(f"{served.url}/v1/status").json()["recent"]
    assert recent[-1]["endpoint"] == "speech" and set(recent[-1]["stages"]) == {
        "voice"
    }  # the thinker did not run


@pytest.mark.ray
def test_speech_refuses_what_it_cannot_serve(served: _Served) -> None:
    for body, param, words in (
        ({"input": "hi", "response_format": "mp3"}, "response_format", "wav, pcm"),
        ({"input": "  "}, "input", "not blank"),
        ({"input": "...."}, "input", "nothing to speak"),
    ):
        r = httpx.post(f"{served.url}/v1/audio/speech", json={"model": "m", "voice": "v", **body})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param and words in r.json()["error"]["message"]


@pytest.mark.ray
def test_entering_at_a_stage_runs_it_and_what_is_downstream(pipeline: Any) -> None:
    import asyncio

    from orchestrator.core.errors import BadRequest
    from orchestrator.runtime.events import AudioChunk, StageEvent, TextDelta

    async def events(**kw: Any) -> list[Any]:
        return [e async for e in pipeline.stream("Say this. And that.", **kw)]

    spoken = asyncio.run(events(entry="voice"))
    assert not any(isinstance(e, TextDelta) for e in spoken)
    assert sum(isinstance(e, AudioChunk) for e in spoken) == 2
    done = {e.stage: e.stats for e in spoken if isinstance(e, StageEvent) and e.kind == "done"}
    assert set(done) == {"voice"} and done["voice"]["chunks_in"] == ["Say this.", "And that."]
    with pytest.raises(
        BadRequest, match=r"(?s)'nope' is not a stage of this pipeline.*thinker, voice"
    ):
        asyncio.run(events(entry="nope"))
    with pytest.raises(BadRequest, match="blank text: stage 'voice' takes text"):
        pipeline.validate("   ", entry="voice")
    result = pipeline.run("One sentence only.", entry="voice", record=None)
    assert result.text == "" and result.chunks == ["One sentence only."]
    assert result.audio_seconds == pytest.approx(len("One sentence only.") * 0.02)
    assert pipeline.runtime.admission.in_flight == 0


@pytest.mark.ray
def test_usage_counts_the_whole_history(served: _Served) -> None:
    client = _client(served)
    history = [
        *MESSAGES,
        {"role": "assistant", "content": "An earlier answer of six words."},
        {"role": "user", "content": "and again"},
    ]
    one = client.chat.completions.create(model="echo-serve", messages=MESSAGES).usage
    more = client.chat.completions.create(model="echo-serve", messages=history).usage
    assert one is not None and more is not None
    assert one.prompt_tokens == 4  # "Be brief." + "hi there": the echo stage counts words as tokens
    assert more.prompt_tokens == one.prompt_tokens + 6 + 2
    assert (
        one.completion_tokens == len(EXPECTED.split())
        and one.total_tokens == one.prompt_tokens + one.completion_tokens
    )


@pytest.mark.ray
def test_eight_concurrent_clients_each_get_their_own_reply(served: _Served) -> None:
    import base64
    from concurrent.futures import ThreadPoolExecutor

    def ask(i: int) -> tuple[str, int]:
        messages = [{"role": "user", "content": f"client {i}"}]
        if i % 2:  # half of them streamed, with audio
            transcript, samples = "", 0
            for chunk in _client(served).chat.completions.create(
                model="echo-serve",
                messages=messages,
                stream=True,
                modalities=["text", "audio"],
                audio={"voice": "x", "format": "pcm16"},
            ):
                audio = chunk.choices[0].delta.audio if chunk.choices else None
                transcript += (audio.transcript or "") if audio else ""
                samples += len(base64.b64decode(audio.data)) // 2 if audio and audio.data else 0
            return transcript, samples
        return _client(served).chat.completions.create(
            model="echo-serve", messages=messages
        ).choices[0].message.content, 0

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(ask, range(8)))
    for i, (text, samples) in enumerate(replies):
        assert text == f"You said client {i}. {REPLY}"
        assert (samples > 0) == bool(i % 2)


# -- inspection -------------------------------------------------------------------------------------
@pytest.mark.ray
def test_plan_status_and_metrics_describe_the_running_pipeline(served: _Served) -> None:
    client = _client(served)
    client.chat.completions.create(
        model="echo-serve",
        messages=MESSAGES,
        modalities=["text", "audio"],
        audio={"voice": "x", "format": "wav"},
    )
    httpx.post(f"{served.url}/v1/chat/completions", json={"messages": []})
    plan = httpx.get(f"{served.url}/v1/plan").json()
    assert plan["pipeline"] == "echo-serve"
    for s in plan["stages"]:
        assert s["measured"]["pool"] == "host_ram" and s["measured"]["measured_peak_bytes"] > 0
        assert s["measured"]["budget_bytes"] > 0
    status = httpx.get(f"{served.url}/v1/status").json()
    assert [
        (s["name"], s["alive"], s["loaded"], s["final_output_type"]) for s in status["stages"]
    ] == [("thinker", True, True, "text"), ("voice", True, True, "audio")]
    pool = status["pools"][0]
    assert (
        pool["id"] == "host_ram"
        and pool["capacity_bytes"] >= pool["budget_bytes"] > 0
        # what the ledger holds may pass the plan's budget: Ray's memory measured at start
        # replaces its estimate (larger in a test session's long-lived Ray), within capacity
        and pool["capacity_bytes"] >= pool["reserved_bytes"] > 0
    )
    last = status["recent"][-1]
    assert (
        last["time_to_first_token_s"] > 0
        and last["time_to_first_audio_s"] >= last["time_to_first_token_s"]
    )
    assert (
        set(last["stages"]) == {"thinker", "voice"}
        and last["stages"]["voice"]["done_s"] <= last["total_s"]
    )
    text = httpx.get(f"{served.url}/metrics").text
    metrics = _samples(text)
    assert metrics["omni_edge_time_to_first_audio_seconds_count"] >= 1
    assert metrics['omni_edge_stage_first_output_seconds_count{stage="voice"}'] >= 1
    assert metrics['omni_edge_requests_refused_total{code="400"}'] >= 1
    assert metrics['omni_edge_ledger_held_bytes{pool="host_ram"}'] == pool["reserved_bytes"]
    assert metrics['omni_edge_stage_measured_peak_bytes{pool="host_ram",stage="voice"}'] > 0
    assert (
        metrics["omni_edge_requests_in_flight"] == 0
        and metrics['omni_edge_stage_alive{device="cpu",stage="thinker"}'] == 1
    )
    assert metrics['omni_edge_generated_tokens_total{stage="thinker"}'] >= len(EXPECTED.split())


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


# -- queue, disconnects ---------------------------------------------------------------------------
LONG_WORDS = int(2 * NEVER_HANGS_S / 0.005)
LONG = " ".join(["word"] * LONG_WORDS)
"""A user message the echo thinker repeats word by word: at its 5 ms a word (a sleep: a lower
bound on any machine) the reply takes at least twice the never-hangs deadline, so a slot seen
free within that deadline was freed by the client going away, not by the reply ending."""


@pytest.mark.ray
def test_a_full_queue_is_a_429_with_retry_after(served: _Served, one_slot: Any) -> None:
    with (
        httpx.Client(timeout=30) as holder,
        holder.stream(
            "POST",
            f"{served.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": LONG}], "stream": True},
        ) as held,
    ):
        lines = (
            held.iter_lines()
        )  # kept: a dropped iterator closes the response, and so frees the slot
        next(lines)  # the request holds the one slot
        with pytest.raises(openai.RateLimitError) as info:
            _client(served).chat.completions.create(model="echo-serve", messages=MESSAGES)
    assert info.value.status_code == 429 and info.value.response.headers["retry-after"] == "1"
    body = info.value.body
    assert isinstance(body, dict) and body["code"] == "pipeline_busy"


@pytest.mark.ray
def test_a_client_that_goes_away_frees_its_slot_and_its_work_at_once(
    served: _Served, one_slot: Any, pipeline: Any
) -> None:
    import json

    import ray

    admission = pipeline.runtime.admission
    client = httpx.Client(timeout=30)
    with client.stream(
        "POST",
        f"{served.url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": LONG}], "stream": True},
    ) as r:
        lines = r.iter_lines()
        rid = json.loads(next(lines).removeprefix("data: "))["id"].removeprefix("chatcmpl-")
        for _ in range(3):
            next(lines)
        assert admission.in_flight == 1
        gone = time.perf_counter()
        client.close()  # mid-stream: ~LONG_WORDS words still to come
    wait_until(lambda: admission.in_flight == 0, "the slot freed after the client went away")
    freed_ms = (time.perf_counter() - gone) * 1000
    # nothing runs for it on the device actor any more: its reply would take twice this
    # deadline (LONG), so its tasks gone within it were stopped by the client going away
    actor = pipeline.runtime.devices["cpu"].actor
    wait_until(
        lambda: ray.get(actor.pending.remote(rid), timeout=NEVER_HANGS_S) == 0,
        "the request's tasks on the device actor stopped",
    )
    t0 = time.perf_counter()
    # served, not refused: the one slot (no queue) is free for the next request
    first = next(
        iter(
            _client(served).chat.completions.create(
                model="echo-serve", messages=MESSAGES, stream=True
            )
        )
    )
    served_ms = (time.perf_counter() - t0) * 1000
    assert first.choices[0].delta.role == "assistant"
    print(
        f"disconnect → slot free in {freed_ms:.1f} ms; next request's first chunk in {served_ms:.1f} ms"
    )


@pytest.mark.ray
def test_a_client_that_goes_away_before_its_reply_starts_frees_its_slot(
    served: _Served, one_slot: Any
) -> None:
    body = {
        "messages": [{"role": "user", "content": LONG}]
    }  # not streamed: the reply starts when it is complete
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{served.url}/v1/chat/completions", json=body, timeout=httpx.Timeout(30, read=0.5)
        )
    gone = time.perf_counter()
    wait_until(lambda: one_slot.in_flight == 0, "the slot freed after the client went away")
    freed_ms = (time.perf_counter() - gone) * 1000
    reply = _client(served).chat.completions.create(model="echo-serve", messages=MESSAGES)
    assert reply.choices[0].message.content == EXPECTED
    print(f"disconnect before the reply → slot free in {freed_ms:.1f} ms")


# -- a dead stage -----------------------------------------------------------------------------------
@pytest.mark.ray
def test_a_dead_stage_fails_only_the_requests_that_need_it(
    ray_cluster: Any, tmp_path: Path
) -> None:
    from orchestrator.api import Pipeline
    from orchestrator.server import create_app
    from tests.helpers.echo import echo_pipeline

    plan, config = echo_pipeline(tmp_path, thinker={"restart": "never"}, voice_device="igpu:0")
    p = Pipeline(plan, config, record=None).start()
    s = _Served(create_app(p))
    try:
        p.runtime.kill_device("cpu")  # the thinker's actor
        deadline = time.monotonic() + 20
        while True:  # the runtime notices through the next call that touches the actor
            r = httpx.post(f"{s.url}/v1/chat/completions", json={"messages": MESSAGES})
            if r.status_code == 503 or time.monotonic() > deadline:
                break
        assert r.status_code == 503 and r.json()["error"]["param"] == "thinker"
        assert "'thinker' on cpu" in r.json()["error"]["message"]
        speech = httpx.post(
            f"{s.url}/v1/audio/speech", json={"model": "m", "input": "Still here.", "voice": "v"}
        )
        assert speech.status_code == 200 and len(speech.content) > 44
        health = httpx.get(f"{s.url}/health")
        assert health.status_code == 503
        assert [(x["name"], x["alive"]) for x in health.json()["stages"]] == [
            ("thinker", False),
            ("voice", True),
        ]
        thinker = health.json()["stages"][0]
        assert (
            thinker["code"] == "device_actor_died" and "error" not in thinker
        )  # the cause is logged only
        assert httpx.get(f"{s.url}/v1/plan").status_code == 200
        metrics = _samples(httpx.get(f"{s.url}/metrics").text)
        assert metrics['omni_edge_stage_alive{device="cpu",stage="thinker"}'] == 0
        assert metrics['omni_edge_requests_refused_total{code="503"}'] >= 1
    finally:
        s.stop()
        final = p.close()
    assert not final.get("held_bytes")
