"""Exported artifacts (contract ``omni-edge.export/1``): a directory with a manifest.

An exported stage is data: a directory holding ``manifest.yaml``, one ONNX
file per precision (or a ``package://`` location inside an installed PyPI
package), and the reference inputs the numeric gate runs. See
``docs/exported-artifacts.md``.

Guarantees:

* ``load_artifact`` reads only the manifest and checks that every file it
  names exists inside the artifact directory; every problem becomes a
  ``ConfigError`` entry (where → what → how to fix).
* ``describe_graph`` reads an ONNX graph's structure **without creating a
  session** (ONNX Runtime is never imported here) and reports node counts, the
  op histogram, initializer bytes including external data, the opset and the
  sha256 of the file(s). External data must stay beside the graph: an absolute
  location or one that climbs out with ``..`` is a ``ConfigError``.
* ``onnx`` and ``numpy`` are imported lazily, and a graph's statistics are
  memoised under the omni-edge cache keyed by each file's size and mtime, so
  re-planning does not re-read a 60 MB graph.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from orchestrator.errors import ConfigError, Problem
from orchestrator.fileio import write_json_atomic
from orchestrator.validation import Strict, problems_from_validation, read_document

log = logging.getLogger(__name__)

EXPORT_FORMAT = "omni-edge.export/1"
MANIFEST_NAME = "manifest.yaml"
PACKAGE_SCHEME = "package://"
GRAPH_STATS_VERSION = 1
"""Bump when ``GraphStats`` changes so memoised statistics are recomputed."""

Precision = Literal["fp32", "fp16", "bf16", "int8", "int4"]
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16", "int8", "int4")
"""fp32/fp16/bf16: float graphs; int8: QDQ (or QOperator) int8; int4: weight-only
int4 (MatMulNBits). The vocabulary grows compatibly; a name never changes meaning."""

TensorDType = Literal[
    "float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8",
    "uint64", "uint32", "uint16", "uint8", "bool", "string",
]

DEFAULT_MIN_EP_COVERAGE = 0.5
"""At 0.5 or more, most of the graph's nodes run where the plan says they run.
Below that the CPU does most of the work and every partition boundary adds a
host↔device copy, so the placement would be a CPU placement in disguise: plan
it on the CPU explicitly instead."""

_ENTRY_POINT = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"


class Source(Strict):
    """Where the graph came from, so a user can judge and reproduce it."""

    origin: str = Field(description="Where the graph was obtained: a URL, a PyPI package and version, or an export script.")
    license: str = Field(description="License of the weights/graph (SPDX id where there is one).")
    notes: str = Field("", description="Anything else a user should know: training data, who exported it and how.")


class TensorSpec(Strict):
    """One graph input or output as the manifest promises it."""

    name: str = Field(min_length=1, description="Tensor name exactly as in the ONNX graph.")
    dtype: TensorDType = Field(description="Element type (numpy spelling: float32, int64, ...).")
    shape: list[int | str] = Field(
        description="Dimensions; a string names a dynamic axis (e.g. batch, phonemes), an int is fixed."
    )


class Reference(Strict):
    """The data the numeric gate runs."""

    inputs: str = Field(description="An .npz file in the artifact directory, one array per graph input name.")
    outputs: str | None = Field(
        None,
        description="Optional .npz of expected outputs (e.g. from the exporting framework). When present it is the reference; otherwise the CPU EP running the fp32 graph is.",
    )


class Tolerance(Strict):
    """How close the target's outputs must be to the reference (all three must hold)."""

    rel_l2: float = Field(1e-3, ge=0, description="Largest allowed ||target − ref||₂ / ||ref||₂ per output.")
    max_abs: float = Field(1e-3, ge=0, description="Largest allowed |target − ref| for any element.")
    cosine_min: float = Field(0.999, ge=-1, le=1, description="Smallest allowed cosine similarity between target and reference, per output.")


