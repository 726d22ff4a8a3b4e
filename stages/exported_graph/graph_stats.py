"""What an ONNX graph says about itself, read without a session, and memoised.

* ``describe_graph`` reads an ONNX graph's structure **without creating a
  session** (ONNX Runtime is never imported here) and reports node counts, the
  op histogram, initializer bytes including external data, the opset and the
  sha256 of the file(s). External data must stay beside the graph: an absolute
  location or one that climbs out with ``..`` is a ``ConfigError``.
* ``onnx`` is imported lazily, and a graph's statistics are memoised under the
  omni-edge cache keyed by each file's size, mtime, ctime, inode and device, so
  re-planning does not re-read a 60 MB graph; a memo whose numbers are
  inconsistent or implausible is ignored (with a warning) and the graph re-read.
* ``check_against_graph`` compares what a manifest promises (input and output
  names, dtypes, shapes) with what a graph declares.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypedDict

from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import ConfigError, Problem
from orchestrator.core.fileio import write_json_atomic
from orchestrator.core.settings import cache_write_failed, graph_stats_dir
from stages.exported_graph.artifact import (
    MANIFEST_NAME,
    ExportedArtifact,
    check_relative,
    file_sha256,
    inside,
)

log = logging.getLogger(__name__)

GRAPH_STATS_VERSION = 3
"""Bump when ``GraphStats`` changes so memoised statistics are recomputed."""


class ValueInfo(TypedDict):
    """One graph input or output as the graph declares it: its name, element type (numpy's
    spelling; ``onnx:N`` for one numpy has not) and shape (a size, or an axis's name)."""

    name: str
    dtype: str
    shape: list[int | str]


@dataclass(frozen=True)
class GraphStats:
    """What an ONNX graph says about itself, read without a session."""

    path: str
    sha256: str
    """Digest of the graph file followed by its external data files (sorted)."""
    file_bytes: int
    """Bytes on disk: the graph file plus external data files."""
    node_count: int
    """Top-level nodes, before ORT's graph optimizations."""
    subgraph_node_count: int
    """Nodes inside control-flow bodies (If/Loop/Scan), not in ``node_count``."""
    op_histogram: dict[str, int]
    initializer_bytes: int
    """Embedded plus external initializer bytes: the weights (evidence D)."""
    external_data: list[str]
    opset: dict[str, int]
    ir_version: int
    inputs: list[ValueInfo]
    outputs: list[ValueInfo]

    def to_dict(self) -> JsonObject:
        """The statistics as the graph cache file keeps them."""
        return asdict(self)


_ELEM = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    8: "string",
    9: "bool",
    10: "float16",
    11: "float64",
    12: "uint32",
    13: "uint64",
    16: "bfloat16",
}
_ELEM_BYTES = {
    1: 4,
    2: 1,
    3: 1,
    4: 2,
    5: 2,
    6: 4,
    7: 8,
    9: 1,
    10: 2,
    11: 8,
    12: 4,
    13: 8,
    16: 2,
    17: 1,
    18: 1,
    19: 1,
    20: 1,
    21: 1,
    22: 1,
    23: 1,
}


READ_TRIES = 3
"""Reads of a graph whose files change while it is read, before it is refused."""


def describe_graph(path: str | Path, *, use_cache: bool = True) -> GraphStats:
    """Statistics of one ONNX graph file; never creates a session.

    With ``use_cache`` the result is memoised under the omni-edge cache, valid
    while every file (graph and external data) keeps its size, mtime, ctime,
    inode and device, and its numbers are consistent (:func:`memo_problem`);
    ``use_cache=False`` always reads and hashes (``omni-edge verify --force``).
    Every file is stamped before it is read and stamped again after: a file
    that changed in between is read again (``READ_TRIES`` times, then refused),
    so statistics — and the digest evidence is keyed by — are never those of
    another content than the stamps a memo keeps. Raises ``ConfigError`` for
    an unreadable graph, external data that leaves the graph's directory, or
    files that keep changing.
    """
    p = Path(path).resolve()
    if not p.is_file():
        raise ConfigError.single(
            str(p), "the ONNX graph does not exist", "check the artifact's precisions"
        )
    memo = _memo_path(p)
    if use_cache:
        cached = _read_memo(memo, p)
        if cached is not None:
            return cached
    for _ in range(READ_TRIES):
        stats, stamps = _read_graph(p)
        if _unchanged(stamps):
            if use_cache:
                _write_memo(memo, p, stats, stamps)
            return stats
        log.info("%s changed while it was read; reading it again", p)
    raise ConfigError.single(
        str(p),
        f"the graph or its external data changed while it was read, {READ_TRIES} times",
        "read it once nothing is writing it (an export or a copy still running?)",
    )


