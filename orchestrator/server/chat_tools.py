"""Tools on ``POST /v1/chat/completions``: OpenAI's ``tools``, ``tool_choice``, an assistant
message's ``tool_calls`` and ``role: tool`` results, in and out.

The guarantees:

* a request's tools reach the decode stage as its sampling's ``tool_call``
  (:func:`tool_call_of`), where the prompt offers them and a grammar makes each call's
  arguments valid JSON for its tool's schema by construction
  (``stages.ar_decode.tool_grammar``); ``tool_choice`` ``none`` offers none and decodes text;
* what the server cannot keep is a 400 naming the field before any work: a ``tool_choice``
  without tools or naming none of them, two tools of one name, an earlier call whose
  ``arguments`` are not JSON;
* with audio output a call is spoken by no voice: the runtime cuts no sentences of a reply
  that is a call (``orchestrator.runtime.router.Router``'s ``tools``: the first character
  decides), so the turn has its ``tool_calls`` and no audio, and the answer after the tool's
  result is spoken as any reply;
* earlier calls and their results go back into the prompt in the tool syntax of the decode
  stage's chat template (:func:`as_text`; ``tool_grammar.FAMILIES``: ChatML's
  ``<tool_call>``/``<tool_response>``, Llama 3's JSON call and ``ipython`` result), so a
  conversation round-trips; the server reads that stage's syntax once (:func:`served_family`)
  with the function the stage itself applies (``tool_grammar.family_of``);
* a reply that is a whole call is returned as ``tool_calls`` with ``finish_reason``
  ``tool_calls`` (:func:`reply_call`); a call cut short by ``max_tokens`` is no call: its
  ``finish_reason`` is ``length`` and it has no content (the half-written call is not text).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core.errors import BadRequest, Problem
from stages.ar_decode.json_grammar import Schema
from stages.ar_decode.tool_grammar import (
    Family,
    call_start,
    call_text,
    parse_call,
    result_message,
)

MAX_TOOLS = 128
"""The most tools a request may offer (OpenAI's own cap)."""
NO_PARAMETERS: Schema = {"type": "object", "additionalProperties": False}
"""A function defined without ``parameters`` takes none: its arguments are ``{}``."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class FunctionDef(_Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: Schema | None = None
    strict: bool | None = None


class ToolDef(_Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Body):
    name: str


class NamedChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedChoice


class CalledFunction(_Body):
    name: str
    arguments: str


class ToolCallItem(_Body):
    """One call of an earlier assistant message, sent back (OpenAI's ``tool_calls[i]``)."""

    id: str
    type: Literal["function"]
    function: CalledFunction


def _bad(where: str, what: str, fix: str) -> BadRequest:
    return BadRequest([Problem(where, what, fix)])


def served_family(kinds: Mapping[str, Any], plans: list[Any], entries: list[str]) -> Family:
    """The tool syntax of the first decode stage a chat request may enter at (its kind's
    ``tool_family``: the chat template its engine reads, by ``tool_grammar.family_of``, the
    stage's own choice); ``chatml`` when none says."""
    for plan in plans:
        probe = getattr(kinds[plan.name], "tool_family", None)
        if plan.name in entries and probe is not None:
            return cast(Family, probe(plan))
    return "chatml"


def name_family(request: object, fam: Family) -> None:
    """Name ``fam`` in a chat request's ``tool_call`` (the syntax its messages were written in),
    so the decode stage and the router read the reply as the server does."""
    sampling = getattr(request, "sampling", None)
    call = sampling.get("tool_call") if isinstance(sampling, dict) else None
    if isinstance(call, dict):
        sampling["tool_call"] = {**call, "family": fam}  # type: ignore[index]


def tool_call_of(
    tools: list[ToolDef] | None, choice: ToolChoice | None
) -> dict[str, object] | None:
    """The decode stage's ``tool_call`` sampling of a request's ``tools`` and ``tool_choice``
    (None: no tools, or ``none``); ``BadRequest`` naming what cannot be kept."""
    if not tools:
        if choice not in (None, "none"):
            raise _bad("tool_choice", "is set, and no tools are", "send tools, or leave it out")
        return None
    names = [t.function.name for t in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise _bad(
                f"tools[{i}].function.name", f"{name!r} names two tools", "name each tool once"
            )
    if choice == "none":
        return None
    named = choice.function.name if isinstance(choice, NamedChoice) else ""
    if isinstance(choice, NamedChoice) and named not in names:
        raise _bad(
            "tool_choice.function.name",
            f"{named!r} is none of the tools",
            f"name one of {', '.join(names)}",
        )
    return {
        "tools": [
            {
                "name": t.function.name,
                "description": t.function.description or "",
                "parameters": NO_PARAMETERS
                if t.function.parameters is None
                else t.function.parameters,
            }
            for t in tools
        ],
        "choice": "named" if named else (choice or "auto"),
        "name": named,
    }


def as_text(
    i: int, role: str, content: str | None, calls: list[ToolCallItem] | None, fam: Family = "chatml"
) -> tuple[str, str] | None:
    """(role, content) of message ``i`` as the prompt carries it in ``fam``'s syntax, when it
    takes part in a tool round trip (a ``tool`` result: ``tool_grammar.result_message``,
    ChatML's user turn around ``<tool_response>`` or Llama 3's ``ipython`` message; an
    assistant turn with ``tool_calls``: its text, then each call as the model writes one);
    else None."""
    if role == "tool":
        if content is None:
            raise _bad(f"messages[{i}].content", "is missing", "send the tool's result as text")
        return result_message(content, fam)
    if role != "assistant" or not calls:
        return None
    texts = [content] if content else []
    for j, call in enumerate(calls):
        try:
            arguments = json.loads(call.function.arguments)
        except ValueError:
            raise _bad(
                f"messages[{i}].tool_calls[{j}].function.arguments",
                "is not JSON",
                "send the arguments the call was given, as the JSON text it was returned in",
            ) from None
        texts.append(call_text(call.function.name, arguments, fam))
    return "assistant", "\n".join(texts)


def reply_call(text: str, rid: str, fam: Family = "chatml") -> list[dict[str, object]] | None:
    """The ``tool_calls`` of a reply that is a call in ``fam``'s syntax (None: it is text):
    OpenAI's shape, one call, its arguments a JSON string."""
    call = parse_call(text, fam)
    if call is None:
        return None
    name, arguments = call
    return [
        {
            "id": f"call_{rid}_0",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
    ]


def looks_like_call(text: str, fam: Family = "chatml") -> bool:
    """Whether a reply decoded under a tool grammar is (or was becoming) a call: its first
    character decides (``tool_grammar``: text under ``auto`` never starts with a call's first
    character, ``<`` in ChatML's syntax, ``{`` in Llama 3's)."""
    return text.startswith(call_start(fam))


class CallWatch:
    """A reply's text as it streams under tools: passed on as content while it is text, held
    back whole once its first character makes it a call (sent as ``delta.tool_calls`` at the
    end: a call's arguments are JSON only once whole)."""

    def __init__(self, tools: bool, fam: Family = "chatml") -> None:
        self.tools, self.fam = tools, fam
        self.held: list[str] | None = None
        self.started = False

    def text(self, piece: str) -> str | None:
        """The content to send for ``piece`` now; None while the reply is a call."""
        if self.held is not None:
            self.held.append(piece)
            return None
        if self.tools and not self.started and piece:
            self.started = True
            if looks_like_call(piece, self.fam):
                self.held = [piece]
                return None
        return piece

    def calls(self, rid: str) -> list[dict[str, object]] | None:
        """The reply's call as ``delta.tool_calls`` (OpenAI's chunk shape: each with its
        ``index``) once it ended; None for text, and for a call cut short."""
        if self.held is None:
            return None
        calls = reply_call("".join(self.held), rid, self.fam)
        return None if calls is None else [{"index": i, **c} for i, c in enumerate(calls)]

    @property
    def is_call(self) -> bool:
        """Whether the reply is (or was becoming) a call rather than text."""
        return self.held is not None
