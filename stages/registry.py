"""Stage kinds by name: the built-ins, then the ``omni_edge.stage_kinds`` entry points.

Plugins are loaded lazily (on the first lookup of an unknown name), each load
is logged, and a plugin that fails to load is reported with its error, never
swallowed.
"""

from __future__ import annotations

import logging
from importlib import import_module
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from stages.base import StageKind

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "omni_edge.stage_kinds"
_BUILTIN = {
    "ar_decode": "stages.ar_decode.kind:ArDecodeKind",
    "exported_graph": "stages.exported_graph.kind:ExportedGraphKind",
    "asr": "stages.asr.kind:AsrKind",
    "vad": "stages.vad.kind:VadKind",
}
_kinds: dict[str, StageKind] = {}
_plugins_loaded = False


def _load(target: str) -> StageKind:
    module, _, attr = target.partition(":")
    cls = getattr(import_module(module), attr)
    kind: StageKind = cls()
    return kind


def register(kind: StageKind) -> None:
    """Register a kind instance under its ``kind`` name (tests, embedding apps)."""
    _kinds[kind.kind] = kind


def _load_plugins() -> None:
    global _plugins_loaded
    _plugins_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _kinds or ep.name in _BUILTIN:
            continue
        log.info("loading stage kind %r from %s", ep.name, ep.value)
        try:
            obj = ep.load()
            _kinds[ep.name] = obj() if isinstance(obj, type) else obj
        except Exception as exc:
            raise ConfigError.single(
                f"entry point {ENTRY_POINT_GROUP}:{ep.name}",
                f"the stage kind plugin {ep.value} failed to load: {type(exc).__name__}: {exc}",
                "fix or uninstall the plugin package",
            ) from exc


def get_kind(name: str) -> StageKind:
    """The kind registered as ``name``; ``KeyError`` when there is none."""
    if name in _kinds:
        return _kinds[name]
    if name in _BUILTIN:
        _kinds[name] = _load(_BUILTIN[name])
        return _kinds[name]
    if not _plugins_loaded:
        _load_plugins()
        if name in _kinds:
            return _kinds[name]
    raise KeyError(name)


def known_kinds() -> list[str]:
    """Names of every kind available: built-in, registered, or offered by a plugin."""
    offered = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted({*_BUILTIN, *_kinds, *offered})
