"""The program a route runs: opens ONNX Runtime sessions and answers framed requests.

The route program is **self-contained** (standard library + numpy; onnxruntime is
imported on first use) because it runs inside interpreters that have neither
omni-edge nor its dependencies: a venv with ``onnxruntime-openvino``, or a
Windows ``python.exe`` reached from WSL. It is three modules: ``wire.py`` (the
bootstrap and the frames), ``worker_probe.py`` (what a probe reports) and this one
(the sessions and the loop), each importable normally here, whose sources the
client (``sessions.py``, ``ROUTE_PROGRAM``) sends concatenated over stdin after a
one-line bootstrap; so the route needs no copy of the repository and no path
translation for code, and none of the three imports anything but the standard
library and each other (in that order).

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
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    import numpy as np

    JsonObject = dict[str, Any]
    """A JSON object on its way out of this worker to the process that started it (this file
    is stdlib-only and stands alone in a route: it has ``orchestrator.core.documents``'s alias
    under the same name, for the type checker only)."""
    Feeds = dict[str, np.ndarray | np.generic]
    """A session's inputs by name: arrays, or numpy scalars for 0-d inputs."""

# imported as a package here; in a route, the program's earlier parts (ROUTE_PROGRAM) already
# defined these names and no orchestrator package need be importable
with contextlib.suppress(ImportError):
    from orchestrator.ort.wire import encode, read_message
    from orchestrator.ort.worker_probe import (
        EngineRecord,
        PluginRecord,
        ProviderUnavailable,
        Registration,
        engines_found,
        ep_devices,
        ort_builds,
        plugged_eps,
        register_plugin,
        runtime_identity,
        select_ep_devices,
    )

# numpy is imported where arrays are handled, not here: the planner imports this
# module for ORT_DISTRIBUTIONS and runtime_identity (stdlib only), and `omni-edge
# plan` must not pay numpy's import for them. main() imports it first thing.

RECORD_ASSIGNMENT = "session.record_ep_graph_assignment_info"


# ---- framing ----------------------------------------------------------------------


# ---- sessions ---------------------------------------------------------------------


# ---- plugin EPs (ONNX Runtime >= 1.22) -------------------------------------------------


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
    what ``sessions.with_plugins`` adds from the target EP's row: its ``plugins`` and the
    coverage ``report`` it writes)."""

    session_options: dict[str, str | int | float | bool]
    session_config: dict[str, str]
    plugins: list[PluginRecord]
    report: dict[str, str]


class EpOptions(TypedDict):
    given: dict[str, str]
    reported: dict[str, str] | None


class SessionIO(TypedDict):
    """One input or output of an opened session: its name, ONNX Runtime's type name
    (``tensor(float)``) and shape (a size, an axis's name, or None)."""

    name: str
    type: str
    shape: list[int | str | None]


class AssignedNodes(TypedDict):
    """One subgraph an EP took: the EP and its nodes (op type, node name)."""

    ep: str
    nodes: list[list[str]]


class EpReport(TypedDict):
    """An EP's own assignment report, summarised: where it was, node counts per device and
    the op types left on a CPU."""

    path: str
    device_stat: dict[str, int]
    cpu_op_types: dict[str, int]


class PluginDevice(TypedDict):
    device_type: str
    vendor: str
    device_id: int
    ep_metadata: dict[str, str]


class PluginReply(TypedDict):
    """The plugin package a session's EP came from, and the devices it was given."""

    package: str
    version: str | None
    library: str | None
    devices: list[PluginDevice]


class RunReply(TypedDict):
    """What ``run`` answers: each output's array and the session's own run time."""

    outputs: dict[str, np.ndarray]
    run_s: float


class OpenedSession(TypedDict):
    """What ``open`` answers: the handle, the providers the session took, the EP options
    given and reported, the node assignment, the graph's inputs and outputs, the plugin."""

    handle: int
    providers: list[str]
    ep_options: EpOptions
    assignment: list[AssignedNodes] | None
    assignment_api: bool
    load_s: float
    inputs: list[SessionIO]
    outputs: list[SessionIO]
    ep_report: EpReport | None
    """The EP's own coverage report, summarised (:func:`ep_report`), where it wrote one."""
    plugin: PluginReply | None


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
    report = spec.get("report", {"file": ""})
    if not isinstance(report, dict) or not isinstance(report.get("file"), str):
        wrong.append(f"'report' is {report!r}, not a mapping with a 'file'")
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
        plugins: list[PluginRecord] | None = None,
        engines: list[EngineRecord] | None = None,
    ) -> JsonObject:
        """This interpreter's Python, numpy, onnxruntime and its EPs; every plugin EP
        package in ``plugins`` that is installed is registered first, and what
        ``get_ep_devices()`` then lists is reported (``ep_devices``), with the
        plugin EPs that expose a device added to ``providers``; of the decode ``engines`` asked
        about, what :func:`engines_found` finds."""
        dist, _version = runtime_identity()
        out: JsonObject = {
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
                AssignedNodes(ep=sg.ep_name, nodes=[[n.op_type, n.name] for n in sg.get_nodes()])
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
            "ep_report": ep_report(spec),
            "plugin": None if plugin is None else _plugin_reply(plugin, plugin_devices),
        }

    def run(
        self,
        handle: int,
        feeds: Feeds,
        outputs: list[str] | None = None,
    ) -> RunReply:
        import numpy as np

        session = self._sessions[handle]
        names = outputs or [o.name for o in session.get_outputs()]
        feeds = {k: _native_byte_order(v) for k, v in _by_name(session, feeds).items()}
        t0 = time.perf_counter()
        values = session.run(names, feeds)
        run_s = time.perf_counter() - t0
        return {"outputs": {n: np.asarray(values[i]) for i, n in enumerate(names)}, "run_s": run_s}

    def close(self, handle: int) -> dict[str, object]:
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


