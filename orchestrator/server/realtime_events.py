"""The client events of ``/v1/realtime`` (``orchestrator.server.realtime``): their fields as
pydantic models, how to fix each field an ``error`` event names, the pcm16 audio they carry."""

from __future__ import annotations

import base64
import binascii
import uuid
from typing import Annotated, Any, Literal, TypedDict

import numpy as np
from pydantic import ConfigDict, Discriminator, Field, Tag

from orchestrator.core.errors import BadRequest, Problem
from orchestrator.server.chat_tools import MAX_TOOLS
from orchestrator.server.protocol import Text, _Body
from orchestrator.server.protocol import validated as _validated
from stages.ar_decode.json_grammar import Schema


class TurnDetection(_Body):
    type: Literal["server_vad"] = "server_vad"
    threshold: float | None = Field(None, gt=0.0, lt=1.0, allow_inf_nan=False)
    prefix_padding_ms: int | None = Field(None, ge=0, le=10_000)
    silence_duration_ms: int | None = Field(None, ge=32, le=10_000)
    create_response: bool | None = None
    interrupt_response: bool | None = None
    eagerness: str | None = None
    """Refused (``Session._turn``): semantic_vad's, not this type's."""


class SemanticTurnDetection(_Body):
    """OpenAI's ``semantic_vad``: a pause as long as the utterance needs
    (``orchestrator.server.realtime_turn_end``). Its fields only: server_vad's are refused."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    type: Literal["semantic_vad"]
    eagerness: Literal["low", "medium", "high", "auto"] | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None


def _turn_type(value: object) -> str | None:
    """``turn_detection``'s tag: its ``type`` (server_vad when it names none); ``~`` keeps the
    tag out of the field an error names (``protocol._problem``)."""
    kind = (
        value.get("type", "server_vad") if isinstance(value, dict) else getattr(value, "type", None)
    )
    return (
        {"server_vad": "~server_vad", "semantic_vad": "~semantic_vad"}.get(kind)
        if isinstance(kind, str)
        else None
    )


class TurnSettings(TypedDict):
    """A session's ``server_vad`` turn detection as it holds and sends it
    (``session.turn_detection``): OpenAI's server VAD fields, the vad stage's own settings
    where the client set none."""

    type: Literal["server_vad"]
    threshold: float
    prefix_padding_ms: int
    silence_duration_ms: int
    create_response: bool
    interrupt_response: bool


class SemanticSettings(TypedDict):
    """A session's ``semantic_vad`` turn detection as it holds and sends it: the pauses are the
    eagerness's (``realtime_turn_end.EAGERNESS``)."""

    type: Literal["semantic_vad"]
    eagerness: str
    create_response: bool
    interrupt_response: bool


SessionTurn = TurnSettings | SemanticSettings
"""A session's turn detection (``Session.turn``); ``type`` tells which."""


VOICE_CHARS = 256
"""A session's ``voice``: a name (kept, not used: the pipeline has one voice), as long as a chat
message's ``name`` may be."""
EVENT_ID_CHARS = 256
"""A client event's ``event_id``: an id, echoed in the ``error`` event that answers the event."""


class RealtimeTool(_Body):
    """One of ``session.tools``: OpenAI Realtime's flat function shape (``realtime_items``)."""

    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: Schema | None = None


class FunctionChoice(_Body):
    type: Literal["function"]
    name: str


RealtimeToolChoice = Literal["auto", "none", "required"] | FunctionChoice


