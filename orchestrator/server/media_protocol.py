"""The bodies of ``POST /v1/audio/transcriptions`` (a multipart form) and ``POST /v1/embeddings``
(JSON), checked before the pipeline sees them, each problem a 400 in OpenAI's error shape naming
the field — as :mod:`orchestrator.server.protocol` does for chat and speech.

Guarantees: a form field this server does not serve is refused by name, never ignored when it
would change the answer (``prompt``, a ``temperature`` above 0, ``timestamp_granularities[]``
``word``, ``include[]``, ``stream``); only ``model`` and ``user`` are read and ignored. The
recording is a 16-bit PCM WAV under ``ServerLimits.max_audio_bytes`` and ``max_audio_seconds``
(the same caps as chat's ``input_audio``); the embeddings' inputs are strings, at most
:data:`MAX_INPUTS`, none empty, all of them within ``max_content_chars``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.core.errors import BadRequest, Problem
from orchestrator.runtime.requests import audio_request
from orchestrator.server.limits import FLAGS, ServerLimits
from orchestrator.server.protocol import _Body, parse_json, validated
from stages.payloads import AudioItem

TRANSCRIPTION_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
"""The ``response_format`` values served: OpenAI's for whisper-1."""
READ_FIELDS = frozenset(
    {"file", "model", "language", "prompt", "response_format", "temperature", "user"}
    | {"timestamp_granularities[]", "timestamp_granularities", "include[]", "include"}
    | {"stream", "chunking_strategy"}
)
"""The form fields a transcription request may carry (each one read, or refused by value)."""
SINGLE_FIELDS = (
    *("model", "language", "prompt", "response_format", "temperature", "user"),
    *("stream", "chunking_strategy"),
)
"""The fields that take one value (the two ``[]`` ones take several)."""
MAX_INPUTS = 2048
"""Inputs per embeddings request: OpenAI's own limit."""
WAV_FIX = "send a 16-bit PCM WAV file (e.g. ffmpeg -i IN -ac 1 -ar 16000 -c:a pcm_s16le OUT.wav)"


@dataclass(frozen=True)
class TranscriptionCall:
    """A transcription request as the endpoint runs it."""

    recording: AudioItem
    response_format: str
    language: str | None


def _bad(where: str, what: str, fix: str) -> BadRequest:
    return BadRequest([Problem(where, what, fix)])


def _one(form: list[tuple[str, Any]], name: str) -> Any:
    values = [v for k, v in form if k == name]
    if len(values) > 1:
        raise _bad(name, f"is given {len(values)} times", f"send {name} once")
    return values[0] if values else None


def _text(form: list[tuple[str, Any]], name: str) -> str | None:
    value = _one(form, name)
    if value is not None and not isinstance(value, str):
        raise _bad(name, "is a file, not a form field", f"send {name} as a plain form field")
    return value


def read_transcription(
    form: list[tuple[str, Any]],
    file_bytes: bytes | None,
    language: str | None,
    limits: ServerLimits,
) -> TranscriptionCall:
    """The checked request of a transcription form (its fields as sent, ``file_bytes`` the
    ``file`` part's content); ``language``: the asr stage's language (the decoder's manifest),
    None when it does not say. ``BadRequest`` naming the first field that is wrong."""
    unknown = sorted({k for k, _ in form} - READ_FIELDS)
    if unknown:
        raise _bad(
            unknown[0],
            "is not a field of a transcription request this server reads",
            f"leave it out; the fields are {', '.join(sorted(READ_FIELDS - {'user'}))}",
        )
    for name in SINGLE_FIELDS:  # each given once (a second value would be read by whom?)
        _text(form, name)
    fmt = _text(form, "response_format") or "json"
    if fmt not in TRANSCRIPTION_FORMATS:
        raise _bad(
            "response_format",
            f"{fmt[:40]!r} is not served",
            f"send one of {', '.join(TRANSCRIPTION_FORMATS)}",
        )
    _refuse_unserved(form, fmt)
    asked = _text(form, "language")
    if asked is not None and asked.strip().lower() != (language or "").lower():
        raise _bad(
            "language",
            f"{asked[:20]!r}: the asr stage transcribes "
            + (f"{language!r} only" if language else "one language it does not name"),
            f"send language={language!r} or leave it out" if language else "leave it out",
        )
    if file_bytes is None:
        if _one(form, "file") is not None:
            raise _bad(
                "file", "is a plain form field, not a file", "send the recording as a file part"
            )
        raise _bad("file", "is missing", "send the recording as the form's file part")
    if len(file_bytes) > limits.max_audio_bytes:
        raise _bad(
            "file",
            f"{len(file_bytes)} bytes of audio: over the cap of {limits.max_audio_bytes} bytes "
            f"per request ({FLAGS['max_audio_bytes']})",
            f"send a shorter recording (or 16 kHz mono), or raise {FLAGS['max_audio_bytes']}",
        )
    if file_bytes[:4] != b"RIFF" or file_bytes[8:12] != b"WAVE":
        raise _bad("file", "is not a WAV file (mp3, ogg, flac, m4a and webm are not read)", WAV_FIX)
    recording = audio_request(
        file_bytes,
        where="file",
        max_seconds=limits.max_audio_seconds,
        seconds_flag=FLAGS["max_audio_seconds"],
    )
    return TranscriptionCall(recording, fmt, language)


