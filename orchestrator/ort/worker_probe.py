"""What a route's interpreter says about itself when probed: its ONNX Runtime build and EPs, the plugin EP packages registered there and the devices they expose, and the decode engines installed there (an engine found by its build asked in a child process). Part of the route program (worker.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
from importlib import metadata
from typing import Any, TypedDict

# imported as a package here; in a route, the program's earlier parts (ROUTE_PROGRAM) already
# defined these names and no orchestrator package need be importable
with contextlib.suppress(ImportError):
    from orchestrator.ort.wire import SAFE_PATH_PRELUDE, safe_path_flags


ORT_DISTRIBUTIONS = (
    "onnxruntime-openvino",
    "onnxruntime-directml",
    "onnxruntime-qnn",
    "onnxruntime-vitisai",
    "onnxruntime-gpu",
    "onnxruntime-training",
    "onnxruntime",
    "ort-nightly",
    "ort-nightly-gpu",
    "ort-nightly-directml",
)
"""Distributions that install the ``onnxruntime`` module, most specific first.
Several builds share the module name; the distribution says which EPs it has.
The route program holds no table, so this is a copy of the backend table's builds
(``orchestrator.core.ort_builds.ort_flavours``), held equal to it by
``tests/orchestrator/core/test_ort_flavours.py``: a new EP's build goes in both."""


class ProviderUnavailable(RuntimeError):
    """The requested EP is not in this interpreter's onnxruntime build."""


PLUGIN_SINCE = {"onnxruntime-qnn": 2}
"""Distributions that were onnxruntime builds before this major version and are
plugin EP packages (next to the plain ``onnxruntime``) from it on (a copy of
``orchestrator.core.ort_builds.plugin_since``, held equal to it)."""


def installed_version(name: str) -> str | None:
    """The version of the distribution ``name`` installed here, or None: the route program's
    copy of ``orchestrator.core.packages.installed_version`` (held equal to it by
    ``tests/orchestrator/core/test_versions.py``)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def runtime_identity() -> tuple[str | None, str | None]:
    """(distribution, version) of the onnxruntime build importable here, or (None, None)."""
    for name, version in ort_builds():
        return name, version
    return None, None


def ort_builds() -> list[tuple[str, str]]:
    """Every onnxruntime build installed here, ``(distribution, version)`` (plugin EP
    packages not counted). More than one is a broken environment: they share the
    ``onnxruntime`` module, and the last one installed overwrote the others' files
    (``orchestrator.core.ort_builds.require_one_ort_flavour`` refuses it in omni-edge's own
    environment; a route reports it through ``probe``)."""
    found = []
    for name in ORT_DISTRIBUTIONS:
        version = installed_version(name)
        if version is not None and not is_plugin_release(name, version):
            found.append((name, version))  # (a plugin EP package is not the module's build)
    return found


def is_plugin_release(distribution: str, version: str) -> bool:
    """Whether ``distribution==version`` is a plugin EP package rather than an onnxruntime build."""
    since = PLUGIN_SINCE.get(distribution)
    major = version.split(".", 1)[0]
    return since is not None and major.isdigit() and int(major) >= since


class PluginRecord(TypedDict, total=False):
    """A plugin EP package as the route worker takes it (``backends.plugin_wire``): its EP, its
    distribution, module and library, the name it registers under, the first version that is
    a plugin, and how a session picks its device (``device_type``, ``select_by``) and spells a
    file option (``option_paths``)."""

    ep: str
    package: str
    module: str
    library: str
    registration: str
    min_version: int
    device_type: str
    select_by: dict[str, str]
    option_paths: dict[str, str]


class Registration(TypedDict):
    """What registering a plugin EP package's library here gave (:func:`register_plugin`)."""

    package: str
    ep: str
    registration: str
    version: str | None
    library: str | None
    status: str
    error: str | None


class EpDevice(TypedDict):
    """One entry of ``onnxruntime.get_ep_devices()`` as plain data."""

    ep_name: str
    ep_vendor: str
    device_type: str
    vendor: str
    vendor_id: int
    device_id: int
    ep_metadata: dict[str, str]
    device_metadata: dict[str, str]


class EngineRecord(TypedDict, total=False):
    """A decode engine as the route is asked about it (``orchestrator.core.engines.wire``): its
    name, the module and distributions that mean it is installed, and the program that reports
    its build (found by its build)."""

    engine: str
    module: str
    distributions: list[str]
    build: str