def _by_name(session: Any, feeds: Any) -> Feeds:
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


def _meta(arg: Any) -> SessionIO:
    return SessionIO(
        name=arg.name,
        type=arg.type,
        shape=[d if isinstance(d, (int, str)) else None for d in arg.shape],
    )


def ep_report(spec: SpecRecord) -> EpReport | None:
    """The target EP's own assignment report, summarised, when its row names one (the spec's
    ``report``: its ``file``, and the ``env`` variable the EP reads for another file name) and
    the EP wrote it: under ``<cache_dir>/<cache_key>/`` of the session's provider options, or
    where the variable points."""
    report = spec.get("report")
    if not report:
        return None
    candidates = []
    env = os.environ.get(report["env"]) if report.get("env") else None
    for opts in spec.get("provider_options", []):
        if "cache_dir" in opts and "cache_key" in opts:
            candidates.append(os.path.join(opts["cache_dir"], opts["cache_key"], report["file"]))
            if env:
                candidates.append(os.path.join(opts["cache_dir"], opts["cache_key"], env))
    if env:
        candidates.append(env)
    for path in candidates:
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                return summarise_ep_report(json.load(f), path)
    return None


def summarise_ep_report(report: dict[str, Any], path: str) -> EpReport:
    """``deviceStat`` (per-device node counts) and the op types of nodes left on a CPU."""
    devices = {str(d.get("name")): int(d.get("nodeNum", 0)) for d in report.get("deviceStat", [])}
    cpu_ops: dict[str, int] = {}
    for node in report.get("nodeStat", []):
        if "CPU" in str(node.get("device", "")).upper():
            op = str(node.get("opType", node.get("op_type", "?")))
            cpu_ops[op] = cpu_ops.get(op, 0) + 1
    return EpReport(path=path, device_stat=devices, cpu_op_types=cpu_ops)


# ---- main loop --------------------------------------------------------------------


def _providers(ort: Any, spec: SpecRecord) -> tuple[Registration | None, list[Any], dict[str, str]]:
    """The spec's providers, checked against this build: ``(plugin, its devices, its options)``
    when the target EP comes from a plugin package, ``(None, [], {})`` when every provider is
    built in; ``ProviderUnavailable`` otherwise.

    A plugin library registered here (by the probe, or by an earlier open) puts its EP in
    get_available_providers(), but a session that names it in providers= silently runs on the
    CPU EP alone: a plugin EP is only ever taken through add_provider_for_devices."""
    plugged = plugged_eps()
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
            }[str(value)]
        elif key == "graph_optimization_level":
            so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, str(value))
        else:
            setattr(so, key, value)
    for key, value in spec.get("session_config", {}).items():
        so.add_session_config_entry(key, str(value))
    if record:
        so.add_session_config_entry(RECORD_ASSIGNMENT, "1")
    return so


def _plugin_reply(plugin: Registration, devices: list[Any]) -> PluginReply:
    """The plugin a session's EP came from, and the devices it was given, as the reply carries them."""
    return PluginReply(
        package=plugin["package"],
        version=plugin["version"],
        library=plugin["library"],
        devices=[
            PluginDevice(
                device_type=str(d.device.type).rsplit(".", 1)[-1],
                vendor=d.device.vendor,
                device_id=int(d.device.device_id),
                ep_metadata={str(k): str(v) for k, v in dict(d.ep_metadata).items()},
            )
            for d in devices
        ],
    )


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
        reply: JsonObject = {"id": message.get("id")}
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