class ExportManifest(Strict):
    """``manifest.yaml`` of an exported artifact (contract ``omni-edge.export/1``)."""

    format: Literal["omni-edge.export/1"] = Field(description="Format tag; must be omni-edge.export/1.")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", description="Artifact name, shown in plans and evidence.")
    version: str = Field(min_length=1, description="Version of this artifact (not of the format).")
    description: str = Field("", description="Free text for humans.")
    source: Source = Field(description="Where the graph came from and under which license.")
    precisions: dict[Precision, str] = Field(
        min_length=1,
        description="Precision → ONNX file: a path relative to the artifact directory, or package://<importable_package>/<path> inside an installed package.",
    )
    inputs: list[TensorSpec] = Field(min_length=1, description="Graph inputs, in the graph's order.")
    outputs: list[TensorSpec] = Field(min_length=1, description="Graph outputs, in the graph's order.")
    reference: Reference = Field(description="Reference inputs (and optionally outputs) for the numeric gate.")
    tolerance: Tolerance = Field(default_factory=Tolerance, description="Numeric gate tolerance.")
    min_ep_coverage: float = Field(
        DEFAULT_MIN_EP_COVERAGE, ge=0, le=1,
        description="Fraction of the graph's nodes the target EP must take (after ORT's graph optimizations). Default 0.5: below it the CPU does most of the work.",
    )
    preprocess: str | None = Field(
        None, pattern=_ENTRY_POINT,
        description="module:function turning one input item into the graph's input arrays; called as fn(item, artifact).",
    )
    postprocess: str | None = Field(
        None, pattern=_ENTRY_POINT,
        description="module:function turning the graph's outputs (name → array) into one output item; called as fn(outputs, artifact).",
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Free map for the hooks and for humans (sample_rate, voice config, ...)."
    )
    activation_bytes: int | None = Field(
        None, ge=0,
        description="Peak bytes of one inference's intermediate tensors for the largest item the preprocess hook "
        "produces, as measured by the artifact's author (e.g. '320MiB'); default max(64 MiB, half the weights).",
    )
    activation_note: str = Field("", description="Where activation_bytes comes from (what was measured, on what input).")

    @field_validator("activation_bytes", mode="before")
    @classmethod
    def _bytes(cls, value: Any) -> Any:
        from orchestrator.units import parse_bytes

        return None if value is None else parse_bytes(value)

    @field_validator("precisions")
    @classmethod
    def _locations(cls, value: dict[str, str]) -> dict[str, str]:
        for precision, location in value.items():
            _check_location(location, f"precisions.{precision}")
        return value

    @model_validator(mode="after")
    def _check(self) -> ExportManifest:
        _check_location(self.reference.inputs, "reference.inputs", package_ok=False)
        if not self.reference.inputs.endswith(".npz"):
            raise ValueError(f"reference.inputs must be an .npz file, got {self.reference.inputs!r}")
        if self.reference.outputs is not None:
            _check_location(self.reference.outputs, "reference.outputs", package_ok=False)
            if not self.reference.outputs.endswith(".npz"):
                raise ValueError(f"reference.outputs must be an .npz file, got {self.reference.outputs!r}")
        if "fp32" not in self.precisions and self.reference.outputs is None:
            raise ValueError(
                "the numeric gate needs a reference: add an fp32 graph to precisions "
                "(the CPU EP runs it as the reference) or reference.outputs (recorded expected outputs)"
            )
        for group in ("inputs", "outputs"):
            names = [t.name for t in getattr(self, group)]
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"{group} names must be unique; repeated: {', '.join(dupes)}")
        return self


def _check_location(location: str, field_name: str, *, package_ok: bool = True) -> None:
    """A location stays inside the artifact: relative, no ``..``; or package://pkg/path."""
    if location.startswith(PACKAGE_SCHEME):
        if not package_ok:
            raise ValueError(f"{field_name}: package:// locations are only allowed for graphs, got {location!r}")
        rest = location[len(PACKAGE_SCHEME):]
        package, _, inner = rest.partition("/")
        if not package or not inner:
            raise ValueError(f"{field_name}: write package://<importable_package>/<path>, got {location!r}")
        _check_relative(inner, field_name)
        return
    _check_relative(location, field_name)


def _check_relative(path: str, field_name: str) -> None:
    p = Path(path)
    if p.is_absolute() or path.startswith(("/", "\\")) or (len(path) > 1 and path[1] == ":"):
        raise ValueError(f"{field_name}: {path!r} is absolute; locations are relative to the artifact directory")
    if ".." in p.parts or ".." in Path(path.replace("\\", "/")).parts:
        raise ValueError(f"{field_name}: {path!r} climbs out of the artifact directory with '..'")


# ---- the artifact ---------------------------------------------------------------


