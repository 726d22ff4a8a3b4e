"""Reading user input: YAML/JSON documents, strict models, and problems that say how to fix them.

:class:`Strict` is the one base of every model that reads user input — pipeline
and stage configs, hardware profiles, artifact manifests — so they all reject
unknown keys and freeze their values the same way; :func:`read_document` is the
one YAML/JSON reader; :func:`problems_from_validation` turns pydantic's errors
into where → what → how-to-fix problems. A validator that knows the remedy
raises :func:`refusal` (what and fix); :func:`unique` and :func:`printable`
are the checks several models share.
"""

from __future__ import annotations

import difflib
import json
import re
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticCustomError

from orchestrator.core.errors import ConfigError, Problem


class Strict(BaseModel):
    """Base of every input model: unknown keys are errors (never warnings), values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


REFUSAL = "omni_edge_refusal"
"""The pydantic error type of :func:`refusal`: its message is the what, its context's ``fix`` the remedy."""

CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""C0 controls (newline and tab too), DEL and the C1 controls: what a terminal may act on
(ESC starts an escape sequence, 0x9b is a one-byte CSI) rather than print."""


def refusal(what: str, fix: str) -> PydanticCustomError:
    """A validator's error with its own remedy: raise it, and :func:`problems_from_validation`
    prints ``what`` at the field and ``fix`` as the how-to-fix line."""
    return PydanticCustomError(REFUSAL, "{what}", {"what": what, "fix": fix})


def shown(value: str, limit: int = 40) -> str:
    """``value`` for an error message: ``repr`` (control characters escaped), cut in the middle
    past ``limit`` characters, with its length when cut."""
    text = repr(value)
    return (
        text
        if len(text) <= limit
        else f"{text[: limit - 12]}…{text[-8:]} ({len(value)} characters)"
    )


def unique(values: Sequence[str], what: str) -> None:
    """``refusal`` naming the first value listed more than once (``what``: the items' noun)."""
    seen: set[str] = set()
    for v in values:
        if v in seen:
            raise refusal(
                f"{v} is listed more than once ({', '.join(values)})",
                f"list each {what} once, in preference order",
            )
        seen.add(v)


def printable(value: str, max_length: int) -> str:
    """``value`` when it holds no control character and at most ``max_length`` characters;
    else a ``refusal`` (names are printed in tables and messages, on terminals)."""
    if CONTROL_CHARACTERS.search(value):
        raise refusal(
            f"{shown(value)} holds a control character, and names are printed on terminals",
            "remove the control characters (escape sequences, newlines, tabs)",
        )
    if len(value) > max_length:
        raise refusal(
            f"{shown(value)} is longer than {max_length} characters, and names are printed in every table",
            f"shorten it to at most {max_length} characters",
        )
    return value


def read_document(path: str | Path) -> Any:
    """Read a YAML or JSON file; syntax errors become ``ConfigError`` with a line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError.single(str(p), "file not found", "check the path") from None
    except IsADirectoryError:
        raise ConfigError.single(
            str(p), "this is a directory, not a file", "pass the YAML or JSON file itself"
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError.single(
            f"{p}: byte {exc.start}", "the file is not UTF-8 text", "save it as UTF-8 YAML or JSON"
        ) from None
    except OSError as exc:
        raise ConfigError.single(
            str(p),
            f"cannot read: {exc.strerror or exc}",
            "make the file readable, or pass another one",
        ) from None
    if p.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError.single(
                f"{p}:{exc.lineno}:{exc.colno}", f"not valid JSON: {exc.msg}", "fix the JSON syntax"
            ) from None
        except RecursionError:
            raise ConfigError.single(
                str(p), "the JSON is nested too deeply", "flatten the document"
            ) from None
    try:
        # libyaml's loader when PyYAML was built with it (the PyPI wheels are): the
        # pure-Python one took most of a warm re-plan's time on the 40-line default config.
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark else str(p)
        what = getattr(exc, "problem", None) or str(exc)
        raise ConfigError.single(
            where, f"not valid YAML: {what}", "fix the YAML syntax (indentation, colons, quotes)"
        ) from None
    except RecursionError:
        raise ConfigError.single(
            str(p), "the YAML is nested too deeply", "flatten the document"
        ) from None


def _loc(parts: tuple[object, ...]) -> str:
    """A pydantic location as a path (``stages[0].restart.max``); a union's tags (``~policy``:
    which member was validated) are no part of the user's document and are left out."""
    out = ""
    for part in parts:
        if isinstance(part, str) and part.startswith("~"):
            continue
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
        elif kind == REFUSAL:
            ctx = err.get("ctx") or {}
            problems.append(
                Problem(place, str(ctx.get("what", err["msg"])), str(ctx.get("fix", "")))
            )
        else:
            msg = err["msg"]
            if kind == "value_error" and msg.startswith("Value error, "):
                msg = msg[len("Value error, ") :]
            given = err.get("input")
            if kind not in ("value_error", "assertion_error") and not isinstance(
                given, (dict, list)
            ):
                shown = repr(given)
                msg = f"{msg} (got {shown if len(shown) <= 80 else shown[:60] + '…' + shown[-8:]})"
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
    if kind in ("value_error", "assertion_error"):
        return "change the values the message names"
    if kind.startswith(
        ("int_", "float_", "bool_", "string_", "list_", "dict_", "model_", "literal_")
    ):
        return "give the field a value of the type and form the format documents"
    return "correct this value (see the format's documentation)"


def _known_fields(model: type[BaseModel] | None, loc: tuple[object, ...]) -> list[str]:
    """Field names valid at ``loc`` inside ``model``, following nested models."""
    current: object = model
    for part in loc:
        if isinstance(part, int) or (isinstance(part, str) and part.startswith("~")):
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        current = _model_of(fields[part].annotation)
    fields = getattr(current, "model_fields", None)
    return list(fields) if fields else []


def _model_of(annotation: object) -> object:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None
