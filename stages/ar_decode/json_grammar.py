"""A JSON schema as a llama.cpp grammar whose every complete sentence validates against it.

The guarantee: a reply decoded under :func:`schema_grammar`'s grammar that ends (the grammar
lets end-of-generation through only once the document is whole) is JSON that validates
against the schema. llama-cpp-python's converter (``llama_cpp.llama_grammar``) turns a
schema into GBNF but passes over what it does not enforce (number bounds, ``oneOf``'s
"exactly one", a string's length beside a ``format``, ``required`` names with no property,
remote ``$ref`` it would fetch) — so the schema is walked first (:func:`prepared`) and:

* a keyword the grammar would not enforce is a ``BadRequest`` naming it and where it is
  (``response_format.json_schema.schema.properties.age.multipleOf``), never dropped;
* where the grammar may generate only part of what the schema allows, it is narrowed, so
  each generated document still validates: an object with ``properties`` gets no other
  keys (``additionalProperties`` false), an integer between ``minimum`` and ``maximum``
  becomes the ``enum`` of that range (at most :data:`MAX_ENUMERATED` values);
* a JSON string's characters exclude the control characters JSON forbids in it (the
  converter's ``char`` rule lets a raw newline through).

Annotations (``title``, ``description``, ``default``, ...) are dropped: they constrain nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeAlias

from orchestrator.core.errors import BadRequest, Problem

Schema: TypeAlias = dict[str, Any]
"""A JSON schema (or one of its subschemas) as parsed JSON: its keywords' values are any JSON."""

MAX_SCHEMA_BYTES = 16 * 1024
"""The largest schema taken, as JSON: a grammar is built from it for each request."""
MAX_DEPTH = 16
"""The deepest nesting of schemas taken."""
MAX_ENUMERATED = 256
"""The widest integer range (``minimum`` to ``maximum``) turned into an ``enum``."""
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "$schema",
        "$id",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
FORMATS = frozenset({"date", "time", "date-time", "uuid"})
"""The string formats the converter writes a rule for; any other ``format`` is refused."""
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
OBJECT_ONLY = frozenset({"type", "properties", "required", "additionalProperties"})
FIX = (
    "use only what the grammar enforces: type, properties, required, additionalProperties, "
    "items, prefixItems, minItems, maxItems, enum, const, anyOf, $ref to $defs, minLength and "
    "maxLength, format date/time/date-time/uuid, and an integer's minimum and maximum "
    f"(at most {MAX_ENUMERATED} values) — docs/serving.md#structured-output"
)
_JSON_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}
_CHAR_RULE = 'char ::= [^"\\\\] |'
_JSON_CHAR_RULE = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'


def _bad(where: str, what: str) -> BadRequest:
    return BadRequest([Problem(where, what, FIX)])