@dataclass(frozen=True)
class ExportedArtifact:
    """A loaded manifest and the directory it lives in; files are resolved, not read."""

    dir: Path
    manifest: ExportManifest

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def metadata(self) -> dict[str, Any]:
        return self.manifest.metadata

    def resolve(self, location: str) -> Path:
        """A manifest location as an absolute path (``package://`` resolved without importing)."""
        if location.startswith(PACKAGE_SCHEME):
            return resolve_package_location(location)
        return (self.dir / location).resolve()

    def graph_path(self, precision: str) -> Path:
        try:
            location = self.manifest.precisions[precision]  # type: ignore[index]
        except KeyError:
            raise KeyError(
                f"artifact {self.name!r} has no {precision} graph (it has {', '.join(self.manifest.precisions)})"
            ) from None
        return self.resolve(location)

    def reference_inputs(self) -> dict[str, Any]:
        """The reference input arrays (imports numpy)."""
        return _load_npz(self.resolve(self.manifest.reference.inputs))

    def reference_outputs(self) -> dict[str, Any] | None:
        if self.manifest.reference.outputs is None:
            return None
        return _load_npz(self.resolve(self.manifest.reference.outputs))

    def reference_digest(self) -> str:
        """sha256 over the reference file(s): evidence is keyed by what the gate ran."""
        files = [self.manifest.reference.inputs]
        if self.manifest.reference.outputs:
            files.append(self.manifest.reference.outputs)
        h = hashlib.sha256()
        for f in files:
            h.update(f.encode())
            h.update(bytes.fromhex(file_sha256(self.resolve(f))))
        return h.hexdigest()

    def hook(self, which: Literal["preprocess", "postprocess"]) -> Callable[..., Any] | None:
        """Import and return a hook, or None when the manifest declares none."""
        target = getattr(self.manifest, which)
        if target is None:
            return None
        module_name, _, attr = target.partition(":")
        try:
            module = importlib.import_module(module_name)
            fn = getattr(module, attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError.single(
                f"{self.dir / MANIFEST_NAME}: {which}",
                f"the hook {target!r} cannot be loaded: {type(exc).__name__}: {exc}",
                "install the package that provides it, or fix the module:function name",
            ) from None
        if not callable(fn):
            raise ConfigError.single(f"{self.dir / MANIFEST_NAME}: {which}", f"{target!r} is not callable", "point it at a function")
        return fn


def load_artifact(path: str | Path) -> ExportedArtifact:
    """Read and check an artifact directory's manifest (no graph, no numpy).

    Raises ``ConfigError`` naming the manifest field for unknown keys, bad
    values, locations that leave the directory, and files that do not exist.
    """
    d = Path(path)
    if str(path).startswith(PACKAGE_SCHEME):
        d = resolve_package_location(str(path))
    d = d.resolve()
    manifest_path = d / MANIFEST_NAME
    if not d.is_dir():
        raise ConfigError.single(str(d), "the artifact directory does not exist", f"point `artifact` at a directory holding {MANIFEST_NAME}")
    if not manifest_path.is_file():
        raise ConfigError.single(str(d), f"no {MANIFEST_NAME} in the artifact directory", f"add {MANIFEST_NAME} (see docs/exported-artifacts.md)")
    data = read_document(manifest_path)
    where = str(manifest_path)
    if isinstance(data, dict) and data.get("format") not in (None, EXPORT_FORMAT):
        raise ConfigError.single(f"{where}: format", f"unknown export format {data.get('format')!r}", f"this version reads {EXPORT_FORMAT!r}")
    try:
        manifest = ExportManifest.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(exc, where, ExportManifest)) from None
    artifact = ExportedArtifact(d, manifest)
    problems: list[Problem] = []
    for precision, location in manifest.precisions.items():
        try:
            p = artifact.resolve(location)
        except ConfigError as exc:
            problems.extend(Problem(f"{where}: precisions.{precision}", q.what, q.fix) for q in exc.problems)
            continue
        if not p.is_file():
            problems.append(Problem(f"{where}: precisions.{precision}", f"{location} does not exist (looked at {p})", "export the graph there or fix the path"))
    references = (("reference.inputs", manifest.reference.inputs), ("reference.outputs", manifest.reference.outputs))
    for field_name, ref_location in references:
        if ref_location is None:
            continue
        location = ref_location
        p = artifact.resolve(location)
        if not p.is_file():
            problems.append(Problem(f"{where}: {field_name}", f"{location} does not exist (looked at {p})", "write the .npz there (see docs/exported-artifacts.md) or fix the path"))
        elif not _inside(p, d):
            problems.append(Problem(f"{where}: {field_name}", f"{location} resolves to {p}, outside the artifact directory (a symlink?)", "keep reference files inside the artifact directory"))
    if problems:
        raise ConfigError(problems)
    return artifact


