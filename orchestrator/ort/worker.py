"""The program a route runs: opens ONNX Runtime sessions and answers framed requests.

This file is **self-contained** (standard library + numpy; onnxruntime is
imported on first use) because it runs inside interpreters that have neither
omni-edge nor its dependencies: a venv with ``onnxruntime-openvino``, or a
Windows ``python.exe`` reached from WSL. The client (``sessions.py``) starts the
interpreter with a one-line bootstrap and sends this file's source over stdin,
so the route needs no copy of the repository and no path translation for code.

Protocol (stdin → requests, stdout → replies, one at a time, in order)::

    frame   = b"OEW1" | uint32 LE header length | header (UTF-8 JSON) | buffers
    header  = {"id": n, "op": ..., "args": {...}, "buffers": [nbytes, ...]}
    reply   = {"id": n, "ok": true, "result": ...}
            | {"id": n, "ok": false, "error": {"type", "message", "traceback"}}

numpy arrays anywhere in ``args``/``result`` travel as
``{"__nd__": i, "dtype": "<f4", "shape": [...]}`` plus their C-order bytes in
buffer i (``"scalar": true`` for a numpy scalar; string tensors as
``"dtype": "|O"`` with ``"utf8_lengths"``): no pickle, so the two sides may run
different numpy and Python versions, and shape (0-d, empty), dtype and byte
order arrive exactly as sent.
Native libraries that print to stdout (OpenVINO's plugins do) cannot corrupt
the stream: fd 1 is pointed at stderr and the protocol uses a private dup.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import platform
import signal
import struct
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from importlib import metadata
from typing import IO, Any, TypedDict

# numpy is imported where arrays are handled, not here: the planner imports this
# module for ORT_DISTRIBUTIONS and runtime_identity (stdlib only), and `omni-edge
# plan` must not pay numpy's import for them. main() imports it first thing.

MAGIC = b"OEW1"
RECORD_ASSIGNMENT = "session.record_ep_graph_assignment_info"
ORT_DISTRIBUTIONS = (
    "onnxruntime-openvino",
    "onnxruntime-directml",
    "onnxruntime-qnn",
    "onnxruntime-vitisai",
    "onnxruntime-gpu",
    "onnxruntime-training",
    "onnxruntime",
    "ort-nightly",
)
"""Distributions that install the ``onnxruntime`` module, most specific first.
Several builds share the module name; the distribution says which EPs it has."""

SAFE_PATH_PRELUDE = "import sys;sys.path[:]=[p for p in sys.path if p not in ('', '.')];"
"""The first statement of every program omni-edge hands a child interpreter with ``-c``: the
working directory off ``sys.path`` before anything is imported. ``-I``/``-P`` already keep it
off (:func:`safe_path_flags`); this covers Python 3.10, which has no ``-P``, and an empty
``PYTHONPATH`` entry (which also means the working directory)."""


def safe_path_flags() -> list[str]:
    """The flags for a child of *this* interpreter that must not import the working directory:
    ``-I`` when this interpreter runs isolated itself (a route worker), else ``-P`` (Python ≥ 3.11:
    no unsafe path first on ``sys.path``, the environment kept — the child sees the packages this
    process sees); on 3.10, none (its program starts with :data:`SAFE_PATH_PRELUDE`)."""
    if sys.flags.isolated:
        return ["-I"]
    return ["-P"] if sys.version_info >= (3, 11) else []


BOOTSTRAP = (
    SAFE_PATH_PRELUDE + "n=int(sys.stdin.buffer.readline());src=sys.stdin.buffer.read(n);"
    "g={'__name__':'omni_edge_route_worker'};"
    "exec(compile(src,'omni_edge_route_worker.py','exec'),g);g['main']()"
)
"""What ``python -I -c`` (``-P`` for this interpreter's own worker) runs in the route: the
working directory off ``sys.path``, then this file's source read from stdin and run."""


# ---- framing ----------------------------------------------------------------------


def encode(message: dict[str, Any]) -> bytes:
    """One frame. numpy arrays and numpy scalars anywhere in ``message`` go as raw buffers."""
    # Not imported here: no message can hold an array before numpy is imported, and the
    # control messages (probe, exit) are sent by a core install, where numpy is absent.
    np = sys.modules.get("numpy")
    buffers: list[bytes] = []

    def walk(obj: Any) -> Any:
        if np is not None and isinstance(obj, (np.ndarray, np.generic)):
            meta, data = _array_to_wire(obj)
            buffers.append(data)
            return {"__nd__": len(buffers) - 1, **meta}
        if isinstance(obj, dict):
            return {str(k): walk(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [walk(v) for v in obj]
        return obj

    body = walk(message)
    body["buffers"] = [len(b) for b in buffers]
    header = json.dumps(body).encode("utf-8")
    return b"".join([MAGIC, struct.pack("<I", len(header)), header, *buffers])


def _array_to_wire(obj: Any) -> tuple[dict[str, Any], bytes]:
    """(header entry, bytes) that rebuild ``obj`` exactly: shape (0-d and empty
    included), dtype with its byte order, C-order bytes of any memory layout.

    Not ``np.ascontiguousarray``: it promotes a 0-d array to shape (1,), and a
    graph with a scalar input (silero VAD's ``sr``) then refuses the tensor.
    A numpy scalar stays a numpy scalar of its dtype on the other side (not a
    Python number), so a route behaves exactly like this-process, which passes
    values untouched. Object arrays must hold ``str`` (ONNX string tensors);
    they travel as UTF-8 with per-element lengths, because numpy's fixed-width
    ``<U`` strings would drop trailing NULs.
    """
    import numpy as np

    arr = np.asarray(obj)
    meta: dict[str, Any] = {"shape": list(arr.shape)}
    if isinstance(obj, np.generic):
        meta["scalar"] = True
    if arr.dtype.kind == "O":
        items = arr.ravel(order="C").tolist()
        bad = next((type(v).__name__ for v in items if not isinstance(v, str)), None)
        if bad is not None:
            raise TypeError(
                f"an object array can cross a route only when it holds str (a string tensor), not {bad}"
            )
        encoded = [v.encode("utf-8") for v in items]
        meta.update(dtype="|O", utf8_lengths=[len(b) for b in encoded])
        return meta, b"".join(encoded)
    if arr.dtype.kind == "V":
        # Structured and opaque dtypes (ml_dtypes' bfloat16 is '<V2') would arrive as bare bytes.
        raise TypeError(
            f"dtype {arr.dtype} cannot cross a route: send a numpy numeric, bool or string array"
        )
    meta["dtype"] = arr.dtype.str
    return meta, arr.tobytes(order="C")


def _array_from_wire(meta: dict[str, Any], data: bytes) -> Any:
    import numpy as np

    shape = tuple(int(n) for n in meta["shape"])
    count = 1
    for n in shape:
        count *= n
    if "utf8_lengths" in meta:
        lengths = meta["utf8_lengths"]
        if len(lengths) != count or sum(lengths) != len(data):
            raise ValueError(
                f"protocol error: {len(lengths)} strings in {len(data)} bytes for shape {list(shape)}"
            )
        arr = np.empty(count, dtype=object)
        pos = 0
        for i, n in enumerate(lengths):
            arr[i] = data[pos : pos + n].decode("utf-8")
            pos += n
        arr = arr.reshape(shape)
    else:
        dtype = np.dtype(meta["dtype"])
        if len(data) != count * dtype.itemsize:
            raise ValueError(f"protocol error: {len(data)} bytes for {list(shape)} of {dtype.str}")
        if dtype.itemsize == 0:
            arr = np.empty(shape, dtype=dtype)
        else:
            arr = np.frombuffer(bytearray(data), dtype=dtype).reshape(shape)  # writable, owned
    return arr[()] if meta.get("scalar") else arr


def read_message(stream: IO[bytes]) -> dict[str, Any] | None:
    """One message, or None at a clean end of stream."""
    head = _read_exact(stream, 8, allow_eof=True)
    if head is None:
        return None
    if head[:4] != MAGIC:
        raise ValueError(f"protocol error: expected {MAGIC!r}, got {head[:4]!r}")
    (length,) = struct.unpack("<I", head[4:])
    body = json.loads(_read_exact(stream, length))
    buffers = [_read_exact(stream, n) for n in body.pop("buffers", [])]

    def walk(obj: Any) -> Any:
        if isinstance(obj, dict):
            if "__nd__" in obj and "dtype" in obj and "shape" in obj:
                return _array_from_wire(obj, buffers[obj["__nd__"]])
            return {k: walk(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        return obj

    return walk(body)


def _read_exact(stream: IO[bytes], n: int, allow_eof: bool = False) -> Any:
    chunks = []
    got = 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            if allow_eof and got == 0:
                return None
            raise EOFError(f"stream ended after {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


# ---- sessions ---------------------------------------------------------------------


class ProviderUnavailable(RuntimeError):
    """The requested EP is not in this interpreter's onnxruntime build."""


PLUGIN_SINCE = {"onnxruntime-qnn": 2}
"""Distributions that were onnxruntime builds before this major version and are
plugin EP packages (next to the plain ``onnxruntime``) from it on."""


def runtime_identity() -> tuple[str | None, str | None]:
    """(distribution, version) of the onnxruntime build importable here, or (None, None)."""
    for name in ORT_DISTRIBUTIONS:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        if is_plugin_release(name, version):
            continue  # a plugin EP package, not the build that provides the module
        return name, version
    return None, None


def ort_builds() -> list[tuple[str, str]]:
    """Every onnxruntime build installed here, ``(distribution, version)`` (plugin EP
    packages not counted). More than one is a broken environment: they share the
    ``onnxruntime`` module, and the last one installed overwrote the others' files
    (``orchestrator.core.packages.require_one_ort_flavour`` refuses it in omni-edge's own
    environment; a route reports it through ``probe``)."""
    found = []
    for name in ORT_DISTRIBUTIONS:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        if not is_plugin_release(name, version):
            found.append((name, version))
    return found


def is_plugin_release(distribution: str, version: str) -> bool:
    """Whether ``distribution==version`` is a plugin EP package rather than an onnxruntime build."""
    since = PLUGIN_SINCE.get(distribution)
    major = version.split(".", 1)[0]
    return since is not None and major.isdigit() and int(major) >= since


# ---- plugin EPs (ONNX Runtime >= 1.22) -------------------------------------------------

_registered: dict[str, dict[str, Any]] = {}
"""Registration name → what registering it gave (a library is registered once per process)."""


def _plugin_library(plugin: dict[str, Any], module: Any) -> str:
    getter = getattr(module, "get_library_path", None)
    if callable(getter):
        return str(getter())
    stem = plugin["library"]
    name = f"{stem}.dll" if sys.platform == "win32" else f"lib{stem}.so"
    path = os.path.join(os.path.dirname(os.path.abspath(module.__file__)), name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{name} is not in {os.path.dirname(path)}")
    return path


def register_plugin(ort: Any, plugin: dict[str, Any]) -> dict[str, Any]:
    """Register one plugin EP package's library here, once; never raises.

    ``status``: ``registered``; ``not installed`` (its module cannot be found);
    ``not a plugin`` (a version before it became one); ``unsupported`` (this
    onnxruntime has no plugin EP API, < 1.22); ``failed`` (``error`` says why).
    """
    key = plugin["registration"]
    if key in _registered:
        return _registered[key]
    out: dict[str, Any] = {
        "package": plugin["package"],
        "ep": plugin["ep"],
        "registration": key,
        "version": None,
        "library": None,
        "status": "not installed",
        "error": None,
    }
    with contextlib.suppress(metadata.PackageNotFoundError):
        out["version"] = metadata.version(plugin["package"])
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


def ep_devices(ort: Any) -> list[dict[str, Any]]:
    """What ``onnxruntime.get_ep_devices()`` lists, as plain data ([] before 1.22)."""
    if not hasattr(ort, "get_ep_devices"):
        return []
    out = []
    for d in ort.get_ep_devices():
        hw = d.device
        out.append(
            {
                "ep_name": d.ep_name,
                "ep_vendor": d.ep_vendor,
                "device_type": str(hw.type).rsplit(".", 1)[-1],
                "vendor": hw.vendor,
                "vendor_id": int(hw.vendor_id),
                "device_id": int(hw.device_id),
                "ep_metadata": {str(k): str(v) for k, v in dict(d.ep_metadata).items()},
                "device_metadata": {str(k): str(v) for k, v in dict(hw.metadata).items()},
            }
        )
    return out


def select_ep_devices(
    ort: Any,
    plugin: dict[str, Any],
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
    found = []
    for name in names:
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found.append(name)
    return found


ENGINE_BUILD_TIMEOUT_S = 60.0
"""Importing llama_cpp and starting its backend takes about a second; a minute is a hung build."""


def engine_build_program(engine: dict[str, Any]) -> str:
    """What :func:`engine_build` runs with ``-c`` in a child of this interpreter: the working
    directory off ``sys.path`` first (:data:`SAFE_PATH_PRELUDE`), then the row's ``build``."""
    return SAFE_PATH_PRELUDE + str(engine["build"])


def engine_build(
    engine: dict[str, Any], timeout: float = ENGINE_BUILD_TIMEOUT_S
) -> dict[str, Any] | None:
    """The build of a decode engine found by its build (``engine``: its row's wire form, whose
    ``build`` is the program to run), asked in a child process so that a build using
    instructions this CPU lacks (killed by SIGILL) or crashing cannot take the route worker
    down; None when its module is not installed. ``error`` says why it cannot run here."""
    module = str(engine["module"])
    if importlib.util.find_spec(module) is None:
        return None
    found_in = installed_distributions(None, list(engine.get("distributions") or ()))
    out: dict[str, Any] = {
        "version": metadata.version(found_in[0]) if found_in else None,
        "system_info": "",
        "gpu_offload": False,
        "error": None,
    }
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


def engines_found(engines: list[dict[str, Any]]) -> dict[str, Any]:
    """What the route has of the decode engines it was asked about (the engine table's wire
    form, ``orchestrator.core.engines.wire``: this file holds no table): the installed
    distributions of those found by them, and the build of those found by their build."""
    distributions: list[str] = []
    builds: dict[str, Any] = {}
    for engine in engines:
        if engine.get("build"):
            build = engine_build(engine)
            if build is not None:
                builds[str(engine["engine"])] = build
        else:
            distributions += installed_distributions(
                engine.get("module"), list(engine.get("distributions") or ())
            )
    return {"engine_distributions": distributions, "builds": builds}


# ---- records that cross the process boundary -----------------------------------
# TypedDicts (stdlib, so this file stays self-contained): the wire is JSON, and these
# say what a spec and an opened-session reply hold. A spec is checked where it
# arrives (:func:`check_spec`), so a malformed one is refused by the key it lacks.


class _SpecKeys(TypedDict):
    graph: str
    providers: list[str]
    provider_options: list[dict[str, str]]


class SpecRecord(_SpecKeys, total=False):
    """A session spec as it crosses to a route (``backends.SessionSpec.to_dict()``, plus
    the ``plugins`` that ``sessions.with_plugins`` adds)."""

    session_options: dict[str, Any]
    session_config: dict[str, str]
    plugins: list[dict[str, Any]]


class EpOptions(TypedDict):
    given: dict[str, str]
    reported: dict[str, str] | None


class OpenedSession(TypedDict):
    """What ``open`` answers: the handle, the providers the session took, the EP options
    given and reported, the node assignment, the graph's inputs and outputs, the plugin."""

    handle: int
    providers: list[str]
    ep_options: EpOptions
    assignment: list[dict[str, Any]] | None
    assignment_api: bool
    load_s: float
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    vitisai_report: dict[str, Any] | None
    plugin: dict[str, Any] | None


SPEC_FIX = "a session spec is backends.SessionSpec.to_dict(): graph, providers, provider_options[, session_options, session_config]"


def check_spec(spec: Any) -> SpecRecord:
    """``spec`` as a :class:`SpecRecord`, or a ``ValueError`` naming the key that is missing
    or of the wrong type (it was a ``KeyError`` or a ``TypeError`` deep in ``open``)."""
    if not isinstance(spec, dict):
        raise ValueError(f"the session spec is a {type(spec).__name__}, not a mapping ({SPEC_FIX})")
    missing = [k for k in _SpecKeys.__annotations__ if k not in spec]
    if missing:
        raise ValueError(
            f"the session spec has no {', '.join(repr(k) for k in missing)} ({SPEC_FIX})"
        )
    wrong = []
    if not isinstance(spec["graph"], str):
        wrong.append(f"'graph' is a {type(spec['graph']).__name__}, not a path")
    providers, options = spec["providers"], spec["provider_options"]
    if (
        not isinstance(providers, list)
        or not providers
        or not all(isinstance(p, str) for p in providers)
    ):
        wrong.append(f"'providers' is {providers!r}, not a non-empty list of EP names")
    if not isinstance(options, list) or not all(isinstance(o, dict) for o in options):
        wrong.append(f"'provider_options' is {options!r}, not a list of mappings")
    elif isinstance(providers, list) and len(options) != len(providers):
        wrong.append(
            f"'provider_options' has {len(options)} entries for {len(providers)} providers"
        )
    for key in ("session_options", "session_config"):
        if not isinstance(spec.get(key, {}), dict):
            wrong.append(f"{key!r} is a {type(spec[key]).__name__}, not a mapping")
    if not isinstance(spec.get("plugins", []), list):
        wrong.append(f"'plugins' is a {type(spec['plugins']).__name__}, not a list")
    if wrong:
        raise ValueError(f"the session spec is malformed: {'; '.join(wrong)} ({SPEC_FIX})")
    return spec  # type: ignore[return-value]  # checked above, key by key


class Sessions:
    """Sessions by handle. Used in-process for this-process routes and by ``main``."""

    def __init__(self) -> None:
        self._sessions: dict[int, Any] = {}
        self._next = 1

    def dispatch(self, op: str, args: dict[str, Any]) -> Any:
        ops: dict[str, Callable[..., Any]] = {
            "probe": self.probe,
            "open": self.open,
            "run": self.run,
            "close": self.close,
        }
        fn = ops.get(op)
        if fn is None:
            raise ValueError(f"unknown op {op!r}")
        return fn(**args)

    def probe(
        self,
        plugins: list[dict[str, Any]] | None = None,
        engines: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """This interpreter's Python, numpy, onnxruntime and its EPs; every plugin EP
        package in ``plugins`` that is installed is registered first, and what
        ``get_ep_devices()`` then lists is reported (``ep_devices``), with the
        plugin EPs that expose a device added to ``providers``; of the decode ``engines`` asked
        about, what :func:`engines_found` finds."""
        dist, _version = runtime_identity()
        out: dict[str, Any] = {
            "python": sys.executable,
            "python_version": platform.python_version(),
            "platform": f"{platform.system()}-{platform.machine()}",
            "numpy_version": None,
            "ort_distribution": dist,
            "ort_version": None,
            "providers": [],
            "error": None,
            **engines_found(engines or []),
            "ort_builds": [f"{n}=={v}" for n, v in ort_builds()],
        }
        try:
            # numpy first: a core install has neither, and the answer names what is missing
            # (sessions are opened and run only on a route whose probe found both).
            import numpy as np

            out["numpy_version"] = np.__version__
            import onnxruntime as ort

            out["ort_version"] = ort.__version__
            out["providers"] = list(ort.get_available_providers())
            out["assignment_api"] = hasattr(
                ort.InferenceSession, "get_provider_graph_assignment_info"
            )
        except Exception as exc:  # ImportError, or a broken native library
            out["error"] = f"{type(exc).__name__}: {exc}"
            return out
        out["plugin_eps"] = [register_plugin(ort, p) for p in plugins or []]
        try:
            out["ep_devices"] = ep_devices(ort)
        except Exception as exc:
            out["ep_devices"] = []
            out["ep_devices_error"] = f"{type(exc).__name__}: {exc}"
        for p in out["plugin_eps"]:
            p["devices"] = sum(1 for d in out["ep_devices"] if d["ep_name"] == p["ep"])
            if p["status"] == "registered" and p["devices"] and p["ep"] not in out["providers"]:
                out["providers"].append(p["ep"])
        return out

    def open(self, spec: SpecRecord, record: bool = True, log_severity: int = 3) -> OpenedSession:
        """Open a session from its spec: the providers resolved (a plugin EP on its devices when
        the target EP is not built in; :func:`_providers`), the session options
        (:func:`_session_options`), the session created, and the reply: its handle, the providers
        it took, the EP options given and reported, the node assignment, the graph's inputs and
        outputs, the plugin it came from."""
        spec = check_spec(spec)  # the process boundary: what arrived is checked before ORT loads
        import onnxruntime as ort

        plugin, plugin_devices, plugin_options = _providers(ort, spec)
        so = _session_options(ort, spec, record, log_severity)
        t0 = time.perf_counter()
        if plugin is not None:
            # The plugin EP first, on the selected devices; ONNX Runtime appends the CPU EP
            # itself unless session.disable_cpu_ep_fallback says not to.
            so.add_provider_for_devices(plugin_devices, plugin_options)
            session = ort.InferenceSession(spec["graph"], sess_options=so)
        else:
            session = ort.InferenceSession(
                spec["graph"],
                sess_options=so,
                providers=spec["providers"],
                provider_options=spec["provider_options"],
            )
        load_s = time.perf_counter() - t0
        handle = self._next
        self._next += 1
        self._sessions[handle] = session
        assignment = None
        api = hasattr(session, "get_provider_graph_assignment_info")
        if record and api:
            assignment = [
                {"ep": sg.ep_name, "nodes": [[n.op_type, n.name] for n in sg.get_nodes()]}
                for sg in session.get_provider_graph_assignment_info()
            ]
        given = plugin_options if plugin is not None else spec["provider_options"][0]
        return {
            "handle": handle,
            "providers": list(session.get_providers()),
            "ep_options": {
                "given": dict(given),
                "reported": _reported_options(session, spec["providers"][0]),
            },
            "assignment": assignment,
            "assignment_api": api,
            "load_s": load_s,
            "inputs": [_meta(i) for i in session.get_inputs()],
            "outputs": [_meta(o) for o in session.get_outputs()],
            "vitisai_report": _vitisai_report(spec),
            "plugin": None if plugin is None else _plugin_reply(plugin, plugin_devices),
        }

    def run(
        self, handle: int, feeds: dict[str, Any], outputs: list[str] | None = None
    ) -> dict[str, Any]:
        import numpy as np

        session = self._sessions[handle]
        names = outputs or [o.name for o in session.get_outputs()]
        feeds = {k: _native_byte_order(v) for k, v in _by_name(session, feeds).items()}
        t0 = time.perf_counter()
        values = session.run(names, feeds)
        run_s = time.perf_counter() - t0
        return {"outputs": {n: np.asarray(values[i]) for i, n in enumerate(names)}, "run_s": run_s}

    def close(self, handle: int) -> dict[str, Any]:
        self._sessions.pop(handle, None)
        return {}


def _reported_options(session: Any, ep: str) -> dict[str, str] | None:
    """The provider options ``session`` says its target EP holds (``get_provider_options()``),
    or None where the API is missing. A plugin EP reports what it was given (the OpenVINO
    plugin its ``load_config``); the built-in OpenVINO EP reports nothing."""
    get = getattr(session, "get_provider_options", None)
    if not callable(get):
        return None
    try:
        return {str(k): str(v) for k, v in dict(get().get(ep) or {}).items()}
    except Exception:  # a build whose report cannot be read is no reason to fail the open
        return None


def _by_name(session: Any, feeds: Any) -> dict[str, Any]:
    """``feeds`` as ``{input name: array}``: a mapping as it is, a bare array as the
    only input of a one-input graph; anything else is a ``TypeError`` naming the
    graph's inputs (it was an ``AttributeError`` on ``.items()``)."""
    import numpy as np

    if isinstance(feeds, dict):
        return feeds
    names = [i.name for i in session.get_inputs()]
    if isinstance(feeds, (np.ndarray, np.generic)) and len(names) == 1:
        return {names[0]: feeds}
    raise TypeError(
        f"the feeds must be a mapping of input name to array (the graph takes {', '.join(names)}), "
        f"or one array for a graph of one input; got {type(feeds).__name__}"
    )


def _native_byte_order(value: Any) -> Any:
    """``value`` with the same numbers in this machine's byte order.

    ONNX Runtime reads a feed's buffer as native-endian whatever its dtype says:
    a big-endian ``>i4`` [0, 1, 2, 3] runs as [0, 16777216, 33554432, 50331648],
    silently. The route carries byte order faithfully; this is where it stops
    mattering.
    """
    import numpy as np

    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.byteorder not in ("=", "|"):
        return np.asarray(value).astype(value.dtype.newbyteorder("="))
    return value


def _meta(arg: Any) -> dict[str, Any]:
    return {
        "name": arg.name,
        "type": arg.type,
        "shape": [d if isinstance(d, (int, str)) else None for d in arg.shape],
    }


def _vitisai_report(spec: SpecRecord) -> dict[str, Any] | None:
    """The VitisAI EP's own assignment report, summarised, when it wrote one."""
    candidates = []
    env = os.environ.get("XLNX_ONNX_EP_REPORT_FILE")
    for opts in spec.get("provider_options", []):
        if "cache_dir" in opts and "cache_key" in opts:
            candidates.append(
                os.path.join(opts["cache_dir"], opts["cache_key"], "vitisai_ep_report.json")
            )
            if env:
                candidates.append(os.path.join(opts["cache_dir"], opts["cache_key"], env))
    if env:
        candidates.append(env)
    for path in candidates:
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                return summarise_vitisai_report(json.load(f), path)
    return None


def summarise_vitisai_report(report: dict[str, Any], path: str) -> dict[str, Any]:
    """``deviceStat`` (per-device node counts) and the op types of nodes left on a CPU."""
    devices = {str(d.get("name")): int(d.get("nodeNum", 0)) for d in report.get("deviceStat", [])}
    cpu_ops: dict[str, int] = {}
    for node in report.get("nodeStat", []):
        if "CPU" in str(node.get("device", "")).upper():
            op = str(node.get("opType", node.get("op_type", "?")))
            cpu_ops[op] = cpu_ops.get(op, 0) + 1
    return {"path": path, "device_stat": devices, "cpu_op_types": cpu_ops}


# ---- main loop --------------------------------------------------------------------


def _providers(
    ort: Any, spec: SpecRecord
) -> tuple[dict[str, Any] | None, list[Any], dict[str, str]]:
    """The spec's providers, checked against this build: ``(plugin, its devices, its options)``
    when the target EP comes from a plugin package, ``(None, [], {})`` when every provider is
    built in; ``ProviderUnavailable`` otherwise.

    A plugin library registered here (by the probe, or by an earlier open) puts its EP in
    get_available_providers(), but a session that names it in providers= silently runs on the
    CPU EP alone: a plugin EP is only ever taken through add_provider_for_devices."""
    plugged = {r["ep"] for r in _registered.values() if r["status"] == "registered"}
    available = set(ort.get_available_providers()) - plugged
    missing = [p for p in spec["providers"] if p not in available]
    if missing == spec["providers"][:1] and spec.get("plugins"):
        # The target EP is not built in: take it from a plugin package, on its devices.
        tried = []
        for plugin in spec["plugins"]:
            reg = register_plugin(ort, plugin)
            if reg["status"] != "registered":
                tried.append(
                    f"{plugin['package']}: {reg['status']}{' (' + reg['error'] + ')' if reg['error'] else ''}"
                )
                continue
            devices, options, looked_for = select_ep_devices(
                ort, plugin, spec["provider_options"][0]
            )
            if devices:
                return reg, devices, options
            listed = "; ".join(
                f"{d['ep_name']} on {d['device_type']} {d['vendor']}" for d in ep_devices(ort)
            )
            tried.append(
                f"{plugin['package']} {reg['version']} registered, but get_ep_devices() lists no device "
                f"for {looked_for} (it lists: {listed or 'nothing'})"
            )
        raise ProviderUnavailable(
            f"{missing[0]} is not built into this onnxruntime {ort.__version__} "
            f"(it offers {', '.join(sorted(available))}) and no plugin gives it a device: {'; '.join(tried)}"
        )
    if missing:
        # ORT would only warn and fall back to the CPU: that is exactly the silent
        # success this project exists to prevent.
        raise ProviderUnavailable(
            f"{', '.join(missing)} not in this onnxruntime {ort.__version__} build "
            f"(it offers {', '.join(sorted(available))})"
        )
    return None, [], {}


def _session_options(ort: Any, spec: SpecRecord, record: bool, log_severity: int) -> Any:
    """``SessionOptions`` from the spec's ``session_options`` and ``session_config``; with
    ``record``, the node assignment is recorded."""
    so = ort.SessionOptions()
    so.log_severity_level = log_severity
    for key, value in spec.get("session_options", {}).items():
        if key == "execution_mode":
            so.execution_mode = {
                "sequential": ort.ExecutionMode.ORT_SEQUENTIAL,
                "parallel": ort.ExecutionMode.ORT_PARALLEL,
            }[value]
        elif key == "graph_optimization_level":
            so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, value)
        else:
            setattr(so, key, value)
    for key, value in spec.get("session_config", {}).items():
        so.add_session_config_entry(key, str(value))
    if record:
        so.add_session_config_entry(RECORD_ASSIGNMENT, "1")
    return so


def _plugin_reply(plugin: dict[str, Any], devices: list[Any]) -> dict[str, Any]:
    """The plugin a session's EP came from, and the devices it was given, as the reply carries them."""
    return {
        "package": plugin["package"],
        "version": plugin["version"],
        "library": plugin["library"],
        "devices": [
            {
                "device_type": str(d.device.type).rsplit(".", 1)[-1],
                "vendor": d.device.vendor,
                "device_id": int(d.device.device_id),
                "ep_metadata": {str(k): str(v) for k, v in dict(d.ep_metadata).items()},
            }
            for d in devices
        ],
    }


def main() -> None:
    proto_in = sys.stdin.buffer
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything else written to fd 1 (native libraries) goes to stderr
    sys.stdout = sys.stderr
    sessions = Sessions()
    while True:
        try:
            message = read_message(proto_in)
        except (EOFError, ValueError) as exc:
            sys.stderr.write(f"omni-edge route worker: {exc}\n")
            return
        if message is None or message.get("op") == "exit":
            return
        reply: dict[str, Any] = {"id": message.get("id")}
        try:
            reply["result"] = sessions.dispatch(message["op"], message.get("args", {}))
            reply["ok"] = True
        except Exception as exc:
            reply["ok"] = False
            reply["error"] = {
                "type": type(exc).__name__,
                "message": str(exc),
                "traceback": traceback.format_exc(),
            }
        try:
            frame = encode(reply)
        except TypeError as exc:  # an output that cannot cross (a dtype the wire refuses)
            frame = encode(
                {
                    "id": reply["id"],
                    "ok": False,
                    "error": {
                        "type": type(exc).__name__,
                        "message": str(exc),
                        "traceback": traceback.format_exc(),
                    },
                }
            )
        proto_out.write(frame)
        proto_out.flush()


if __name__ == "__main__":
    main()
