"""A realtime session's conversation as OpenAI's Realtime items, and the client events that
read and edit it: ``conversation.item.create``, ``.delete``, ``.truncate`` and ``.retrieve``;
and the session's tools (``session.tools`` / ``tool_choice``, and a ``response.create``'s own).

The guarantees:

* the conversation is what the next response sees: :meth:`Conversation.messages` is every
  item in order as the decode stage reads it — a user's or a system's text, an assistant's
  words (as far as their audio was heard, for a spoken reply), a ``function_call`` as the model
  writes one and a ``function_call_output`` as the tool's result is given back
  (``stages.ar_decode.tool_grammar``'s convention, as ``chat_tools`` sends a chat's round trip);
* an item is created, deleted or truncated whole or not at all: a bad event (a field of the wrong
  type, text over ``serve --max-content-chars``, an id the conversation has already, a
  ``previous_item_id`` or ``item_id`` it has not — code ``item_not_found`` —, a
  ``function_call_output`` whose ``call_id`` no call has, an ``audio_end_ms`` past the audio
  sent) is an ``error`` event naming the field with the client's ``event_id``, and the
  conversation is as it was;
* a truncated assistant item keeps the sentences whose audio ended by ``audio_end_ms`` (what
  the user heard), and the next response sees only those;
* tools are offered only where the decode stage constrains a call (:func:`session_tool_call`:
  the request the response would send, checked by the stage before it is kept); a backend that
  cannot is refused by name in the ``session.update`` (or ``response.create``) that asks.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

from pydantic import Field

from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import BadRequest, Problem
from orchestrator.server.chat_tools import (
    FunctionDef,
    NamedChoice,
    NamedFunction,
    ToolDef,
    tool_call_of,
)
from orchestrator.server.protocol import Text, _Body
from orchestrator.server.realtime_events import (
    FunctionChoice,
    RealtimeTool,
    RealtimeToolChoice,
    ToolFields,
    new_id,
    validated,
)
from stages.ar_decode.tool_grammar import call_text, result_text
from stages.requests import ChatMessage, ChatRequest

ITEM_ID_CHARS = 64
"""An item id a client chooses: at most this long (OpenAI's ids are 20-odd characters)."""
ITEM_EXAMPLE = (
    "{'type': 'conversation.item.create', 'item': {'type': 'message', 'role': 'user', "
    "'content': [{'type': 'input_text', 'text': 'Hello'}]}}"
)


class ContentPart(_Body):
    type: Literal["input_text", "text", "output_text", "input_audio", "audio"]
    text: Text | None = None
    transcript: Text | None = None


class ItemFields(_Body):
    id: str | None = Field(None, min_length=1, max_length=ITEM_ID_CHARS)
    type: Literal["message", "function_call", "function_call_output"] = "message"
    role: Literal["user", "assistant", "system"] | None = None
    content: list[ContentPart] | None = Field(None, max_length=16)
    call_id: str | None = Field(None, min_length=1, max_length=ITEM_ID_CHARS)
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    arguments: Text | None = None
    output: Text | None = None


class ItemCreate(_Body):
    item: ItemFields
    previous_item_id: str | None = None


class ItemRef(_Body):
    item_id: str


class ItemTruncate(_Body):
    item_id: str
    content_index: int = Field(ge=0, le=0)
    audio_end_ms: int = Field(ge=0)


class ResponseCreate(_Body):
    response: ToolFields | None = None


FIXES = {
    "item": ITEM_EXAMPLE,
    "id": f"an id of at most {ITEM_ID_CHARS} characters, or none (the server picks one)",
    "role": "'user', 'assistant' or 'system'",
    "content": "a list of parts, e.g. [{'type': 'input_text', 'text': 'Hello'}]",
    "text": "a string",
    "call_id": "the call_id of the function_call item this output answers",
    "name": "the function's name: letters, digits, _ and -, at most 64",
    "arguments": 'the call\'s arguments as JSON text, e.g. \'{"city": "Paris"}\'',
    "output": "the tool's result as text",
    "item_id": "the id of an item of this conversation (conversation.item.created named it)",
    "content_index": "0: an item has one content part",
    "audio_end_ms": "whole milliseconds, at most the audio the item's response sent",
    "tools": "[{'type': 'function', 'name': 'get_weather', 'parameters': {...}}]",
    "tool_choice": "'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
}


def _check(model: type[_Body], doc: dict[str, object], example: str) -> Any:
    """``doc`` as ``model``; ``BadRequest`` naming the field with this module's fix where the
    session's own has none."""
    try:
        return validated(model, doc, example)
    except BadRequest as exc:
        p = exc.problems[0]
        fix = p.fix or FIXES.get(p.where.rpartition(".")[2].split("[")[0], "")
        raise BadRequest([Problem(p.where, p.what, fix)]) from None


class NotFound(Exception):
    """An id the conversation does not have: an ``error`` event with code ``item_not_found``."""

    def __init__(self, where: str, item_id: str) -> None:
        super().__init__(
            f"{where}: {item_id[:80]!r} is no item of this conversation "
            "(conversation.item.created names each one)"
        )
        self.where = where


def _text_of(item: JsonObject) -> str:
    parts = item.get("content") or []
    return "".join(str(p.get("text") or p.get("transcript") or "") for p in parts)


class Conversation:
    """One session's items, in order, and what they say to the model (the module's guarantees)."""

    def __init__(self) -> None:
        self.items: list[JsonObject] = []
        self.spoken: dict[str, list[tuple[float, str]]] = {}
        """An assistant item whose audio was sent: each sentence with when its audio ended (ms)."""

    def index(self, item_id: str) -> int | None:
        return next((i for i, it in enumerate(self.items) if it["id"] == item_id), None)

    def get(self, item_id: str, where: str = "item_id") -> JsonObject:
        i = self.index(item_id)
        if i is None:
            raise NotFound(where, item_id)
        return self.items[i]

    def last_id(self) -> str | None:
        return str(self.items[-1]["id"]) if self.items else None

    def add(self, item: JsonObject, after: str | None = None) -> str | None:
        """``item`` appended (``after``: None), first (``root``) or after that item; the id of
        the item before it (None: it is first)."""
        if after is None:
            previous = self.last_id()
            self.items.append(item)
            return previous
        at = 0 if after == "root" else self.index(after)
        if at is None:
            raise NotFound("previous_item_id", after)
        at = at if after == "root" else at + 1
        self.items.insert(at, item)
        return None if at == 0 else str(self.items[at - 1]["id"])

    def add_response(self, r: Any) -> None:
        """What a finished response (``realtime_early.Response``) adds: the spoken user's turn,
        then the assistant's words (with each sentence's audio end) or its call."""
        for m in r.history:
            if m["role"] == "user":
                self.add(message(r.user_item_id, "user", "input_audio", m["content"]))
            else:
                kind = "audio" if r.audio_chunks else "text"
                self.add(message(r.item_id, "assistant", kind, m["content"]))
                if r.audio_chunks:
                    self.spoken[r.item_id] = list(zip(r.audio_ends, r.chunks, strict=False))
        if r.call is not None:
            self.add(dict(r.call))

    def messages(self) -> list[ChatMessage]:
        """Every item as the decode stage reads it (the module's guarantees)."""
        out: list[ChatMessage] = []
        for item in self.items:
            if item["type"] == "function_call":
                text = call_text(str(item["name"]), json.loads(str(item["arguments"])))
                out.append(ChatMessage(role="assistant", content=text))
            elif item["type"] == "function_call_output":
                out.append(ChatMessage(role="user", content=result_text(str(item["output"]))))
            elif _text_of(item).strip():
                out.append(ChatMessage(role=str(item["role"]), content=_text_of(item)))
        return out

    def truncate(self, item_id: str, audio_end_ms: int) -> None:
        """The assistant item's words cut to the sentences heard by ``audio_end_ms``."""
        item = self.get(item_id)
        spoken = self.spoken.get(item_id)
        if item.get("role") != "assistant" or spoken is None:
            raise BadRequest.single(
                "item_id",
                f"{item_id!r} is no assistant item with audio: only a spoken reply is truncated",
                "truncate the item of a response whose audio you played",
            )
        sent = round(spoken[-1][0]) if spoken else 0
        if audio_end_ms > sent:
            raise BadRequest.single(
                "audio_end_ms",
                f"{audio_end_ms} ms is past the {sent} ms of audio the item has",
                f"send at most {sent}: the audio the user heard",
            )
        heard = " ".join(t.strip() for end, t in spoken if end <= audio_end_ms and t.strip())
        item["content"] = [{"type": "audio", "transcript": heard}]
        self.spoken[item_id] = [(end, t) for end, t in spoken if end <= audio_end_ms]


def message(item_id: str, role: str, kind: str, text: str) -> JsonObject:
    """A message item of OpenAI's shape: one content part, ``text`` or ``transcript``."""
    key = "transcript" if kind in ("audio", "input_audio") else "text"
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "role": role,
        "status": "completed",
        "content": [{"type": kind, key: text}],
    }