def resolve_package_location(location: str) -> Path:
    """``package://pkg.sub/path`` → an absolute path, found with ``find_spec`` without
    importing the package (a dotted package's parents are searched, not imported)."""
    rest = location[len(PACKAGE_SCHEME):]
    package, _, inner = rest.partition("/")
    parts = package.split(".")
    spec = importlib.util.find_spec(parts[0]) if parts[0] else None
    for part in parts[1:]:
        if spec is None or not spec.submodule_search_locations:
            break
        spec = importlib.machinery.PathFinder.find_spec(part, list(spec.submodule_search_locations))
    if spec is None:
        raise ConfigError.single(location, f"the package {package!r} is not installed in this interpreter", f"pip install the distribution that provides {package!r}")
    if not spec.submodule_search_locations:
        raise ConfigError.single(location, f"{package!r} is a module, not a package", "name the package directory that holds the file")
    roots = [Path(r) for r in spec.submodule_search_locations]
    for root in roots:
        candidate = (root / inner).resolve()
        if candidate.exists():
            return candidate
    return (roots[0] / inner).resolve()


# ---- graph statistics -------------------------------------------------------------


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
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_ELEM = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    8: "string", 9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16",
}
_ELEM_BYTES = {
    1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2,
    17: 1, 18: 1, 19: 1, 20: 1, 21: 1, 22: 1, 23: 1,
}


def describe_graph(path: str | Path, *, use_cache: bool = True) -> GraphStats:
    """Statistics of one ONNX graph file; never creates a session.

    With ``use_cache`` the result is memoised under the omni-edge cache, valid
    while every file (graph and external data) keeps its size and mtime;
    ``use_cache=False`` always reads and hashes (``omni-edge verify --force``).
    Raises ``ConfigError`` for an unreadable graph or external data that
    leaves the graph's directory.
    """
    p = Path(path).resolve()
    if not p.is_file():
        raise ConfigError.single(str(p), "the ONNX graph does not exist", "check the artifact's precisions")
    memo = _memo_path(p)
    if use_cache:
        cached = _read_memo(memo, p)
        if cached is not None:
            return cached
    stats = _read_graph(p)
    if use_cache:
        _write_memo(memo, p, stats)
    return stats


