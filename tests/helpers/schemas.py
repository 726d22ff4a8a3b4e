"""JSON schemas held in for structured output's tests: nested objects, enums and constants,
arrays and numbers with bounds, definitions, references and unions — each within what
``stages.ar_decode.json_grammar`` enforces, so a reply decoded under its grammar validates."""

from __future__ import annotations

from typing import Any

HELD_IN_SCHEMAS: list[dict[str, Any]] = [
    # nested objects, integers with bounds
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "at": {
                "type": "object",
                "properties": {
                    "lat": {"type": "integer", "minimum": -90, "maximum": 90},
                    "lon": {"type": "integer", "exclusiveMinimum": -91, "exclusiveMaximum": 91},
                },
                "required": ["lat", "lon"],
            },
        },
        "required": ["city", "at"],
    },
    # enums, booleans, constants
    {
        "type": "object",
        "properties": {
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "raining": {"type": "boolean"},
            "kind": {"const": "forecast"},
        },
        "required": ["unit", "raining", "kind"],
    },
    # arrays with bounds, numbers
    {
        "type": "object",
        "properties": {
            "tags": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": 8},
                "minItems": 1,
                "maxItems": 3,
            },
            "score": {"type": "number"},
            "pair": {
                "type": "array",
                "prefixItems": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "null"}],
            },
        },
        "required": ["tags", "score", "pair"],
    },
    # definitions, references, unions
    {
        "$defs": {
            "step": {
                "type": "object",
                "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 5}},
                "required": ["n"],
            }
        },
        "type": "object",
        "properties": {
            "first": {"$ref": "#/$defs/step"},
            "maybe": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/step"}]},
            "note": {"type": ["string", "null"]},
        },
        "required": ["first", "maybe"],
    },
]
"""Every string bounded, every array bounded, every optional property absent from none: a
document of each schema is at most ~200 tokens (a character is at most 6 tokens, ``\\u0041``),
so a reply under its grammar given 400 tokens ends by construction — with the document whole.
The last one's ``note`` is unbounded on purpose: it is optional, so only "stop" is checked."""
