"""The request models of ``orchestrator.server.protocol``: OpenAI's shapes, extra keys
ignored, and every malformed body a ``BadRequest`` naming the field a client wrote —
never an exception that would be a 500. No server, no Ray: the functions the app runs
in its worker thread (``read_chat``, ``read_speech``) on the body's bytes. The served
path (a real ``omni-edge serve``) is ``test_server_hostile.py``."""

from __future__ import annotations

import base64
import io
import json
import threading
import wave
from typing import Any

import numpy as np
import pytest

from orchestrator.api import audio_request
from orchestrator.core.errors import BadRequest
from orchestrator.core.units import MiB
from orchestrator.server import ServerLimits
from orchestrator.server.protocol import (
    FLAGS,
    ChatBody,
    body_too_large,
    read_chat,
    read_speech,
)
from stages.audio_items import RESAMPLE_BLOCK_SAMPLES, Cancelled, resample, resample_blocks
from stages.requests import ChatRequest

LIMITS = ServerLimits()
HI = [{"role": "user", "content": "hi"}]


def _chat(
    raw: bytes | dict[str, Any], *, audio_entry: bool = False, limits: ServerLimits = LIMITS
) -> Any:
    data = raw if isinstance(raw, bytes) else json.dumps(raw).encode()
    return read_chat(data, audio_entry=audio_entry, has_audio=True, limits=limits)


def _refused(raw: bytes | dict[str, Any], **kw: Any) -> tuple[str, str, str]:
    with pytest.raises(BadRequest) as err:
        _chat(raw, **kw)
    p = err.value.problems[0]
    return p.where, p.what, p.fix


def wav(samples: int, rate: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.sin(np.arange(samples) / 7.0) * 8000).astype("<i2").tobytes())
    return buf.getvalue()


MALFORMED: list[tuple[bytes | dict[str, Any], str, str]] = [
    # (body, the field the 400 names, words of what it says)
    ({"messages": HI, "stream_options": "x"}, "stream_options", "must be a JSON object"),
    (
        {"messages": HI, "stream_options": {"include_usage": "yes"}},
        "stream_options.include_usage",
        "valid boolean",
    ),
    ({"messages": HI, "modalities": [{}]}, "modalities[0]", "'text' or 'audio'"),
    ({"messages": HI, "modalities": "text"}, "modalities", "must be a JSON array"),
    (
        {"messages": HI, "audio": "x", "modalities": ["text", "audio"]},
        "audio",
        "must be a JSON object",
    ),
    (b"[" * 100_000, "body", "deeper than the JSON reader goes"),
    (b'{"messages": ' + b"[" * 100_000, "body", "deeper than the JSON reader goes"),
    (
        b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}',
        "messages[0].content",
        "lone surrogate (\\ud800)",
    ),
    (
        b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
        "messages[0].content[0].text",
        "lone surrogate",
    ),
    (b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', "body", "not UTF-8"),
    (b"[1, 2]", "body", "JSON array, not an object"),
    (b'"hello"', "body", "JSON string, not an object"),
    (b"null", "body", "JSON null, not an object"),
    (b"42", "body", "JSON number, not an object"),
    (b"", "body", "is not JSON"),
    (b'{"messages": ', "body", "is not JSON"),
    (
        b'{"messages": [{"role": "user", "content": "hi"}], "seed": 1' + b"0" * 5000 + b"}",
        "body",
        "is not JSON",
    ),
    ({"messages": "hi"}, "messages", "must be a JSON array"),
    ({"messages": []}, "messages", "at least 1 item"),
    ({"model": "m"}, "messages", "is required"),
    ({"messages": [5]}, "messages[0]", "must be a JSON object"),
    (
        {"messages": [{"role": "system", "content": "x"}, {"role": "user"}]},
        "messages[1].content",
        "is missing",
    ),
    (
        {"messages": [{"role": "function", "content": "x"}]},
        "messages[0].role",
        "'system', 'developer', 'user', 'assistant' or 'tool'",
    ),
    (
        {"messages": [{"role": "user", "content": 5}]},
        "messages[0].content",
        "must be text or a list of content parts",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages[0].content[0]",
        "only text, input_audio and input_tensor content parts are served",
    ),
    (
        {"messages": [{"role": "user", "content": [{"text": "no type"}]}]},
        "messages[0].content[0]",
        "only text, input_audio and",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]},
        "messages[0].content[0].text",
        "valid string",
    ),
    ({"messages": HI, "stream": "yes"}, "stream", "valid boolean"),
    ({"messages": HI, "max_tokens": "5"}, "max_tokens", "valid integer"),
    ({"messages": HI, "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    (
        {"messages": HI, "max_completion_tokens": 2**31},
        "max_completion_tokens",
        "less than or equal to",
    ),
    ({"messages": HI, "n": 2}, "n", "one choice per request is served"),
    ({"messages": HI, "n": True}, "n", "valid integer"),
    # vLLM's own bounds: past them the engine step fails (seed) or the sampler does
    ({"messages": HI, "seed": 2**64}, "seed", "less than or equal to 9223372036854775807"),
    ({"messages": HI, "seed": 2**63}, "seed", "less than or equal to 9223372036854775807"),
    (
        {"messages": HI, "seed": -(2**63) - 1},
        "seed",
        "greater than or equal to -9223372036854775808",
    ),
    ({"messages": HI, "seed": 1.5}, "seed", "valid integer"),
    ({"messages": HI, "temperature": 3.0}, "temperature", "less than or equal to 2"),
    ({"messages": HI, "temperature": -0.1}, "temperature", "greater than or equal to 0"),
    (
        b'{"messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}',
        "temperature",
        "finite number",
    ),
    (
        b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        "temperature",
        "finite number",
    ),
    (
        b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e400}',
        "temperature",
        "finite number",
    ),
    ({"messages": HI, "top_p": 0}, "top_p", "greater than 0"),
    ({"messages": HI, "top_p": 1.5}, "top_p", "less than or equal to 1"),
    ({"messages": HI, "top_k": -2}, "top_k", "greater than or equal to -1"),
    ({"messages": HI, "min_tokens": -1}, "min_tokens", "greater than or equal to 0"),
]