def _unchanged(stamps: dict[str, list[int]]) -> bool:
    """Whether every file still has the stamp it had before it was read."""
    try:
        return all(_stamp(Path(name)) == stamp for name, stamp in stamps.items())
    except OSError:  # gone meanwhile
        return False


def _read_graph(p: Path) -> tuple[GraphStats, dict[str, list[int]]]:
    """The statistics of ``p``, and the stamp of each file they were read from, each taken
    before that file was read (the graph before it is parsed, its external data before it
    is hashed)."""
    stamps = {str(p): _stamp(p)}
    try:
        import onnx
    except ImportError:  # pragma: no cover - the onnx extra is missing
        raise ConfigError.single(
            str(p), "reading ONNX graphs needs the onnx package", "pip install 'omni-edge[onnx]'"
        ) from None
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as exc:
        raise ConfigError.single(
            str(p), f"not a readable ONNX graph: {type(exc).__name__}: {exc}", "re-export the graph"
        ) from None
    graph = model.graph
    histogram: dict[str, int] = {}
    for node in graph.node:
        histogram[node.op_type] = histogram.get(node.op_type, 0) + 1
    external, embedded = _initializer_bytes(graph, p, onnx)
    files = [p, *sorted((p.parent / loc).resolve() for loc in external)]
    stamps.update({str(f): _stamp(f) for f in files[1:]})
    digest = hashlib.sha256()
    for f in files:
        digest.update(bytes.fromhex(file_sha256(f)))
    stats = GraphStats(
        path=str(p),
        sha256=digest.hexdigest() if len(files) > 1 else file_sha256(p),
        file_bytes=sum(stamps[str(f)][0] for f in files),
        node_count=len(graph.node),
        subgraph_node_count=_subgraph_nodes(graph, onnx),
        op_histogram=dict(sorted(histogram.items(), key=lambda kv: (-kv[1], kv[0]))),
        initializer_bytes=embedded + sum(external.values()),
        external_data=sorted(external),
        opset={(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import},
        ir_version=int(model.ir_version),
        inputs=[
            _value_info(v) for v in graph.input if v.name not in {t.name for t in graph.initializer}
        ],
        outputs=[_value_info(v) for v in graph.output],
    )
    return stats, stamps


def _initializer_bytes(graph: Any, p: Path, onnx: Any) -> tuple[dict[str, int], int]:
    """The bytes of ``p``'s weights: per external data file (its location), and embedded.
    ``ConfigError`` for external data that is not a file beside the graph."""
    external: dict[str, int] = {}
    embedded = 0
    problems: list[Problem] = []
    for tensor in _all_initializers(graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            embedded += _embedded_nbytes(tensor)
            continue
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        where = f"{p}: initializer {tensor.name}"
        try:
            check_relative(location, "external data location")
        except ValueError as exc:
            problems.append(
                Problem(
                    where,
                    str(exc),
                    "re-save the graph with its external data beside it (onnx.save(..., location='<name>.data'))",
                )
            )
            continue
        target = (p.parent / location).resolve()
        if not inside(target, p.parent.resolve()):
            problems.append(
                Problem(
                    where,
                    f"external data {location!r} resolves to {target}, outside {p.parent}",
                    "keep external data files inside the artifact directory",
                )
            )
            continue
        if not target.is_file():
            problems.append(
                Problem(
                    where,
                    f"external data file {location!r} does not exist",
                    "copy the .data file next to the graph",
                )
            )
            continue
        length = int(info["length"]) if "length" in info else _tensor_nbytes(tensor)
        external[location] = external.get(location, 0) + length
    if problems:
        raise ConfigError(problems)
    return external, embedded


def _all_initializers(graph: Any) -> list[Any]:
    """Initializers and Constant tensors, those of subgraphs (If/Loop/Scan bodies) included:
    silero_vad.onnx keeps all 2.2 MB of its weights inside its If's branches."""
    out = list(graph.initializer)
    for node in graph.node:
        if node.op_type == "Constant":
            out.extend(a.t for a in node.attribute if a.name == "value" and a.HasField("t"))
        for a in node.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                out.extend(_all_initializers(sub))
    return out


def _embedded_nbytes(tensor: Any) -> int:
    if tensor.raw_data:
        return len(tensor.raw_data)
    return _tensor_nbytes(tensor)


def _tensor_nbytes(tensor: Any) -> int:
    n = 1
    for d in tensor.dims:
        n *= int(d)
    if tensor.data_type == 8:  # strings have no fixed width: count what is stored
        return sum(len(s) for s in tensor.string_data)
    bits_per = {22: 4, 21: 4}.get(tensor.data_type)  # int4/uint4 pack two per byte
    if bits_per:
        return (n * bits_per + 7) // 8
    return n * _ELEM_BYTES.get(tensor.data_type, 4)


def _subgraph_nodes(graph: Any, onnx: Any) -> int:
    count = 0
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                count += len(attr.g.node) + _subgraph_nodes(attr.g, onnx)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    count += len(g.node) + _subgraph_nodes(g, onnx)
    return count


def _value_info(v: Any) -> ValueInfo:
    t = v.type.tensor_type
    shape: list[int | str] = []
    for d in t.shape.dim:
        shape.append(int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?"))
    return ValueInfo(name=v.name, dtype=_ELEM.get(t.elem_type, f"onnx:{t.elem_type}"), shape=shape)


def check_against_graph(
    artifact: ExportedArtifact, precision: str, stats: GraphStats
) -> list[Problem]:
    """Differences between what the manifest promises and what the graph declares."""
    where = f"{artifact.dir / MANIFEST_NAME}"
    problems: list[Problem] = []
    for group, declared in (("inputs", stats.inputs), ("outputs", stats.outputs)):
        specs = getattr(artifact.manifest, group)
        promised = [t.name for t in specs]
        actual = [v["name"] for v in declared]
        if promised != actual:
            problems.append(
                Problem(
                    f"{where}: {group}",
                    f"the manifest lists {promised} but the {precision} graph's {group} are {actual}",
                    f"make manifest {group} match the graph ({stats.path})",
                )
            )
            continue
        for i, (spec, graph_value) in enumerate(zip(specs, declared, strict=True)):
            if precision == "fp32" and spec.dtype != graph_value["dtype"]:
                problems.append(
                    Problem(
                        f"{where}: {group}[{i}].dtype",
                        f"{spec.name!r} is {graph_value['dtype']} in the {precision} graph, not {spec.dtype}",
                        "write the graph's dtype in the manifest",
                    )
                )
            shape = graph_value["shape"]
            clash = len(spec.shape) != len(shape) or any(
                isinstance(a, int) and isinstance(b, int) and a != b
                for a, b in zip(spec.shape, shape, strict=True)
            )
            if clash:
                problems.append(
                    Problem(
                        f"{where}: {group}[{i}].shape",
                        f"{spec.name!r} has shape {shape} in the {precision} graph; the manifest says {spec.shape}",
                        "match the rank and the fixed dimensions (strings name dynamic axes)",
                    )
                )
    return problems


# ---- the memo ------------------------------------------------------------------------


def _memo_path(p: Path) -> Path:
    return graph_stats_dir() / f"{hashlib.sha256(str(p).encode()).hexdigest()[:24]}.json"


def _stamp(p: Path) -> list[int]:
    """What must stay equal for a memo of ``p`` to hold: size, mtime, ctime, inode,
    device (as ``stages.ar_decode.checkpoint.file_stamp``). A rewrite that restores
    size and mtime still changes ctime; a file swapped in by rename changes the inode."""
    st = p.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


NON_WEIGHT_BYTES_BASE = 1 << 20
NON_WEIGHT_BYTES_PER_NODE = 8 << 10
"""What a graph file may hold besides its weights: names, shapes, attributes and
metadata. Measured: the piper voice 217 bytes per node, silero VAD 0.66 MB for 90
nodes (its If bodies); a memo claiming fewer weight bytes than the file minus this
allowance is implausible (an edited memo would shrink a reservation)."""


def memo_problem(stats: GraphStats, stamps: dict[str, list[int]], p: Path) -> str | None:
    """Why memoised statistics cannot be right for the files they were stamped from, or None."""
    counts = {
        "file_bytes": stats.file_bytes,
        "node_count": stats.node_count,
        "subgraph_node_count": stats.subgraph_node_count,
        "initializer_bytes": stats.initializer_bytes,
        "ir_version": stats.ir_version,
    }
    for name, value in counts.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"{name} is {value!r}, not a non-negative integer"
    if stats.path != str(p):
        return f"it describes {stats.path}, not {p}"
    if (
        not isinstance(stats.sha256, str)
        or len(stats.sha256) != 64
        or any(c not in "0123456789abcdef" for c in stats.sha256)
    ):
        return "sha256 is not a hex digest"
    if (
        not isinstance(stats.op_histogram, dict)
        or sum(stats.op_histogram.values()) != stats.node_count
    ):
        return f"the op histogram does not add up to node_count {stats.node_count}"
    on_disk = sum(stamp[0] for stamp in stamps.values())
    if stats.file_bytes != on_disk:
        return f"file_bytes {stats.file_bytes} is not the {on_disk} bytes the files hold"
    if stats.initializer_bytes > stats.file_bytes:
        return (
            f"initializer_bytes {stats.initializer_bytes} exceeds the file bytes {stats.file_bytes}"
        )
    allowance = NON_WEIGHT_BYTES_BASE + NON_WEIGHT_BYTES_PER_NODE * (
        stats.node_count + stats.subgraph_node_count
    )
    if stats.file_bytes - stats.initializer_bytes > allowance:
        return (
            f"initializer_bytes {stats.initializer_bytes} leaves {stats.file_bytes - stats.initializer_bytes} of "
            f"{stats.file_bytes} bytes to {stats.node_count + stats.subgraph_node_count} nodes (at most {allowance} is plausible)"
        )
    return None


def _read_memo(memo: Path, p: Path) -> GraphStats | None:
    try:
        record = json.loads(memo.read_text(encoding="utf-8"))
        if record.get("version") != GRAPH_STATS_VERSION or record.get("path") != str(p):
            return None
        stamps = record["stamps"]
        if str(p) not in stamps:
            return None
        for name, stamp in stamps.items():
            if _stamp(Path(name)) != stamp:
                return None
        stats = GraphStats(**record["stats"])
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning(
            "ignoring the graph statistics memo %s for %s (%s: %s); reading the graph again",
            memo,
            p,
            type(exc).__name__,
            exc,
        )
        return None
    try:
        problem = memo_problem(stats, stamps, p)
    except (TypeError, ValueError, AttributeError, IndexError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
    if problem is not None:
        log.warning(
            "ignoring the graph statistics memo %s for %s: %s; reading the graph again",
            memo,
            p,
            problem,
        )
        return None
    return stats


def _write_memo(memo: Path, p: Path, stats: GraphStats, stamps: dict[str, list[int]]) -> None:
    """Memoise ``stats`` under the stamps the files had before they were read (and still had
    after): never a stamp taken later, which could be a newer content's."""
    record = {
        "version": GRAPH_STATS_VERSION,
        "path": str(p),
        "stamps": stamps,
        "stats": stats.to_dict(),
    }
    problem = memo_problem(stats, stamps, p)
    if problem is not None:
        # A real graph outside the plausibility bounds (e.g. megabytes of metadata) is read
        # every time rather than memoised, so its memo is never flagged as edited.
        log.info("not memoising the statistics of %s: %s", p, problem)
        return
    try:
        write_json_atomic(memo, record, indent=None, durable=False)  # a cache: cheap to rebuild
    except OSError as exc:  # a read-only cache costs speed, never correctness
        cache_write_failed(memo.parent, "graph statistics", exc)