# -- the client events ---------------------------------------------------------------------
def _new_item(fields: ItemFields, conv: Conversation, max_chars: int) -> JsonObject:
    """The item a ``conversation.item.create`` adds, checked (the module's guarantees)."""
    item_id = fields.id or new_id("item")
    if conv.index(item_id) is not None:
        raise BadRequest.single(
            "item.id", f"{item_id!r} is an item already", "leave id out, or pick a new one"
        )
    base: JsonObject = {"id": item_id, "object": "realtime.item", "status": "completed"}
    if fields.type == "function_call":
        if fields.name is None or fields.arguments is None:
            raise BadRequest.single(
                "item.name" if fields.name is None else "item.arguments",
                "is missing",
                "a function_call item names its function and its arguments (JSON text)",
            )
        try:
            json.loads(fields.arguments)
        except ValueError:
            raise BadRequest.single("item.arguments", "is not JSON", FIXES["arguments"]) from None
        call_id = fields.call_id or new_id("call")
        return {
            **base,
            "type": "function_call",
            "call_id": call_id,
            "name": fields.name,
            "arguments": fields.arguments,
        }
    if fields.type == "function_call_output":
        if fields.call_id is None or fields.output is None:
            where = "item.call_id" if fields.call_id is None else "item.output"
            raise BadRequest.single(where, "is missing", FIXES[where.rpartition(".")[2]])
        if not any(
            i["type"] == "function_call" and i.get("call_id") == fields.call_id for i in conv.items
        ):
            raise BadRequest.single(
                "item.call_id",
                f"{fields.call_id!r} is the call_id of no function_call item of this conversation",
                FIXES["call_id"],
            )
        _cap("item.output", len(fields.output), max_chars)
        return {
            **base,
            "type": "function_call_output",
            "call_id": fields.call_id,
            "output": fields.output,
        }
    return {**base, **_message(fields, max_chars)}


