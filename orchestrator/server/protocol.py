"""The request bodies ``omni-edge serve`` takes, as pydantic models of OpenAI's shapes,
and the limits a body is checked against before the pipeline sees it.

A body goes through four steps, each a 400 in OpenAI's error shape naming the field
(``messages[0].content``, ``seed``) when it fails, never a 500:

1. read under ``ServerLimits.max_body_bytes`` (413 naming the cap: the app does it);
2. parsed as JSON (:func:`parse_json`: not JSON, not UTF-8, nested deeper than the
   parser goes);
3. validated against its model here (:class:`ChatBody`, :class:`SpeechBody`): types
   and OpenAI's own ranges, and vLLM's (``seed`` within int64, ``temperature``
   finite and within 0-2, ``top_p`` in (0, 1]); text that is not Unicode (a lone surrogate)
   is refused. OpenAI's fields that would change the reply and are not served
   (``logit_bias``, ...) are refused by name (:mod:`orchestrator.server.chat_fields` holds
   the table); keys the models do not name are otherwise ignored, as OpenAI's server does;
4. checked against the server's limits (:class:`ServerLimits`: messages per
   request, characters of text, the speech input's length, the recording's bytes
   and seconds), each named with its ``omni-edge serve`` flag in the 400.

What a stage checks itself (the config's sampling limits, the prompt against the
context) stays with the stage (``Runtime.validate_request``); the app runs steps
2-4 and the stage's check off the event loop.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    ValidationError,
)

from orchestrator.core.errors import BadRequest, Problem
from orchestrator.core.units import MiB
from orchestrator.runtime.requests import audio_request, tensor_request
from orchestrator.server.chat_fields import first_refused
from orchestrator.server.chat_logprobs import LOGPROB_FIXES, LogprobFields, logprobs_of
from orchestrator.server.chat_tools import (
    MAX_TOOLS,
    Family,
    ToolCallItem,
    ToolChoice,
    ToolDef,
    as_text,
    tool_call_of,
)
from orchestrator.server.limits import FLAGS, ServerLimits
from stages.ar_decode.json_grammar import Schema
from stages.payloads import Array, AudioItem, Item
from stages.requests import (
    INT32_MAX,
    INT64_MAX,
    INT64_MIN,
    PENALTY_MAX,
    STOP_MAX_CHARS,
    STOPS_MAX,
    TEMPERATURE_MAX,
    AudioRequest,
    ChatMessage,
    ChatRequest,
    Sampling,
    TensorRequest,
)
from stages.requests import Request as PipelineRequest

SAMPLING_FIELDS = {
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "seed": "seed",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "stop": "stop",
    "min_tokens": "min_tokens",
    "top_k": "top_k",
    "repetition_penalty": "repetition_penalty",
}
"""OpenAI's request fields (and vLLM's extensions, sent as ``extra_body``) → sampling keys."""
CHAT_AUDIO_FORMATS, SPEECH_FORMATS, AUDIO_INPUT_FORMATS = ("wav", "pcm16"), ("wav", "pcm"), ("wav",)


# -- the models ----------------------------------------------------------------------
def _unicode(value: str) -> str:
    """Text that can be encoded: JSON's ``\\ud800`` escapes make strings no encoder takes."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"holds a lone surrogate (\\u{ord(value[exc.start]):04x}) at character {exc.start}, "
            "which is not text"
        ) from None
    return value


Text = Annotated[str, AfterValidator(_unicode)]
StopString = Annotated[
    str, AfterValidator(_unicode), StringConstraints(min_length=1, max_length=STOP_MAX_CHARS)
]


class _Body(BaseModel):
    """OpenAI's shapes: keys not named here are ignored; no type is coerced (``"5"`` is no number)."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class TextPart(_Body):
    type: Literal["text"]
    text: Text


class InputAudio(_Body):
    data: str
    format: str | None = None


class AudioPart(_Body):
    type: Literal["input_audio"]
    input_audio: InputAudio


class InputTensor(_Body):
    data: str
    """A ``.npy`` file's bytes (``numpy.save``), base64: dtype and shape travel with the values."""
    name: str | None = Field(None, min_length=1, max_length=256)
    """The entry graph's input it feeds; left out, the array feeds a graph of one input."""


