"""Turn pydantic's errors into where → what → how-to-fix problems."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator.errors import Problem


def _loc(parts: tuple[object, ...]) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def problems_from_validation(
    exc: ValidationError, where: str, model: type[BaseModel] | None = None
) -> list[Problem]:
    """One ``Problem`` per pydantic error, with a suggestion for unknown keys."""
    problems = []
    for err in exc.errors():
        loc = _loc(tuple(err["loc"]))
        # ``where`` is a file, or a file plus a path inside it ("p.yaml: stages[0]")
        sep = "." if ": " in where else ": "
        place = f"{where}{sep}{loc}" if loc else where
        kind = err["type"]
        if kind == "extra_forbidden":
            key = str(err["loc"][-1]) if err["loc"] else "?"
            fix = "remove it"
            known = _known_fields(model, err["loc"][:-1]) if model else []
            close = difflib.get_close_matches(key, known, n=1)
            if close:
                fix = f"did you mean {close[0]!r}? (or remove it)"
            elif known:
                fix = f"remove it; allowed here: {', '.join(sorted(known))}"
            problems.append(Problem(place, f"unknown key {key!r}", fix))
        elif kind == "missing":
            problems.append(Problem(place, "required field is missing", "add it"))
        else:
            msg = err["msg"]
            given = err.get("input")
            if kind not in ("value_error", "assertion_error") and not isinstance(given, (dict, list)):
                msg = f"{msg} (got {given!r})"
            problems.append(Problem(place, msg, _fix_for(kind, err)))
    return problems


def _fix_for(kind: str, err: Any) -> str:
    ctx = err.get("ctx") or {}
    if kind == "literal_error":
        return f"use one of {ctx.get('expected', '')}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        return "change the value to fit the limit"
    if kind == "string_pattern_mismatch":
        return f"match the pattern {ctx.get('pattern', '')}"
    return ""


def _known_fields(model: type[BaseModel] | None, loc: tuple[object, ...]) -> list[str]:
    """Field names valid at ``loc`` inside ``model``, following nested models."""
    current: object = model
    for part in loc:
        if isinstance(part, int):
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        current = _model_of(fields[part].annotation)
    fields = getattr(current, "model_fields", None)
    return list(fields) if fields else []


def _model_of(annotation: object) -> object:
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None
