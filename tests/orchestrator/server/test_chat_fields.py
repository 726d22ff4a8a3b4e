"""No silent fail-open on ``POST /v1/chat/completions``: every field of OpenAI's chat request,
as the installed ``openai`` package declares it, is honoured, accepted and ignored as
``docs/serving.md`` lists it, or refused with a 400 naming it. No server, no Ray: the
functions the app runs on a body's bytes (the served path is ``test_server.py``)."""

from __future__ import annotations

import json
import re
import typing
from typing import Any

import pytest

from orchestrator.core.errors import BadRequest
from orchestrator.server import ServerLimits
from orchestrator.server.chat_fields import (
    EXTENSIONS,
    HONOURED,
    IGNORED,
    MESSAGE_HONOURED,
    MESSAGE_IGNORED,
    MESSAGE_REFUSED,
    REFUSED,
    treatment,
)
from orchestrator.server.chat_tools import NO_PARAMETERS
from orchestrator.server.protocol import ChatBody, Message, read_chat
from tests.helpers import REPO

openai_params = pytest.importorskip("openai.types.chat.completion_create_params")
message_params = pytest.importorskip("openai.types.chat.chat_completion_message_param")

HI = [{"role": "user", "content": "hi"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ASKING: dict[str, Any] = {
    # a value of each refused field that asks for something the server does not do
    "functions": [TOOL["function"]],
    "function_call": {"name": "get_weather"},
    "logit_bias": {"50256": -100},
    "reasoning_effort": "low",
    "verbosity": "low",
    "web_search_options": {},
    "moderation": {"model": "omni-moderation-latest"},
}
HARMLESS: dict[str, Any] = {
    # a value of each ignored field a client may send
    "user": "u-1",
    "safety_identifier": "s-1",
    "metadata": {"a": "b"},
    "store": True,
    "service_tier": "auto",
    "prompt_cache_key": "k",
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {"mode": "implicit"},
    "prediction": {"type": "content", "content": "Hello"},
    "parallel_tool_calls": False,
}


def _openai_fields() -> list[str]:
    base = openai_params.CompletionCreateParamsBase.__annotations__
    streaming = openai_params.CompletionCreateParamsStreaming.__annotations__
    return sorted(set(base) | set(streaming))


WAV = {"audio": {"format": "wav"}}


def _chat(body: dict[str, Any]) -> Any:
    return read_chat(
        json.dumps(body).encode(), audio_entry=False, has_audio=True, limits=ServerLimits()
    )


def _refused(body: dict[str, Any]) -> tuple[str, str, str]:
    with pytest.raises(BadRequest) as err:
        _chat(body)
    p = err.value.problems[0]
    return p.where, p.what, p.fix


def _documented() -> dict[str, str]:
    """The field table of docs/serving.md's "Request fields": name → treatment."""
    text = (REPO / "docs/serving.md").read_text()
    section = text.split("#### Request fields", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([a-z_.\[\]]+)` \| (honoured|ignored|refused) \|", section, re.M)
    return dict(rows)


def test_the_openai_package_still_declares_the_fields_this_table_was_written_for() -> None:
    fields = _openai_fields()
    # the walk below is only as good as the list it walks
    assert {"messages", "tools", "response_format", "stop", "logprobs", "stream"} <= set(fields)


@pytest.mark.parametrize("name", _openai_fields())
def test_every_openai_chat_field_is_honoured_ignored_or_refused(name: str) -> None:
    how = treatment(name)
    assert how is not None, f"{name}: a field of OpenAI's chat request this server has no word on"
    assert _documented().get(name) == how, f"{name}: docs/serving.md does not list it as {how}"
    if how == "honoured":
        assert name in ChatBody.model_fields, f"{name}: honoured, but the request model drops it"
    elif how == "refused":
        where, what, fix = _refused({"messages": HI, name: ASKING[name]})
        assert where == name and "is not served" in what and fix == REFUSED[name]
        # null, as the openai client never sends but others do, asks for nothing
        assert _chat({"messages": HI, name: None}).prompt == {"messages": HI}
    else:
        assert name not in ChatBody.model_fields
        assert _chat({"messages": HI, name: HARMLESS[name]}).prompt == {"messages": HI}


def test_the_tables_hold_no_field_twice_and_the_docs_no_field_the_tables_lack() -> None:
    groups = [HONOURED, EXTENSIONS, IGNORED, REFUSED]
    names = [n for g in groups for n in g]
    assert len(names) == len(set(names))
    assert set(_documented()) - {
        f"messages[].{k}" for k in (*MESSAGE_REFUSED, *MESSAGE_IGNORED, *MESSAGE_HONOURED)
    } <= set(names)
    assert set(ASKING) == set(REFUSED) and set(HARMLESS) == set(IGNORED)


@pytest.mark.parametrize("name", sorted(EXTENSIONS))
def test_vllms_extensions_reach_the_decode_stages_sampling(name: str) -> None:
    value = {"min_tokens": 4, "top_k": 40, "repetition_penalty": 1.1}[name]
    assert _chat({"messages": HI, name: value}).prompt["sampling"] == {name: value}
    assert _documented().get(name) == "honoured"


def _message_keys() -> list[str]:
    keys: set[str] = set()
    for param in typing.get_args(message_params.ChatCompletionMessageParam):
        keys |= set(param.__annotations__)
    return sorted(keys)


@pytest.mark.parametrize("key", _message_keys())
def test_every_key_of_an_openai_message_is_read_ignored_or_refused(key: str) -> None:
    if key in MESSAGE_REFUSED:
        message = {"role": "assistant", "content": "ok", key: {"name": "f", "arguments": "{}"}}
        where, what, fix = _refused({"messages": [*HI, message, *HI]})
        assert (
            where == f"messages[1].{key}"
            and "is not served" in what
            and fix == MESSAGE_REFUSED[key]
        )
        assert _documented().get(f"messages[].{key}") == "refused"
    elif key in MESSAGE_IGNORED:
        message = {"role": "assistant", "content": "ok", key: "x"}
        prompt = _chat({"messages": [*HI, message]}).prompt
        assert prompt == {"messages": [*HI, {"role": "assistant", "content": "ok"}]}
        assert _documented().get(f"messages[].{key}") == "ignored"
    elif key in MESSAGE_HONOURED:
        assert key in Message.model_fields
        assert _documented().get(f"messages[].{key}") == "honoured"
    else:
        assert key in Message.model_fields, f"messages[].{key}: no word on it"


CALLED = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}


def _called(arguments: str) -> dict[str, Any]:
    return {**CALLED, "function": {"name": "get_weather", "arguments": arguments}}


def test_a_round_trips_call_and_result_go_back_into_the_prompt_as_the_model_writes_them() -> None:
    said = {"role": "assistant", "content": None, "tool_calls": [_called('{"city": "Paris"}')]}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "12 degrees"}
    prompt = _chat({"messages": [*HI, said, result]}).prompt
    assert prompt["messages"][1:] == [
        {
            "role": "assistant",
            "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            "</tool_call>",
        },
        {"role": "user", "content": "<tool_response>\n12 degrees\n</tool_response>"},
    ]
    where, _, _ = _refused({"messages": [*HI, {**said, "tool_calls": [_called("{city")]}]})
    assert where == "messages[1].tool_calls[0].function.arguments"
    where, _, _ = _refused({"messages": [*HI, {"role": "tool", "tool_call_id": "call_1"}]})
    assert where == "messages[1].content"


def _tool_call(body: dict[str, Any]) -> Any:
    return _chat({"messages": HI, **body}).prompt.get("sampling", {}).get("tool_call")


def test_tools_reach_the_decode_stage_as_its_tool_call() -> None:
    other = {"type": "function", "function": {"name": "noop", "description": "does nothing"}}
    offered = [
        {"name": "get_weather", "description": "", "parameters": TOOL["function"]["parameters"]},
        {"name": "noop", "description": "does nothing", "parameters": NO_PARAMETERS},
    ]
    assert _tool_call({"tools": [TOOL, other]}) == {"tools": offered, "choice": "auto", "name": ""}
    assert _tool_call({"tools": [TOOL, other], "tool_choice": "required"})["choice"] == "required"
    named = {"type": "function", "function": {"name": "noop"}}
    assert _tool_call({"tools": [TOOL, other], "tool_choice": named}) == {
        "tools": offered,
        "choice": "named",
        "name": "noop",
    }
    assert _tool_call({"tools": [TOOL], "tool_choice": "none"}) is None  # text, nothing offered
    assert _chat({"messages": HI, "tools": [TOOL]}).tools
    assert not _chat({"messages": HI, "tools": [TOOL], "tool_choice": "none"}).tools
    # with audio output too: the runtime speaks no call (test_serve_tools_voice.py)
    spoken = _chat({"messages": HI, "tools": [TOOL], "modalities": ["text", "audio"], **WAV})
    assert spoken.tools and spoken.audio_format == "wav"


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"tool_choice": "auto"}, "tool_choice"),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice.function.name",
        ),
        ({"tools": [TOOL, TOOL]}, "tools[1].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ],
)
def test_tools_the_server_cannot_keep_are_a_400_naming_the_field(
    body: dict[str, Any], where: str
) -> None:
    assert _refused({"messages": HI, **body})[0] == where


def test_the_off_value_of_a_refused_field_asks_for_nothing() -> None:
    for off in (
        {"logprobs": False},
        {"response_format": {"type": "text"}},  # honoured: text is what text asks for
        {"logit_bias": {}},
        {"tool_choice": "none"},
    ):
        assert _chat({"messages": HI, **off}).prompt == {"messages": HI}, off


def test_logprobs_reach_the_decode_stage_as_its_logprobs_sampling() -> None:
    def sampling(body: dict[str, Any]) -> Any:
        return _chat({"messages": HI, **body}).prompt.get("sampling")

    assert sampling({"logprobs": True}) == {"logprobs": 0}
    assert sampling({"logprobs": True, "top_logprobs": 20}) == {"logprobs": 20}
    assert sampling({"logprobs": False, "top_logprobs": 0}) is None
    where, what, fix = _refused({"messages": HI, "top_logprobs": 3})
    assert (where, what) == ("top_logprobs", "3: is set, and logprobs is not true")
    assert "logprobs: true" in fix
    for bad in (21, -1, "3", 2.0):
        where, _, fix = _refused({"messages": HI, "logprobs": True, "top_logprobs": bad})
        assert where == "top_logprobs" and fix == "a whole number from 0 to 20, with logprobs: true"
    assert _refused({"messages": HI, "logprobs": 1})[0] == "logprobs"


def test_response_format_becomes_the_schema_the_decode_stage_enforces() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}

    def sampling(fmt: dict[str, Any]) -> Any:
        return _chat({"messages": HI, "response_format": fmt}).prompt.get("sampling")

    assert sampling({"type": "text"}) is None
    assert sampling({"type": "json_object"}) == {"json_schema": {"type": "object"}}
    named = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}}
    assert sampling(named) == {"json_schema": schema}
    where, what, _ = _refused({"messages": HI, "response_format": {"type": "json_schema"}})
    assert (where, what) == ("response_format.json_schema", "is required with type json_schema")
    where, _, _ = _refused({"messages": HI, "response_format": {"type": "xml"}})
    assert where == "response_format.type"


def test_a_stages_refusal_of_a_schema_keyword_names_the_openai_field() -> None:
    from orchestrator.server.failures import _openai_param

    assert _openai_param("request.sampling.json_schema") == "response_format"
    assert (
        _openai_param("request.sampling.json_schema.properties.a.minimum")
        == "response_format.json_schema.schema.properties.a.minimum"
    )
    assert _openai_param("request.sampling.stop") == "stop"
    assert _openai_param("request.sampling.tool_call") == "tools"
    assert (
        _openai_param("request.sampling.tool_call.tools[2].parameters.properties.a.minimum")
        == "tools[2].function.parameters.properties.a.minimum"
    )
    assert _openai_param("request.sampling.tool_call.name") == "tool_choice.function.name"


@pytest.mark.parametrize(
    ("field", "value", "key"),
    [
        ("max_tokens", 8, "max_tokens"),
        ("max_completion_tokens", 9, "max_tokens"),
        ("temperature", 0.5, "temperature"),
        ("top_p", 0.5, "top_p"),
        ("seed", 3, "seed"),
        ("presence_penalty", 1.5, "presence_penalty"),
        ("frequency_penalty", -0.5, "frequency_penalty"),
        ("stop", "five", "stop"),
    ],
)
def test_each_honoured_sampling_field_reaches_the_decode_stage(
    field: str, value: Any, key: str
) -> None:
    expected = [value] if field == "stop" else value  # one stop string is a list of one
    assert _chat({"messages": HI, field: value}).prompt["sampling"] == {key: expected}
    # beside another field, too (a field left unset never clears one that is set)
    both = _chat({"messages": HI, field: value, "seed": 1}).prompt["sampling"]
    assert both[key] == (expected if field != "seed" else 1)
