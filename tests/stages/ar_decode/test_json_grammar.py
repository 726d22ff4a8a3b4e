"""``stages.ar_decode.json_grammar``: a JSON schema becomes a grammar only where the grammar
enforces all of it; a keyword it would pass over is a ``BadRequest`` naming the keyword and
where it is. No model here: the decoding under the grammars is ``test_llamacpp_runner.py``."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.core.errors import BadRequest
from stages.ar_decode.json_grammar import MAX_ENUMERATED, grammar_of, prepared, schema_grammar
from tests.helpers.schemas import HELD_IN_SCHEMAS

pytest.importorskip("llama_cpp")

W = "request.sampling.json_schema"
OBJ = {"type": "object"}


def _refused(schema: Any) -> tuple[str, str]:
    with pytest.raises(BadRequest) as err:
        schema_grammar(schema, W)
    p = err.value.problems[0]
    assert p.fix, "a refusal says what the grammar does enforce"
    return p.where, p.what


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "number", "minimum": 0.5}, f"{W}.minimum"),
        ({"type": "integer", "minimum": 0}, f"{W}.minimum"),  # one-sided: no range
        ({"type": "integer", "minimum": 0, "maximum": MAX_ENUMERATED}, f"{W}.maximum"),
        ({"type": "integer", "multipleOf": 2}, f"{W}.multipleOf"),
        ({"not": OBJ}, f"{W}.not"),
        ({"oneOf": [OBJ]}, f"{W}.oneOf"),
        ({"allOf": [OBJ]}, f"{W}.allOf"),
        ({"if": OBJ, "then": OBJ}, f"{W}.if"),
        ({"type": "string", "pattern": "^a$"}, f"{W}.pattern"),
        ({"type": "string", "format": "email"}, f"{W}.format"),
        ({"type": "string", "format": "date", "maxLength": 3}, f"{W}.maxLength"),
        ({"type": "array", "items": OBJ, "uniqueItems": True}, f"{W}.uniqueItems"),
        ({"type": "object", "properties": {"a": OBJ}, "minProperties": 1}, f"{W}.minProperties"),
        ({"type": "object", "properties": {"a": OBJ}, "required": ["b"]}, f"{W}.required"),
        ({"type": "object", "patternProperties": {"a": OBJ}}, f"{W}.patternProperties"),
        ({"properties": {"a": {"type": "integer", "maximum": 3}}}, f"{W}.properties.a.maximum"),
        ({"$ref": "https://example.com/schema.json"}, f"{W}.$ref"),
        ({"$ref": "#/$defs/a", "type": "object"}, f"{W}.type"),
        ({"anyOf": [OBJ], "type": "object"}, f"{W}.type"),
        ({"enum": [1, "a"], "type": "string"}, f"{W}.enum"),
        ({"type": ["string", "null"], "maxLength": 3}, f"{W}.maxLength"),
        ({"type": "bogus"}, f"{W}.type"),
        ({"type": "array", "items": [OBJ, OBJ], "maxItems": 1}, f"{W}.minItems"),
    ],
)
def test_a_keyword_the_grammar_would_pass_over_is_refused_by_name(schema: Any, where: str) -> None:
    assert _refused(schema)[0] == where


def test_what_the_grammar_may_only_narrow_is_narrowed_so_each_document_still_validates() -> None:
    closed = prepared({"type": "object", "properties": {"a": OBJ}, "title": "T"}, W)
    assert closed == {
        "type": "object",
        "properties": {"a": OBJ},
        "required": [],
        "additionalProperties": False,  # no undeclared key, no key twice
    }
    assert prepared({"type": "integer", "minimum": 2, "exclusiveMaximum": 5}, W) == {
        "enum": [2, 3, 4]
    }
    # JSON forbids raw control characters in a string: the grammar's characters leave them out
    grammar = schema_grammar({"type": "string", "maxLength": 4}, W)
    assert "\\x00-\\x1F" in grammar


@pytest.mark.parametrize("schema", HELD_IN_SCHEMAS)
def test_the_held_in_schemas_become_grammars(schema: dict[str, Any]) -> None:
    assert "root ::=" in schema_grammar(schema, W)


def test_a_schema_beside_a_stop_string_or_min_tokens_is_refused() -> None:
    for extra, where in (({"stop": ["}"]}, "stop"), ({"min_tokens": 3}, "min_tokens")):
        with pytest.raises(BadRequest) as err:
            grammar_of({"json_schema": OBJ, **extra})
        assert err.value.problems[0].where == f"request.sampling.{where}"
    assert grammar_of({"stop": ["x"], "min_tokens": 3}) is None  # no schema: free text
    assert grammar_of({"json_schema": OBJ, "stop": [], "min_tokens": 0}) is not None


def test_an_engine_that_cannot_constrain_refuses_a_schema_by_name() -> None:
    from stages.ar_decode.engines import engine_for

    backend = "transformers-cpu"
    with pytest.raises(BadRequest) as err:
        engine_for(backend).check_sampling({"json_schema": OBJ}, backend)
    p = err.value.problems[0]
    assert p.where == "request.sampling.json_schema" and f"{backend} cannot apply it" in p.what
    assert "llamacpp-cpu" in p.fix and "vllm" in p.fix


@pytest.mark.parametrize("backend", ["llamacpp-cpu", "vllm-cpu", "vllm-cuda"])
def test_llamacpp_and_vllm_decode_a_schema_under_the_same_grammar(backend: str) -> None:
    """vLLM is handed the grammar llama.cpp decodes under (its structured outputs compile it),
    so a keyword either would pass over is refused on both, by the same name."""
    from stages.ar_decode.engines import engine_for

    for schema in (OBJ, *HELD_IN_SCHEMAS):
        want = schema_grammar(schema, W)
        assert engine_for(backend).check_sampling({"json_schema": schema}, backend) == want
    with pytest.raises(BadRequest) as err:
        engine_for(backend).check_sampling(
            {"json_schema": {"type": "number", "multipleOf": 2}}, backend
        )
    assert err.value.problems[0].where == f"{W}.multipleOf"
    assert engine_for(backend).check_sampling({}, backend) is None  # free text


def test_every_held_in_grammar_is_one_vllms_structured_outputs_compile() -> None:
    """vLLM is handed these grammars as they are (``StructuredOutputsParams(grammar=...)``):
    xgrammar, its structured-output backend, parses each — the schemas' and the tool calls'."""
    xgr = pytest.importorskip("xgrammar")
    from stages.ar_decode.tool_grammar import as_call, tool_grammar

    grammars = [schema_grammar(s, W) for s in (OBJ, *HELD_IN_SCHEMAS)]
    tools = [{"name": f"t{i}", "parameters": s} for i, s in enumerate(HELD_IN_SCHEMAS)]
    for choice, name in (("auto", ""), ("required", ""), ("named", "t2")):
        grammars.append(tool_grammar(as_call({"tools": tools, "choice": choice, "name": name})))
    for grammar in grammars:
        assert xgr.Grammar.from_ebnf(grammar, root_rule_name="root")


@pytest.mark.parametrize(
    ("sampling", "key", "field"),
    [
        ({"json_schema": OBJ}, "json_schema", "response_format"),
        (
            {"tool_call": {"tools": [{"name": "f", "parameters": OBJ}], "choice": "required"}},
            "tool_call",
            "tools",
        ),
    ],
)
def test_vllm_without_the_schema_converter_refuses_by_name(
    monkeypatch: pytest.MonkeyPatch, sampling: dict[str, Any], key: str, field: str
) -> None:
    """vLLM's grammar is written by llama-cpp-python's converter: without it, a request that
    needs a grammar is a ``BadRequest`` naming its key and the remedy, never decoded free."""
    import sys

    from stages.ar_decode.engines import engine_for

    monkeypatch.setitem(sys.modules, "llama_cpp.llama_grammar", None)  # import: ImportError
    with pytest.raises(BadRequest) as err:
        engine_for("vllm-cpu").check_sampling(sampling, "vllm-cpu")  # type: ignore[arg-type]
    p = err.value.problems[0]
    assert p.where == f"request.sampling.{key}" and "llama-cpp-python" in p.what
    assert "install llama-cpp-python" in p.fix and f"leave {field} out" in p.fix
    assert engine_for("vllm-cpu").check_sampling({"logprobs": 3}, "vllm-cpu") is None
