"""An exported artifact, built whole in a temporary directory and renamed into place.

:func:`export` takes an :class:`ExportRequest` and

1. exports the source to an fp32 graph (``orchestrator.exporter.sources``);
2. refuses non-finite reference outputs (a NaN reference passes no gate);
3. derives the other precisions: ``fp16`` with ONNX Runtime's float16 converter
   (``keep_io_types``: the graph takes and returns float32 like the fp32 one, so
   the reference inputs feed every precision), ``int8`` as QDQ static
   quantization (``onnxruntime.quantization``, per-channel int8 weights, uint8
   activations, MinMax over the calibration set; :class:`Int8Scheme` in the
   Python API takes uint16 activations and quantizes only the nodes it names);
4. measures each precision on the CPU EP against the fp32 graph over the
   calibration set, and against the reference outputs on the reference inputs,
   and suggests a tolerance: ``HEADROOM`` × the worst error, never tighter than
   the precision's floor (:data:`FLOORS`); a precision whose worst error passes
   :data:`CEILINGS` is refused instead (no useful tolerance would admit it);
5. writes the reference ``.npz`` files (fixed zip timestamps: the same arrays give
   the same bytes, and the digest keys the evidence) and the manifest;
6. validates: ``onnx.checker`` on every graph, ``load_artifact`` (the manifest,
   hooks included), the manifest against each graph, and each precision through
   the numeric and coverage gates on the CPU EP in this process
   (``orchestrator.verify.gates``) — the reference round trip;
7. renames the directory into place, durably (``--force`` replaces an existing
   one only now, and only an earlier artifact: ``orchestrator.exporter.place``).
   Any failure removes the temporary directory: nothing half-written.

With more than one precision, the manifest's ``tolerances`` gives each precision
its own suggestion (the gate judges a graph by its precision's entry), and
``tolerance`` — what a precision without an entry gets — is the loosest; each
precision's measurement is in ``metadata.export.precisions``.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from orchestrator.core.backends import CPU_EP, SessionSpec
from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import ConfigError, Problem
from orchestrator.core.fileio import file_sha256
from orchestrator.exporter import sources
from orchestrator.exporter.place import move_into_place, target_problem, work_directory
from orchestrator.ort.sessions import open_sessions, this_process
from orchestrator.verify.gates import compare, judge, measure
from stages.exported_graph.artifact import (
    EXPORT_FORMAT,
    MANIFEST_NAME,
    Tolerance,
    load_artifact,
    save_npz,
)
from stages.exported_graph.graph_stats import (
    GraphStats,
    ValueInfo,
    check_against_graph,
    describe_graph,
)
from stages.payloads import parse_payloads

if TYPE_CHECKING:
    import numpy as np

ARTIFACT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
"""As the manifest's ``name`` (stages.exported_graph.artifact): checked before any work."""

EXPORT_PRECISIONS = ("fp32", "fp16", "int8")
"""What the exporter writes (the format also knows bf16 and int4)."""

HEADROOM = 4.0
"""The suggested tolerance is this many times the worst error measured on the CPU EP:
another EP (OpenVINO, an NPU's) rounds differently, and a new input lands elsewhere."""

FLOORS: dict[str, Tolerance] = {
    "fp32": Tolerance(rel_l2=1e-3, max_abs=1e-3, cosine_min=0.999),
    "fp16": Tolerance(rel_l2=5e-3, max_abs=1e-2, cosine_min=0.999),
    "int8": Tolerance(rel_l2=2e-2, max_abs=5e-2, cosine_min=0.995),
}
"""The loosest tolerance never needs to be tighter than this per precision: the format's
defaults for fp32, and what fp16/int8 arithmetic is expected to cost on any EP."""