class TensorPart(_Body):
    """omni-edge's own content part (OpenAI has none for arrays): the request as arrays, for a
    pipeline whose entry stage consumes a tensor."""

    type: Literal["input_tensor"]
    input_tensor: InputTensor


def _part_type(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return (
        {"text": "~text", "input_audio": "~input_audio", "input_tensor": "~input_tensor"}.get(kind)
        if isinstance(kind, str)
        else None
    )


ContentPart = Annotated[
    Annotated[TextPart, Tag("~text")]
    | Annotated[AudioPart, Tag("~input_audio")]
    | Annotated[TensorPart, Tag("~input_tensor")],
    Discriminator(
        _part_type,
        custom_error_type="content_part",
        custom_error_message="only text, input_audio and input_tensor content parts are served",
    ),
]


def _content_kind(value: Any) -> str | None:
    return (
        "~str" if isinstance(value, str) else "~parts" if isinstance(value, list | tuple) else None
    )


Content = Annotated[
    Annotated[Text, Tag("~str")] | Annotated[list[ContentPart], Tag("~parts")],
    Discriminator(
        _content_kind,
        custom_error_type="content",
        custom_error_message="must be text or a list of content parts",
    ),
]


class AssistantAudio(_Body):
    id: str


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content | None = None
    audio: AssistantAudio | None = None
    tool_calls: list[ToolCallItem] | None = None
    tool_call_id: str | None = None


class StreamOptions(_Body):
    include_usage: bool | None = None


class AudioOutput(_Body):
    format: str | None = None
    voice: Any = None


class JsonSchemaFormat(_Body):
    name: str = Field(min_length=1, max_length=64)
    schema_: Schema | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(_Body):
    """OpenAI's ``response_format``: ``text``, ``json_object`` or ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatBody(_Body, LogprobFields):
    """``POST /v1/chat/completions`` (``logprobs`` and ``top_logprobs``: ``chat_logprobs``)."""

    messages: list[Message] = Field(min_length=1)
    model: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioOutput | None = None
    n: int | None = Field(None, ge=1, le=128)
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    min_tokens: int | None = Field(None, ge=0, le=INT32_MAX)
    temperature: float | None = Field(None, ge=0.0, le=TEMPERATURE_MAX, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX)
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    repetition_penalty: float | None = Field(None, gt=0.0, allow_inf_nan=False)
    presence_penalty: float | None = Field(
        None, ge=-PENALTY_MAX, le=PENALTY_MAX, allow_inf_nan=False
    )
    frequency_penalty: float | None = Field(
        None, ge=-PENALTY_MAX, le=PENALTY_MAX, allow_inf_nan=False
    )
    stop: StopString | list[StopString] | None = Field(None, max_length=STOPS_MAX)
    response_format: ResponseFormat | None = None
    tools: list[ToolDef] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None


class SpeechBody(_Body):
    """``POST /v1/audio/speech``."""

    input: Text
    model: str | None = None
    voice: Any = None
    response_format: str | None = None
    speed: float | None = Field(None, allow_inf_nan=False)


FIXES = {
    "seed": f"a whole number from {INT64_MIN} to {INT64_MAX} (int64, as vLLM's server takes)",
    "temperature": f"a finite number from 0 to {TEMPERATURE_MAX:g}, e.g. 0.7",
    "top_p": "a number above 0 and at most 1, e.g. 0.9",
    "top_k": "a whole number: -1 (off) or at least 1, e.g. 40",
    "max_tokens": "a whole number of at least 1, e.g. 64",
    "max_completion_tokens": "a whole number of at least 1, e.g. 64",
    "min_tokens": "a whole number of at least 0, e.g. 16",
    "repetition_penalty": "a finite number above 0; 1.0 is none, e.g. 1.1",
    "presence_penalty": f"a number from -{PENALTY_MAX:g} to {PENALTY_MAX:g}, e.g. 0.5",
    "frequency_penalty": f"a number from -{PENALTY_MAX:g} to {PENALTY_MAX:g}, e.g. 0.5",
    "stop": f"a string or a list of up to {STOPS_MAX}, each 1 to {STOP_MAX_CHARS} characters",
    "n": "leave n unset or 1",
    "stream": "true or false",
    "stream_options": "e.g. {'include_usage': true}",
    "include_usage": "true or false",
    "modalities": "e.g. ['text'] or ['text', 'audio']",
    "audio": "e.g. {'voice': 'alloy', 'format': 'pcm16'}",
    "messages": "e.g. [{'role': 'user', 'content': 'Hi'}]",
    "role": "system, developer, user, assistant or tool",
    "content": "send the message's text as a string, or text and input_audio parts",
    "text": "send the text as a string of valid Unicode",
    "input_audio": "e.g. {'type': 'input_audio', 'input_audio': {'data': base64 WAV, 'format': 'wav'}}",
    "data": "base64-encode the file's bytes (a WAV for input_audio, a .npy for input_tensor)",
    "input_tensor": "e.g. {'type': 'input_tensor', 'input_tensor': {'name': 'embedding', 'data': base64 .npy}}",
    "name": "the entry graph's input name, as its manifest names it",
    "input": "send the text to speak as a string of valid Unicode",
    "speed": "leave speed unset or 1.0",
    **LOGPROB_FIXES,
}


# -- parsing and validating -------------------------------------------------------------
def parse_json(raw: bytes) -> Any:
    """The JSON document of a request body; ``BadRequest`` naming ``body`` when it is none."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise _bad(
            "body",
            "nests arrays or objects deeper than the JSON reader goes",
            "send OpenAI's request shape: it nests a few levels",
        ) from None
    except UnicodeDecodeError:
        raise _bad("body", "is not UTF-8 text", "send the JSON body encoded as UTF-8") from None
    except ValueError as exc:  # JSONDecodeError, and numbers too long for int()
        raise _bad("body", f"is not JSON ({str(exc)[:80]})", "send a JSON object") from None


