"""The imports of the stage loads running in one process, made one at a time.

A device actor loads the stages the ledger admitted together at once, each
``runner.load()`` in a thread of its own. Python's import system is safe for
two threads importing one module, not for two threads importing packages
that import each other: each can hold a module the other needs, and Python
breaks that cycle by handing one thread a partially initialised module
(``ImportError: cannot import name 'PreTrainedConfig' from 'transformers'``:
a vLLM engine starting while the Whisper stage's hooks loaded its tokenizer,
both importing transformers, whose lazy module imports on attribute access)
or by raising ``_DeadlockError`` (a first ``import numpy`` in two loads). The
kinds' ``runner_imports`` cover only what a kind declares, not what an engine
imports inside itself.

So while a thread runs a load (:func:`loading`), every import it makes holds
one process-wide reentrant lock: ``import`` statements (``builtins.__import__``,
with the ``from x import y`` that makes a lazy module import a submodule) and
``importlib.import_module`` (what transformers' ``_LazyModule`` calls). The
imports of two loads never interleave, whatever they import; everything else
a load does (reading weights, compiling, allocating) still runs beside the
other loads. A statement that imports nothing new (the module is in
``sys.modules``, initialised, and no name is taken from it) skips the lock.

Threads that are not loading — the actor's event loop, Ray's threads, the
threads a runner starts — import as before, without the lock: a load never
waits on them through it, so the lock adds no cycle with them. The limit
that follows: imports made by a thread a load starts are not serialised.
The hooks are installed on the first load in a process and stay (a thread
that is not loading pays one attribute lookup per import statement).
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.RLock()
"""Held by a loading thread for the whole of each import it makes (reentrant: nested imports)."""
_state = threading.local()
_counts = threading.Lock()
_waiting = 0
_install = threading.Lock()
_original_import: Callable[..., Any] | None = None
_original_import_module: Callable[..., Any] | None = None


def waiting() -> int:
    """How many loading threads are waiting for another load's import to end (for tests and logs)."""
    return _waiting


@contextlib.contextmanager
def _held() -> Iterator[None]:
    global _waiting
    if not _lock.acquire(blocking=False):
        with _counts:
            _waiting += 1
        try:
            _lock.acquire()
        finally:
            with _counts:
                _waiting -= 1
    try:
        yield
    finally:
        _lock.release()


def _imports_nothing(name: str, fromlist: Any, level: int) -> bool:
    """Whether ``import name`` (absolute, no names taken) finds a module already initialised."""
    if fromlist or level:
        return False
    module = sys.modules.get(name)
    return module is not None and not getattr(
        getattr(module, "__spec__", None), "_initializing", False
    )


def _import(
    name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
) -> Any:
    assert _original_import is not None
    if not getattr(_state, "loading", False) or _imports_nothing(name, fromlist, level):
        return _original_import(name, globals, locals, fromlist, level)
    with _held():
        return _original_import(name, globals, locals, fromlist, level)


def _import_module(name: str, package: str | None = None) -> Any:
    assert _original_import_module is not None
    if not getattr(_state, "loading", False):
        return _original_import_module(name, package)
    with _held():
        return _original_import_module(name, package)


def install() -> None:
    """Put the serialising hooks in place (once per process; idempotent)."""
    global _original_import, _original_import_module
    with _install:
        if _original_import is not None:
            return
        _original_import, _original_import_module = builtins.__import__, importlib.import_module
        builtins.__import__ = _import
        importlib.import_module = _import_module


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """Run the body as a load: its thread's imports are serialised with every other load's."""
    install()
    before = getattr(_state, "loading", False)
    _state.loading = True
    try:
        yield
    finally:
        _state.loading = before


def call_loading(fn: Callable[[], T]) -> T:
    """``fn()`` as a load (for ``asyncio.to_thread``: the flag belongs to the thread that runs it)."""
    with loading():
        return fn()