class EngineBuild(TypedDict):
    """A decode engine's build as a child process reported it (:func:`engine_build`)."""

    version: str | None
    system_info: str
    gpu_offload: bool
    error: str | None


class EnginesFound(TypedDict):
    """What the route has of the engines asked about (:func:`engines_found`)."""

    engine_distributions: list[str]
    builds: dict[str, EngineBuild]


_registered: dict[str, Registration] = {}
"""Registration name → what registering it gave (a library is registered once per process)."""


def plugged_eps() -> set[str]:
    """The EPs a plugin package registered in this process put in get_available_providers()."""
    return {r["ep"] for r in _registered.values() if r["status"] == "registered"}


def _plugin_library(plugin: PluginRecord, module: Any) -> str:
    getter = getattr(module, "get_library_path", None)
    if callable(getter):
        return str(getter())
    stem = plugin["library"]
    name = f"{stem}.dll" if sys.platform == "win32" else f"lib{stem}.so"
    path = os.path.join(os.path.dirname(os.path.abspath(module.__file__)), name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{name} is not in {os.path.dirname(path)}")
    return path


def register_plugin(ort: Any, plugin: PluginRecord) -> Registration:
    """Register one plugin EP package's library here, once; never raises.

    ``status``: ``registered``; ``not installed`` (its module cannot be found);
    ``not a plugin`` (a version before it became one); ``unsupported`` (this
    onnxruntime has no plugin EP API, < 1.22); ``failed`` (``error`` says why).
    """
    key = plugin["registration"]
    if key in _registered:
        return _registered[key]
    out = Registration(
        package=plugin["package"],
        ep=plugin["ep"],
        registration=key,
        version=None,
        library=None,
        status="not installed",
        error=None,
    )
    out["version"] = installed_version(plugin["package"])
    if importlib.util.find_spec(plugin["module"]) is None:
        return out  # not remembered: it may be installed later in a long-lived worker
    if (
        out["version"]
        and plugin.get("min_version")
        and not is_plugin_release_of(out["version"], plugin["min_version"])
    ):
        out["status"] = "not a plugin"
        out["error"] = (
            f"{plugin['package']} {out['version']} is an onnxruntime build, not a plugin (plugins are >= {plugin['min_version']})"
        )
    elif not hasattr(ort, "register_execution_provider_library"):
        out["status"] = "unsupported"
        out["error"] = (
            f"onnxruntime {ort.__version__} has no register_execution_provider_library (plugin EPs need >= 1.22)"
        )
    else:
        try:
            module = importlib.import_module(plugin["module"])
            out["library"] = _plugin_library(plugin, module)
            ort.register_execution_provider_library(key, out["library"])
            out["status"] = "registered"
        except Exception as exc:
            out["status"] = "failed"
            out["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    _registered[key] = out
    return out


def is_plugin_release_of(version: str, min_major: int) -> bool:
    major = version.split(".", 1)[0]
    return not major.isdigit() or int(major) >= min_major


def ep_devices(ort: Any) -> list[EpDevice]:
    """What ``onnxruntime.get_ep_devices()`` lists, as plain data ([] before 1.22)."""
    if not hasattr(ort, "get_ep_devices"):
        return []
    out = []
    for d in ort.get_ep_devices():
        hw = d.device
        out.append(
            EpDevice(
                ep_name=d.ep_name,
                ep_vendor=d.ep_vendor,
                device_type=str(hw.type).rsplit(".", 1)[-1],
                vendor=hw.vendor,
                vendor_id=int(hw.vendor_id),
                device_id=int(hw.device_id),
                ep_metadata={str(k): str(v) for k, v in dict(d.ep_metadata).items()},
                device_metadata={str(k): str(v) for k, v in dict(hw.metadata).items()},
            )
        )
    return out


def select_ep_devices(
    ort: Any,
    plugin: PluginRecord,
    options: dict[str, str],
) -> tuple[list[Any], dict[str, str], str]:
    """The plugin EP's devices a session takes, the options the EP gets, and what was
    looked for (for the error when nothing matches).

    Devices of the plugin's EP; of its ``device_type`` when it has one; whose
    ``ep_metadata`` value starts with an option named in ``select_by`` (that
    option is the selection, not passed on). An option in ``option_paths``
    that names a bare file becomes that file inside the package.
    """
    options = dict(options)
    wanted = [d for d in ort.get_ep_devices() if d.ep_name == plugin["ep"]]
    looked_for = [f"ep {plugin['ep']}"]
    if plugin.get("device_type"):
        wanted = [
            d for d in wanted if str(d.device.type).rsplit(".", 1)[-1] == plugin["device_type"]
        ]
        looked_for.append(f"device type {plugin['device_type']}")
    for option, key in plugin.get("select_by", {}).items():
        if option in options:
            prefix = str(options.pop(option)).lower()
            wanted = [
                d
                for d in wanted
                if str(dict(d.ep_metadata).get(key, "")).lower().startswith(prefix)
            ]
            looked_for.append(f"ep_metadata {key} starting with {prefix!r}")
    module = sys.modules.get(plugin["module"])
    for option, fn in plugin.get("option_paths", {}).items():
        given = options.get(option)
        if (
            module is not None
            and given
            and os.path.basename(given) == given
            and callable(getattr(module, fn, None))
        ):
            options[option] = str(getattr(module, fn)())
    return wanted[:1], options, ", ".join(looked_for)


def installed_distributions(module: str | None, names: list[str]) -> list[str]:
    """Which of ``names`` (a decode engine's distributions) are installed here, when its
    ``module`` is importable; read from their metadata, nothing imported.

    A direct lookup per name reads one dist-info; iterating every distribution
    would parse every installed package's METADATA.
    """
    if module and importlib.util.find_spec(module) is None:
        return []
    return [name for name in names if installed_version(name) is not None]


ENGINE_BUILD_TIMEOUT_S = 60.0
"""Importing llama_cpp and starting its backend takes about a second; a minute is a hung build."""


def engine_build_program(engine: EngineRecord) -> str:
    """What :func:`engine_build` runs with ``-c`` in a child of this interpreter: the working
    directory off ``sys.path`` first (:data:`SAFE_PATH_PRELUDE`), then the row's ``build``."""
    return SAFE_PATH_PRELUDE + str(engine["build"])


def engine_build(
    engine: EngineRecord, timeout: float = ENGINE_BUILD_TIMEOUT_S
) -> EngineBuild | None:
    """The build of a decode engine found by its build (``engine``: its row's wire form, whose
    ``build`` is the program to run), asked in a child process so that a build using
    instructions this CPU lacks (killed by SIGILL) or crashing cannot take the route worker
    down; None when its module is not installed. ``error`` says why it cannot run here."""
    module = str(engine["module"])
    if importlib.util.find_spec(module) is None:
        return None
    found_in = installed_distributions(None, list(engine.get("distributions") or ()))
    out = EngineBuild(
        version=installed_version(found_in[0]) if found_in else None,
        system_info="",
        gpu_offload=False,
        error=None,
    )
    try:
        proc = subprocess.run(
            [sys.executable, *safe_path_flags(), "-c", engine_build_program(engine)],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {**out, "error": f"importing {module} did not finish in {timeout:.0f} s"}
    except OSError as exc:
        return {**out, "error": f"cannot start {sys.executable}: {exc}"}
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        why = ": the build uses an instruction this CPU does not have" if name == "SIGILL" else ""
        return {
            **out,
            "error": f"importing {module} and starting its backend was killed by {name}{why}",
        }
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return {**out, "error": f"importing {module} failed (exit {proc.returncode}): {tail}"}
    try:
        found = json.loads(lines[-1])
    except ValueError:
        return {**out, "error": f"{module}'s probe printed no report: {lines[-1][:200]}"}
    return {
        **out,
        "version": out["version"] or found.get("version"),
        "system_info": str(found.get("system_info") or ""),
        "gpu_offload": bool(found.get("gpu_offload")),
    }


def engines_found(engines: list[EngineRecord]) -> EnginesFound:
    """What the route has of the decode engines it was asked about (the engine table's wire
    form, ``orchestrator.core.engines.wire``: this file holds no table): the installed
    distributions of those found by them, and the build of those found by their build."""
    distributions: list[str] = []
    builds: dict[str, EngineBuild] = {}
    for engine in engines:
        if engine.get("build"):
            build = engine_build(engine)
            if build is not None:
                builds[str(engine["engine"])] = build
        else:
            distributions += installed_distributions(
                engine.get("module"), list(engine.get("distributions") or ())
            )
    return EnginesFound(engine_distributions=distributions, builds=builds)