def validated(model: type[_Body], body: Any, example: str) -> Any:
    """``body`` as ``model``; ``BadRequest`` naming the first field that is wrong."""
    if not isinstance(body, dict):
        raise _bad("body", f"is a JSON {_json_type(body)}, not an object", f"send {example}")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise BadRequest([_problem(exc.errors(include_url=False)[0])]) from None


def _problem(err: Any) -> Problem:
    loc = [p for p in err.get("loc", ()) if not (isinstance(p, str) and p.startswith("~"))]
    where = where_of(loc) or "body"
    name = next((p for p in reversed(loc) if isinstance(p, str)), "body")
    msg = str(err.get("msg", "is not valid")).removeprefix("Value error, ")
    if err.get("type") == "missing":
        what = "is required"
    elif err.get("type") in ("model_type", "model_attributes_type", "dict_type"):
        what = f"{_shown(err.get('input'))}: must be a JSON object"
    elif err.get("type") == "list_type":
        what = f"{_shown(err.get('input'))}: must be a JSON array"
    else:
        what = f"{_shown(err.get('input'))}: {msg[:1].lower()}{msg[1:]}"
    return Problem(where, what, FIXES.get(name, ""))


def where_of(loc: list[Any]) -> str:
    """A pydantic location as the field a client wrote: ``messages[0].content[1].text``."""
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _shown(value: Any) -> str:
    text = (
        json.dumps(value, ensure_ascii=True, default=repr)
        if not isinstance(value, BaseModel)
        else repr(value)
    )
    return text if len(text) <= 60 else text[:57] + "..."