@pytest.mark.parametrize(("body", "where", "what"), MALFORMED)
def test_every_malformed_chat_body_is_a_bad_request_naming_the_field(
    body: Any, where: str, what: str
) -> None:
    got_where, got_what, _ = _refused(body)
    assert got_where == where, (got_where, got_what)
    assert what in got_what


def test_a_refusal_shows_the_value_short_and_says_how_to_fix_it() -> None:
    where, what, fix = _refused({"messages": HI, "seed": 10**300})
    assert where == "seed" and len(what) < 200 and "..." in what
    assert "int64" in fix and str(2**63 - 1) in fix


def test_keys_openai_sends_that_are_not_served_are_ignored() -> None:
    call = _chat(
        {
            "model": "m",
            "messages": HI,
            "user": "u-1",
            "metadata": {"a": [[[1]]]},
            "logprobs": False,
            "parallel_tool_calls": True,
            "store": False,
            "seed": 2**63 - 1,
            "temperature": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
            "modalities": ["text", "audio"],
            "audio": {"voice": {"id": "v"}, "format": "pcm16"},
        }
    )
    assert call.prompt == {"messages": HI, "sampling": {"seed": 2**63 - 1, "temperature": 2}}
    assert call.stream and call.include_usage and call.audio_format == "pcm16"


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_either_name_of_max_tokens_reaches_the_sampling(field: str) -> None:
    """Both OpenAI names map to one sampling key: the one given is kept, whichever it is."""
    call = _chat({"model": "m", "messages": HI, field: 4})
    assert call.prompt == {"messages": HI, "sampling": {"max_tokens": 4}}


def test_the_models_are_openais_shapes() -> None:
    chat = ChatBody.model_validate(
        {
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "a"}]},
                {"role": "assistant", "audio": {"id": "audio-1"}},
            ]
        }
    )
    assert chat.messages[0].role == "developer" and chat.messages[1].content is None


@pytest.mark.parametrize(
    ("field", "body", "where", "cap_words"),
    [
        (
            "max_messages",
            {"messages": HI * 5},
            "messages",
            "5 messages: over the cap of 4 messages per request",
        ),
        (
            "max_content_chars",
            {
                "messages": [
                    {"role": "system", "content": "x" * 6},
                    {"role": "user", "content": "y" * 6},
                ]
            },
            "messages[1].content",
            "reaches 12 characters here: over the cap of 10 characters",
        ),
    ],
)
def test_each_limit_is_named_with_its_value_and_its_flag(
    field: str, body: Any, where: str, cap_words: str
) -> None:
    limits = ServerLimits(max_messages=4, max_content_chars=10)
    got_where, what, fix = _refused(body, limits=limits)
    assert got_where == where and cap_words in what and FLAGS[field] in what and FLAGS[field] in fix


def test_the_speech_input_is_capped_and_checked() -> None:
    limits = ServerLimits(max_speech_chars=10)
    with pytest.raises(BadRequest) as err:
        read_speech(json.dumps({"input": "x" * 11}).encode(), limits=limits)
    assert err.value.problems[0].where == "input" and "11 characters: over the cap of 10" in str(
        err.value
    )
    assert "--max-speech-chars" in str(err.value)
    for raw, where in (
        (b'{"input": "\\ud800"}', "input"),
        (b'{"input": 5}', "input"),
        (b"[" * 100_000, "body"),
        (b'{"input": "hi", "speed": Infinity}', "speed"),
        (b"[]", "body"),
    ):
        with pytest.raises(BadRequest) as err:
            read_speech(raw, limits=limits)
        assert err.value.problems[0].where == where, str(err.value)
    assert read_speech(b'{"input": "Hi.", "voice": "alloy", "extra": 1}', limits=limits) == (
        "Hi.",
        "wav",
    )


