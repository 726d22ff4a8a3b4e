"""The transcription form and the embeddings body checked before anything runs
(``server.media_protocol``): each problem a ``BadRequest`` naming the field as the client sent
it. No Ray: the readers alone; the served endpoints are ``test_serve_media.py``'s."""

from __future__ import annotations

import io
import json
import wave
from typing import Any

import numpy as np
import pytest

from orchestrator.core.errors import BadRequest
from orchestrator.server.limits import ServerLimits
from orchestrator.server.media_protocol import MAX_INPUTS, read_embeddings, read_transcription

RATE = 16000


def wav(seconds: float, rate: int = RATE) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.zeros(int(seconds * rate), dtype="<i2").tobytes())
    return buf.getvalue()


def refused(call: Any) -> tuple[str, str]:
    with pytest.raises(BadRequest) as err:
        call()
    p = err.value.problems[0]
    return p.where, p.what


def test_a_good_form_gives_the_recording_its_format_and_language() -> None:
    form = [("model", "m"), ("response_format", "verbose_json"), ("language", "EN")]
    form += [("timestamp_granularities[]", "segment"), ("temperature", "0"), ("user", "u")]
    call = read_transcription(form, wav(1.5), "en", ServerLimits())
    assert (call.response_format, call.language) == ("verbose_json", "en")
    assert call.recording["sample_rate"] == RATE and len(call.recording["audio"]) == 1.5 * RATE


@pytest.mark.parametrize(
    ("form", "data", "where", "what"),
    [
        ([("model", "a"), ("model", "b")], wav(1), "model", "is given 2 times"),
        ([], None, "file", "is missing"),
        ([("file", "q.wav")], None, "file", "is a plain form field"),
        ([], b"OggS" + bytes(64), "file", "is not a WAV file"),
        ([], wav(3), "file", "over the cap of 2 s"),
        (
            [("timestamp_granularities[]", "segment")],
            wav(1),
            "timestamp_granularities[]",
            "verbose_json",
        ),
        ([("include[]", "logprobs")], wav(1), "include[]", "is not served"),
        ([("stream", "true")], wav(1), "stream", "is not served"),
        ([("temperature", "hot")], wav(1), "temperature", "is not a number"),
        ([("temperature", "2")], wav(1), "temperature", "is not within 0-1"),
        ([("chunking_strategy", "server_vad")], wav(1), "chunking_strategy", "only auto"),
    ],
)
def test_a_bad_form_is_refused_naming_the_field(
    form: list[tuple[str, Any]], data: bytes | None, where: str, what: str
) -> None:
    limits = ServerLimits(max_audio_seconds=2.0)
    got = refused(lambda: read_transcription(form, data, "en", limits))
    assert got[0] == where and what in got[1], got


def test_a_file_over_the_byte_cap_is_refused_before_it_is_decoded() -> None:
    limits = ServerLimits(max_audio_bytes=1000)
    where, what = refused(lambda: read_transcription([], wav(1), "en", limits))
    assert where == "file" and "--max-audio-mib" in what


def test_an_embeddings_body_gives_its_texts_and_format() -> None:
    raw = json.dumps({"model": "m", "input": ["a.", "b. c."], "encoding_format": "base64"})
    assert read_embeddings(raw.encode(), ServerLimits()) == (["a.", "b. c."], "base64")
    assert read_embeddings(b'{"input": "x"}', ServerLimits()) == (["x"], "float")


@pytest.mark.parametrize(
    ("body", "where", "what"),
    [
        ({"input": []}, "input", "is an empty list"),
        ({"input": ["a", ""]}, "input[1]", "is empty"),
        ({"input": [1, 2]}, "input[0]", "token ids are not served"),
        ({"input": "a", "dimensions": 8}, "dimensions", "is not served"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format", ""),
        ({"input": ["x"] * (MAX_INPUTS + 1)}, "input", f"at most {MAX_INPUTS}"),
        ({"input": ["abcdef", "ghijkl"]}, "input[1]", "reach 12 characters"),
    ],
)
def test_a_bad_embeddings_body_is_refused_naming_the_field(
    body: dict[str, Any], where: str, what: str
) -> None:
    limits = ServerLimits(max_content_chars=10)
    got = refused(lambda: read_embeddings(json.dumps(body).encode(), limits))
    assert got[0] == where and what in got[1], got
