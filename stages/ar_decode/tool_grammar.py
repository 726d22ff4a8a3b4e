"""Tool calls for a decode stage: the tools in the prompt, a call's text, and the grammar that
makes every call's arguments valid JSON for its tool's schema by construction.

A request asks for tools with its sampling's ``tool_call`` (:class:`ToolCall`: the functions,
each a name, a description and a JSON schema of its parameters; and the choice: ``auto``,
``required`` or ``named``). The guarantees:

* the tools, a call and a tool's result are written in the model's own chat template's
  convention, its *family* (:data:`FAMILIES`), chosen from the template's text in one place
  (:func:`family_of`, applied to a request once by :func:`with_family`; a request's
  ``tool_call`` may name its ``family`` itself):

  - ``chatml`` (Qwen2.5/3's and Hermes' templates; SmolLM2's and Gemma 3's have no tool
    syntax of their own and get it; the default for any template not recognised): a
    ``<tools>`` block in the system message (:func:`tools_prompt`), a call
    ``<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>``, a result a user
    message inside ``<tool_response>``;
  - ``llama3_json`` (a template with Llama 3's ``<|start_header_id|>``: Llama 3.1/3.2's
    JSON-based tool calling): the functions as JSON in the first user message after Llama's
    instruction (:data:`LLAMA3_HEAD`), a call ``{"name": NAME, "parameters": ARGS}``, a result
    an ``ipython`` message;
* a reply decoded under :func:`tool_grammar`'s grammar is either one call in its family's form,
  with NAME one of the tools' and ARGS valid against that tool's parameters (the schema walked
  by :func:`~stages.ar_decode.json_grammar.prepared`, so a keyword the grammar would not enforce
  is a ``BadRequest`` naming it) — or, under ``auto`` only, text whose first character is not
  the call's first (:func:`call_start`: ``<``, or ``{`` — the JSON grammar's object rule opens
  with ``"{"`` and no space before it), so the first character decides which;
  :func:`parse_call` reads a whole reply;
* under ``required`` and ``named`` the call is the whole reply.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Literal, NotRequired, TypedDict

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
Family = Literal["chatml", "llama3_json"]
FAMILIES: dict[Family, str] = {
    "chatml": "<tool_call>{name, arguments}</tool_call>; tools in the system message",
    "llama3_json": '{"name", "parameters"}; tools in the first user message; results as ipython',
}
"""The tool syntaxes a prompt and a reply may follow, with what each writes."""
LLAMA3_MARK = "<|start_header_id|>"
"""What tells a Llama 3 template: its role headers (Llama 3.0-3.3 write them)."""
LLAMA3_HEAD = (
    "Given the following functions, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt.\n\n"
    'Respond in the format {"name": function name, "parameters": dictionary of argument name '
    "and its value}.Do not use variables.\n\n"
)
"""Before the functions in the first user message, word for word Llama 3.1's chat template's
(the missing space before "Do" is the template's)."""


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
    family: NotRequired[Family]
    """The tool syntax (:data:`FAMILIES`); absent: ``chatml``."""


def family_of(template: str | None) -> Family:
    """The tool syntax of a chat template's text (a GGUF's ``tokenizer.chat_template``, a
    checkpoint tokenizer's ``chat_template``): ``llama3_json`` for Llama 3's role headers, else
    ``chatml`` (also for no template)."""
    return "llama3_json" if template and LLAMA3_MARK in template else "chatml"


def with_family(sampling: dict[str, object], template: str | None) -> None:
    """Name, in ``sampling``'s ``tool_call`` (when it has one), the family of the template its
    prompt is written with (:func:`family_of`), unless the request named one itself."""
    call = sampling.get("tool_call")
    if isinstance(call, Mapping) and "family" not in call:
        sampling["tool_call"] = {**call, "family": family_of(template)}


def family(call: Mapping[str, object]) -> Family:
    """The family a (checked) ``tool_call`` is written in."""
    return "llama3_json" if call.get("family") == "llama3_json" else "chatml"


def call_start(fam: Family) -> str:
    """The first character of every call in ``fam``: under ``auto`` no text starts with it."""
    return "{" if fam == "llama3_json" else CALL_OPEN[0]


def _shown(call: ToolCall) -> list[dict[str, object]]:
    return [{"type": "function", "function": dict(t)} for t in call["tools"] if _offered(call, t)]


def tools_prompt(call: ToolCall) -> str:
    """The text that offers the tools (``named``: only the one named): ChatML's system text, or
    Llama 3's head and functions that open the first user message."""
    if family(call) == "llama3_json":
        # as the template's ``tojson(indent=4)`` renders each (transformers: no key sorting)
        return LLAMA3_HEAD + "".join(
            json.dumps(t, indent=4, ensure_ascii=False) + "\n\n" for t in _shown(call)
        )
    shown = "\n".join(json.dumps(t, ensure_ascii=False) for t in _shown(call))
    return TOOLS_HEAD + shown + TOOLS_TAIL


def tools_messages(messages: list[dict[str, str]], call: ToolCall) -> list[dict[str, str]]:
    """``messages`` with the tools offered where the family puts them: ChatML's at the end of
    the system message (a system message of them first when there is none); Llama 3's before
    the first user message's text (a user message of them after the system's when none)."""
    tools = tools_prompt(call)
    if family(call) == "llama3_json":
        at = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
        if at is None:
            at = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
            return [*messages[:at], {"role": "user", "content": tools.rstrip()}, *messages[at:]]
        first = {"role": "user", "content": tools + messages[at]["content"]}
        return [*messages[:at], first, *messages[at + 1 :]]
    if messages and messages[0]["role"] == "system":
        return [
            {"role": "system", "content": f"{messages[0]['content']}\n\n{tools}"},
            *messages[1:],
        ]
    return [{"role": "system", "content": tools}, *messages]


def call_text(name: str, arguments: object, fam: Family = "chatml") -> str:
    """A call as the model writes it (an earlier assistant turn's ``tool_calls`` sent back)."""
    if fam == "llama3_json":
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return CALL_OPEN + body + CALL_CLOSE


def result_text(content: str) -> str:
    """A tool's result as the user turn that carries it back (ChatML's)."""
    return RESULT_OPEN + content + RESULT_CLOSE


def result_message(content: str, fam: Family = "chatml") -> tuple[str, str]:
    """(role, content) of the message that carries a tool's result back: ChatML's user turn
    around ``<tool_response>``, Llama 3's ``ipython`` message."""
    return ("ipython", content) if fam == "llama3_json" else ("user", result_text(content))


def _offered(call: ToolCall, tool: ToolFunction) -> bool:
    return call["choice"] != "named" or tool["name"] == call["name"]


def tool_grammar(call: ToolCall) -> str:
    """The GBNF grammar (root ``root``) of a reply to ``call``; ``BadRequest`` naming the tool's
    parameter keyword (``request.sampling.tool_call.tools[1].parameters.properties.x.format``)
    the grammar would not enforce — every tool's is checked, offered or not."""
    fam = family(call)
    args_key = "parameters" if fam == "llama3_json" else "arguments"
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
                "properties": {"name": {"const": tool["name"]}, args_key: params},
                "required": ["name", args_key],
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
    if fam == "llama3_json":
        call_rule = "tool-call-json"  # an object: its rule opens with "{", no space before
    if call["choice"] == "auto":
        free = f"tool-free-text ::= [^{call_start(fam)}] [^\\x00]*\n"
        root = f"root ::= {call_rule} | tool-free-text\n{free}"
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
    if value.get("family") not in (None, *FAMILIES):
        raise BadRequest.single(
            f"{WHERE}.family",
            f"{str(value.get('family'))[:40]!r} is no tool syntax this server writes",
            f"name one of {', '.join(FAMILIES)}, or leave it out (the chat template's)",
        )
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
    call = ToolCall(tools=out, choice=value["choice"], name=str(value.get("name") or ""))
    if value.get("family") is not None:
        call["family"] = value["family"]
    return call


def parse_call(text: str, fam: Family = "chatml") -> tuple[str, str] | None:
    """(name, arguments as JSON text) of a reply that is one whole call in ``fam``'s form, None
    for text (a reply under :func:`tool_grammar` cut by ``max_tokens`` before its call ended is
    neither: its call is ``None`` and its text starts with :func:`call_start`)."""
    key = "parameters" if fam == "llama3_json" else "arguments"
    if fam == "llama3_json":
        body = text if text.startswith("{") else ""
    elif text.startswith(CALL_OPEN) and text.endswith(CALL_CLOSE):
        body = text[len(CALL_OPEN) : -len(CALL_CLOSE)]
    else:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not (isinstance(doc, dict) and isinstance(doc.get("name"), str) and key in doc):
        return None
    return doc["name"], json.dumps(doc[key], ensure_ascii=False)
