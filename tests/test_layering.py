"""Layering that a tool checks, beyond what ``lint-imports`` can say.

``lint-imports`` (run by scripts/test.sh, contracts in pyproject.toml) checks
who may import whom. Two rules it cannot express are checked here:

* no import cycle at all among the project's modules (import-linter has no
  acyclic contract for arbitrary modules; grimp, its graph library, gives the
  graph, and this file finds the cycles);
* an import inside a function or method is for a heavy or optional package
  only (the allow-list below, one reason per entry): a project module imported
  lazily hides a dependency from readers and from the layering check's
  reviewers, and usually papers over a cycle.

And one rule that keeps the layers contract honest: every module of the
orchestrator sits in one of its layers, so a new module cannot slip past it.

docs/architecture.md lists the contracts and this allow-list.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (the dev extra)")

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "stages", "exports")

LAZY_IMPORTS_ALLOWED: dict[str, str] = {
    # imported package (top-level name): why it may be imported inside a function
    "ray": "the runtime's cluster and actors; seconds to import, and plan/verify never need it",
    "vllm": "the ar_decode runner, inside a device actor only; 8-12 s to import",
    "llama_cpp": "the llama.cpp ar_decode runner (in a device actor) and the GGUF vocabulary the request check"
    " reads; loads its shared library and numpy, and planning reads GGUF headers itself",
    "torch": "the GGUF → safetensors conversion in the model cache, before an engine starts; the transformers runner",
    "transformers": "the same conversion, the tokenizer and the transformers runner (in a device actor); pulls torch",
    "onnxruntime": "sessions open only in gates, runners and route workers, never while planning",
    "onnx": "graph statistics, read once per graph file and memoised: a warm plan never imports it",
    "numpy": "arrays exist only where a session or a runner runs; planning must not pay ~0.1 s for it",
    "pynvml": "optional (the gpu extra): the GPU probe falls back to nvidia-smi without it",
    "espeakng_loader": "the Piper voice's phonemizer library, loaded when the hook runs, not when the artifact is read",
    "safetensors": "the Omni talker's own tensors, read when its stage loads (the run extra; planning reads headers itself)",
    "tokenizers": "the tiny Omni checkpoints' tokenizer, built once at set-up by exports/omni_tiny.py",
    "rich": "tables, progress bars and cell widths cost tens of ms to import; `plan --json` and the planning path draw none",
}
LAZY_IMPORTERS_ALLOWED: dict[str, str] = {
    # importing module (prefix): why its functions may import anything lazily
    "orchestrator.commands.": "cli.build_parser() imports every command module (import_module) to build its"
    " parser, so what a command needs only to run is imported inside run(): `omni-edge plan` must not pay"
    " for the runtime's, verify's or the renderer's modules",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_names(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:  # relative: resolve against the importing module's package
        package = module.split(".")[: -node.level]
        return [".".join([*package, node.module] if node.module else package)]
    return [node.module or ""]


def function_level_imports() -> list[tuple[str, int, str]]:
    """(module, line, imported) for every import statement inside a function or method."""
    found: list[tuple[str, int, str]] = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            module = _module_name(path)

            def walk(node: ast.AST, in_function: bool, module: str = module) -> None:
                for child in ast.iter_child_nodes(node):
                    if in_function and isinstance(child, ast.Import | ast.ImportFrom):
                        found.extend(
                            (module, child.lineno, name) for name in _imported_names(child, module)
                        )
                    walk(
                        child,
                        in_function
                        or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda),
                    )

            walk(ast.parse(path.read_text(), str(path)), False)
    return found


def _allowed(module: str, imported: str) -> bool:
    return imported.split(".")[0] in LAZY_IMPORTS_ALLOWED or any(
        module.startswith(prefix) for prefix in LAZY_IMPORTERS_ALLOWED
    )


def _named_module(arg: ast.expr, module: str) -> str | None:
    """The module (or, ending in ``.``, the prefix of modules) an ``import_module`` argument
    names: a string literal, or an f-string whose constant start names a project package
    (``f"orchestrator.commands.{name}"``; ``{__name__}`` is the calling module)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr):
        head = ""
        for part in arg.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                head += part.value
            elif (
                isinstance(part, ast.FormattedValue)
                and isinstance(part.value, ast.Name)
                and part.value.id == "__name__"
            ):
                head += module
            else:
                break
        return head if "." in head else None
    return None


def import_module_edges(modules: set[str]) -> dict[str, set[str]]:
    """The project modules each module loads by name (``import_module("...")``), which grimp
    does not see: a lazy import must not hide a cycle. An f-string prefix stands for every
    module under it."""
    edges: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            module = _module_name(path)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not (isinstance(node, ast.Call) and node.args):
                    continue
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name != "import_module":
                    continue
                named = _named_module(node.args[0], module)
                if named is None or named.split(".")[0] not in PACKAGES:
                    continue
                found = {
                    m
                    for m in modules
                    if m == named or (named.endswith(".") and m.startswith(named))
                }
                edges.setdefault(module, set()).update(found - {module})
    return edges