CEILINGS: dict[str, tuple[float, float]] = {
    "fp32": (1e-3, 0.9999),
    "fp16": (1e-2, 0.999),
    "int8": (5e-2, 0.995),
}
"""The worst measured (rel L2, cosine) a precision may have against fp32 and still be written.
Beyond it the graph is refused rather than given a tolerance so loose that the gate
would pass anything: all-MiniLM-L6-v2 quantized to QDQ int8 this way measured rel L2
0.74, cosine 0.75 on its hidden states (its activations have outliers MinMax calibration
cannot hold in 8 bits)."""

Step = Callable[[str], None]

INT8_ACTIVATIONS = ("uint8", "uint16")
"""Activation types of the int8 QDQ graph: uint8 (A8W8, the default) or uint16 (A16W8:
int8 weights, 16-bit activations, which NPU EPs such as VitisAI and QNN's HTP also take).
The weights are int8 either way — the manifest's ``int8`` precision."""


@dataclass(frozen=True)
class Int8Scheme:
    """How the int8 graph is quantized (the CLI's ``--int8-activations`` and ``--int8-nodes``).

    ``nodes``: name prefixes of the nodes to quantize (``("/dec/",)``), the rest
    left in fp32 — for a graph whose discrete decisions (a duration rounded up to
    whole frames) must not move; empty: every node the quantizer takes."""

    activations: str = "uint8"
    nodes: tuple[str, ...] = ()

    def describe(self) -> str:
        where = (
            f"the nodes under {', '.join(self.nodes)} (the rest fp32)"
            if self.nodes
            else "every node it takes"
        )
        return (
            f"int8 as QDQ static quantization of {where}: per-channel int8 weights, {self.activations} "
            "activations, MinMax over {n} calibration input(s)"
        )


@dataclass
class ExportRequest:
    """Everything ``omni-edge export`` was asked (the CLI's flags, as data)."""

    source: str
    """``torch``, ``transformers`` or ``onnx``."""
    location: str
    out: Path
    precisions: tuple[str, ...] = ("fp32",)
    opset: int = sources.DEFAULT_OPSET
    name: str | None = None
    version: str = "1.0.0"
    description: str = ""
    license: str = "unknown"
    origin: str | None = None
    preprocess: str | None = None
    postprocess: str | None = None
    consumes: list[str] | None = None
    produces: list[str] | None = None
    metadata: JsonObject = field(default_factory=dict)
    inputs_npz: str | None = None
    calibration_npz: list[str] = field(default_factory=list)
    calibration_text: str | None = None
    """transformers: a text file, one calibration sentence per line."""
    int8: Int8Scheme = field(default_factory=Int8Scheme)
    """How the int8 graph is quantized (uint8 activations over every node by default)."""
    activation_bytes: str | None = None
    """The manifest's ``activation_bytes`` (e.g. ``"320MiB"``), when the author measured it."""
    activation_note: str = ""
    force: bool = False
    command: str = ""
    """The command line, recorded in the manifest's notes."""


@dataclass
class ExportResult:
    out: Path
    name: str
    precisions: dict[str, JsonObject]
    tolerance: dict[str, float]
    inputs: list[ValueInfo]
    outputs: list[ValueInfo]
    files: dict[str, str]
    seconds: float

    def to_json(self) -> JsonObject:
        return {
            "format": "omni-edge.export-result/1",
            "artifact": str(self.out),
            "name": self.name,
            "precisions": self.precisions,
            "tolerance": self.tolerance,
            "inputs": self.inputs,
            "outputs": self.outputs,
            "sha256": self.files,
            "seconds": round(self.seconds, 2),
        }


def _no_step(_: str) -> None:
    return None


def check_request(req: ExportRequest) -> None:
    """Refuse what can be refused before any work (exit 2, nothing written)."""
    problems = _what_problems(req) + _where_problems(req) + _flag_problems(req)
    if problems:
        raise ConfigError(problems)