def schema_grammar(schema: object, where: str) -> str:
    """The GBNF grammar (root rule ``root``) of ``schema``; ``BadRequest`` naming the keyword
    (at ``where`` + its path) the grammar could not enforce."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    size = len(json.dumps(schema))
    if size > MAX_SCHEMA_BYTES:
        raise BadRequest.single(
            where,
            f"is {size} bytes of JSON, over the {MAX_SCHEMA_BYTES} bytes a schema may have",
            "send a smaller schema",
        )
    ready = prepared(schema, where)
    try:
        gbnf = json_schema_to_gbnf(json.dumps(ready))
    except (AssertionError, KeyError, ValueError, RecursionError) as exc:
        raise _bad(where, f"cannot be made a grammar ({type(exc).__name__}: {exc})") from None
    if _CHAR_RULE in gbnf:
        gbnf = gbnf.replace(_CHAR_RULE, _JSON_CHAR_RULE)
    return str(gbnf)


def prepared(schema: object, where: str, depth: int = 0) -> Schema:
    """``schema`` as the converter is given it: annotations dropped, objects with properties
    closed, integer ranges enumerated; ``BadRequest`` for a keyword it would not enforce."""
    if depth > MAX_DEPTH:
        raise _bad(where, f"nests schemas deeper than {MAX_DEPTH} levels")
    if schema is True:
        return {}
    if not isinstance(schema, dict):
        raise _bad(where, f"{json.dumps(schema)[:40]}: a schema is a JSON object")
    node = {k: v for k, v in schema.items() if k not in ANNOTATIONS}
    for key in ("$defs", "definitions"):
        if key in node:
            defs = node[key]
            if not isinstance(defs, dict):
                raise _bad(f"{where}.{key}", "must be an object of schemas")
            node[key] = {n: prepared(s, f"{where}.{key}.{n}", depth + 1) for n, s in defs.items()}
    rest = {k: v for k, v in node.items() if k not in ("$defs", "definitions")}
    kept = {k: v for k, v in node.items() if k in ("$defs", "definitions")}
    return {**kept, **_node(rest, where, depth)}


def _node(node: Schema, where: str, depth: int) -> Schema:
    """One schema's constraints (its definitions already taken out), checked and narrowed."""
    if "$ref" in node:
        ref = node["$ref"]
        if not (isinstance(ref, str) and ref.startswith(("#/$defs/", "#/definitions/"))):
            raise _bad(f"{where}.$ref", f"{json.dumps(ref)[:60]}: only #/$defs/NAME is resolved")
        _alone(node, "$ref", where)
        return {"$ref": ref}
    for key in ("enum", "const"):
        if key in node:
            return _constants(node, key, where)
    if "anyOf" in node:
        _alone(node, "anyOf", where)
        options = node["anyOf"]
        if not isinstance(options, list) or not options:
            raise _bad(f"{where}.anyOf", "must be a list of schemas")
        return {
            "anyOf": [prepared(s, f"{where}.anyOf[{i}]", depth + 1) for i, s in enumerate(options)]
        }
    kind = node.get("type")
    if isinstance(kind, list):
        _alone(node, "type", where)
        if not kind or not all(t in TYPES for t in kind):
            raise _bad(f"{where}.type", f"{json.dumps(kind)[:60]}: each must be a JSON type")
        return {"type": kind}
    if kind is not None and kind not in TYPES:
        raise _bad(f"{where}.type", f"{json.dumps(kind)[:40]}: not a JSON type")
    if kind == "integer" and any(b in node for b in BOUNDS):
        return _integer_range(node, where)
    if kind in (None, "object") and ("properties" in node or "additionalProperties" in node):
        return _object(node, where, depth)
    if kind in (None, "array") and ("items" in node or "prefixItems" in node):
        return _array(node, where, depth)
    if kind == "string":
        return _string(node, where)
    for key in node:
        if key != "type":
            raise _bad(f"{where}.{key}", _unenforced(key, kind))
    return node


def _unenforced(key: str, kind: object) -> str:
    shown = f" on a schema of type {kind}" if kind is not None else ""
    return f"is not enforced by the grammar{shown}, so a reply could break it"


def _alone(node: Schema, key: str, where: str) -> None:
    """``BadRequest`` for a keyword beside ``key`` that the converter would pass over."""
    for other in node:
        if other != key and not (other == "type" and key in ("enum", "const")):
            raise _bad(f"{where}.{other}", f"beside {key}: {_unenforced(other, None)}")


def _constants(node: Schema, key: str, where: str) -> Schema:
    _alone(node, key, where)
    values = node[key] if key == "enum" else [node[key]]
    if not isinstance(values, list) or not values:
        raise _bad(f"{where}.{key}", "must be a non-empty list of values")
    kind = node.get("type")
    if kind is not None:  # the converter writes the values as they are: each must be of the type
        for v in values:
            if not _of_type(v, kind):
                raise _bad(f"{where}.{key}", f"{json.dumps(v)[:40]} is not of type {kind}")
    return {key: node[key]}


def _of_type(value: object, kind: object) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    expected = _JSON_TYPES.get(str(kind))
    return expected is not None and isinstance(value, expected)


def _integer_range(node: Schema, where: str) -> Schema:
    """An integer between bounds as the ``enum`` of the range (the converter has no bounds)."""
    for key in node:
        if key not in ("type", *BOUNDS):
            raise _bad(f"{where}.{key}", _unenforced(key, "integer"))
    for key in BOUNDS:
        if key in node and not (isinstance(node[key], int) and not isinstance(node[key], bool)):
            raise _bad(f"{where}.{key}", "must be a whole number on an integer")
    low, high = node.get("minimum"), node.get("maximum")
    if "exclusiveMinimum" in node:
        low = (
            node["exclusiveMinimum"] + 1 if low is None else max(low, node["exclusiveMinimum"] + 1)
        )
    if "exclusiveMaximum" in node:
        high = (
            node["exclusiveMaximum"] - 1
            if high is None
            else min(high, node["exclusiveMaximum"] - 1)
        )
    if low is None or high is None:
        missing = "minimum" if low is None else "maximum"
        raise _bad(
            f"{where}.{'maximum' if low is None else 'minimum'}",
            f"an integer bounded on one side ({missing} is missing): the grammar enforces a range",
        )
    if high < low or high - low + 1 > MAX_ENUMERATED:
        raise _bad(
            f"{where}.maximum",
            f"an integer range of {max(high - low + 1, 0)} values: the grammar enumerates "
            f"1 to {MAX_ENUMERATED}",
        )
    return {"enum": list(range(low, high + 1))}