def import_cycles() -> list[list[str]]:
    """One cycle (a closed chain of direct imports, ``import_module`` by name included) per
    strongly connected group of modules."""
    graph = grimp.build_graph(*PACKAGES)
    by_name = import_module_edges(set(graph.modules))
    edges = {
        m: sorted(set(graph.find_modules_directly_imported_by(m)) | by_name.get(m, set()))
        for m in sorted(graph.modules)
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for m in edges:
        if m not in index:
            connect(m)
    cycles = []
    for group in sorted(groups):
        first, members = group[0], set(group)
        # the shortest way back to `first`, through the group only
        back = {first: [first]}
        frontier = [first]
        while frontier and first not in {w for v in frontier for w in edges[v]}:
            nxt = []
            for v in frontier:
                for w in edges[v]:
                    if w in members and w not in back:
                        back[w] = [*back[v], w]
                        nxt.append(w)
            frontier = nxt
        last = next(v for v in frontier if first in edges[v])
        cycles.append([*back[last], first])
    return cycles


def test_no_import_cycle_among_the_projects_modules() -> None:
    cycles = import_cycles()
    assert not cycles, (
        "import cycles (each a chain of direct imports, type-checking ones included):\n"
        + "\n".join("  " + " -> ".join(c) for c in cycles)
    )


def test_the_cycle_check_follows_modules_loaded_by_name() -> None:
    """``import_module`` with a literal or an f-string prefix counts as an import: a kind that
    loads its runner by name, and the CLI that loads every command, are edges of the graph."""
    graph = grimp.build_graph(*PACKAGES)
    edges = import_module_edges(set(graph.modules))
    assert "stages.token2wav.runner" in edges["stages.token2wav.kind"]
    assert "stages.asr.runner" in edges["stages.asr.kind"]
    assert "orchestrator.commands.plan" in edges["orchestrator.cli"]
    assert "orchestrator.server.app" in edges["orchestrator.server"]
    # the runner importing its kind back would close a cycle the check now reports
    assert graph.find_modules_directly_imported_by("stages.token2wav.runner").isdisjoint(
        {"stages.token2wav.kind"}
    )


def test_function_level_imports_are_for_heavy_packages_only() -> None:
    bad = [
        f"{m}:{line}: {imported}"
        for m, line, imported in function_level_imports()
        if not _allowed(m, imported)
    ]
    assert not bad, (
        f"{len(bad)} imports inside functions of modules the allow-list does not name "
        "(tests/test_layering.py LAZY_IMPORTS_ALLOWED; move them to the top of the module):\n  "
        + "\n  ".join(bad)
    )


def test_every_allowance_is_used() -> None:
    """A stale entry would let a new lazy import in unnoticed: the lists hold what the code needs."""
    found = function_level_imports()
    packages = {imported.split(".")[0] for _, _, imported in found}
    assert set(LAZY_IMPORTS_ALLOWED) - packages == set()
    assert all(any(m.startswith(prefix) for m, _, _ in found) for prefix in LAZY_IMPORTERS_ALLOWED)


def test_the_lazy_import_check_sees_what_it_should() -> None:
    """The walk finds imports in methods and nested functions, resolves relative ones, and skips
    module-level and class-level ones."""
    found = {(m, imported) for m, _, imported in function_level_imports()}
    assert ("orchestrator.runtime.cluster", "ray") in found  # in a function
    assert all(m.split(".")[0] in PACKAGES for m, _ in found)
    assert _allowed("stages.ar_decode.engines.vllm_runner", "vllm.engine.arg_utils")
    assert _allowed("orchestrator.commands.plan", "orchestrator.planner")
    assert not _allowed("orchestrator.api", "orchestrator.planner")
    tree = ast.parse("from .b import c\nfrom . import d\n")
    assert _imported_names(tree.body[0], "pkg.sub.a") == ["pkg.sub.b"]  # type: ignore[arg-type]
    assert _imported_names(tree.body[1], "pkg.sub.a") == ["pkg.sub"]  # type: ignore[arg-type]


def test_every_module_sits_in_a_layer() -> None:
    """A module is placed when it, or a package above it, is named in the layers contract."""
    tomllib = pytest.importorskip("tomllib", reason="platform: tomllib is Python 3.11+")
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in config["contracts"] if c["id"] == "layers"]
    placed = {name.strip() for layer in layers for name in layer.replace("|", ":").split(":")}
    graph = grimp.build_graph("orchestrator", "stages")
    unplaced = sorted(
        m
        for m in graph.modules
        if m not in ("orchestrator", "stages")
        and not any(m == p or m.startswith(p + ".") for p in placed)
        and not any(p.startswith(m + ".") for p in placed)  # a package whose children are placed
    )
    assert not unplaced, (
        "modules in no layer of the layers contract (pyproject.toml): " + ", ".join(unplaced)
    )