def _what_problems(req: ExportRequest) -> list[Problem]:
    """What to export: the source, the precisions, the int8 activation type."""
    problems: list[Problem] = []
    if req.source not in ("torch", "transformers", "onnx"):
        problems.append(
            Problem("--from", f"unknown source {req.source!r}", "use torch, transformers or onnx")
        )
    bad = [p for p in req.precisions if p not in EXPORT_PRECISIONS]
    if bad or not req.precisions:
        problems.append(
            Problem(
                "--precision",
                f"cannot export {', '.join(bad) or 'nothing'}",
                f"choose from {', '.join(EXPORT_PRECISIONS)} (comma-separated)",
            )
        )
    elif "fp32" not in req.precisions:
        problems.append(
            Problem(
                "--precision",
                "fp32 is missing: the other precisions are made and measured from it",
                "add fp32 (e.g. --precision fp32,int8)",
            )
        )
    if req.int8.activations not in INT8_ACTIVATIONS:
        problems.append(
            Problem(
                "int8 activations",
                f"{req.int8.activations!r} is not an activation type the exporter writes",
                f"choose {' or '.join(INT8_ACTIVATIONS)}",
            )
        )
    return problems


def _where_problems(req: ExportRequest) -> list[Problem]:
    """Where it goes: ``-o`` free (or ``--force``), a directory, a usable name, an existing parent."""
    problems: list[Problem] = []
    taken = target_problem(req.out, req.force)
    if taken is not None:
        problems.append(taken)
    if req.out.exists() and not req.out.is_dir():
        problems.append(
            Problem(
                f"-o {req.out}",
                "it is a file, not an artifact directory",
                "choose a directory path",
            )
        )
    name = req.name or req.out.name
    if not ARTIFACT_NAME.match(name):
        problems.append(
            Problem(
                "--name" if req.name else f"-o {req.out}",
                f"{name!r} is not an artifact name",
                "letters, digits, '_', '.' and '-', starting with a letter or digit (or pass --name)",
            )
        )
    parent = req.out.resolve().parent
    if not parent.is_dir():
        problems.append(
            Problem(
                f"-o {req.out}", f"the parent directory {parent} does not exist", "create it first"
            )
        )
    return problems


def _flag_problems(req: ExportRequest) -> list[Problem]:
    """Flags that do not fit: one only another source reads, payload types that do not parse."""
    problems: list[Problem] = []
    for flag, given, source in (
        ("--inputs", req.inputs_npz, "onnx"),
        ("--calibration", req.calibration_npz, "onnx"),
        ("--calibration-text", req.calibration_text, "transformers"),
    ):
        if given and req.source != source:
            problems.append(
                Problem(
                    flag,
                    f"only a --from {source} source reads it",
                    "leave it out (a torch factory returns its own 'calibration')",
                )
            )
    for flag, value in (("--consumes", req.consumes), ("--produces", req.produces)):
        if value:
            try:
                parse_payloads(value)
            except ValueError as exc:
                problems.append(
                    Problem(
                        flag,
                        str(exc),
                        "spell payload types as in docs/pipelines.md (text, audio@16000, tensor<float32>[384])",
                    )
                )
    return problems


def export(req: ExportRequest, step: Step = _no_step) -> ExportResult:
    """Build the artifact ``req`` asks for; see the module docstring. ``step`` is told each phase."""
    check_request(req)
    t0 = time.perf_counter()
    with work_directory(req.out.resolve()) as work:
        result = _build(req, work, step)
        step("moving the artifact into place")
        umask = os.umask(0)
        os.umask(umask)
        work.chmod(0o777 & ~umask)  # 0700 is for the work in progress, not the artifact
        move_into_place(work, req.out.resolve(), force=req.force)
    result.out = req.out
    result.seconds = time.perf_counter() - t0
    return result