def _object(node: Schema, where: str, depth: int) -> Schema:
    for key in node:
        if key not in OBJECT_ONLY:
            raise _bad(f"{where}.{key}", _unenforced(key, "object"))
    props = node.get("properties", {})
    if not isinstance(props, dict):
        raise _bad(f"{where}.properties", "must be an object of schemas")
    required = node.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise _bad(f"{where}.required", "must be a list of property names")
    extra = node.get("additionalProperties", True)
    out: Schema = {"type": "object"}
    if props:
        for name in required:
            if name not in props:
                raise _bad(
                    f"{where}.required",
                    f"names {name!r}, which properties does not define",
                )
        out["properties"] = {
            n: prepared(s, f"{where}.properties.{n}", depth + 1) for n, s in props.items()
        }
        out["required"] = required
        out["additionalProperties"] = False  # generated documents keep to the declared keys
    elif required:
        raise _bad(f"{where}.required", "names properties, and properties defines none")
    elif extra is False:
        out["additionalProperties"] = False
    elif isinstance(extra, dict):
        out["additionalProperties"] = prepared(extra, f"{where}.additionalProperties", depth + 1)
    return out


def _array(node: Schema, where: str, depth: int) -> Schema:
    for key in node:
        if key not in ("type", "items", "prefixItems", "minItems", "maxItems"):
            raise _bad(f"{where}.{key}", _unenforced(key, "array"))
    items = node.get("items", node.get("prefixItems"))
    key = "items" if "items" in node else "prefixItems"
    if "items" in node and "prefixItems" in node:
        raise _bad(f"{where}.prefixItems", "beside items: give one of them")
    low, high = node.get("minItems", 0), node.get("maxItems")
    if isinstance(items, list):  # a tuple: exactly its items, which must fit the bounds
        if not low <= len(items) <= (len(items) if high is None else high):
            raise _bad(f"{where}.minItems", f"a tuple of {len(items)} items outside its bounds")
        return {
            "type": "array",
            "prefixItems": [
                prepared(s, f"{where}.{key}[{i}]", depth + 1) for i, s in enumerate(items)
            ],
        }
    out: Schema = {"type": "array", "items": prepared(items, f"{where}.{key}", depth + 1)}
    for bound in ("minItems", "maxItems"):
        if bound in node:
            if not (isinstance(node[bound], int) and node[bound] >= 0):
                raise _bad(f"{where}.{bound}", "must be a whole number of at least 0")
            out[bound] = node[bound]
    return out


def _string(node: Schema, where: str) -> Schema:
    for key in node:
        if key not in ("type", "minLength", "maxLength", "format"):
            raise _bad(f"{where}.{key}", _unenforced(key, "string"))
    if "format" in node:
        if node["format"] not in FORMATS:
            raise _bad(
                f"{where}.format",
                f"{json.dumps(node['format'])[:40]}: {_unenforced('format', 'string')}",
            )
        for key in ("minLength", "maxLength"):
            if key in node:
                raise _bad(f"{where}.{key}", "beside format: " + _unenforced(key, "string"))
        return {"type": "string", "format": node["format"]}
    out: Schema = {"type": "string"}
    for key in ("minLength", "maxLength"):
        if key in node:
            if not (isinstance(node[key], int) and node[key] >= 0):
                raise _bad(f"{where}.{key}", "must be a whole number of at least 0")
            out[key] = node[key]
    return out


def grammar_of(sampling: Mapping[str, object]) -> str | None:
    """The grammar a request's ``json_schema`` decodes under (None: free text); ``BadRequest``
    for the schema's keyword the grammar would not enforce, and for what would end the reply
    before its document is whole or hold it past its end: a ``stop`` string, ``min_tokens``."""
    schema = sampling.get("json_schema")
    if schema is None:
        return None
    if sampling.get("stop"):
        raise BadRequest.single(
            "request.sampling.stop",
            "beside response_format: a stop string could cut the JSON short",
            "leave stop out with response_format: the reply ends where its JSON does",
        )
    if int(str(sampling.get("min_tokens") or 0)) > 0:
        raise BadRequest.single(
            "request.sampling.min_tokens",
            "beside response_format: the grammar ends the reply where its JSON does, and "
            "min_tokens would hold it past there",
            "leave min_tokens out (0) with response_format",
        )
    return schema_grammar(schema, "request.sampling.json_schema")
