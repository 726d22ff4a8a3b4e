"""``stages.ar_decode.tool_grammar``: the tools in the prompt, a call's text both ways, and the
grammar of a reply under tools — every tool's schema checked with the tool's own path, the
call forced under ``required`` and ``named``, an alternative of text under ``auto``. No model
here: decoding under these grammars is ``tests/orchestrator/server/test_serve_tools.py``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.core.errors import BadRequest
from stages.ar_decode.tool_grammar import (
    CALL_CLOSE,
    CALL_OPEN,
    TOOLS_HEAD,
    call_text,
    decode_grammar,
    parse_call,
    result_text,
    tool_grammar,
    tools_prompt,
)
from tests.helpers.schemas import HELD_IN_SCHEMAS

pytest.importorskip("llama_cpp")

W = "request.sampling.tool_call"
TOOLS = [
    {"name": f"tool_{i}", "description": f"the {i}th", "parameters": s}
    for i, s in enumerate(HELD_IN_SCHEMAS)
]


def _call(choice: str, name: str = "", tools: list[Any] | None = None) -> dict[str, Any]:
    return {"tools": TOOLS if tools is None else tools, "choice": choice, "name": name}


def _refused(sampling: dict[str, Any]) -> str:
    with pytest.raises(BadRequest) as err:
        decode_grammar(sampling)
    assert err.value.problems[0].fix
    return err.value.problems[0].where


def test_a_forced_call_is_the_whole_reply_and_auto_lets_text_begin_otherwise() -> None:
    forced = '"<tool_call>\\n" tool-call-json "\\n</tool_call>"'
    for choice, name in (("required", ""), ("named", "tool_1")):
        first = tool_grammar(_call(choice, name)).splitlines()[0]  # type: ignore[arg-type]
        assert first == f"root ::= {forced}"
    auto = tool_grammar(_call("auto")).splitlines()  # type: ignore[arg-type]
    assert auto[:2] == [f"root ::= {forced} | tool-free-text", "tool-free-text ::= [^<] [^\\x00]*"]
    assert CALL_OPEN.startswith("<")  # so the first character tells a call from text


def test_a_named_call_can_name_only_that_tool() -> None:
    named = tool_grammar(_call("named", "tool_2"))  # type: ignore[arg-type]
    assert '"\\"tool_2\\""' in named and '"\\"tool_0\\""' not in named
    required = tool_grammar(_call("required"))  # type: ignore[arg-type]
    assert all(f'"\\"tool_{i}\\""' in required for i in range(len(TOOLS)))


@pytest.mark.parametrize("index", range(len(HELD_IN_SCHEMAS)))
def test_each_held_in_schema_is_a_tools_parameters(index: int) -> None:
    grammar = tool_grammar(_call("named", f"tool_{index}"))  # type: ignore[arg-type]
    assert grammar.count("\nroot ::=") == 0 and grammar.startswith("root ::=")
    assert "tool-call-json ::=" in grammar


def test_a_keyword_the_grammar_would_pass_over_is_refused_at_its_tool() -> None:
    bad = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}}
    tools = [TOOLS[0], {"name": "odd", "description": "", "parameters": bad}]
    # checked whether offered or not: a request is refused for what it sends
    for choice, name in (("auto", ""), ("named", "tool_0")):
        assert (
            _refused({"tool_call": _call(choice, name, tools)})
            == f"{W}.tools[1].parameters.properties.n.multipleOf"
        )


def test_what_would_cut_a_call_short_or_name_no_tool_is_refused() -> None:
    call = _call("auto")
    assert _refused({"tool_call": call, "stop": ["}"]}) == "request.sampling.stop"
    assert _refused({"tool_call": call, "min_tokens": 2}) == "request.sampling.min_tokens"
    assert _refused({"tool_call": call, "json_schema": {}}) == "request.sampling.json_schema"
    assert _refused({"tool_call": _call("named", "nobody")}) == f"{W}.name"
    assert _refused({"tool_call": {"tools": [], "choice": "auto"}}) == f"{W}.tools"
    assert _refused({"tool_call": {"tools": TOOLS, "choice": "maybe"}}) == W
    assert decode_grammar({"tool_call": call, "stop": [], "min_tokens": 0}) is not None
    assert decode_grammar({"stop": ["x"]}) is None  # neither tools nor a schema: free text


def test_two_tools_may_not_define_one_name_two_ways() -> None:
    def with_defs(name: str, n_max: int) -> dict[str, Any]:
        step = {
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 1, "maximum": n_max}},
        }
        return {
            "name": name,
            "description": "",
            "parameters": {
                "$defs": {"step": step},
                "type": "object",
                "properties": {"s": {"$ref": "#/$defs/step"}},
                "required": ["s"],
            },
        }

    same = [with_defs("a", 3), with_defs("b", 3)]
    assert "step ::=" in tool_grammar(_call("required", tools=same))  # type: ignore[arg-type]
    other = [with_defs("a", 3), with_defs("b", 4)]
    assert _refused({"tool_call": _call("required", tools=other)}) == (
        f"{W}.tools[1].parameters.$defs.step"
    )


def test_the_prompt_offers_the_tools_in_chatmls_convention() -> None:
    text = tools_prompt(_call("auto"))  # type: ignore[arg-type]
    assert text.startswith(TOOLS_HEAD)
    lines = text.removeprefix(TOOLS_HEAD).split("\n</tools>")[0].splitlines()
    assert [json.loads(line)["function"]["name"] for line in lines] == [t["name"] for t in TOOLS]
    assert json.loads(lines[0])["function"]["parameters"] == HELD_IN_SCHEMAS[0]
    named = tools_prompt(_call("named", "tool_3"))  # type: ignore[arg-type]
    assert "tool_3" in named and "tool_0" not in named


def test_a_call_is_read_back_from_its_text_and_a_cut_one_is_no_call() -> None:
    text = call_text("get_weather", {"city": "Paris", "at": [1, 2]})
    assert text.startswith(CALL_OPEN) and text.endswith(CALL_CLOSE)
    assert parse_call(text) == ("get_weather", '{"city": "Paris", "at": [1, 2]}')
    assert parse_call(text[:-3]) is None  # cut by max_tokens
    assert parse_call(CALL_OPEN + '{"name": "x"}' + CALL_CLOSE) is None  # no arguments
    assert parse_call("The weather is fine.") is None
    assert result_text("12 C") == "<tool_response>\n12 C\n</tool_response>"


def test_an_engine_that_cannot_constrain_refuses_tools_by_name() -> None:
    from stages.ar_decode.engines import engine_for

    backend = "transformers-cpu"
    sampling: Any = {"tool_call": _call("auto")}
    with pytest.raises(BadRequest) as err:
        engine_for(backend).check_sampling(sampling, backend)
    p = err.value.problems[0]
    assert p.where == W and f"{backend} cannot apply it" in p.what
    assert "leave tools out" in p.fix and "llamacpp-cpu" in p.fix and "vllm" in p.fix


@pytest.mark.parametrize("backend", ["llamacpp-cpu", "vllm-cpu", "vllm-cuda"])
def test_llamacpp_and_vllm_decode_a_call_under_the_same_grammar(backend: str) -> None:
    """vLLM is handed the tool grammar llama.cpp decodes under (its structured outputs compile
    it), so what either refuses beside tools is refused on both, by the same name."""
    from stages.ar_decode.engines import engine_for

    for choice, name in (("auto", ""), ("required", ""), ("named", "tool_1")):
        sampling: Any = {"tool_call": _call(choice, name)}
        want = tool_grammar(_call(choice, name))  # type: ignore[arg-type]
        assert engine_for(backend).check_sampling(sampling, backend) == want
    for beside in ({"stop": ["x"]}, {"min_tokens": 2}, {"json_schema": {}}):
        with pytest.raises(BadRequest) as err:
            engine_for(backend).check_sampling({"tool_call": _call("auto"), **beside}, backend)
        assert err.value.problems[0].where == f"request.sampling.{next(iter(beside))}"