def _source(req: ExportRequest, work: Path, step: Step) -> sources.Exported:
    if req.source == "torch":
        return sources.from_torch(req.location, work, opset=req.opset, step=step)
    if req.source == "transformers":
        sentences = (
            sources.read_sentences(req.calibration_text)
            if req.calibration_text
            else sources.CALIBRATION_SENTENCES
        )
        return sources.from_transformers(
            req.location, work, opset=req.opset, sentences=sentences, step=step
        )
    return sources.from_onnx(
        req.location, work, inputs=req.inputs_npz, calibration=req.calibration_npz, step=step
    )


def _build(req: ExportRequest, work: Path, step: Step) -> ExportResult:
    exported = _source(req, work, step)
    step("checking fp32: onnx.checker, a CPU session")
    _checker(exported.graph, "fp32")
    cpu = _CpuRunner()
    fp32_outputs = [cpu.run(exported.graph, feeds, "fp32") for feeds in exported.calibration]
    reference_outputs = (
        exported.framework_outputs if exported.framework_outputs is not None else fp32_outputs[0]
    )
    _refuse_non_finite(
        reference_outputs,
        "the reference outputs"
        + (
            " (the exporting framework's)"
            if exported.framework_outputs is not None
            else " (the CPU EP's, fp32)"
        ),
    )
    _refuse_non_finite(fp32_outputs[0], "the fp32 graph's outputs on the CPU EP")
    graphs = {"fp32": exported.graph}
    if "fp16" in req.precisions:
        step("converting to fp16 (ORT float16 converter, float32 I/O)")
        graphs["fp16"] = _to_fp16(exported.graph, work / "fp16.onnx")
    if "int8" in req.precisions:
        step(f"quantizing to int8 QDQ ({len(exported.calibration)} calibration inputs)")
        graphs["int8"] = _to_int8(
            exported.graph, work / "int8.onnx", exported.calibration, work, req.int8
        )
    measured: dict[str, dict[str, float]] = {}
    for precision, graph in graphs.items():
        step(f"measuring {precision} on the CPU EP ({len(exported.calibration)} inputs)")
        if precision != "fp32":
            _checker(graph, precision)
        measured[precision] = _measure(
            cpu, graph, precision, exported, fp32_outputs, reference_outputs
        )
    suggestions = {p: _suggest(p, m) for p, m in measured.items()}
    tolerance = Tolerance(
        rel_l2=max(s.rel_l2 for s in suggestions.values()),
        max_abs=max(s.max_abs for s in suggestions.values()),
        cosine_min=min(s.cosine_min for s in suggestions.values()),
    )
    step("writing the reference data and the manifest")
    save_npz(work / "reference_inputs.npz", exported.reference_inputs)
    save_npz(work / "reference_outputs.npz", reference_outputs)
    stats = {p: describe_graph(g, use_cache=False) for p, g in graphs.items()}
    files = {f"{p}.onnx": stats[p].sha256 for p in graphs}
    for ref in ("reference_inputs.npz", "reference_outputs.npz"):
        files[ref] = file_sha256(work / ref)
    name = req.name or req.out.name
    manifest = _manifest(req, name, exported, stats, tolerance, measured, suggestions, files)
    text = _header(req) + yaml.dump(
        manifest, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100
    )
    (work / MANIFEST_NAME).write_text(text)
    step("validating: manifest, hooks, gates on the CPU EP")
    _validate(work, graphs, stats)
    precisions = {
        p: {
            "graph": f"{p}.onnx",
            "bytes": stats[p].file_bytes,
            "nodes": stats[p].node_count,
            **{k: measured[p][k] for k in ("rel_l2", "max_abs", "cosine")},
            "suggested": suggestions[p].model_dump(),
        }
        for p in graphs
    }
    return ExportResult(
        out=req.out,
        name=name,
        precisions=precisions,
        tolerance=tolerance.model_dump(),
        inputs=stats["fp32"].inputs,
        outputs=stats["fp32"].outputs,
        files=files,
        seconds=0.0,
    )


# ---- graphs ------------------------------------------------------------------------------