def _message(fields: ItemFields, max_chars: int) -> JsonObject:
    role = fields.role
    if role is None:
        raise BadRequest.single("item.role", "is missing", FIXES["role"])
    takes = {"user": ("input_text",), "system": ("input_text",)}.get(role, ("text", "output_text"))
    if not fields.content:
        raise BadRequest.single("item.content", "is missing", FIXES["content"])
    texts = []
    for j, part in enumerate(fields.content):
        if part.type not in takes:
            audio = part.type in ("input_audio", "audio")
            raise BadRequest.single(
                f"item.content[{j}].type",
                f"{part.type!r} is not taken in a {role} message"
                + (": audio enters through input_audio_buffer.append" if audio else ""),
                f"send {' or '.join(repr(t) for t in takes)} parts",
            )
        if part.text is None:
            raise BadRequest.single(f"item.content[{j}].text", "is missing", FIXES["text"])
        texts.append(part.text)
    text = "".join(texts)
    _cap("item.content", len(text), max_chars)
    kind = "input_text" if role != "assistant" else "text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def _cap(where: str, n: int, max_chars: int) -> None:
    if n > max_chars:
        raise BadRequest.single(
            where,
            f"{n} characters: over the cap of {max_chars} characters (serve --max-content-chars)",
            "send a shorter text, or raise --max-content-chars",
        )


async def on_item_create(s: Any, doc: dict[str, object]) -> None:
    event: ItemCreate = _check(ItemCreate, doc, ITEM_EXAMPLE)
    conv: Conversation = s.items
    item = _new_item(event.item, conv, s.rt.app.limits.max_content_chars)
    try:
        previous = conv.add(item, event.previous_item_id)
    except NotFound as exc:
        await _not_found(s, exc, doc)
        return
    await s.send("conversation.item.created", previous_item_id=previous, item=item)


async def on_item_retrieve(s: Any, doc: dict[str, object]) -> None:
    event: ItemRef = _check(ItemRef, doc, "{'type': 'conversation.item.retrieve', 'item_id': ...}")
    try:
        item = s.items.get(event.item_id)
    except NotFound as exc:
        await _not_found(s, exc, doc)
        return
    await s.send("conversation.item.retrieved", item=item)


async def on_item_delete(s: Any, doc: dict[str, object]) -> None:
    event: ItemRef = _check(ItemRef, doc, "{'type': 'conversation.item.delete', 'item_id': ...}")
    conv: Conversation = s.items
    i = conv.index(event.item_id)
    if i is None:
        await _not_found(s, NotFound("item_id", event.item_id), doc)
        return
    del conv.items[i]
    conv.spoken.pop(event.item_id, None)
    await s.send("conversation.item.deleted", item_id=event.item_id)


async def on_item_truncate(s: Any, doc: dict[str, object]) -> None:
    event: ItemTruncate = _check(
        ItemTruncate,
        doc,
        "{'type': 'conversation.item.truncate', 'item_id': ..., 'content_index': 0, "
        "'audio_end_ms': 1500}",
    )
    try:
        s.items.truncate(event.item_id, event.audio_end_ms)
    except NotFound as exc:
        await _not_found(s, exc, doc)
        return
    await s.send(
        "conversation.item.truncated",
        item_id=event.item_id,
        content_index=event.content_index,
        audio_end_ms=event.audio_end_ms,
    )