def _refuse_unserved(form: list[tuple[str, Any]], fmt: str) -> None:
    """The fields whose value would change the answer and is not served: a 400 naming each."""
    prompt = _text(form, "prompt")
    if prompt:
        raise _bad(
            "prompt",
            "is not served: the asr stage decodes without a previous-text prompt",
            "leave it out (or send it empty)",
        )
    temperature = _text(form, "temperature")
    if temperature is not None and temperature.strip() != "":
        try:
            value = float(temperature)
        except ValueError:
            raise _bad("temperature", f"{temperature[:20]!r} is not a number", "send 0") from None
        if not math.isfinite(value) or not 0 <= value <= 1:
            raise _bad("temperature", f"{temperature[:20]} is not within 0-1", "send 0")
        if value != 0:
            raise _bad(
                "temperature",
                f"{value:g}: the asr stage decodes greedily (temperature 0) only",
                "send 0 or leave it out",
            )
    for name in ("timestamp_granularities[]", "timestamp_granularities"):
        for value in (v for k, v in form if k == name):
            if value != "segment":
                raise _bad(
                    name,
                    f"{str(value)[:20]!r}: only segment timestamps are served",
                    "send segment (with response_format verbose_json), or leave it out",
                )
            if fmt != "verbose_json":
                raise _bad(
                    name,
                    f"timestamps come with response_format verbose_json, not {fmt}",
                    "send response_format=verbose_json",
                )
    for name in ("include[]", "include"):
        if any(True for k, _ in form if k == name):
            raise _bad(name, "is not served (no logprobs)", "leave it out")
    stream = _text(form, "stream")
    if stream is not None and stream.strip().lower() not in ("", "false", "0"):
        raise _bad("stream", "is not served: the transcript comes whole", "leave it out")
    chunking = _text(form, "chunking_strategy")
    if chunking is not None and chunking.strip() not in ("", "auto"):
        raise _bad(
            "chunking_strategy",
            "only auto is served (the recording is cut into the asr stage's windows)",
            "send auto or leave it out",
        )


# -- embeddings ----------------------------------------------------------------------
class EmbeddingsBody(_Body):
    """``POST /v1/embeddings``: OpenAI's fields (``user`` and unknown keys ignored, ``dimensions``
    refused: the graph gives its own)."""

    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


def read_embeddings(raw: bytes, limits: ServerLimits) -> tuple[list[str], str]:
    """(the input strings, the encoding format) of an embeddings body; ``BadRequest`` naming
    the field (``input[3]``) that is wrong."""
    body: EmbeddingsBody = validated(
        EmbeddingsBody, parse_json(raw), "{'model': ..., 'input': 'text' or ['text', ...]}"
    )
    if body.dimensions is not None:
        raise _bad(
            "dimensions",
            "is not served: the embedding stage's graph gives vectors of its own size",
            "leave it out",
        )
    texts = [body.input] if isinstance(body.input, str) else list(body.input)
    if not texts:
        raise _bad("input", "is an empty list", "send a string or a list of strings")
    if len(texts) > MAX_INPUTS:
        raise _bad("input", f"{len(texts)} inputs: at most {MAX_INPUTS}", "send fewer per request")
    total = 0
    for i, text in enumerate(texts):
        where = "input" if isinstance(body.input, str) else f"input[{i}]"
        if not isinstance(text, str):
            raise _bad(
                where,
                "token ids are not served: the stage tokenizes text itself",
                "send the text as a string",
            )
        if not text.strip():
            raise _bad(where, "is empty", "send text to embed")
        total += len(text)
        if total > limits.max_content_chars:
            raise _bad(
                where,
                f"the inputs reach {total} characters here: over the cap of "
                f"{limits.max_content_chars} characters per request ({FLAGS['max_content_chars']})",
                f"send less text per request, or raise {FLAGS['max_content_chars']}",
            )
    return [str(t) for t in texts], body.encoding_format
