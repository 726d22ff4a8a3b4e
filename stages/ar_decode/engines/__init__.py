"""The decode engines by name: one module per engine, registered by its row's name.

The engine table (``orchestrator.core.engines``) names each engine and its backends; an engine
whose module is ``stages.ar_decode.engines.<name>`` is loaded from there (its ``ENGINE``, a
:class:`~stages.ar_decode.engines.base.DecodeEngine`), in the table's order. An engine that
lives elsewhere — another distribution's, a test's — is :func:`register`-ed after its row.

:data:`ENGINES` is the registry the ``ar_decode`` kind holds: the kind is what the runtime hands
each device actor, so the engines registered in the caller's process (their objects, their rows)
travel with it and run there too.
"""

from __future__ import annotations

import importlib.util
from importlib import import_module

from orchestrator.core import engines as table
from stages.ar_decode.engines.base import DecodeEngine


def _built_in() -> dict[str, DecodeEngine]:
    """The engines of the table's rows that have a module here, in the table's order."""
    found: dict[str, DecodeEngine] = {}
    for row in table.rows():
        module = f"{__name__}.{row.engine}"
        if importlib.util.find_spec(module) is None:
            continue
        engine = import_module(module).ENGINE
        if not isinstance(engine, DecodeEngine) or engine.name != row.engine:
            raise TypeError(f"{module}.ENGINE is not the DecodeEngine named {row.engine!r}")
        found[row.engine] = engine
    return found


ENGINES: dict[str, DecodeEngine] = _built_in()
"""Engine name → engine, in the order a plain decoder tries them."""


def register(engine: DecodeEngine) -> None:
    """Add an engine whose row the table has (``orchestrator.core.engines.register``) and whose
    module is not here. Its name must be new."""
    if engine.name in ENGINES:
        raise ValueError(f"decode engine {engine.name!r} is registered already")
    ENGINES[engine.name] = engine


def unregister(name: str) -> None:
    """Remove a registered engine (a test's, when it is done)."""
    ENGINES.pop(name, None)


def engine_for(backend: str, engines: dict[str, DecodeEngine] | None = None) -> DecodeEngine:
    """The engine that runs ``backend`` (one of its backends, or the engine's own name) among
    ``engines`` (default: :data:`ENGINES`); ``LookupError`` naming the backends there are."""
    engines = ENGINES if engines is None else engines
    for engine in engines.values():
        if backend in engine.backends or backend == engine.name:
            return engine
    known = ", ".join(b for e in engines.values() for b in e.backends)
    raise LookupError(f"no decode engine runs backend {backend!r} (there are {known})")
