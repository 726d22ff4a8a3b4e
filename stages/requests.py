"""Requests as they enter a pipeline: one typed record per payload a request carries.

A request's kind is its type: :class:`TextRequest`, :class:`ChatRequest` (messages, a
prompt, sampling), :class:`AudioRequest`, :class:`TensorRequest` (an array, or arrays by
input name) and :class:`TokenIdsRequest`. Each says which payload it carries (``payload``,
``stages.payloads.REQUEST_PAYLOADS``), how a result and a refusal name it (``label``,
``described``), and the item the entry stage receives (``item()``: plain data, as every
payload is, so it crosses to the stage's actor as any item does).

Where requests enter, they are made once: the server's protocol and its realtime session
build the records from what they parsed; the Python API takes what its users pass — a
``str``, ``{"messages": [...], "sampling": {...}}`` (or ``{"prompt": ..., "sampling": ...}``),
an audio dict ``{"audio", "sample_rate"}``, an array or a mapping of arrays, a list of token
ids — and :func:`as_request` turns it into a record there, the one place a request's shape
is read. A value of any other shape is an :class:`OtherRequest`: no payload names it, so
the stage that takes the request decides (``StageKind.validate_request``): the built-in kinds
refuse it in their own words, a plugin kind may take a shape of its own (the test kinds'
scripted prompt), and a stage that consumes neither text nor audio never gets one.

The sampling a request may carry (:class:`Sampling`) and its bounds (:data:`INT64_MIN` ..
:data:`TEMPERATURE_MAX`) are the request vocabulary's; a decode stage checks the values
against its own config's ranges.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, TypedDict, cast

from stages.payloads import Array, AudioItem, Item, is_array

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""``seed``'s range: vLLM's OpenAI server bounds it to ``torch.iinfo(torch.long)``; a larger
one passes ``SamplingParams`` and overflows inside the engine step ("Overflow when
unpacking long long"), which stops the engine for every later request."""
INT32_MAX = 2**31 - 1
"""The bound on token counts and ``top_k``: vLLM keeps them in C ints."""
TEMPERATURE_MAX = 2.0
"""OpenAI's documented range for ``temperature`` is 0 to 2 (vLLM's server takes it as is)."""
PENALTY_MAX = 2.0
"""OpenAI's range for ``presence_penalty`` and ``frequency_penalty``: -2 to 2."""
STOPS_MAX = 4
"""The most stop strings a request may give (OpenAI's "up to 4 sequences")."""
STOP_MAX_CHARS = 256
TOP_LOGPROBS_MAX = 20
"""The most alternatives a token's log-probabilities carry (OpenAI's ``top_logprobs`` cap)."""
"""The longest stop string: each is matched against the reply's tail after every token."""


class Sampling(TypedDict, total=False):
    """A request's own sampling, each key overriding the decode stage's config."""

    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    min_tokens: int
    seed: int | None
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    stop: list[str]
    json_schema: dict[str, object]
    """The reply must be JSON valid against this schema (OpenAI's ``response_format``;
    ``json_object`` is ``{"type": "object"}``), enforced by constrained decoding."""
    tool_call: dict[str, object]
    """The tools the reply may call and the choice (``stages.ar_decode.tool_grammar.ToolCall``:
    OpenAI's ``tools`` and ``tool_choice``), a call's arguments enforced by constrained decoding."""
    logprobs: int
    """Each reply token's log-probability, with this many most likely alternatives (OpenAI's
    ``logprobs: true`` and ``top_logprobs``, 0 to :data:`TOP_LOGPROBS_MAX`), in the decode
    stage's stats; left out: none."""


SAMPLING_KEYS: tuple[str, ...] = tuple(Sampling.__annotations__)
"""The keys a request's ``sampling`` may have, in the order refusals list them."""
OFF_VALUES: dict[str, tuple[object, ...]] = {
    "stop": ([], ()),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "json_schema": (),
    "tool_call": (),
    "logprobs": (),
}
"""The keys that shape the reply's text beyond sampling a token, or what comes with it
(``logprobs``): a stage that cannot apply one must refuse it; each with the values that ask
for nothing."""


