"""``omni-edge serve configs/voice-assistant.yaml`` (SmolLM2 on vLLM → Piper) driven by
the real ``openai`` client: one server for the module (started as a user starts
it, a subprocess on a port it picks), stopped by SIGTERM with a request in flight
in the last test.

Assertions are on what a client reads — status codes, headers, shapes, token
counts, the order of a stream's deltas, the audio's duration and loudness, and the
words of ``/v1/audio/speech``'s input heard back by the suite's Whisper — never on
the words the model picks.
Replies are made long enough to speak with ``min_tokens`` (vLLM's extension of
the request)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import signal
import statistics
import struct
import threading
import time
import wave
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from orchestrator.runtime.audio import rms_dbfs
from stages.text_chunks import SentenceChunker
from tests.helpers import REPO
from tests.helpers.serve import ServeProcess
from tests.helpers.speech import heard, transcribe
from tests.helpers.waiting import NEVER_HANGS_S, wait_until

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

CONFIG = REPO / "configs/voice-assistant.yaml"
VOICE_RATE = 22050  # en_US-joe-medium.onnx.json
PCM_RATE = 24000
SPEECH = (
    "The Moon is the only natural satellite of the Earth. It takes about a month to go around us."
)
FRAME_S = 0.02
SPEAKING_DBFS = -50.0
"""A 20 ms frame quieter than this is silence (Piper's pauses sit far below; its vowels far above)."""


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("serve-voice")
    s = ServeProcess(CONFIG, "--max-waiting", "0", cwd=tmp, start_timeout_s=600)
    yield s
    rc = s.stop()
    assert rc == 0, s.output()


def _client(serve: ServeProcess, timeout: float = 120) -> Any:
    return openai.OpenAI(
        base_url=f"{serve.url}/v1", api_key="unused", max_retries=0, timeout=timeout
    )


def _ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _assert_speech(samples: np.ndarray, rate: int, sentences: int) -> None:
    seconds = samples.size / rate
    assert seconds > 0.3 * sentences, f"{seconds:.2f} s of audio for {sentences} sentence(s)"
    assert rms_dbfs(samples) > -40, f"RMS {rms_dbfs(samples):.1f} dBFS"
    n = int(rate * FRAME_S)
    frames = samples[: samples.size // n * n].reshape(-1, n)
    speaking = float(np.mean([rms_dbfs(f) > SPEAKING_DBFS for f in frames]))
    assert speaking > 0.5, f"only {speaking:.0%} of 20 ms frames are above {SPEAKING_DBFS} dBFS"


def _pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767


def _sentences(text: str) -> int:
    chunker = SentenceChunker()
    return len([*chunker.feed(text), *chunker.flush()])


def test_chat_whole_and_streamed(serve: ServeProcess) -> None:
    client = _client(serve)
    whole = client.chat.completions.create(
        model="voice-assistant",
        messages=_ask("Name a planet."),
        max_tokens=24,
        extra_body={"min_tokens": 4},
    )
    assert whole.object == "chat.completion" and whole.choices[0].message.content
    assert (
        whole.usage is not None
        and 4 <= whole.usage.completion_tokens <= 24
        and whole.usage.prompt_tokens > 0
    )
    chunks = list(
        client.chat.completions.create(
            model="voice-assistant",
            messages=_ask("Name a star."),
            max_tokens=24,
            stream=True,
            extra_body={"min_tokens": 4},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_a_prompt_beyond_the_context_is_a_400_naming_both_numbers(serve: ServeProcess) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _client(serve).chat.completions.create(
            model="voice-assistant", messages=_ask("word " * 2100), max_tokens=64
        )
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == "messages" and body["code"] == "bad_request"
    assert "max_tokens 64" in body["message"] and "max_model_len of 2048" in body["message"]


def test_streamed_audio_is_speech_sent_as_it_is_made(serve: ServeProcess) -> None:
    """Sent as it is made, by the stream's own order: the reply is pinned at the config's 96
    tokens and the voice's first chunk is cut after its first few words (``first_chunk_chars``),
    so its audio is due while the model still has more than half the reply to write; a server
    that held the audio back until the text was done would send it after the last text."""
    stream = _client(serve).chat.completions.create(
        model="voice-assistant",
        messages=_ask("Tell me two facts about the Moon."),
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "pcm16"},
        stream=True,
        max_tokens=96,
        extra_body={"min_tokens": 96},
    )
    transcript, audio, order = [], [], []
    for chunk in stream:
        delta = chunk.choices[0].delta.audio if chunk.choices else None
        if delta is not None and delta.transcript:
            transcript.append(delta.transcript)
            order.append("text")
        if delta is not None and delta.data:
            audio.append(_pcm(base64.b64decode(delta.data)))
            order.append("audio")
    text = "".join(transcript)
    assert text and audio, "a 96-token reply is spoken"
    first_audio, last_text = order.index("audio"), len(order) - 1 - order[::-1].index("text")
    assert first_audio < last_text, (
        f"the first audio came after the last of {len(transcript)} text deltas: {order}"
    )
    print(f"first audio after text delta {order[:first_audio].count('text')} of {len(transcript)}")
    # one audio chunk per sentence the voice was fed (the runtime cut the text as it streamed;
    # cutting the whole text here can differ by a forced cut, hence the one spare)
    assert 1 <= len(audio) <= _sentences(text) + 1
    for piece in audio:
        assert piece.size / PCM_RATE > 0.3  # each chunk is a spoken sentence, sent as it was made
    _assert_speech(np.concatenate(audio), PCM_RATE, len(audio))


def test_whole_audio_is_a_wav_at_the_voices_rate(serve: ServeProcess) -> None:
    message = (
        _client(serve)
        .chat.completions.create(
            model="voice-assistant",
            messages=_ask("Say something about the sea."),
            modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "wav"},
            extra_body={"min_tokens": 16},
        )
        .choices[0]
        .message
    )
    assert message.audio is not None and message.audio.transcript
    with wave.open(io.BytesIO(base64.b64decode(message.audio.data))) as w:
        assert w.getframerate() == VOICE_RATE
        samples = _pcm(w.readframes(w.getnframes()))
    _assert_speech(samples, VOICE_RATE, _sentences(message.audio.transcript))


def test_history_reaches_the_chat_template(serve: ServeProcess) -> None:
    client = _client(serve)
    last = {"role": "user", "content": "And the second one?"}
    earlier = [
        {"role": "user", "content": "Name two oceans, please, the largest first."},
        {"role": "assistant", "content": "The Pacific Ocean and the Atlantic Ocean."},
    ]
    alone = client.chat.completions.create(
        model="voice-assistant", messages=[last], max_tokens=4
    ).usage
    with_history = client.chat.completions.create(
        model="voice-assistant", messages=[*earlier, last], max_tokens=4
    ).usage
    own_system = client.chat.completions.create(
        model="voice-assistant",
        messages=[{"role": "system", "content": "Be brief."}, last],
        max_tokens=4,
    ).usage
    assert alone is not None and with_history is not None and own_system is not None
    added_words = sum(len(m["content"].split()) for m in earlier)
    assert (
        with_history.prompt_tokens >= alone.prompt_tokens + added_words
    )  # every word is at least one token
    assert (
        own_system.prompt_tokens < alone.prompt_tokens
    )  # "Be brief." replaced the config's longer system prompt


@pytest.mark.parametrize(("fmt", "rate"), [("wav", VOICE_RATE), ("pcm", PCM_RATE)])
def test_speech_is_the_voice_speaking_the_input(serve: ServeProcess, fmt: str, rate: int) -> None:
    t0 = time.perf_counter()
    with _client(serve).audio.speech.with_streaming_response.create(
        model="voice-assistant", voice="alloy", input=SPEECH, response_format=fmt
    ) as response:  # type: ignore[arg-type]
        first: float | None = None
        data = b""
        for piece in response.iter_bytes():
            first = first or time.perf_counter() - t0
            data += piece
        assert response.headers["x-sample-rate"] == str(rate)
    if fmt == "wav":
        assert data[:4] == b"RIFF" and struct.unpack("<I", data[24:28])[0] == VOICE_RATE
        data = data[44:]
    _assert_speech(_pcm(data), rate, 2)
    heard(SPEECH, transcribe(_pcm(data), rate))  # the input's words, within the suite's WER bound
    recent = httpx.get(f"{serve.url}/v1/status").json()["recent"]
    assert recent[-1]["endpoint"] == "speech" and set(recent[-1]["stages"]) == {"voice"}
    print(f"speech ({fmt}): first bytes after {first:.3f} s, {len(data) / 2 / rate:.2f} s of audio")


def test_eight_concurrent_clients_are_all_answered(serve: ServeProcess) -> None:
    replies: list[Any] = [None] * 8
    errors: list[BaseException] = []

    def ask(i: int) -> None:
        try:
            replies[i] = _client(serve, timeout=300).chat.completions.create(
                model="voice-assistant",
                messages=_ask(f"Give me fact number {i + 1} about rain."),
                max_tokens=24,
                extra_body={"min_tokens": 4},
            )
        except BaseException as exc:
            errors.append(exc)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert all(r is not None and r.choices[0].message.content for r in replies)
    print(f"8 concurrent chat requests answered in {time.perf_counter() - t0:.1f} s")


def test_a_full_queue_is_429_and_clients_that_leave_free_their_slots(serve: ServeProcess) -> None:
    """``--max-waiting 0``: with every slot taken the next request is refused at once;
    when the clients holding them go away, every slot is freed by cancelling its request
    (answered 499: each held reply is more audio than the sockets buffer, so none can end
    while its client reads nothing)."""
    limit = httpx.get(f"{serve.url}/v1/status").json()["queue"]["limit"]
    left_before = _answered(serve, "speech", 499)

    async def main() -> tuple[httpx.Response, float]:
        async with httpx.AsyncClient(base_url=serve.url, timeout=120) as held:

            async def hold() -> None:
                async with held.stream(
                    "POST",
                    "/v1/audio/speech",
                    json={"model": "m", "voice": "v", "input": SPEECH * 4},
                ) as r:
                    async for _ in r.aiter_bytes():
                        await asyncio.sleep(3600)  # keep the slot: read nothing more

            holders = [asyncio.create_task(hold()) for _ in range(limit)]
            deadline = time.monotonic() + NEVER_HANGS_S
            while (await _queue(serve))["in_flight"] < limit:
                assert time.monotonic() < deadline, "the holders never took every slot"
                await asyncio.sleep(0.05)
            async with httpx.AsyncClient(base_url=serve.url, timeout=30) as other:
                refused = await other.post(
                    "/v1/audio/speech", json={"model": "m", "voice": "v", "input": "Hello."}
                )
            for h in holders:
                h.cancel()
            await asyncio.gather(*holders, return_exceptions=True)
        gone = time.perf_counter()
        deadline = time.monotonic() + NEVER_HANGS_S
        while (await _queue(serve))["in_flight"]:
            assert time.monotonic() < deadline, "slots still held after their clients left"
            await asyncio.sleep(0.005)
        return refused, (time.perf_counter() - gone) * 1000

    refused, freed_ms = asyncio.run(main())
    # every holder's request was cancelled for its client leaving, none ran to its end
    assert _answered(serve, "speech", 499) - left_before == limit
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "pipeline_busy"
    t0 = time.perf_counter()
    reply = _client(serve).chat.completions.create(
        model="voice-assistant", messages=_ask("Hi."), max_tokens=4
    )
    assert reply.choices[0].message.content is not None
    print(
        f"{limit} clients left → every slot free in {freed_ms:.0f} ms; the next request answered in "
        f"{time.perf_counter() - t0:.2f} s"
    )


def test_a_streamed_reply_whose_client_leaves_is_cancelled_at_once(serve: ServeProcess) -> None:
    """At once: the slot is freed by cancelling the request (answered 499, its decoder never
    done), not by the reply running out its 96 tokens, however fast the machine decodes."""
    left_before = _answered(serve, "chat", 499)
    client = httpx.Client(timeout=120)
    with client.stream(
        "POST",
        f"{serve.url}/v1/chat/completions",
        json={
            "messages": _ask("Tell me a long story."),
            "stream": True,
            "max_tokens": 96,
            "min_tokens": 96,
        },
    ) as r:
        lines = r.iter_lines()
        for _ in range(4):
            next(lines)
        assert httpx.get(f"{serve.url}/v1/status").json()["queue"]["in_flight"] == 1
        gone = time.perf_counter()
        client.close()
    wait_until(
        lambda: httpx.get(f"{serve.url}/v1/status").json()["queue"]["in_flight"] == 0,
        "the slot freed after the client left",
        every_s=0.005,
    )
    freed_ms = (time.perf_counter() - gone) * 1000
    assert _answered(serve, "chat", 499) - left_before == 1  # cancelled, not finished
    left = httpx.get(f"{serve.url}/v1/status").json()["recent"][-1]
    assert left["endpoint"] == "chat" and left["stages"]["thinker"]["done_s"] is None, left
    t0 = time.perf_counter()
    first = next(
        iter(
            _client(serve).chat.completions.create(
                model="voice-assistant", messages=_ask("Hi."), max_tokens=8, stream=True
            )
        )
    )
    assert first.choices[0].delta.role == "assistant"
    print(
        f"disconnect mid-stream → slot free in {freed_ms:.0f} ms; next first chunk in "
        f"{(time.perf_counter() - t0) * 1000:.0f} ms"
    )


def test_metrics_plan_and_status_after_requests(serve: ServeProcess) -> None:
    text = httpx.get(f"{serve.url}/metrics").text
    samples = {
        line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert samples["omni_edge_time_to_first_token_seconds_count"] >= 1
    assert samples["omni_edge_time_to_first_audio_seconds_count"] >= 1
    assert samples['omni_edge_requests_refused_total{code="429"}'] >= 1
    assert samples['omni_edge_decode_tokens_per_second{stage="thinker"}'] > 0
    assert samples['omni_edge_ledger_held_bytes{pool="host_ram"}'] > 0
    plan = httpx.get(f"{serve.url}/v1/plan").json()
    for s in plan["stages"]:
        m = s["measured"]
        assert m["measured_peak_bytes"] > 0 and m["budget_bytes"] > 0, s["name"]
    status = httpx.get(f"{serve.url}/v1/status").json()
    firsts = [r["time_to_first_audio_s"] for r in status["recent"] if r["time_to_first_audio_s"]]
    print(
        f"median time to first audio over {len(firsts)} recent requests: {statistics.median(firsts):.3f} s; "
        f"peaks {[(s['name'], s['measured']['measured_peak_bytes']) for s in plan['stages']]}"
    )


def test_sigterm_with_a_request_in_flight_finishes_it_then_exits_0_with_the_ledger_at_zero(
    serve: ServeProcess,
) -> None:
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        with httpx.stream(
            "POST",
            f"{serve.url}/v1/chat/completions",
            timeout=120,
            json={
                "messages": _ask("Tell me about the Sun."),
                "stream": True,
                "max_tokens": 64,
                "min_tokens": 64,
            },
        ) as r:
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                    started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert started.wait(60)
    t0 = time.perf_counter()
    rc = serve.stop(signal.SIGTERM, timeout_s=120)
    stopped_s = time.perf_counter() - t0
    reader.join(10)
    assert lines[-1] == "data: [DONE]", lines[-3:]
    docs = [json.loads(x.removeprefix("data: ")) for x in lines if x.startswith("data: {")]
    assert (
        docs[-1]["choices"][0]["finish_reason"] == "length"
    )  # all 64 tokens were generated and sent
    assert rc == 0, serve.output()
    assert "stopped by SIGTERM" in serve.output() and "ledger holds 0 bytes" in serve.output()
    print(f"SIGTERM mid-reply → reply finished, pipeline closed, exit 0 in {stopped_s:.1f} s")


def _answered(serve: ServeProcess, endpoint: str, code: int) -> float:
    """How many ``endpoint`` requests serve has answered with ``code`` (its metrics)."""
    key = f'omni_edge_requests_total{{code="{code}",endpoint="{endpoint}"}}'
    for line in httpx.get(f"{serve.url}/metrics", timeout=30).text.splitlines():
        if line.startswith(key + " "):
            return float(line.rpartition(" ")[2])
    return 0.0


async def _queue(serve: ServeProcess) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=serve.url, timeout=10) as c:
        return dict((await c.get("/v1/status")).json()["queue"])