def _read_graph(p: Path) -> GraphStats:
    try:
        import onnx
    except ImportError:  # pragma: no cover - the onnx extra is missing
        raise ConfigError.single(str(p), "reading ONNX graphs needs the onnx package", "pip install 'omni-edge[onnx]'") from None
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as exc:
        raise ConfigError.single(str(p), f"not a readable ONNX graph: {type(exc).__name__}: {exc}", "re-export the graph") from None
    graph = model.graph
    histogram: dict[str, int] = {}
    for node in graph.node:
        histogram[node.op_type] = histogram.get(node.op_type, 0) + 1
    external: dict[str, int] = {}
    embedded = 0
    problems: list[Problem] = []
    for tensor in _all_initializers(graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in tensor.external_data}
            location = info.get("location", "")
            try:
                _check_relative(location, "external data location")
            except ValueError as exc:
                problems.append(Problem(f"{p}: initializer {tensor.name}", str(exc), "re-save the graph with its external data beside it (onnx.save(..., location='<name>.data'))"))
                continue
            target = (p.parent / location).resolve()
            if not _inside(target, p.parent.resolve()):
                problems.append(Problem(f"{p}: initializer {tensor.name}", f"external data {location!r} resolves to {target}, outside {p.parent}", "keep external data files inside the artifact directory"))
                continue
            if not target.is_file():
                problems.append(Problem(f"{p}: initializer {tensor.name}", f"external data file {location!r} does not exist", "copy the .data file next to the graph"))
                continue
            length = int(info["length"]) if "length" in info else _tensor_nbytes(tensor)
            external[location] = external.get(location, 0) + length
        else:
            embedded += _embedded_nbytes(tensor)
    if problems:
        raise ConfigError(problems)
    files = [p, *sorted((p.parent / loc).resolve() for loc in external)]
    digest = hashlib.sha256()
    for f in files:
        digest.update(bytes.fromhex(file_sha256(f)))
    return GraphStats(
        path=str(p),
        sha256=digest.hexdigest() if len(files) > 1 else file_sha256(p),
        file_bytes=sum(f.stat().st_size for f in files),
        node_count=len(graph.node),
        subgraph_node_count=_subgraph_nodes(graph, onnx),
        op_histogram=dict(sorted(histogram.items(), key=lambda kv: (-kv[1], kv[0]))),
        initializer_bytes=embedded + sum(external.values()),
        external_data=sorted(external),
        opset={(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import},
        ir_version=int(model.ir_version),
        inputs=[_value_info(v) for v in graph.input if v.name not in {t.name for t in graph.initializer}],
        outputs=[_value_info(v) for v in graph.output],
    )


def _all_initializers(graph: Any) -> list[Any]:
    out = list(graph.initializer)
    for node in graph.node:
        if node.op_type == "Constant":
            out.extend(a.t for a in node.attribute if a.name == "value" and a.HasField("t"))
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


def _value_info(v: Any) -> dict[str, Any]:
    t = v.type.tensor_type
    shape: list[int | str] = []
    for d in t.shape.dim:
        shape.append(int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?"))
    return {"name": v.name, "dtype": _ELEM.get(t.elem_type, f"onnx:{t.elem_type}"), "shape": shape}


def check_against_graph(artifact: ExportedArtifact, precision: str, stats: GraphStats) -> list[Problem]:
    """Differences between what the manifest promises and what the graph declares."""
    where = f"{artifact.dir / MANIFEST_NAME}"
    problems: list[Problem] = []
    for group, declared in (("inputs", stats.inputs), ("outputs", stats.outputs)):
        specs = getattr(artifact.manifest, group)
        promised = [t.name for t in specs]
        actual = [v["name"] for v in declared]
        if promised != actual:
            problems.append(Problem(
                f"{where}: {group}",
                f"the manifest lists {promised} but the {precision} graph's {group} are {actual}",
                f"make manifest {group} match the graph ({stats.path})",
            ))
            continue
        for i, (spec, graph_value) in enumerate(zip(specs, declared, strict=True)):
            if precision == "fp32" and spec.dtype != graph_value["dtype"]:
                problems.append(Problem(
                    f"{where}: {group}[{i}].dtype",
                    f"{spec.name!r} is {graph_value['dtype']} in the {precision} graph, not {spec.dtype}",
                    "write the graph's dtype in the manifest",
                ))
            shape = graph_value["shape"]
            clash = len(spec.shape) != len(shape) or any(
                isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(spec.shape, shape, strict=True)
            )
            if clash:
                problems.append(Problem(
                    f"{where}: {group}[{i}].shape",
                    f"{spec.name!r} has shape {shape} in the {precision} graph; the manifest says {spec.shape}",
                    "match the rank and the fixed dimensions (strings name dynamic axes)",
                ))
    return problems


# ---- files ------------------------------------------------------------------------


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def _load_npz(path: Path) -> dict[str, Any]:
    import numpy as np

    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def _memo_path(p: Path) -> Path:
    from orchestrator.settings import graph_stats_dir

    return graph_stats_dir() / f"{hashlib.sha256(str(p).encode()).hexdigest()[:24]}.json"


def _stamp(p: Path) -> list[int]:
    st = p.stat()
    return [st.st_size, st.st_mtime_ns]


def _read_memo(memo: Path, p: Path) -> GraphStats | None:
    try:
        record = json.loads(memo.read_text(encoding="utf-8"))
        if record.get("version") != GRAPH_STATS_VERSION or record.get("path") != str(p):
            return None
        for name, stamp in record["stamps"].items():
            if _stamp(Path(name)) != stamp:
                return None
        return GraphStats(**record["stats"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_memo(memo: Path, p: Path, stats: GraphStats) -> None:
    files = [p, *((p.parent / loc).resolve() for loc in stats.external_data)]
    record = {
        "version": GRAPH_STATS_VERSION,
        "path": str(p),
        "stamps": {str(f): _stamp(f) for f in files},
        "stats": stats.to_dict(),
    }
    try:
        write_json_atomic(memo, record, indent=None)
    except OSError as exc:  # a read-only cache costs speed, never correctness
        log.info("cannot memoise graph statistics in %s: %s", memo, exc)
