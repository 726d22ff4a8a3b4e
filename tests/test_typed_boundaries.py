"""What crosses a process is typed, and generic code asks a stage kind what it is instead of
naming it (docs/architecture.md, "Records that cross a process" and "The stage-kind
interface"). Read from the code, without running it:

* every method a Ray actor serves (``DeviceActor``, ``LedgerService``), every function a
  remote task runs, and the runner and kind interface in ``stages/base.py`` that the device
  actor reads, are annotated without ``Any`` in their parameters or answers;
* no module of ``orchestrator/`` compares a stage's ``kind`` with a built-in kind's name
  (``s.kind == "ar_decode"``): the vLLM-Omni importer alone maps upstream stages onto
  kinds by name, which is what it is for.
"""

from __future__ import annotations

import ast
import inspect
import typing
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.helpers import REPO

BUILTIN_KINDS = {"ar_decode", "exported_graph", "vad", "asr", "token2wav"}
NAMES_KINDS_BY_DESIGN = ("orchestrator/importers/",)
"""The vLLM-Omni importer turns upstream stage entries into kinds: naming them is its job."""


def _annotation_namespace() -> dict[str, Any]:
    """The names the modules import for annotations only (``TYPE_CHECKING``)."""
    import numpy as np
    from ray import ObjectRef, ObjectRefGenerator
    from ray.actor import ActorHandle

    from orchestrator.core.plan import StagePlan
    from orchestrator.core.profile import Device, Route
    from orchestrator.runtime import device_actor
    from stages.base import StageRunner

    return {
        "np": np,
        "ObjectRef": ObjectRef,
        "ObjectRefGenerator": ObjectRefGenerator,
        "ActorHandle": ActorHandle,
        "Device": Device,
        "Route": Route,
        "StagePlan": StagePlan,
        "StageRunner": StageRunner,
        # (names the old device actor lacked are left out: its annotations then say Any)
        **{
            n: getattr(device_actor, n)
            for n in ("LoadReport", "StreamMessage")
            if hasattr(device_actor, n)
        },
    }


def _any_in(hint: object) -> bool:
    if hint is Any:
        return True
    return any(_any_in(arg) for arg in typing.get_args(hint))


def _public_methods(cls: type) -> Iterator[tuple[str, Callable[..., object]]]:
    for name, fn in inspect.getmembers(cls, inspect.isfunction):
        if not name.startswith("_") or name == "__init__":
            yield name, fn


def _crossing() -> list[tuple[str, Callable[..., object]]]:
    """What another process calls (an actor's methods, a remote task) and what the device
    actor reads of a runner and of a kind."""
    pytest.importorskip("ray")
    from orchestrator.runtime import cluster_probe, cluster_verify
    from orchestrator.runtime.device_actor import DeviceActor
    from orchestrator.runtime.ledger_actor import LedgerService
    from stages.base import StageKind, StageRunner

    out = [(f"DeviceActor.{n}", f) for n, f in _public_methods(DeviceActor)]
    out += [(f"LedgerService.{n}", f) for n, f in _public_methods(LedgerService)]
    out += [(f"StageRunner.{n}", f) for n, f in _public_methods(StageRunner)]
    out += [
        (f"StageKind.{n}", getattr(StageKind, n))
        for n in ("validate_request", "warm_request_check", "turn_detection", "runner")
    ]
    out += [
        ("cluster_probe._probe_here", cluster_probe._probe_here),
        ("cluster_probe._ray_memory_here", cluster_probe._ray_memory_here),
        ("cluster_verify._verify_here", cluster_verify._verify_here),
    ]
    return out


def test_no_any_crosses_an_actor_or_a_remote_task() -> None:
    namespace = _annotation_namespace()
    untyped = []
    for name, fn in _crossing():
        hints = typing.get_type_hints(fn, localns=namespace)
        missing = [
            p
            for p in inspect.signature(fn).parameters
            if p not in ("self", "cls") and p not in hints
        ]
        if missing or "return" not in hints:
            untyped.append(f"{name}: not annotated ({', '.join(missing) or 'its answer'})")
        untyped += [f"{name}: {p} is {hint}" for p, hint in hints.items() if _any_in(hint)]
    assert not untyped, "\n".join(untyped)


def test_the_device_actor_reads_a_runner_s_figures_without_any() -> None:
    """``StageRunner.load_info`` (what the load found) is read by the device actor and sent
    to the driver: it is annotated too."""
    from stages.base import StageRunner

    hint = typing.get_type_hints(StageRunner, localns=_annotation_namespace())["load_info"]
    assert not _any_in(hint), hint


def _kind_names(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``x.kind == "ar_decode"`` (either side, ``!=`` too) and ``x.kind in ("vad", ...)``."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if not any(isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides):
            continue
        for s in sides:
            values = s.elts if isinstance(s, ast.Tuple | ast.List | ast.Set) else [s]
            for v in values:
                if isinstance(v, ast.Constant) and v.value in BUILTIN_KINDS:
                    yield node.lineno, v.value


def test_generic_code_names_no_stage_kind() -> None:
    named = []
    for path in sorted((REPO / "orchestrator").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(NAMES_KINDS_BY_DESIGN):
            continue
        for line, kind in _kind_names(ast.parse(path.read_text(encoding="utf-8"))):
            named.append(f"{rel}:{line}: names the kind {kind!r}")
    assert not named, "\n".join(named)


def test_the_kind_name_check_sees_what_it_should() -> None:
    """The scan finds the forms generic code used (so its silence above means something)."""
    source = (
        'w = 2 if stage.kind == "ar_decode" else 1\n'
        'if "vad" == s.kind: pass\n'
        'if s.kind in ("asr", "vad"): pass\n'
        'if s.kind != "token2wav": pass\n'
        'if s.kind == "echo": pass\n'  # a plugin's name: not a built-in kind
        'if device.kind == "cpu": pass\n'
    )
    found = [k for _, k in sorted(_kind_names(ast.parse(source)))]
    assert found == ["ar_decode", "vad", "asr", "vad", "token2wav"]
