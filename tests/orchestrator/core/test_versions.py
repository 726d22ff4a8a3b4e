"""One helper reads a package's version (``orchestrator.core.packages.installed_version``):
the route program's stdlib-only copy answers as it does, and no other module looks a
version up by name."""

from __future__ import annotations

import ast

import pytest

from orchestrator.core import packages
from orchestrator.ort import worker_probe
from tests.helpers import REPO

HELPERS = {"orchestrator/core/packages.py", "orchestrator/ort/worker_probe.py"}
"""The helper and the route program's copy of it."""
LOOKUPS = {"version", "distribution", "distributions", "PackageNotFoundError"}
"""What ``importlib.metadata`` looks a distribution up with."""


@pytest.mark.parametrize("name", ["pydantic", "PyYAML", "omni-edge", "no-such-distribution-x"])
def test_the_route_programs_copy_answers_as_the_helper(name: str) -> None:
    assert worker_probe.installed_version(name) == packages.installed_version(name)


def test_the_helper_tells_installed_from_missing() -> None:
    import pydantic

    assert packages.installed_version("pydantic") == pydantic.VERSION
    assert packages.installed_version("no-such-distribution-x") is None
    assert packages.first_installed(["no-such-distribution-x", "pydantic", "PyYAML"]) == (
        "pydantic",
        pydantic.VERSION,
    )
    assert packages.first_installed(["no-such-distribution-x"]) is None


def _lookups(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a module looks a distribution up through ``importlib.metadata``: an import of
    one of :data:`LOOKUPS` from it, or an attribute of it (``metadata.version``)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "importlib.metadata":
            out += [(node.lineno, a.name) for a in node.names if a.name in LOOKUPS]
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in LOOKUPS
            and ast.unparse(node.value) in ("metadata", "importlib.metadata")
        ):
            out.append((node.lineno, ast.unparse(node)))
    return out


def test_no_other_module_looks_a_version_up() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line}: {what}"
        for package in ("orchestrator", "stages", "exports")
        for path in sorted((REPO / package).rglob("*.py"))
        if str(path.relative_to(REPO)) not in HELPERS
        for line, what in _lookups(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert found == []


def test_the_scan_sees_a_lookup() -> None:
    tree = ast.parse(
        "from importlib import metadata\nfrom importlib.metadata import version\n"
        "import importlib.metadata\n"
        "a = metadata.version('x')\nb = importlib.metadata.distribution('y')\n"
    )
    assert [w for _, w in _lookups(tree)] == [
        "version",
        "metadata.version",
        "importlib.metadata.distribution",
    ]
