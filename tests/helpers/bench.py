"""A script of ``bench/`` loaded as a module, for tests of its report (no run)."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from tests.helpers import REPO


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` as the module ``bench_<name>``."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