def asked(sampling: Mapping[str, object], key: str) -> bool:
    """Whether ``sampling`` asks for ``key`` (one of :data:`OFF_VALUES`' keys): set, and not to
    a value that asks for nothing."""
    value = sampling.get(key)
    return value is not None and value not in OFF_VALUES.get(key, ())


_FLOAT_KEYS = frozenset(
    {"temperature", "top_p", "repetition_penalty", "presence_penalty", "frequency_penalty"}
)


class ChatMessage(TypedDict):
    """One message of a conversation: its role (system, user, assistant) and its text."""

    role: str
    content: str


class ChatItem(TypedDict, total=False):
    """A chat request as the decode stage's runner reads it (``ar_decode.prompt``), and as a
    realtime session passes the conversation so far as context."""

    messages: list[ChatMessage]
    prompt: str
    sampling: Sampling


PayloadName = Literal["text", "audio", "tensor", "token_ids"]


@dataclass(frozen=True)
class TextRequest:
    """Text, to the stage that takes the request (a decoder's prompt, a voice's words)."""

    text: str
    whole: bool = False
    """Entering at a stage (``Runtime.stream(entry=)``): the text reaches it as one item, not
    cut into sentences as a producer's stream would be (``/v1/embeddings``: one vector per
    input)."""
    payload: ClassVar[PayloadName] = "text"
    described: ClassVar[str] = "text"

    def item(self) -> str:
        return self.text

    def label(self) -> str:
        return self.text


@dataclass(frozen=True)
class ChatRequest:
    """A chat request: the conversation's ``messages`` and/or a ``prompt`` (a user turn after
    them), and ``sampling`` overrides. Its item is the dict the decode stage reads, with the
    keys that were given."""

    messages: tuple[ChatMessage, ...] | None = None
    prompt: str | None = None
    sampling: Sampling | None = None
    payload: ClassVar[PayloadName] = "text"
    described: ClassVar[str] = "a chat request"

    def item(self) -> ChatItem:
        out: ChatItem = {}
        if self.messages is not None:
            out["messages"] = [
                ChatMessage(role=m["role"], content=m["content"]) for m in self.messages
            ]
        if self.prompt is not None:
            out["prompt"] = self.prompt
        if self.sampling is not None:
            out["sampling"] = Sampling(**self.sampling)
        return out

    def label(self) -> str:
        return str(self.item())


@dataclass(frozen=True, eq=False)
class AudioRequest:
    """One recording: mono samples in [-1, 1) (a float32 array, or a list of floats) and
    their rate, to a stage that takes audio (a VAD, a speech recogniser). Compared by
    identity: an array's ``==`` answers element by element."""

    samples: Array | Sequence[float]
    sample_rate: int
    payload: ClassVar[PayloadName] = "audio"
    described: ClassVar[str] = "audio"

    def item(self) -> AudioItem:
        return {"audio": self.samples, "sample_rate": self.sample_rate}

    def label(self) -> str:
        n = int(getattr(self.samples, "size", 0) or len(self.samples))
        rate = self.sample_rate
        return f"(audio: {n / rate:.2f} s at {rate} Hz)" if rate > 0 else "(audio)"


@dataclass(frozen=True, eq=False)
class TensorRequest:
    """Arrays, to a stage that consumes a tensor (an exported graph): one bare array (a graph
    of one input) or a mapping of the graph's input names to arrays."""

    arrays: Array | Mapping[str, Array]
    payload: ClassVar[PayloadName] = "tensor"
    described: ClassVar[str] = "a tensor"

    def item(self) -> Array | Mapping[str, Array]:
        return self.arrays

    def named(self) -> list[tuple[str | None, Array]]:
        """Each array with its input name (None for a bare array)."""
        if isinstance(self.arrays, Mapping):
            return list(self.arrays.items())
        return [(None, self.arrays)]

    def label(self) -> str:
        shown = ", ".join(
            f"{k + ' ' if k else ''}{a.dtype}{list(a.shape)}" for k, a in self.named()
        )
        return f"(tensor: {shown})"


@dataclass(frozen=True)
class TokenIdsRequest:
    """Token ids, to a stage that consumes them."""

    ids: tuple[int, ...]
    payload: ClassVar[PayloadName] = "token_ids"
    described: ClassVar[str] = "token ids"

    def item(self) -> list[int]:
        return list(self.ids)

    def label(self) -> str:
        return str(list(self.ids))