def _json_type(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


def _bad(where: str, what: str, fix: str = "") -> BadRequest:
    return BadRequest([Problem(where, what, fix)])


def _over(limits: ServerLimits, name: str, shown: str) -> str:
    cap = getattr(limits, name)
    unit = {
        "max_body_bytes": " bytes",
        "max_audio_bytes": " bytes",
        "max_audio_seconds": " s",
        "max_content_chars": " characters",
        "max_speech_chars": " characters",
        "max_messages": " messages",
        "max_tensor_bytes": " bytes",
    }[name]
    value = f"{cap:g}" if isinstance(cap, float) else str(cap)
    return f"{shown}: over the cap of {value}{unit} per request ({FLAGS[name]})"


# -- chat ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChatCall:
    """A chat body, checked: the pipeline's request and how to answer it."""

    request: PipelineRequest
    """The request record: a chat request, a recording or arrays (``stages.requests``)."""
    audio_format: str | None
    stream: bool
    include_usage: bool
    tensor_at: dict[str, str] = field(default_factory=dict)
    tools: bool = False
    """Whether the reply may be a tool call (tools offered, ``tool_choice`` not ``none``)."""
    """For a request of arrays: each input name ("" for a bare array) → its content part's place
    (``messages[0].content[1]``), so the entry stage's check names the field that was sent."""

    @property
    def prompt(self) -> Item:
        """The request as its entry stage receives it (``Request.item``)."""
        return self.request.item()


def read_chat(
    raw: bytes,
    *,
    audio_entry: bool,
    has_audio: bool,
    limits: ServerLimits,
    tensor_entry: bool = False,
    family: Family = "chatml",
) -> ChatCall:
    """A chat request's body bytes, parsed, validated and checked (run it off the event loop:
    it parses JSON and may decode a recording or arrays)."""
    chat = _chat_body(parse_json(raw), limits)
    prompt, tensor_at = _chat_prompt(chat, audio_entry, limits, tensor_entry, family)
    fmt = audio_format(chat, has_audio=has_audio)
    usage = bool(chat.stream_options and chat.stream_options.include_usage)
    tools = tool_call_of(chat.tools, chat.tool_choice) is not None
    return ChatCall(prompt, fmt, bool(chat.stream), usage, tensor_at, tools)


CHAT_EXAMPLE = "{'model': ..., 'messages': [{'role': 'user', 'content': 'Hi'}]}"


def chat_request(
    body: Any,
    *,
    audio_entry: bool = False,
    limits: ServerLimits | None = None,
    tensor_entry: bool = False,
) -> Item:
    """The pipeline request of an OpenAI chat body, as its entry stage receives it (the record's
    ``item()``: ``read_chat`` gives the record); ``BadRequest`` for what it cannot take.

    With an ``input_audio`` content part (and ``audio_entry``: the pipeline has an entry
    stage that takes audio) the request is the recording, ``{"audio", "sample_rate"}``; with
    ``input_tensor`` parts (and ``tensor_entry``) it is their arrays: one bare array, or a
    mapping of input names to arrays; else ``{"messages": [...], "sampling": {...}}``."""
    limits = limits or ServerLimits()
    chat = _chat_body(body, limits)
    return _chat_prompt(chat, audio_entry, limits, tensor_entry, "chatml")[0].item()


def _chat_body(body: Any, limits: ServerLimits) -> ChatBody:
    if (
        isinstance(body, dict)
        and isinstance(body.get("messages"), list)
        and len(body["messages"]) > limits.max_messages
    ):
        raise _bad(
            "messages",
            _over(limits, "max_messages", f"{len(body['messages'])} messages"),
            f"send fewer (drop the oldest turns), or raise {FLAGS['max_messages']}",
        )
    refused = first_refused(body) if isinstance(body, dict) else None
    if refused is not None:  # a field that would change the reply, which is not served
        where, value, fix = refused
        raise _bad(where, f"{_shown(value)}: is not served, and the reply would differ", fix)
    chat: ChatBody = validated(ChatBody, body, CHAT_EXAMPLE)
    _check_text(chat, limits)
    return chat


def _chat_prompt(
    chat: ChatBody, audio_entry: bool, limits: ServerLimits, tensor_entry: bool, fam: Family
) -> tuple[PipelineRequest, dict[str, str]]:
    if chat.n not in (None, 1):
        raise _bad("n", f"{chat.n}: one choice per request is served", FIXES["n"])
    tensors = _input_tensors(chat.messages, tensor_entry, limits)
    heard = _input_audio(chat.messages, audio_entry, limits)
    if tensors is not None:
        if heard is not None:
            raise _bad(
                heard[0],
                "a request carries arrays or a recording, not both",
                "send the input_tensor parts alone, or the recording alone",
            )
        _alone(chat, next(iter(tensors[1].values())), "arrays")
        return TensorRequest(tensors[0]), tensors[1]
    if heard is not None:
        where, recording = heard
        _alone(chat, where, "recording")
        return AudioRequest(recording["audio"], recording["sample_rate"]), {}
    out: list[ChatMessage] = []
    for i, m in enumerate(chat.messages):
        content = m.content
        if m.role == "assistant" and content is None and m.audio is not None:
            content = ""  # an earlier audio reply sent back by id: its words are not in the message
        if isinstance(content, list):
            content = "".join(p.text for p in content if isinstance(p, TextPart))
        carried = as_text(i, m.role, content, m.tool_calls, fam)  # a tool round trip's turn
        if carried is not None:
            out.append(ChatMessage(role=carried[0], content=carried[1]))
            continue
        if content is None:
            raise _bad(f"messages[{i}].content", "is missing", FIXES["content"])
        out.append(ChatMessage(role="system" if m.role == "developer" else m.role, content=content))
    if not any(m["role"] == "user" and m["content"].strip() for m in out):
        raise _bad(
            "messages", "has no user message with text", "add {'role': 'user', 'content': '...'}"
        )
    return ChatRequest(tuple(out), sampling=_sampling(chat) or None), {}


def _sampling(chat: ChatBody) -> Sampling:
    # two fields name max_tokens: one left out (None) is skipped, never written over the other
    values = {k: v for n, k in SAMPLING_FIELDS.items() if (v := getattr(chat, n)) is not None}
    if isinstance(values.get("stop"), str):
        values["stop"] = [values["stop"]]
    for key, value in (
        ("json_schema", json_schema(chat.response_format)),
        ("tool_call", tool_call_of(chat.tools, chat.tool_choice)),
        ("logprobs", logprobs_of(chat)),
    ):
        if value is not None:
            values[key] = value
    return cast(Sampling, values)


def json_schema(fmt: ResponseFormat | None) -> Schema | None:
    """The schema a ``response_format`` asks the reply to validate against (``json_object``:
    any JSON object), or None for text; ``BadRequest`` for ``json_schema`` without one."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "object"}
    if fmt.json_schema is None:
        raise _bad(
            "response_format.json_schema",
            "is required with type json_schema",
            "e.g. {'name': 'answer', 'schema': {'type': 'object', ...}}",
        )
    return fmt.json_schema.schema_ if fmt.json_schema.schema_ is not None else {}


def _texts(chat: ChatBody) -> list[tuple[str, str]]:
    out = []
    for i, m in enumerate(chat.messages):
        if isinstance(m.content, str):
            out.append((f"messages[{i}].content", m.content))
        elif isinstance(m.content, list):
            out += [
                (f"messages[{i}].content[{j}].text", p.text)
                for j, p in enumerate(m.content)
                if isinstance(p, TextPart)
            ]
    return out


def _check_text(chat: ChatBody, limits: ServerLimits) -> None:
    total = 0
    for where, text in _texts(chat):
        total += len(text)
        if total > limits.max_content_chars:
            raise _bad(
                where,
                _over(
                    limits,
                    "max_content_chars",
                    f"the messages' text reaches {total} characters here",
                ),
                f"send less text (drop the oldest turns), or raise {FLAGS['max_content_chars']}",
            )


def _input_audio(
    messages: list[Message], audio_entry: bool, limits: ServerLimits
) -> tuple[str, AudioItem] | None:
    """(where, the decoded recording) of the one ``input_audio`` part, or None when there is none."""
    found = [
        (i, j, p)
        for i, m in enumerate(messages)
        if isinstance(m.content, list)
        for j, p in enumerate(m.content)
        if isinstance(p, AudioPart)
    ]
    if not found:
        return None
    i, j, part = found[0]
    where = f"messages[{i}].content[{j}]"
    if not audio_entry:
        raise _bad(
            where,
            "this pipeline has no entry stage that takes audio",
            "send the message as text, or serve a pipeline whose first stage is a vad or asr stage "
            "(configs/examples/voice-chat.yaml)",
        )
    if len(found) > 1:
        raise _bad(
            f"messages[{found[1][0]}].content[{found[1][1]}]",
            "a request carries one recording",
            "send one input_audio part per request",
        )
    if messages[i].role != "user":
        raise _bad(
            f"messages[{i}].role",
            f"{messages[i].role!r}: audio is heard from the user only",
            "put the input_audio part in a user message",
        )
    fmt = part.input_audio.format
    if fmt not in AUDIO_INPUT_FORMATS:
        raise _bad(
            f"{where}.input_audio.format",
            f"{fmt!r} is not read",
            "send a 16-bit PCM WAV file, format 'wav'",
        )
    data = part.input_audio.data
    if (
        len(data) > 4 * math.ceil(limits.max_audio_bytes / 3) + 4
    ):  # before decoding: the cap in base64 characters
        raise _bad(
            f"{where}.input_audio.data",
            _over(
                limits,
                "max_audio_bytes",
                f"{len(data) * 3 // 4} bytes of audio ({len(data)} base64 characters)",
            ),
            f"send a shorter recording (or 16 kHz mono), or raise {FLAGS['max_audio_bytes']}",
        )
    try:
        wav = base64.b64decode(data, validate=True)
    except (ValueError, binascii.Error):
        raise _bad(
            f"{where}.input_audio.data", "is not base64", "base64-encode the WAV file's bytes"
        ) from None
    return where, audio_request(
        wav,
        where=f"{where}.input_audio.data",
        max_seconds=limits.max_audio_seconds,
        seconds_flag=FLAGS["max_audio_seconds"],
    )


def _input_tensors(
    messages: list[Message], tensor_entry: bool, limits: ServerLimits
) -> tuple[Array | dict[str, Array], dict[str, str]] | None:
    """(the request's arrays: one bare array or a mapping by input name, each name → its part's
    place) of the ``input_tensor`` parts, or None when there is none. Each ``.npy`` is read
    without unpickling (``api.tensor_request``), under ``max_tensor_bytes`` for them all."""
    found = [
        (f"messages[{i}].content[{j}]", m, p)
        for i, m in enumerate(messages)
        if isinstance(m.content, list)
        for j, p in enumerate(m.content)
        if isinstance(p, TensorPart)
    ]
    if not found:
        return None
    where = found[0][0]
    if not tensor_entry:
        raise _bad(
            where,
            "this pipeline has no entry stage that consumes a tensor",
            "send the message as text, or serve a pipeline whose entry stage is an exported graph taking "
            "arrays (docs/pipelines.md#request-payloads)",
        )
    total = 0
    arrays: dict[str, Array] = {}
    at: dict[str, str] = {}
    for where, message, part in found:
        if message.role != "user":
            raise _bad(
                f"{where.partition('.')[0]}.role",
                f"{message.role!r}: arrays come from the user only",
                "put the input_tensor parts in a user message",
            )
        name = part.input_tensor.name or ""
        if name in at:
            raise _bad(
                f"{where}.input_tensor.name",
                f"{name or '(none)'!r}: input given twice (first in {at[name]})",
                "name each part by the graph input it feeds, once"
                if name
                else "name each part (input_tensor.name) when a request carries several",
            )
        if "" in at or (not name and arrays):
            raise _bad(
                f"{where}.input_tensor.name",
                "is missing, and the request carries several arrays",
                "name each part by the graph input it feeds",
            )
        data = part.input_tensor.data
        total += len(data) * 3 // 4
        if total > limits.max_tensor_bytes + 3:  # before decoding: the cap in base64 characters
            raise _bad(
                f"{where}.input_tensor.data",
                _over(limits, "max_tensor_bytes", f"the arrays reach {total} bytes here"),
                f"send smaller arrays, or raise {FLAGS['max_tensor_bytes']}",
            )
        try:
            raw = base64.b64decode(data, validate=True)
        except (ValueError, binascii.Error):
            raise _bad(
                f"{where}.input_tensor.data", "is not base64", "base64-encode the .npy file's bytes"
            ) from None
        arrays[name] = tensor_request(
            raw,
            where=f"{where}.input_tensor.data",
            max_bytes=limits.max_tensor_bytes,
            bytes_flag=FLAGS["max_tensor_bytes"],
        )
        at[name] = where
    return arrays.get("", arrays), at


def _alone(chat: ChatBody, where: str, what: str) -> None:
    """``BadRequest`` unless the arrays or the recording (``what``, first in ``where``) may be
    the whole request: nothing else in the body would be silently dropped (no text beside them,
    no sampling, no response format)."""
    audio = what == "recording"
    for i, m in enumerate(chat.messages):
        parts: list[Any] = (
            m.content
            if isinstance(m.content, list)
            else [TextPart(type="text", text=m.content or "")]
        )
        for j, p in enumerate(parts):
            if isinstance(p, TextPart) and p.text.strip():
                at = f"messages[{i}].content" + (f"[{j}]" if isinstance(m.content, list) else "")
                reach = (
                    "only the audio reaches the pipeline's audio entry stage"
                    if audio
                    else f"only the {what} reach the pipeline's entry stage"
                )
                raise _bad(
                    at,
                    f"text next to the {what} in {where}: {reach}, so this text would be ignored",
                    f"send the {what} alone (the config's system prompt applies downstream), or text alone",
                )
    for name in (*SAMPLING_FIELDS, "response_format", "tools"):
        if getattr(chat, name) is not None:
            raise _bad(
                name,
                f"sampling goes to the stage that takes the request, and with "
                f"{'audio' if audio else what} that stage takes none",
                f"leave it out with {'input_audio' if audio else 'the ' + what} (the config's "
                "sampling applies)",
            )


def audio_format(body: ChatBody | Any, *, has_audio: bool) -> str | None:
    """The audio format a chat body asks for (``modalities`` with ``audio``), or None for text only."""
    chat = body if isinstance(body, ChatBody) else validated(ChatBody, body, CHAT_EXAMPLE)
    if "audio" not in (chat.modalities or ["text"]):
        return None
    if not has_audio:
        raise _bad("modalities", "this pipeline has no audio output stage", "ask for ['text'] only")
    fmt = chat.audio.format if chat.audio is not None else None
    if fmt not in CHAT_AUDIO_FORMATS:
        raise _bad(
            "audio.format", f"{fmt!r} is not served", f"use one of {', '.join(CHAT_AUDIO_FORMATS)}"
        )
    if chat.stream and fmt != "pcm16":
        raise _bad(
            "audio.format",
            f"{fmt!r} cannot be streamed",
            "use 'pcm16' with stream: true (as OpenAI does)",
        )
    return str(fmt)


# -- speech -------------------------------------------------------------------------------
def read_speech(raw: bytes, *, limits: ServerLimits) -> tuple[str, str]:
    """A speech request's body bytes, parsed, validated and checked (off the event loop)."""
    return speech_request(parse_json(raw), limits=limits)


def speech_request(body: Any, *, limits: ServerLimits | None = None) -> tuple[str, str]:
    """(input text, response format) of an OpenAI speech body; ``BadRequest`` for what it cannot take."""
    limits = limits or ServerLimits()
    speech: SpeechBody = validated(SpeechBody, body, "{'model': ..., 'input': '...', 'voice': ...}")
    if not speech.input.strip():
        raise _bad("input", "must be text that is not blank", "send the text to speak")
    if len(speech.input) > limits.max_speech_chars:
        raise _bad(
            "input",
            _over(limits, "max_speech_chars", f"{len(speech.input)} characters"),
            f"send the text in parts, or raise {FLAGS['max_speech_chars']}",
        )
    fmt = speech.response_format or "wav"
    if fmt not in SPEECH_FORMATS:
        raise _bad(
            "response_format", f"{fmt!r} is not served", f"use one of {', '.join(SPEECH_FORMATS)}"
        )
    if speech.speed not in (None, 1.0):
        raise _bad("speed", f"{speech.speed!r}: the voice speaks at its own speed", FIXES["speed"])
    return speech.input, fmt


def body_too_large(limits: ServerLimits, size: int | None) -> str:
    """The 413's message: the cap, and the body's size where it is known."""
    shown = (
        f"the request body is {size} bytes" if size is not None else "the request body is larger"
    )
    return (
        _over(limits, "max_body_bytes", shown)
        + f"; send less (a shorter recording), or raise {FLAGS['max_body_bytes']} "
        f"(now {limits.max_body_bytes / MiB:g})"
    )
