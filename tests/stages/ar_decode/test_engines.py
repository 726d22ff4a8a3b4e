"""Decode engines are one family with one table: the engine table (``orchestrator.core.engines``,
what the layers below the stage kinds read) and the engine modules (``stages.ar_decode.engines``,
planning and the runner) name the same engines, and the generic code asks them instead of naming
one."""

from __future__ import annotations

import ast
from pathlib import Path

from orchestrator.core import engines as table
from stages.ar_decode.engines import ENGINES, engine_for
from stages.ar_decode.engines.base import DecodeEngine
from stages.registry import get_kind
from tests.helpers import REPO

GENERIC = (
    "orchestrator/core/profile.py",
    "orchestrator/ort/worker.py",
    "orchestrator/ort/routes.py",
    "orchestrator/ort/sessions.py",
    "orchestrator/probe/__init__.py",
    "orchestrator/probe/engines.py",
    "orchestrator/planner.py",
    "orchestrator/calibration.py",
    "orchestrator/runtime/record.py",
    "orchestrator/commands/probe.py",
    "stages/ar_decode/kind.py",
    "stages/ar_decode/config.py",
    "stages/ar_decode/prompt.py",
    "stages/ar_decode/engines/__init__.py",
)
"""The modules that once branched on an engine's name (the probe's offers, the worker's
question, the planner's refusals, calibration's version, the record's versions, the kind's
planning and runner choice) and now ask the table or the engine."""
BUILD_RECORD = "llama_cpp"
"""The profile's field for a route's recorded engine build (``Route.llama_cpp``, a
``LlamaCppBuild``): a name of the profile's contract, which the probe writes."""


def test_the_table_and_the_engine_modules_name_the_same_engines() -> None:
    assert list(ENGINES) == [r.engine for r in table.rows()]
    for row in table.rows():
        engine = ENGINES[row.engine]
        assert isinstance(engine, DecodeEngine) and engine.row == row
        assert engine.backends == row.backend_names
        assert {r.backend for r in engine.format_rules} <= set(row.backend_names), row.engine
        assert set(engine.default_for) <= {"gguf", "checkpoint"}, row.engine
        for backend in row.backend_names:
            assert engine_for(backend) is engine


def test_the_kind_offers_every_engines_backends_in_the_tables_order() -> None:
    kind = get_kind("ar_decode")
    assert kind.backends == table.backend_names()
    assert kind.backends == (
        "llamacpp-cpu",
        "llamacpp-vulkan",
        "vllm-cuda",
        "vllm-cpu",
        "transformers-cuda",
        "transformers-cpu",
    )


def _literals(path: Path) -> list[tuple[int, str]]:
    """Every string constant of ``path`` but docstrings (f-strings' constant parts included),
    the profile's build record (its class and its field) and that field's name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = set()
    for node in ast.walk(tree):
        record = (isinstance(node, ast.ClassDef) and node.name == "LlamaCppBuild") or (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == BUILD_RECORD
        )
        if record:
            docstrings |= {id(n) for n in ast.walk(node)}
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            # a docstring, and the string that documents an assignment (the attribute docstring)
            for i, stmt in enumerate(body):
                if (
                    isinstance(stmt, ast.Expr)
                    and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)
                    and (i == 0 or isinstance(body[i - 1], ast.Assign | ast.AnnAssign))
                ):
                    docstrings.add(id(stmt.value))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and node.value != BUILD_RECORD
    ]


def test_no_generic_module_names_an_engine_or_its_backends() -> None:
    names = [*table.backend_names(), "vllm", "llamacpp", "llama_cpp", "llama-cpp"]
    found = [
        f"{module}:{line}: {value!r}"
        for module in GENERIC
        for line, value in _literals(REPO / module)
        if any(name in value for name in names)
    ]
    assert found == []


def test_an_engines_own_name_stands_for_its_backends() -> None:
    """A plan may name the engine itself as its backend (``vllm``): it is the engine's."""
    assert engine_for("vllm") is ENGINES["vllm"]
    assert get_kind("ar_decode").engine("vllm") is ENGINES["vllm"]
