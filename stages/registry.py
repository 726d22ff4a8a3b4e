"""Stage kinds by name: the built-ins, then the ``omni_edge.stage_kinds`` entry points.

Plugins are loaded lazily and one at a time: the first lookup of a name that
is not built in loads only the entry point of that name, so a broken plugin
matters only when its kind is asked for (or when everything is listed, as
``omni-edge stages`` does). Each load is logged with the entry point's
``name → module:attr`` and the distribution that offers it; a plugin that
fails to load is reported by name — which entry point, which distribution,
the exception in one line — as a ``ConfigError``, never swallowed, and the
failure is remembered (:func:`plugin_failures`).

Hooks (``omni_edge.hooks``, loaded by ``stages.exported_graph.artifact`` when a
manifest names one) are listed here too, with their distribution, and
:func:`survey` tries loading them so that a broken one is reported by name.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from importlib import import_module
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from orchestrator.core.errors import ConfigError
from stages.base import StageKind

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "omni_edge.stage_kinds"
HOOKS_GROUP = "omni_edge.hooks"
"""The hooks' entry-point group (the same name as ``stages.exported_graph.artifact``'s)."""
BUILT_IN = "built in"
REGISTERED = "registered"
_BUILTIN = {
    "ar_decode": "stages.ar_decode.kind:ArDecodeKind",
    "exported_graph": "stages.exported_graph.kind:ExportedGraphKind",
    "asr": "stages.asr.kind:AsrKind",
    "vad": "stages.vad.kind:VadKind",
    "token2wav": "stages.token2wav.kind:Token2WavKind",
}
_kinds: dict[str, StageKind] = {}
_origins: dict[str, KindOrigin] = {}


@dataclass(frozen=True)
class KindOrigin:
    """Where a kind came from: built in, ``register()``-ed, or an entry point of a distribution."""

    source: str
    """``built in``, ``registered``, or ``entry point``."""
    target: str
    """``module:attr``."""
    distribution: str | None = None
    """``name version`` of the distribution that offers the entry point."""

    def describe(self) -> str:
        if self.distribution:
            return f"{self.distribution} (entry point)"
        return self.source


@dataclass(frozen=True)
class PluginFailure:
    """An entry point that could not be loaded: which one, from which distribution, why."""

    group: str
    name: str
    target: str
    distribution: str
    error: str
    """The exception in one line: ``Type: message``."""

    def what(self) -> str:
        return (
            f"the plugin {self.group}:{self.name} = {self.target} (from {self.distribution}) "
            f"failed to load: {self.error}"
        )

    def to_dict(self) -> dict[str, str]:
        return {
            "group": self.group,
            "name": self.name,
            "target": self.target,
            "distribution": self.distribution,
            "error": self.error,
        }


_failures: dict[tuple[str, str], PluginFailure] = {}


def _distribution(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "an unknown distribution"
    return f"{dist.name} {dist.version}"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _failure_error(failure: PluginFailure) -> ConfigError:
    return ConfigError.single(
        f"entry point {failure.group}:{failure.name}",
        failure.what(),
        f"fix or uninstall the distribution {failure.distribution.split(' ')[0]} "
        f"(pip uninstall {failure.distribution.split(' ')[0]}), or install what it needs",
    )


def load_entry_point(ep: EntryPoint, group: str) -> Any:
    """Load one entry point, logged; a failure is remembered and raised as ``ConfigError``."""
    dist = _distribution(ep)
    key = (group, ep.name)
    if key in _failures:
        raise _failure_error(_failures[key])
    log.info(
        "loading %s %r from %s (%s)",
        "stage kind" if group == ENTRY_POINT_GROUP else "hook",
        ep.name,
        ep.value,
        dist,
    )
    try:
        return ep.load()
    except Exception as exc:
        failure = PluginFailure(group, ep.name, ep.value, dist, _one_line(exc))
        _failures[key] = failure
        log.info("%s", failure.what())
        raise _failure_error(failure) from exc


def _load_builtin(name: str) -> StageKind:
    target = _BUILTIN[name]
    module, _, attr = target.partition(":")
    log.debug("loading built-in stage kind %r from %s", name, target)
    kind: StageKind = getattr(import_module(module), attr)()
    _origins[name] = KindOrigin(BUILT_IN, target)
    return kind


def _load_plugin(ep: EntryPoint) -> StageKind:
    obj = load_entry_point(ep, ENTRY_POINT_GROUP)
    problem = None
    kind: Any = None
    try:
        kind = obj() if isinstance(obj, type) else obj
    except Exception as exc:
        problem = f"instantiating it raised {_one_line(exc)}"
    if problem is None and not isinstance(kind, StageKind):
        problem = f"TypeError: it is a {type(kind).__name__}, not a stages.base.StageKind"
    if problem is None and getattr(kind, "kind", None) != ep.name:
        problem = f"ValueError: the entry point is named {ep.name!r} but the class says kind = {getattr(kind, 'kind', None)!r}"
    if problem is not None:
        failure = PluginFailure(ENTRY_POINT_GROUP, ep.name, ep.value, _distribution(ep), problem)
        _failures[(ENTRY_POINT_GROUP, ep.name)] = failure
        log.info("%s", failure.what())
        raise _failure_error(failure)
    _origins[ep.name] = KindOrigin("entry point", ep.value, _distribution(ep))
    return kind


def _entry_points(group: str, name: str | None = None) -> list[EntryPoint]:
    eps = entry_points(group=group) if name is None else entry_points(group=group, name=name)
    return sorted(eps, key=lambda ep: (ep.name, _distribution(ep)))


def register(kind: StageKind) -> None:
    """Register a kind instance under its ``kind`` name (tests, embedding apps)."""
    _kinds[kind.kind] = kind
    cls = type(kind)
    _origins[kind.kind] = KindOrigin(REGISTERED, f"{cls.__module__}:{cls.__name__}")


def get_kind(name: str) -> StageKind:
    """The kind registered as ``name``; ``KeyError`` when there is none.

    ``ConfigError`` (naming the entry point, its distribution and the error)
    when the plugin that offers ``name`` fails to load. Only that plugin is
    loaded: other plugins, broken or not, are not touched.
    """
    if name in _kinds:
        return _kinds[name]
    if name in _BUILTIN:
        _kinds[name] = _load_builtin(name)
        return _kinds[name]
    offered = _entry_points(ENTRY_POINT_GROUP, name)
    if not offered:
        raise KeyError(name)
    if len(offered) > 1:
        log.warning(
            "stage kind %r is offered by %s; using %s's",
            name,
            " and ".join(_distribution(ep) for ep in offered),
            _distribution(offered[0]),
        )
    _kinds[name] = _load_plugin(offered[0])
    return _kinds[name]


def origin(name: str) -> KindOrigin | None:
    """Where the loaded kind ``name`` came from (None until it is loaded)."""
    return _origins.get(name)


def known_kinds() -> list[str]:
    """Names of every kind available: built-in, registered, or offered by a plugin."""
    offered = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted({*_BUILTIN, *_kinds, *offered})


def plugin_failures() -> list[PluginFailure]:
    """The entry points that failed to load in this process so far."""
    return list(_failures.values())


@dataclass(frozen=True)
class HookInfo:
    name: str
    target: str
    distribution: str


@dataclass
class Survey:
    """Every kind and hook there is, each loaded once (``omni-edge stages``)."""

    kinds: dict[str, StageKind] = field(default_factory=dict)
    hooks: list[HookInfo] = field(default_factory=list)
    failures: list[PluginFailure] = field(default_factory=list)


def survey(*, load_hooks: bool = True) -> Survey:
    """Load every kind (built in, registered, each entry point) and, with
    ``load_hooks``, every hook entry point; failures are collected, not raised."""
    out = Survey()
    for name in known_kinds():
        with contextlib.suppress(ConfigError):  # collected in _failures
            out.kinds[name] = get_kind(name)
    for ep in _entry_points(HOOKS_GROUP):
        if load_hooks:
            try:
                load_entry_point(ep, HOOKS_GROUP)
            except ConfigError:
                continue
        out.hooks.append(HookInfo(ep.name, ep.value, _distribution(ep)))
    out.failures = sorted(_failures.values(), key=lambda f: (f.group, f.name))
    return out