class ToolFields(_Body):
    """The tools a session (``session.update``) or one response (``response.create``) offers."""

    tools: list[RealtimeTool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: RealtimeToolChoice | None = None


class SessionFields(ToolFields):
    instructions: Text | None = None
    """Capped by ``ServerLimits.max_content_chars`` (``check_instructions``): it is the system
    message of every turn, as a chat's messages are capped."""
    voice: str | None = Field(None, max_length=VOICE_CHARS)
    modalities: list[Literal["text", "audio"]] | None = Field(None, min_length=1, max_length=2)
    input_audio_format: Literal["pcm16"] | None = None
    output_audio_format: Literal["pcm16"] | None = None
    input_audio_sample_rate: Literal[16000, 24000] | None = None
    output_audio_sample_rate: Literal[16000, 24000] | None = None
    turn_detection: (
        Annotated[
            Annotated[TurnDetection, Tag("~server_vad")]
            | Annotated[SemanticTurnDetection, Tag("~semantic_vad")],
            Discriminator(
                _turn_type,
                custom_error_type="turn_detection_type",
                custom_error_message="type must be 'server_vad' or 'semantic_vad'",
            ),
        ]
        | None
    ) = None


class SessionUpdate(_Body):
    session: SessionFields


class AppendEvent(_Body):
    audio: str


FIXES = {
    "audio": "base64 of 16-bit little-endian mono pcm at the session's input_audio_sample_rate",
    "session": "e.g. {'type': 'session.update', 'session': {'turn_detection': {'silence_duration_ms': 500}}}",
    "instructions": "a string: the system message of every turn (at most --max-content-chars)",
    "voice": f"a name of at most {VOICE_CHARS} characters (the pipeline has one voice; the name "
    "is kept, not used)",
    "modalities": "['text', 'audio'] or ['text']",
    "input_audio_format": "'pcm16'",
    "output_audio_format": "'pcm16'",
    "input_audio_sample_rate": "16000 or 24000 (OpenAI's pcm16 is 24000)",
    "output_audio_sample_rate": "16000 or 24000 (OpenAI's pcm16 is 24000)",
    "turn_detection": "null (commit yourself), {'type': 'server_vad', 'silence_duration_ms': 500, ...} "
    "or {'type': 'semantic_vad', 'eagerness': 'auto'}",
    "type": "'server_vad' or 'semantic_vad'",
    "eagerness": "'low', 'medium', 'high' or 'auto' (semantic_vad only)",
    "threshold": "a number between 0 and 1, e.g. 0.5",
    "prefix_padding_ms": "whole milliseconds from 0 to 10000, at most silence_duration_ms",
    "silence_duration_ms": "whole milliseconds from 32 to 10000, e.g. 500",
    "create_response": "true or false",
    "interrupt_response": "true or false",
    "tools": "[{'type': 'function', 'name': 'get_weather', 'parameters': {...}}]",
    "tool_choice": "'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
}
"""How to fix each field of a client event, for the ``error`` event that names it."""


def validated(model: type[_Body], doc: dict[str, object], example: str) -> Any:
    """``doc`` as ``model``; ``BadRequest`` naming the field, with this endpoint's own fix."""
    try:
        return _validated(model, doc, example)
    except BadRequest as exc:
        p = exc.problems[0]
        name = p.where.rpartition(".")[2]
        fix = FIXES.get(name, "")
        if p.what.endswith(
            "extra inputs are not permitted"
        ):  # a server_vad field under semantic_vad
            fix = f"leave {name} out: semantic_vad takes eagerness, create_response and interrupt_response"
        raise BadRequest([Problem(p.where, p.what, fix)]) from None


def check_instructions(text: str | None, max_chars: int, flag: str) -> None:
    """``BadRequest`` naming ``session.instructions`` and its cap (``max_chars``, the server's
    ``flag``) when ``text`` is longer: the system message of every turn is capped as a chat's
    messages are."""
    if text is not None and len(text) > max_chars:
        raise BadRequest.single(
            "session.instructions",
            f"{len(text)} characters: over the cap of {max_chars} characters ({flag}); it is "
            "the system message of every turn",
            f"send shorter instructions, or raise {flag}",
        )


def check_event_id(doc: Any) -> str | None:
    """The event's ``event_id`` (None when it has none, or none that is a string); ``BadRequest``
    naming it and its cap when it is longer than ``EVENT_ID_CHARS``."""
    event_id = doc.get("event_id") if isinstance(doc, dict) else None
    if not isinstance(event_id, str):
        return None
    if len(event_id) > EVENT_ID_CHARS:
        raise BadRequest.single(
            "event_id",
            f"{len(event_id)} characters: over the cap of {EVENT_ID_CHARS} characters",
            "send a short id of your own (evt_…), or none",
        )
    return event_id


def pcm16(data: str, where: str) -> np.ndarray:
    """A client's base64 pcm16 as float32 samples; ``BadRequest`` naming ``where`` otherwise."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (ValueError, binascii.Error):
        raise BadRequest.single(where, "is not base64", "base64-encode the pcm16 bytes") from None
    if len(raw) % 2:
        raise BadRequest.single(
            where,
            f"{len(raw)} bytes: pcm16 is two bytes a sample",
            "send whole 16-bit little-endian samples",
        )
    return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0


def new_id(prefix: str) -> str:
    """An id of OpenAI's shape: ``sess_…``, ``item_…``, ``resp_…``, ``event_…``."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"