@dataclass(frozen=True, eq=False)
class OtherRequest:
    """A value the Python API was given in a shape no payload names (an int, a dict of
    unknown keys, a chat request whose fields have the wrong types): kept as it came, for the
    stage that takes the request to judge — a built-in kind refuses it saying what is wrong,
    a plugin kind may take a shape of its own."""

    value: object
    payload: ClassVar[None] = None

    @property
    def described(self) -> str:
        return f"a {type(self.value).__name__}"

    def item(self) -> Item:
        """The value as it came: the entry stage's kind judged it (``validate_request``)."""
        return cast(Item, self.value)

    def label(self) -> str:
        return str(self.value)


Request = TextRequest | ChatRequest | AudioRequest | TensorRequest | TokenIdsRequest | OtherRequest
"""A request as the runtime takes it."""

RequestLike = Request | str | Mapping[str, object] | Array | Sequence[int]
"""What the Python API takes as a request (``Pipeline.run``, ``stream``, ``validate``)."""

_RECORDS = (TextRequest, ChatRequest, AudioRequest, TensorRequest, TokenIdsRequest, OtherRequest)


def as_request(value: RequestLike | object) -> Request:
    """The request record of what a caller passed (the module docstring's shapes); a record
    is returned as it is. The one place a request's shape decides its kind."""
    if isinstance(value, _RECORDS):
        return value
    if isinstance(value, str):
        return TextRequest(value)
    if is_array(value):
        return TensorRequest(value)
    if isinstance(value, Mapping):
        return _from_mapping(value)
    if (
        isinstance(value, list | tuple)
        and value
        and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
    ):
        return TokenIdsRequest(tuple(value))
    return OtherRequest(value)


def _from_mapping(value: Mapping[str, object]) -> Request:
    if {"messages", "prompt", "sampling"} & set(value):
        return _chat(value) or OtherRequest(value)
    if {"audio", "sample_rate"} <= set(value) and isinstance(value["sample_rate"], int):
        samples = value["audio"]
        if is_array(samples) or isinstance(samples, list | tuple):
            return AudioRequest(samples, value["sample_rate"])
        return OtherRequest(value)
    if value and all(isinstance(k, str) and is_array(v) for k, v in value.items()):
        return TensorRequest({str(k): v for k, v in value.items() if is_array(v)})
    return OtherRequest(value)


def _chat(value: Mapping[str, object]) -> ChatRequest | None:
    """The chat request of a mapping with ``messages``, ``prompt`` or ``sampling``, or None
    when a field is not what a chat request holds (the decode stage then says which)."""
    if set(value) - {"messages", "prompt", "sampling"}:
        return None
    messages = value.get("messages")
    prompt = value.get("prompt")
    sampling = value.get("sampling")
    if messages is not None and not (
        isinstance(messages, list | tuple)
        and all(
            isinstance(m, Mapping)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in messages
        )
    ):
        return None
    if prompt is not None and not isinstance(prompt, str):
        return None
    if sampling is not None and _sampling(sampling) is None:
        return None
    return ChatRequest(
        None if messages is None else tuple(_message(m) for m in messages),
        prompt,
        None if sampling is None else _sampling(sampling),
    )


def _message(m: object) -> ChatMessage:
    assert isinstance(m, Mapping)
    return ChatMessage(role=str(m["role"]), content=str(m["content"]))


def _sampling(value: object) -> Sampling | None:
    """``value`` as sampling overrides, or None when it is not a mapping of known keys to
    numbers (a whole number where the key counts; a seed may be None) or, for ``stop``, to a
    list of strings."""
    if not isinstance(value, Mapping):
        return None
    for key, v in value.items():
        if key not in SAMPLING_KEYS or isinstance(v, bool):
            return None
        if key == "stop":
            if not (isinstance(v, list | tuple) and all(isinstance(x, str) for x in v)):
                return None
        elif key in ("json_schema", "tool_call"):
            if not isinstance(v, Mapping):
                return None
        elif key in _FLOAT_KEYS:
            if not isinstance(v, int | float):
                return None
        elif not (isinstance(v, int) or (key == "seed" and v is None)):
            return None
    return cast(Sampling, {str(k): v for k, v in value.items()})
