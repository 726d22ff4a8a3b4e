"""How a route program is started and spoken to: the bootstrap a child interpreter runs (the working directory off sys.path first), and the frames both sides exchange (JSON headers and raw array buffers, never pickle). Part of the route program (worker.py)."""

from __future__ import annotations

import json
import struct
import sys
from typing import IO, Any

MAGIC = b"OEW1"


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
