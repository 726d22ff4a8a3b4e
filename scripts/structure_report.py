"""The structure figures docs/architecture.md quotes, measured on this checkout.

    python scripts/structure_report.py          # the table
    python scripts/structure_report.py --json   # the same figures as JSON

Counts, over the shipped packages (orchestrator/, stages/, exports/): modules over 800
lines, classes over 400 lines and functions over 80 lines (orchestrator/ and stages/,
measured with the AST after ``ruff format``, docstrings included), the ``dict[str, Any]``
annotations, apart from them the ``JsonObject`` ones (``orchestrator/core/documents.py``: a
JSON document on its way out of the program, an alias of ``dict[str, Any]`` counted on its
own so neither figure hides the other), the import cycles among the project's modules,
modules loaded by name (``import_module``) included (``tests/test_layering.py``'s check, which
CI runs), and the files a newcomer touches to add a decode engine or an execution provider:
the ones the recipe names (docs/architecture.md, "Extension points"), plus every module that
still names an engine or an EP outside its table (the scans of
``tests/stages/ar_decode/test_engines.py`` and ``tests/orchestrator/core/test_new_ep.py``).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ("orchestrator", "stages", "exports")
MODULE_LINES, CLASS_LINES, FUNCTION_LINES = 800, 400, 80
JSON_ALIAS_MODULE = "orchestrator/core/documents.py"
"""Where ``JsonObject`` is defined (its own lines are not uses of it)."""


def _files(packages: tuple[str, ...]) -> list[Path]:
    return sorted(p for pkg in packages for p in (REPO / pkg).rglob("*.py"))


NEW_ENGINE = (
    "orchestrator/core/engines.py: the engine's row",
    "stages/ar_decode/engines/<engine>.py: its DecodeEngine and runner",
)
NEW_EP = (
    "orchestrator/core/backends.py: the EP's row",
    "orchestrator/ort/worker_probe.py: its own build, if any (the route's copy)",
    "pyproject.toml: the extra that installs that build, if any",
)


def new_engine_files() -> list[str]:
    """What a new decode engine touches: its row and its module, and each module that once
    branched on an engine's name and still names one."""
    from orchestrator.core import engines
    from tests.stages.ar_decode.test_engines import GENERIC, _literals

    names = [*engines.backend_names(), "vllm", "llamacpp", "llama_cpp", "llama-cpp"]
    naming = {m for m in GENERIC for _, v in _literals(REPO / m) if any(n in v for n in names)}
    return [*NEW_ENGINE, *sorted(naming)]


def new_ep_files() -> list[str]:
    """What a new execution provider touches: its row (and, as the case may be, the route
    program's copy of the builds and its extra), and each module outside the table that names
    an EP."""
    from tests.orchestrator.core.test_new_ep import names_of_an_ep

    return [*NEW_EP, *sorted({hit.split(":", 1)[0] for hit in names_of_an_ep()})]


def measure() -> dict[str, object]:
    modules, classes, functions = [], [], []
    dicts = documents = 0
    for path in _files(SHIPPED):
        text = path.read_text(encoding="utf-8")
        rel = str(path.relative_to(REPO))
        lines = text.count("\n")
        dicts += len(re.findall(r"dict\[str, Any\]", text))
        if rel != JSON_ALIAS_MODULE:
            documents += sum(
                len(re.findall(r"\bJsonObject\b", line))
                for line in text.splitlines()
                if not line.lstrip().startswith(("from ", "import "))
            )
        if lines > MODULE_LINES:
            modules.append((rel, lines))
        if not rel.startswith(("orchestrator/", "stages/")):
            continue
        for node in ast.walk(ast.parse(text)):
            size = (
                (node.end_lineno or node.lineno) - node.lineno + 1 if hasattr(node, "lineno") else 0
            )
            if isinstance(node, ast.ClassDef) and size > CLASS_LINES:
                classes.append((f"{rel}:{node.name}", size))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and size > FUNCTION_LINES:
                functions.append((f"{rel}:{node.name}", size))
    sys.path.insert(0, str(REPO))
    from tests.test_layering import import_cycles

    return {
        "modules_over_800_lines": sorted(modules, key=lambda m: -m[1]),
        "classes_over_400_lines": sorted(classes, key=lambda c: -c[1]),
        "functions_over_80_lines": sorted(functions, key=lambda f: -f[1]),
        "dict_str_any": dicts,
        "json_object": documents,
        "import_cycles": [" -> ".join(c) for c in import_cycles()],
        "files_for_a_new_decode_engine": new_engine_files(),
        "files_for_a_new_execution_provider": new_ep_files(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    figures = measure()
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    for key in ("modules_over_800_lines", "classes_over_400_lines", "functions_over_80_lines"):
        rows = figures[key]
        assert isinstance(rows, list)
        print(f"{key.replace('_', ' ')}: {len(rows)}")
        for name, size in rows:
            print(f"  {name} ({size})")
    print(f"dict[str, Any] annotations: {figures['dict_str_any']}")
    print(f"JsonObject annotations (documents leaving the program): {figures['json_object']}")
    cycles = figures["import_cycles"]
    assert isinstance(cycles, list)
    print(f"import cycles (lazy ones included): {len(cycles)}")
    for c in cycles:
        print(f"  {c}")
    for key in ("files_for_a_new_decode_engine", "files_for_a_new_execution_provider"):
        touched = figures[key]
        assert isinstance(touched, list)
        print(f"{key.replace('_', ' ')}: {len(touched)}")
        for name in touched:
            print(f"  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