def _checker(graph: Path, precision: str) -> None:
    import onnx

    try:
        onnx.checker.check_model(str(graph), full_check=True)
    except Exception as exc:
        raise ConfigError.single(
            f"{precision} graph",
            f"onnx.checker refused it: {str(exc).strip()[:600]}",
            "fix the source model (or its export settings) so the graph is valid ONNX",
        ) from None


def _to_fp16(fp32: Path, out: Path) -> Path:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True))
    model.topological_sort()  # the converter appends the float32 → float16 input casts last
    onnx.save(model.model, str(out))
    return out


class _Calibration:
    """``onnxruntime.quantization``'s CalibrationDataReader over a list of feed dicts."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:  # pragma: no cover - not used by MinMax
        pass


def _to_int8(
    fp32: Path,
    out: Path,
    calibration: list[dict[str, np.ndarray]],
    work: Path,
    scheme: Int8Scheme | None = None,
) -> Path:
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    scheme = scheme or Int8Scheme()
    pre = work / "int8.pre.onnx"
    logging.disable(logging.WARNING)  # the quantizer warns per weight ("Axis 1 is out-of-range …")
    try:
        quant_pre_process(str(fp32), str(pre), skip_symbolic_shape=True)
    except Exception:
        shutil.copyfile(fp32, pre)  # pre-processing is an optimisation; quantize the graph as it is
    selected = None
    if scheme.nodes:
        selected = [
            n.name
            for n in onnx.load(str(pre), load_external_data=False).graph.node
            if n.name.startswith(scheme.nodes)
        ]
        if not selected:
            logging.disable(logging.NOTSET)
            pre.unlink(missing_ok=True)
            raise ConfigError.single(
                "int8 nodes",
                f"no node name starts with {', '.join(scheme.nodes)}",
                "name prefixes of the graph's nodes (e.g. '/dec/'), as onnx shows them",
            )
    activations = QuantType.QUInt16 if scheme.activations == "uint16" else QuantType.QUInt8
    try:
        quantize_static(
            str(pre),
            str(out),
            _Calibration(calibration),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=activations,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            nodes_to_quantize=selected,
        )
    except Exception as exc:
        raise ConfigError.single(
            "--precision int8",
            f"quantize_static failed: {type(exc).__name__}: {str(exc)[:600]}",
            "export fp32 (and fp16) only, or simplify the ops the quantizer rejected",
        ) from None
    finally:
        logging.disable(logging.NOTSET)
        pre.unlink(missing_ok=True)
        for extra in work.glob("*.onnx.data"):
            extra.unlink(missing_ok=True)
    return out


class _CpuRunner:
    """One CPU-EP session per graph, kept for the calibration set."""

    def __init__(self) -> None:
        self._sessions: dict[Path, Any] = {}

    def run(
        self, graph: Path, feeds: dict[str, np.ndarray], precision: str
    ) -> dict[str, np.ndarray]:
        import onnxruntime as ort

        if graph not in self._sessions:
            try:
                self._sessions[graph] = ort.InferenceSession(str(graph), providers=[CPU_EP])
            except Exception as exc:
                raise ConfigError.single(
                    f"{precision} graph",
                    f"the CPU EP cannot open it: {str(exc).strip()[:600]}",
                    "ONNX Runtime here must run the graph: check the opset and custom ops",
                ) from None
        session = self._sessions[graph]
        try:
            names = [o.name for o in session.get_outputs()]
            return dict(zip(names, session.run(names, feeds), strict=True))
        except Exception as exc:
            raise ConfigError.single(
                f"{precision} graph",
                f"the CPU EP failed on the inputs: {str(exc).strip()[:600]}",
                "the example/calibration inputs must match the graph's inputs",
            ) from None


def _refuse_non_finite(outputs: dict[str, np.ndarray], what: str) -> None:
    import numpy as np

    bad = {
        n: int(np.size(v) - np.count_nonzero(np.isfinite(v)))
        for n, v in outputs.items()
        if np.asarray(v).dtype.kind == "f" and not np.all(np.isfinite(v))
    }
    if bad:
        listed = ", ".join(f"{n!r}: {k} of {np.size(outputs[n])}" for n, k in bad.items())
        raise ConfigError.single(
            "reference outputs",
            f"{what} are not finite (NaN/Inf values: {listed}); no gate can compare against them",
            "fix the model or choose example inputs where it is finite (look for log/div/sqrt of zero or overflow)",
        )


def _measure(
    cpu: _CpuRunner,
    graph: Path,
    precision: str,
    exported: sources.Exported,
    fp32_outputs: list[dict[str, np.ndarray]],
    reference: dict[str, np.ndarray],
) -> dict[str, float]:
    """The worst error of ``graph`` against fp32 over the calibration set and against the reference."""
    worst = {"rel_l2": 0.0, "max_abs": 0.0, "cosine": 1.0}
    outs = [cpu.run(graph, feeds, precision) for feeds in exported.calibration]
    pairs = [(o, f) for o, f in zip(outs, fp32_outputs, strict=True)] + [(outs[0], reference)]
    for got, want in pairs:
        for name, value in want.items():
            m = compare(got[name], value)
            worst["rel_l2"] = max(worst["rel_l2"], m["rel_l2"])
            worst["max_abs"] = max(worst["max_abs"], m["max_abs"])
            worst["cosine"] = min(worst["cosine"], m["cosine"])
    max_rel, min_cos = CEILINGS[precision]
    if (
        not all(math.isfinite(v) for v in worst.values())
        or worst["rel_l2"] > max_rel
        or worst["cosine"] < min_cos
    ):
        raise ConfigError.single(
            f"--precision {precision}",
            f"the {precision} graph loses too much: worst rel L2 {worst['rel_l2']:.3g} (at most {max_rel:g}) and "
            f"cosine {worst['cosine']:.4f} (at least {min_cos:g}) against fp32 and the reference on the CPU EP; "
            "no tolerance that admits it would still catch a broken placement",
            f"leave {precision} out (e.g. --precision fp32), or export a model whose activations {precision} can "
            "hold (outliers in a few channels defeat MinMax calibration; a calibration set closer to real inputs helps)",
        )
    return worst


def _round_up(x: float) -> float:
    """Two significant digits, rounded away from tightness."""
    if x <= 0:
        return 0.0
    e = math.floor(math.log10(x)) - 1
    return math.ceil(x / 10**e) * 10**e


def _suggest(precision: str, m: dict[str, float]) -> Tolerance:
    floor = FLOORS[precision]
    return Tolerance(
        rel_l2=float(f"{max(floor.rel_l2, _round_up(HEADROOM * m['rel_l2'])):.2g}"),
        max_abs=float(f"{max(floor.max_abs, _round_up(HEADROOM * m['max_abs'])):.2g}"),
        cosine_min=float(
            f"{min(floor.cosine_min, 1 - _round_up(HEADROOM * (1 - m['cosine']))):.6g}"
        ),
    )


# ---- files -------------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    """Safe YAML with short lists of scalars on one line (``shape: [batch, 16]``)."""


def _flow_scalars(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flow = bool(data) and all(isinstance(v, str | int | float) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _flow_scalars)


def _header(req: ExportRequest) -> str:
    lines = [
        "# Written by omni-edge export (docs/export.md); contract: docs/exported-artifacts.md."
    ]
    if req.command:
        lines.append(f"# Regenerate: {req.command}")
    return "\n".join(lines) + "\n"


def _tensors(values: list[ValueInfo]) -> list[ValueInfo]:
    return [{"name": v["name"], "dtype": v["dtype"], "shape": v["shape"]} for v in values]


def _manifest(
    req: ExportRequest,
    name: str,
    exported: sources.Exported,
    stats: dict[str, GraphStats],
    tolerance: Tolerance,
    measured: dict[str, dict[str, float]],
    suggestions: dict[str, Tolerance],
    files: dict[str, str],
) -> JsonObject:
    fp32 = stats["fp32"]
    notes = [f"opset {exported.opset}; precisions {', '.join(stats)}."]
    raised = {
        p: st.opset.get("ai.onnx")
        for p, st in stats.items()
        if st.opset.get("ai.onnx") not in (None, exported.opset)
    }
    if raised:  # onnxruntime's quantizer raises the opset for 16-bit QuantizeLinear (21)
        notes.append(
            "; ".join(f"{p} graph: opset {o}" for p, o in raised.items())
            + " (raised by its converter)."
        )
    if "fp16" in stats:
        notes.append("fp16 by onnxruntime's float16 converter (float32 inputs and outputs kept).")
    if "int8" in stats:
        notes.append(req.int8.describe().format(n=len(exported.calibration)) + ".")
    notes.extend(exported.notes)
    manifest: JsonObject = {
        "format": EXPORT_FORMAT,
        "name": name,
        "version": req.version,
    }
    if req.description:
        manifest["description"] = req.description
    manifest["source"] = {
        "origin": req.origin or exported.origin,
        "license": req.license,
        "notes": " ".join(notes),
    }
    manifest["precisions"] = {p: f"{p}.onnx" for p in stats}
    manifest["inputs"] = _tensors(fp32.inputs)
    manifest["outputs"] = _tensors(fp32.outputs)
    manifest["reference"] = {"inputs": "reference_inputs.npz", "outputs": "reference_outputs.npz"}
    manifest["tolerance"] = tolerance.model_dump()
    if len(stats) > 1:  # each precision judged by its own suggestion, not the loosest
        manifest["tolerances"] = {p: suggestions[p].model_dump() for p in stats}
    for key in (
        "consumes",
        "produces",
        "preprocess",
        "postprocess",
        "activation_bytes",
        "activation_note",
    ):
        if getattr(req, key):
            manifest[key] = getattr(req, key)
    manifest["metadata"] = {
        **req.metadata,
        "export": {
            "reference": "the exporting framework's outputs"
            if exported.framework_outputs is not None
            else "the CPU EP's outputs of the fp32 graph",
            "headroom": HEADROOM,
            "precisions": {
                p: {
                    "measured_on_cpu_ep": {
                        k: round(v, 8) if k == "cosine" else float(f"{v:.3g}")
                        for k, v in measured[p].items()
                    },
                    "suggested_tolerance": suggestions[p].model_dump(),
                }
                for p in stats
            },
            "sha256": files,
        },
    }
    return manifest


def _validate(work: Path, graphs: dict[str, Path], stats: dict[str, GraphStats]) -> None:
    """The artifact as ``plan`` and ``verify`` will read it; every precision through the gates on the CPU EP."""
    artifact = load_artifact(work)
    problems = [
        p
        for precision in graphs
        for p in check_against_graph(artifact, precision, stats[precision])
    ]
    if problems:
        raise ConfigError(problems)
    sessions = open_sessions(this_process())
    try:
        for precision, graph in graphs.items():
            spec = SessionSpec(str(graph), [CPU_EP], [{}], {}, {})
            record = measure(
                sessions, artifact, precision, spec, reference_graph=str(graphs["fp32"])
            )
            verdict = judge(
                record,
                artifact_name=artifact.name,
                device_id="cpu",
                min_coverage=artifact.manifest.min_ep_coverage,
                tolerance=artifact.manifest.tolerance_for(precision),
                precisions=tuple(graphs),
            )
            if not verdict.passed:
                raise ConfigError(
                    [
                        Problem(f"{precision} graph on the CPU EP", r.message, r.remedy)
                        for r in verdict.refusals
                    ]
                )
    finally:
        sessions.shutdown()
