"""Tool calls for a decode stage: the tools in the prompt, a call's text, and the grammar that
makes every call's arguments valid JSON for its tool's schema by construction.

A request asks for tools with its sampling's ``tool_call`` (:class:`ToolCall`: the functions,
each a name, a description and a JSON schema of its parameters; and the choice: ``auto``,
``required`` or ``named``). The guarantees:

* the prompt carries the tools in the chat template family's convention (:func:`tools_prompt`:
  ChatML's, as Qwen2.5's and Hermes' templates write it — a ``<tools>`` block in the system
  message; SmolLM2's own template has no tool syntax and is of that family);
* a reply decoded under :func:`tool_grammar`'s grammar is either one call —
  ``<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>`` with NAME one of the
  tools' and ARGS valid against that tool's parameters (the schema walked by
  :func:`~stages.ar_decode.json_grammar.prepared`, so a keyword the grammar would not enforce is
  a ``BadRequest`` naming it) — or, under ``auto`` only, text whose first character is not
  ``<`` (so the first character decides which; :func:`parse_call` reads a whole reply);
* under ``required`` and ``named`` the call is the whole reply.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Literal, TypedDict

from orchestrator.core.errors import BadRequest
from stages.ar_decode.json_grammar import Schema, grammar_of, schema_grammar

CALL_OPEN = "<tool_call>\n"
"""What a call's text starts with (ChatML's convention); under ``auto`` a reply starting with
its first character is a call."""
CALL_CLOSE = "\n</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<tool_response>\n", "\n</tool_response>"
"""Around a tool's result, sent back as a user message (as Qwen2.5's template renders it)."""
TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
"""The tools' system text, word for word Qwen2.5's chat template's (the ChatML family's)."""
WHERE = "request.sampling.tool_call"

Choice = Literal["auto", "required", "named"]


class ToolFunction(TypedDict):
    """One tool: its name, what it does, and the JSON schema of its arguments."""

    name: str
    description: str
    parameters: Schema


class ToolCall(TypedDict):
    """The tools a request offers (each's index is its place in the request's ``tools``) and
    whether the reply may be text (``auto``), must be a call (``required``) or a call of
    ``name`` (``named``)."""

    tools: list[ToolFunction]
    choice: Choice
    name: str


def tools_prompt(call: ToolCall) -> str:
    """The system text that offers the tools (``named``: only the one named)."""
    shown = [{"type": "function", "function": dict(t)} for t in call["tools"] if _offered(call, t)]
    return TOOLS_HEAD + "\n".join(json.dumps(t, ensure_ascii=False) for t in shown) + TOOLS_TAIL


def call_text(name: str, arguments: object) -> str:
    """A call as the model writes it (an earlier assistant turn's ``tool_calls`` sent back)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return CALL_OPEN + body + CALL_CLOSE


def result_text(content: str) -> str:
    """A tool's result as the user turn that carries it back."""
    return RESULT_OPEN + content + RESULT_CLOSE


def _offered(call: ToolCall, tool: ToolFunction) -> bool:
    return call["choice"] != "named" or tool["name"] == call["name"]


def tool_grammar(call: ToolCall) -> str:
    """The GBNF grammar (root ``root``) of a reply to ``call``; ``BadRequest`` naming the tool's
    parameter keyword (``request.sampling.tool_call.tools[1].parameters.properties.x.format``)
    the grammar would not enforce — every tool's is checked, offered or not."""
    shapes: list[Schema] = []
    defs: Schema = {}  # each tool's definitions, lifted to the call's schema its $refs now in
    for i, tool in enumerate(call["tools"]):
        where = f"{WHERE}.tools[{i}].parameters"
        schema_grammar(tool["parameters"], where)  # the checks, with the tool's own path
        if not _offered(call, tool):
            continue
        params = dict(tool["parameters"])
        for key in ("$defs", "definitions"):
            for name, sub in (params.pop(key, None) or {}).items():
                if defs.setdefault(f"{key}/{name}", sub) != sub:
                    raise BadRequest.single(
                        f"{where}.{key}.{name}",
                        "is defined otherwise by another tool",
                        "give the tools' definitions distinct names",
                    )
        shapes.append(
            {
                "type": "object",
                "properties": {"name": {"const": tool["name"]}, "arguments": params},
                "required": ["name", "arguments"],
            }
        )
    if not shapes:
        raise BadRequest.single(
            f"{WHERE}.name", f"{call['name']!r} is none of the tools", "name one of the tools"
        )
    whole: Schema = shapes[0] if len(shapes) == 1 else {"anyOf": shapes}
    for key in ("$defs", "definitions"):
        found = {k.split("/", 1)[1]: v for k, v in defs.items() if k.startswith(key + "/")}
        if found:
            whole = {**whole, key: found}
    body = schema_grammar(whole, WHERE)
    body = re.sub(r"^root ::=", "tool-call-json ::=", body, count=1, flags=re.MULTILINE)
    call_rule = f"{_literal(CALL_OPEN)} tool-call-json {_literal(CALL_CLOSE)}"
    if call["choice"] == "auto":
        root = f"root ::= {call_rule} | tool-free-text\ntool-free-text ::= [^<] [^\\x00]*\n"
    else:
        root = f"root ::= {call_rule}\n"
    return root + body


def _literal(text: str) -> str:
    return json.dumps(text)  # a GBNF string literal: JSON's escapes (\n, \", \\) are GBNF's


def decode_grammar(sampling: Mapping[str, object]) -> str | None:
    """The grammar a request decodes under: its tools' (:func:`tool_grammar`), its
    ``json_schema``'s (``json_grammar.grammar_of``), or None (free text); ``BadRequest`` for
    both at once, and for what would cut a call short (a ``stop`` string, ``min_tokens``)."""
    call = sampling.get("tool_call")
    if call is None:
        return grammar_of(sampling)
    for key, fix in (
        ("json_schema", "leave response_format out with tools: a reply is a call or text"),
        ("stop", "leave stop out with tools: a stop string could cut a call's JSON short"),
    ):
        if sampling.get(key) not in (None, []):  # {} is a schema (any JSON); [] no stop
            raise BadRequest.single(f"request.sampling.{key}", "beside tools", fix)
    if int(str(sampling.get("min_tokens") or 0)) > 0:
        raise BadRequest.single(
            "request.sampling.min_tokens",
            "beside tools: a call ends where its JSON does, and min_tokens would hold it past",
            "leave min_tokens out (0) with tools",
        )
    return tool_grammar(as_call(call))


def as_call(value: object) -> ToolCall:
    """``value`` (a request's ``tool_call``, as the server builds it) as a :class:`ToolCall`;
    ``BadRequest`` for another shape (the Python API's caller wrote it)."""
    fix = (
        "e.g. {'tools': [{'name': 'f', 'description': '', 'parameters': {...}}], 'choice': 'auto'}"
    )
    if not isinstance(value, Mapping) or value.get("choice") not in ("auto", "required", "named"):
        raise BadRequest.single(WHERE, "must name tools and a choice", fix)
    tools = value.get("tools")
    if not isinstance(tools, list) or not tools:
        raise BadRequest.single(f"{WHERE}.tools", "must be a non-empty list", fix)
    out: list[ToolFunction] = []
    for i, t in enumerate(tools):
        if not (isinstance(t, Mapping) and isinstance(t.get("name"), str)):
            raise BadRequest.single(f"{WHERE}.tools[{i}]", "must have a name", fix)
        params = t.get("parameters")
        out.append(
            ToolFunction(
                name=t["name"],
                description=str(t.get("description") or ""),
                parameters=dict(params) if isinstance(params, Mapping) else {"type": "object"},
            )
        )
    return ToolCall(tools=out, choice=value["choice"], name=str(value.get("name") or ""))


def parse_call(text: str) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of a reply that is one whole call, None for text (a reply
    under :func:`tool_grammar` cut by ``max_tokens`` before its call ended is neither: its
    call is ``None`` and its text starts with :data:`CALL_OPEN`'s first character)."""
    if not (text.startswith(CALL_OPEN) and text.endswith(CALL_CLOSE)):
        return None
    try:
        doc = json.loads(text[len(CALL_OPEN) : -len(CALL_CLOSE)])
    except ValueError:
        return None
    if not (isinstance(doc, dict) and isinstance(doc.get("name"), str) and "arguments" in doc):
        return None
    return doc["name"], json.dumps(doc["arguments"], ensure_ascii=False)