async def _not_found(s: Any, exc: NotFound, doc: dict[str, object]) -> None:
    event_id = doc.get("event_id")
    await s.error(
        str(exc),
        code="item_not_found",
        param=exc.where,
        event_id=event_id if isinstance(event_id, str) else None,
    )


# -- tools ---------------------------------------------------------------------------------
async def session_tool_call(
    s: Any, tools: list[RealtimeTool] | None, choice: RealtimeToolChoice | None, where: str
) -> JsonObject | None:
    """The decode stage's ``tool_call`` sampling of ``tools`` and ``choice`` (None: no tools,
    or ``none``), checked by the stage a response enters at as the request it would send
    (its kind's ``validate_request``: the engine constrains a call, the schemas are grammars);
    ``BadRequest`` naming ``where``'s field and, for a backend that cannot, the backend."""
    defs = [
        ToolDef(
            type="function",
            function=FunctionDef(name=t.name, description=t.description, parameters=t.parameters),
        )
        for t in tools or []
    ]
    named = (
        NamedChoice(type="function", function=NamedFunction(name=choice.name))
        if isinstance(choice, FunctionChoice)
        else choice
    )
    try:
        call = tool_call_of(defs, named)
    except BadRequest as exc:
        p = exc.problems[0]
        raise BadRequest.single(
            f"{where}.{p.where.replace('.function', '')}", p.what, p.fix
        ) from None
    if call is None:
        return None
    # a session's items are written in ChatML's tool syntax (``messages``), on every model
    call["family"] = "chatml"
    stage = s.rt.reply_entry
    if stage is None:
        raise BadRequest.single(
            f"{where}.tools",
            "this pipeline has no decode stage a response enters at to call a tool",
            "leave tools out",
        )
    probe = ChatRequest(prompt="?", sampling={"tool_call": call, "min_tokens": 0})
    plan, config = s.rt.app.pipeline.plan.stage(stage), s.rt.app.pipeline.config.stage(stage)
    try:  # the stage's kind checks it as the request would be (its engine, its grammar)
        await asyncio.to_thread(s.rt.app.runtime.kinds[stage].validate_request, plan, config, probe)
    except BadRequest as exc:
        p = exc.problems[0]
        backend = plan.backend
        # the engine's refusal of tool_call itself shows the whole value first: not worth repeating
        what = p.what.rpartition("}: ")[2] if p.where.endswith(".tool_call") else p.what
        raise BadRequest.single(
            f"{where}.tools",
            f"the {stage} stage on {backend} cannot offer them: {p.where}: {what}",
            p.fix,
        ) from None
    return call


def tools_doc(tools: list[RealtimeTool] | None) -> list[JsonObject]:
    """``session.tools`` as ``session.updated`` shows them."""
    return [t.model_dump(exclude_none=True) for t in tools or []]


def choice_doc(choice: RealtimeToolChoice) -> object:
    """``session.tool_choice`` as ``session.updated`` shows it."""
    return choice if isinstance(choice, str) else choice.model_dump()


def check_answerable(s: Any) -> None:
    """``BadRequest`` unless a ``response.create`` with no committed audio has the conversation's
    items to answer, and a stage to answer them at (``Realtime.reply_entry``)."""
    said = [m for m in s.items.messages() if m["role"] != "system"]
    if not said or said[-1]["role"] != "user":
        raise BadRequest.single(
            "input_audio_buffer",
            "no committed audio is waiting for a response, and "
            + ("the conversation has no item" if not said else "its last item is the assistant's"),
            "append audio and send input_audio_buffer.commit, or create a user item (or a "
            "function_call_output) with conversation.item.create first",
        )
    if s.rt.reply_entry is None:
        raise BadRequest.single(
            "response",
            "this pipeline has no decode stage to answer the conversation's items",
            "speak the turn: append audio and commit it",
        )


async def response_tools(s: Any, doc: dict[str, object]) -> tuple[bool, JsonObject | None]:
    """A ``response.create``'s own tools and choice, over the session's: (whether it set any,
    the ``tool_call`` of this response)."""
    event: ResponseCreate = _check(ResponseCreate, doc, "{'type': 'response.create'}")
    fields = event.response
    if fields is None or not fields.model_fields_set & {"tools", "tool_choice"}:
        return False, None
    tools = fields.tools if "tools" in fields.model_fields_set else s.tools
    choice = fields.tool_choice if "tool_choice" in fields.model_fields_set else s.tool_choice
    return True, await session_tool_call(s, tools, choice, "response")