def test_the_body_cap_message_names_the_cap_and_the_flag() -> None:
    text = body_too_large(ServerLimits(max_body_bytes=MiB), 64 * MiB)
    assert f"the request body is {64 * MiB} bytes" in text and f"cap of {MiB} bytes" in text
    assert "--max-body-mib" in text and "(now 1)" in text


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_messages"):
        ServerLimits(max_messages=0)
    with pytest.raises(ValueError, match="max_audio_seconds"):
        ServerLimits(max_audio_seconds=float("inf"))


# -- a recording: rate range, duration and size caps, before its samples are read -----------
def _audio_body(data: bytes) -> dict[str, Any]:
    return {
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "input_audio",
                        "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"},
                    }
                ],
            }
        ]
    }


@pytest.mark.parametrize("rate", [8, 7999, 192_001, 1_000_000])
def test_a_wav_declaring_a_rate_outside_8_to_192_khz_is_refused_naming_it(rate: int) -> None:
    where, what, fix = _refused(_audio_body(wav(4000, rate)), audio_entry=True)
    assert where == "messages[0].content[0].input_audio.data"
    assert f"{rate} Hz: outside the 8000-192000 Hz" in what and "16000" in fix


def test_a_tiny_rate_with_megabytes_of_samples_is_refused_from_its_header() -> None:
    data = wav(1_000_000, 8)  # 2 MB of samples at 8 Hz: 2000× as many at 16 kHz (8 GB of float32)
    with pytest.raises(BadRequest, match="8 Hz: outside"):
        audio_request(data, where="x")


def test_a_recording_over_the_duration_cap_is_refused_naming_the_cap() -> None:
    limits = ServerLimits(max_audio_seconds=2.0)
    where, what, fix = _refused(_audio_body(wav(16000 * 3, 16000)), audio_entry=True, limits=limits)
    assert where.endswith("input_audio.data") and "3.0 s of audio: over the cap of 2 s" in what
    assert "--max-audio-seconds" in what and "--max-audio-seconds" in fix
    assert (
        _chat(_audio_body(wav(16000 * 2, 16000)), audio_entry=True, limits=limits).prompt[
            "sample_rate"
        ]
        == 16000
    )


def test_a_recording_over_the_size_cap_is_refused_before_it_is_decoded() -> None:
    limits = ServerLimits(max_audio_bytes=64_000)
    where, what, _ = _refused(_audio_body(wav(40_000, 16000)), audio_entry=True, limits=limits)
    assert (
        where.endswith("input_audio.data")
        and "over the cap of 64000 bytes" in what
        and "--max-audio-mib" in what
    )


def test_the_python_api_reads_a_long_file_only_when_asked(tmp_path: Any) -> None:
    path = tmp_path / "long.wav"
    path.write_bytes(wav(8000 * 700, 8000))  # 700 s
    with pytest.raises(BadRequest, match=r"700\.0 s of audio: over the cap of 600 s"):
        audio_request(path)
    assert audio_request(path, max_seconds=None)["audio"].size == 8000 * 700


# -- resampling in blocks, stopped by its request's cancel flag ----------------------------
def test_blocked_resampling_matches_and_stops_when_cancelled() -> None:
    import soxr

    x = np.sin(np.arange(RESAMPLE_BLOCK_SAMPLES * 3 + 123) / 5.0).astype(np.float32)
    whole = soxr.resample(x, 44100, 16000)
    blocked = resample(x, 44100, 16000)
    assert blocked.size == whole.size and np.max(np.abs(blocked - whole)) < 1e-4
    cancel = threading.Event()
    blocks = resample_blocks(x, 44100, 16000, cancel)
    next(blocks)
    cancel.set()
    with pytest.raises(Cancelled):
        next(blocks)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-messages", "0"),
        ("--max-body-mib", "-1"),
        ("--max-audio-seconds", "inf"),
        ("--max-audio-mib", "nan"),
        ("--max-body-mib", "1e-9"),
    ],
)
def test_a_limit_flag_that_is_not_positive_exits_2_before_anything_starts(
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    flag: str,
    value: str,
) -> None:
    from orchestrator.api import Pipeline
    from orchestrator.cli import main

    def refuse(*a: Any, **k: Any) -> None:
        raise AssertionError("the pipeline was started with a limit that is refused")

    monkeypatch.setattr(Pipeline, "from_config", refuse)
    rc = main(["serve", str(tmp_path / "never-read.yaml"), flag, value])
    err = capsys.readouterr().err
    assert rc == 2 and flag in err and "Traceback" not in err


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_chats_max_tokens_reaches_the_request_whichever_field_names_it(field: str) -> None:
    """Both OpenAI fields name the decode stage's ``max_tokens``: the one sent counts, never
    the other's absence written over it (an HTTP chat's ``max_tokens`` was dropped)."""
    body = {"messages": [{"role": "user", "content": "Hi"}], field: 24, "temperature": 0.5}
    call = read_chat(json.dumps(body).encode(), audio_entry=False, has_audio=False, limits=LIMITS)
    assert isinstance(call.request, ChatRequest)
    assert call.request.sampling == {"max_tokens": 24, "temperature": 0.5}
