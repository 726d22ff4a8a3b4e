"""Payload types: what flows along an edge of the stage graph, as data a config check reads.

A stage kind declares the types it consumes and produces as short strings
(``StageKind.consumes`` / ``produces``; an exported graph's manifest may
narrow them per artifact), parsed here into :class:`PayloadType`:

==========================================  ==============================================
spelling                                    what travels (one item)
==========================================  ==============================================
``text``                                    a ``str`` delta or chunk
``token_ids``                               a sequence of ``int`` token ids
``audio`` / ``audio@16000``                 ``{"audio": float32 array, "sample_rate": int}``
                                            (:class:`AudioItem`)
``tensor`` / ``tensor:hidden_states``       a numpy array (or a mapping of named arrays)
``tensor<float32>[seq,896]``                … with its dtype and shape (``*`` or a name:
                                            any size on that axis)
``event`` / ``event:segment``               a mapping of plain data (str, int, float, lists)
==========================================  ==============================================

A part left out means "any": ``audio`` takes every sample rate, ``tensor``
every dtype and shape. The optional ``:role`` names what a tensor or event
is (hidden states, codec codes); two roles must match when both are given.

Output ports: each produced type is a port named by its role, else its kind
(:func:`port_name`); a consumer's input may name one, ``stage.port``
(:func:`split_input`), and a stage of several ports yields each item tagged
with its port (:func:`on_port`, a plain two-key dict; :func:`untag`).

Guarantees: :func:`parse_payload` accepts exactly the grammar above and
round-trips (``str(parse_payload(s))`` is the canonical spelling);
:func:`mismatch` is symmetric in what it refuses for kinds, roles, sample
rates, dtypes and fixed sizes, and returns the first difference in words.
Every payload is plain data (str, int, numpy arrays, mappings of them): a
consumer never receives a pickled application object.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypedDict, TypeGuard, cast

PayloadKind = Literal["text", "token_ids", "audio", "tensor", "event"]
PAYLOAD_KINDS: tuple[PayloadKind, ...] = ("text", "token_ids", "audio", "tensor", "event")
"""The vocabulary, in the order docs and errors list it."""

REQUEST_PAYLOADS: tuple[str, ...] = ("text", "audio", "tensor", "token_ids")
"""What a request may carry into an entry stage (a stage whose inputs name ``request``):
every payload a stage consumes but ``event`` (what a stage says about a stream, as a VAD's
segments, which no caller makes). Which one a request carries is its type
(``stages.requests``)."""


class DType(Protocol):
    """An array's element type as a payload's check reads it (numpy's ``dtype``)."""

    @property
    def kind(self) -> str:
        """numpy's one-letter class: ``b`` bool, ``i``/``u`` integers, ``f`` floats, ``c``, ..."""

    @property
    def name(self) -> str: ...


class Array(Protocol):
    """An array as a payload carries it: a numpy ``ndarray``, named by its shape here so that
    planning never imports numpy (every value a check reads is one of these)."""

    @property
    def dtype(self) -> DType: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def size(self) -> int: ...

    def __len__(self) -> int: ...


class AudioItem(TypedDict):
    """One audio item: float32 mono samples in [-1, 1) and their rate (Hz)."""

    audio: Array | Sequence[float]
    sample_rate: int


Item = str | Sequence[int] | Array | Mapping[str, object]
"""One item on an edge or into an entry stage: text, token ids, an array, or a mapping of
plain data (an :class:`AudioItem`, a chat request's ``stages.requests.ChatItem``, arrays by
input name, an event, a port-tagged item, a fan-in's joined item). It pickles: it is what
crosses between actors."""


def is_array(value: object) -> TypeGuard[Array]:
    """Whether ``value`` is an array (duck-typed: numpy is not imported here)."""
    return hasattr(value, "dtype") and hasattr(value, "shape") and hasattr(value, "tolist")


_SPEC = re.compile(
    r"^(?P<kind>[a-z_]+)"
    r"(?::(?P<role>[A-Za-z][A-Za-z0-9_]*))?"
    r"(?:<(?P<dtype>[a-z][a-z0-9]*)>)?"
    r"(?:@(?P<rate>[1-9][0-9]*))?"
    r"(?:\[(?P<shape>[^\]]*)\])?$"
)
_DIM = re.compile(r"^(\*|[1-9][0-9]*|[A-Za-z_][A-Za-z0-9_]*)$")


@dataclass(frozen=True)
class PayloadType:
    """One payload type; ``None`` fields mean "any"."""

    kind: PayloadKind
    role: str | None = None
    """What a tensor or event is (``hidden_states``, ``codec_codes``, ``segment``)."""
    dtype: str | None = None
    """A tensor's element type (numpy spelling: float32, int64, ...)."""
    sample_rate: int | None = None
    """Audio samples per second."""
    shape: tuple[str, ...] | None = None
    """A tensor's axes: a fixed size (digits) or any size (``*`` or a symbolic name)."""

    def __str__(self) -> str:
        out: str = self.kind
        if self.role:
            out += f":{self.role}"
        if self.dtype:
            out += f"<{self.dtype}>"
        if self.sample_rate:
            out += f"@{self.sample_rate}"
        if self.shape is not None:
            out += f"[{','.join(self.shape)}]"
        return out


class PayloadSpecError(ValueError):
    """A payload spelling outside the grammar; the message says what is wrong."""


def parse_payload(spec: str) -> PayloadType:
    """``spec`` (see the module docstring) as a :class:`PayloadType`; ``PayloadSpecError`` otherwise."""
    m = _SPEC.match(spec.strip()) if isinstance(spec, str) else None
    if m is None:
        raise PayloadSpecError(
            f"{spec!r} is not a payload type (e.g. text, audio@16000, tensor<float32>[seq,896])"
        )
    kind = m["kind"]
    if kind not in PAYLOAD_KINDS:
        raise PayloadSpecError(
            f"{kind!r} is not a payload kind; the kinds are {', '.join(PAYLOAD_KINDS)}"
        )
    if m["rate"] and kind != "audio":
        raise PayloadSpecError(f"{spec!r}: only audio has a sample rate")
    if (m["dtype"] or m["shape"] is not None) and kind != "tensor":
        raise PayloadSpecError(f"{spec!r}: only a tensor has a dtype and a shape")
    if m["role"] and kind not in ("tensor", "event"):
        raise PayloadSpecError(f"{spec!r}: only a tensor or an event has a role")
    shape = None
    if m["shape"] is not None:
        shape = tuple(d.strip() for d in m["shape"].split(",")) if m["shape"].strip() else ()
        bad = [d for d in shape if not _DIM.match(d)]
        if bad:
            raise PayloadSpecError(f"{spec!r}: axis {bad[0]!r} is neither a size nor a name")
    return PayloadType(
        cast(PayloadKind, kind), m["role"], m["dtype"], int(m["rate"]) if m["rate"] else None, shape
    )


def parse_payloads(specs: tuple[str, ...] | list[str]) -> tuple[PayloadType, ...]:
    """Every spelling of ``specs`` parsed, in order (``PayloadSpecError`` at the first bad one)."""
    return tuple(parse_payload(s) for s in specs)


def mismatch(produced: PayloadType, consumed: PayloadType) -> str | None:
    """Why an item of type ``produced`` cannot feed a consumer of ``consumed``, or None when it can."""
    if produced.kind != consumed.kind:
        return f"{produced.kind} is not {consumed.kind}"
    if produced.role and consumed.role and produced.role != consumed.role:
        return f"{produced.kind} {produced.role!r} is not {consumed.role!r}"
    if (
        produced.sample_rate
        and consumed.sample_rate
        and produced.sample_rate != consumed.sample_rate
    ):
        return f"audio at {produced.sample_rate} Hz is not audio at {consumed.sample_rate} Hz"
    if produced.dtype and consumed.dtype and produced.dtype != consumed.dtype:
        return f"{produced.dtype} is not {consumed.dtype}"
    if produced.shape is not None and consumed.shape is not None:
        if len(produced.shape) != len(consumed.shape):
            return f"a rank-{len(produced.shape)} tensor is not rank {len(consumed.shape)}"
        for axis, (a, b) in enumerate(zip(produced.shape, consumed.shape, strict=True)):
            if a.isdigit() and b.isdigit() and a != b:
                return f"axis {axis} has size {a}, not {b}"
    return None


def edge_mismatch(
    produces: tuple[PayloadType, ...], consumes: tuple[PayloadType, ...]
) -> str | None:
    """None when some produced type feeds some consumed type; otherwise the closest miss in words
    (a pair of the same kind when there is one, so a sample-rate or shape difference is what is named)."""
    reasons = []
    for p in produces:
        for c in consumes:
            why = mismatch(p, c)
            if why is None:
                return None
            reasons.append((p.kind != c.kind, why))
    return min(reasons)[1] if reasons else "nothing is produced or nothing is consumed"


def spell(types: tuple[PayloadType, ...]) -> str:
    """Types as a config would spell them, for messages: ``text``, ``audio@16000 or text``."""
    return " or ".join(str(t) for t in types) or "nothing"


def port_name(t: PayloadType) -> str:
    """The name of the output port a produced type is on: its role when it has one
    (``tensor:hidden_states`` → ``hidden_states``), else its kind (``text``, ``audio@22050`` → ``audio``)."""
    return t.role or t.kind


@dataclass(frozen=True)
class Ports:
    """What one stage consumes and produces (its kind's declaration, narrowed per stage)."""

    consumes: tuple[PayloadType, ...]
    produces: tuple[PayloadType, ...]

    def port_names(self) -> tuple[str, ...]:
        """The stage's output ports (``port_name`` of each produced type, each once, in order)."""
        return tuple(dict.fromkeys(port_name(t) for t in self.produces))

    def port(self, name: str) -> tuple[PayloadType, ...]:
        """The produced types on output port ``name`` (empty when the stage has no such port)."""
        return tuple(t for t in self.produces if port_name(t) == name)


# ---- output ports at run time -----------------------------------------------------

PORT_KEY = "__port__"
"""The key of a port-tagged item (:func:`on_port`)."""


def split_input(spec: str) -> tuple[str, str | None]:
    """An entry of a stage's ``inputs`` as ``(source, port)``: ``thinker.text`` →
    ``("thinker", "text")``; ``thinker`` or ``request`` → ``(name, None)`` (every port).
    Stage names have no dot, so the first dot separates the port."""
    source, dot, port = spec.partition(".")
    return (source, port) if dot else (source, None)


def on_port(port: str, item: object) -> dict[str, object]:
    """``item`` tagged with the output port it is on, as a stage of several ports yields it:
    plain data (a two-key dict), so it travels between actors like any other item. The
    runtime strips the tag and hands ``item`` only to the consumers of that port."""
    return {PORT_KEY: port, "item": item}


def untag(item: object) -> tuple[str | None, object]:
    """``(port, item)`` for an item tagged by :func:`on_port`; ``(None, item)`` for any other."""
    if (
        isinstance(item, dict)
        and len(item) == 2
        and "item" in item
        and isinstance(item.get(PORT_KEY), str)
    ):
        return item[PORT_KEY], item["item"]
    return None, item


MIN_SAMPLE_RATE = 8000
MAX_SAMPLE_RATE = 192_000
"""The sample rates an audio item may have: telephone audio (8 kHz) to studio audio
(192 kHz). A rate outside is not audio anyone records, and a tiny one is an attack: an
8 Hz "recording" resampled to 16 kHz grows 2000-fold (megabytes in, gigabytes out)."""


def sample_rate_problem(rate: object) -> str | None:
    """What is wrong with an audio item's ``sample_rate``, or None when it is in range."""
    if not isinstance(rate, int) or isinstance(rate, bool):
        return f"{rate!r} is not a whole number of Hz"
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        return f"{rate} Hz: outside the {MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz that is read"
    return None
