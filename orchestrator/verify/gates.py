"""The two gates of an exported placement: EP node coverage and numerics.

``measure`` opens sessions in a route (``orchestrator.ort.sessions``) and
returns plain data (the body of an evidence record); ``judge`` turns such data plus the current
thresholds into a verdict with named refusals. Measuring and judging are
apart so cached evidence is judged exactly like fresh evidence.

Coverage counts nodes per EP from ``get_provider_graph_assignment_info()`` —
ONNX Runtime's own record of who took what, after its graph optimizations
(fusions change the count: MatMul+Add becomes one Gemm). ``get_providers()``
is never evidence: it lists an EP that took zero nodes. Where the EP's row names a
report of its own (``coverage_report``: VitisAI's ``vitisai_ep_report.json``) and
the EP wrote it, its device split is used instead, because such an EP can claim
nodes and run them on its own CPU path.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from orchestrator.core.backends import CPU_EP, EP_BACKENDS, SessionSpec, row_for_ep
from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import RefusalCode, VerificationError
from orchestrator.core.plan import Refusal
from orchestrator.ort.sessions import RemoteError, Sessions
from orchestrator.ort.worker import AssignedNodes, EpReport, OpenedSession

if TYPE_CHECKING:
    import numpy as np

    from stages.exported_graph.artifact import ExportedArtifact, Tolerance

# ---- the records a measurement writes ---------------------------------------------
# Not total: :func:`judge` also reads records back from the evidence cache, which
# ``evidence.py`` checks key by key before one is trusted; what is optional there is
# read with ``.get`` here.


class Coverage(TypedDict, total=False):
    """Who took which node: ``record["coverage"]`` of a measurement (:func:`coverage_from_assignment`,
    :func:`coverage_from_report`, or a session the EP could not build: ``source`` ``session_error``)."""

    ep: str
    taken: int
    total: int | None
    """None where the session failed to open (nothing was counted)."""
    fraction: float
    partitions: int | None
    """Subgraphs the target EP compiled; None for the CPU EP (it runs node by node)."""
    by_ep: dict[str, int]
    fallback_op_types: dict[str, int]
    source: str
    session_error: str
    ort_assignment: Coverage | None
    """From an EP's own report only: ONNX Runtime's own count beside it."""


class OutputComparison(TypedDict, total=False):
    """One output against its reference (:func:`compare`): ``record["numeric"]["outputs"][name]``."""

    shape: list[int]
    reference_shape: list[int]
    dtype: str
    shape_match: bool
    rel_l2: float
    max_abs: float
    cosine: float
    non_finite: bool
    missing: bool
    """The target did not answer this output at all."""


class Numeric(TypedDict, total=False):
    """The outputs against the reference: ``record["numeric"]`` of a measurement (:func:`_numeric`)."""

    reference: str
    outputs: dict[str, OutputComparison]
    error: str | None
    bit_identical_to_cpu: bool | None


class RouteRecord(TypedDict):
    """The route a measurement ran in: its name, kind and interpreter."""

    name: str
    kind: str
    python: str | None


class Measurement(TypedDict, total=False):
    """What :func:`measure` answers: the EP and precision measured, the graph, the providers
    the session took, its coverage and numeric comparison, whether the claim looks hollow
    (``suspicious``), the timings, and the target's outputs (dropped before saving). Saved as
    an evidence record (``evidence.EvidenceStore.save``), it also holds where and against which
    thresholds it was measured, and the record's header (format, key, machine, time); read
    back, ``evidence.record_problem`` checked it key by key first."""

    ep: str
    precision: str
    graph: str
    session_providers: list[str]
    coverage: Coverage
    numeric: Numeric
    suspicious: bool
    timings: dict[str, float]
    target_outputs: dict[str, np.ndarray] | None
    route: RouteRecord
    thresholds_at_measurement: JsonObject
    format: str
    key_digest: str
    key: JsonObject
    evidence: str
    machine: dict[str, str]
    measured_at: str


# ---- coverage ----------------------------------------------------------------------


def coverage_from_assignment(assignment: list[AssignedNodes], target_ep: str) -> Coverage:
    """Node counts per EP from ORT's assignment info (one entry per assigned subgraph).

    ``partitions`` is the number of subgraphs the target EP compiled; the CPU EP
    runs node by node (ORT lists each node as its own entry), so for it the
    figure is None rather than the node count.
    """
    by_ep: Counter[str] = Counter()
    subgraphs: Counter[str] = Counter()
    fallback: Counter[str] = Counter()
    for sg in assignment:
        ep = sg["ep"]
        by_ep[ep] += len(sg["nodes"])
        subgraphs[ep] += 1
        if ep != target_ep:
            for op_type, *_ in sg["nodes"]:
                fallback[op_type] += 1
    total = sum(by_ep.values())
    taken = by_ep.get(target_ep, 0)
    return {
        "ep": target_ep,
        "taken": taken,
        "total": total,
        "fraction": taken / total if total else 0.0,
        "partitions": None if target_ep == CPU_EP else subgraphs.get(target_ep, 0),
        "by_ep": dict(by_ep),
        "fallback_op_types": dict(fallback.most_common()),
        "source": "ort_assignment_info",
    }


def coverage_from_report(
    report: EpReport, ort_coverage: Coverage | None, target_ep: str
) -> Coverage:
    """Node counts from ``target_ep``'s own report (``orchestrator.ort.worker.ep_report``'s
    summary), as its row's ``coverage_report`` reads it: the nodes on the devices it names the
    accelerators are the ones the EP took; ONNX Runtime's own count rides along."""
    row = row_for_ep(target_ep)
    spec = row.coverage_report if row is not None else None
    if spec is None:
        raise ValueError(f"{target_ep}'s row names no coverage report")
    stat = report.get("device_stat", {})
    total = int(stat.get("all", sum(stat.values())))
    taken = sum(int(v) for k, v in stat.items() if k.upper() in spec.accelerators)
    return {
        "ep": target_ep,
        "taken": taken,
        "total": total,
        "fraction": taken / total if total else 0.0,
        "partitions": (ort_coverage or {}).get("partitions"),
        "by_ep": {k: int(v) for k, v in stat.items() if k != "all"},
        "fallback_op_types": dict(report.get("cpu_op_types", {})),
        "source": f"{spec.source} ({report.get('path')})",
        "ort_assignment": ort_coverage,
    }


# ---- numerics ----------------------------------------------------------------------


def compare(target: Any, reference: Any) -> OutputComparison:
    """rel L2, max abs and cosine of one output against its reference (float64 maths)."""
    import numpy as np

    t, r = np.asarray(target), np.asarray(reference)
    out: OutputComparison = {
        "shape": list(t.shape),
        "reference_shape": list(r.shape),
        "dtype": str(t.dtype),
    }
    if t.shape != r.shape:
        out.update(
            {"shape_match": False, "rel_l2": float("inf"), "max_abs": float("inf"), "cosine": 0.0}
        )
        return out
    out["shape_match"] = True
    if t.dtype.kind in "OSUb" or r.dtype.kind in "OSUb":
        same = bool(np.array_equal(t, r))
        out.update(
            {
                "rel_l2": 0.0 if same else float("inf"),
                "max_abs": 0.0 if same else float("inf"),
                "cosine": 1.0 if same else 0.0,
            }
        )
        return out
    tf, rf = t.astype(np.float64).ravel(), r.astype(np.float64).ravel()
    if tf.size == 0:
        out.update({"rel_l2": 0.0, "max_abs": 0.0, "cosine": 1.0})
        return out
    if not np.all(np.isfinite(tf)) and not np.array_equal(np.isfinite(tf), np.isfinite(rf)):
        out.update(
            {"rel_l2": float("inf"), "max_abs": float("inf"), "cosine": 0.0, "non_finite": True}
        )
        return out
    diff = tf - rf
    rn, tn, dn = float(np.linalg.norm(rf)), float(np.linalg.norm(tf)), float(np.linalg.norm(diff))
    out["rel_l2"] = dn / rn if rn > 0 else (0.0 if dn == 0 else float("inf"))
    out["max_abs"] = float(np.max(np.abs(diff)))
    if rn > 0 and tn > 0:
        out["cosine"] = float(np.dot(tf, rf) / (tn * rn))
    else:
        out["cosine"] = 1.0 if rn == tn == 0 else 0.0
    return out


def _bit_identical(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import numpy as np

    return set(a) == set(b) and all(
        np.asarray(a[k]).shape == np.asarray(b[k]).shape
        and np.asarray(a[k]).tobytes() == np.asarray(b[k]).tobytes()
        for k in a
    )


# ---- measuring ---------------------------------------------------------------------


def cpu_reference_spec(graph: str) -> SessionSpec:
    return SessionSpec(graph, [CPU_EP], [{}], {}, {})


def measure(
    sessions: Sessions,
    artifact: ExportedArtifact,
    precision: str,
    spec: SessionSpec,
    *,
    reference_graph: str | None,
) -> Measurement:
    """Open the target session (recording assignment), run the reference inputs,
    run the reference (recorded outputs, else the CPU EP on the fp32 graph) and
    compare. Returns the measurement part of an evidence record.

    Raises ``RemoteError`` with ``type_name == 'ProviderUnavailable'`` when the
    route lacks the EP (the caller refuses the route), and
    ``VerificationError`` when the graph cannot even load on the CPU EP.
    """
    feeds = artifact.reference_inputs()
    t0 = time.perf_counter()
    target = _run_target(sessions, spec, feeds)
    # The CPU EP on the fp32 graph: the reference when no outputs are recorded, and
    # always the yardstick for "bit-identical to the CPU".
    same_as_target = (
        target.ep == CPU_EP
        and precision == "fp32"
        and not spec.session_options
        and target.outputs is not None
        and reference_graph == spec.graph
    )
    cpu_outputs = (
        target.outputs
        if same_as_target
        else _run_cpu_reference(
            sessions,
            reference_graph,
            feeds,
            target,
            failed_to_open=target.coverage.get("source") == "session_error",
        )
    )
    numeric = _numeric(
        target, cpu_outputs, artifact.reference_outputs(), same_as_target=same_as_target
    )
    target.timings["total_s"] = time.perf_counter() - t0
    return {
        "ep": target.ep,
        "precision": precision,
        "graph": spec.graph,
        **({"session_providers": target.providers} if target.providers is not None else {}),
        "coverage": target.coverage,
        "numeric": numeric,
        "suspicious": bool(
            target.ep != CPU_EP
            and target.coverage.get("taken", 0) > 0
            and numeric["bit_identical_to_cpu"]
        ),
        "timings": target.timings,
        "target_outputs": target.outputs,  # dropped before saving; handy for callers
    }


@dataclass
class _Target:
    """What the target session did: who took which node, and what it answered."""

    ep: str
    coverage: Coverage
    providers: list[str] | None = None
    outputs: dict[str, np.ndarray] | None = None
    error: str | None = None
    """Why the session failed on the reference inputs (or to open: see ``coverage``)."""
    timings: dict[str, float] = field(default_factory=dict)


def _run_target(sessions: Sessions, spec: SessionSpec, feeds: dict[str, Any]) -> _Target:
    """Open the target session recording EP assignment, count coverage, run the feeds.

    A session that fails to open is a measurement (coverage ``session_error``),
    not an error — unless the route lacks the EP altogether, which is raised.
    """
    target_ep = spec.providers[0]
    handle = None
    try:
        info = sessions.open(spec.to_dict(), record=True)
        handle = info["handle"]
        target = _Target(
            target_ep,
            _coverage(info, target_ep),
            providers=info["providers"],
            timings={"open_target_s": info["load_s"]},
        )
        try:
            ran = sessions.run(handle, feeds)
            target.outputs = ran["outputs"]
            target.timings["run_target_s"] = ran["run_s"]
        except RemoteError as exc:
            target.error = (
                f"the target session failed on the reference inputs: {exc.type_name}: {exc.message}"
            )
        return target
    except RemoteError as exc:
        if exc.type_name == "ProviderUnavailable":
            raise
        error = f"{exc.type_name}: {exc.message}"
        return _Target(
            target_ep,
            {
                "ep": target_ep,
                "taken": 0,
                "total": None,
                "fraction": 0.0,
                "partitions": 0,
                "by_ep": {},
                "fallback_op_types": {},
                "source": "session_error",
                "session_error": error,
            },
            error=error,
        )
    finally:
        if handle is not None:
            sessions.close(handle)


def _coverage(info: OpenedSession, target_ep: str) -> Coverage:
    """Coverage from an opened session: the EP's own report where its row names one and it
    wrote it, else ORT's assignment."""
    assignment, report = info.get("assignment"), info.get("ep_report")
    coverage = coverage_from_assignment(assignment, target_ep) if assignment is not None else None
    if report:
        coverage = coverage_from_report(report, coverage, target_ep)
    if coverage is None:
        raise VerificationError(
            f"the route's onnxruntime has no get_provider_graph_assignment_info (added in 1.24), so "
            f"{target_ep}'s node coverage cannot be measured; upgrade onnxruntime in that route"
        )
    return coverage


def _run_cpu_reference(
    sessions: Sessions,
    reference_graph: str | None,
    feeds: dict[str, Any],
    target: _Target,
    *,
    failed_to_open: bool,
) -> dict[str, Any] | None:
    """The CPU EP's outputs on the fp32 graph, or None without one.

    When the target failed to open and the CPU EP cannot open the graph either,
    the artifact is broken, not the placement: ``VerificationError``.
    """
    if reference_graph is None:
        return None
    t1 = time.perf_counter()
    try:
        ref = sessions.open(cpu_reference_spec(reference_graph).to_dict(), record=False)
    except RemoteError as exc:
        if failed_to_open:
            raise VerificationError(
                f"the graph does not load on the CPU EP either ({exc.type_name}: {exc.message}); "
                f"the artifact is broken, not the placement"
            ) from None
        raise
    try:
        outputs: dict[str, Any] = sessions.run(ref["handle"], feeds)["outputs"]
    finally:
        sessions.close(ref["handle"])
    target.timings["reference_s"] = time.perf_counter() - t1
    return outputs


def _numeric(
    target: _Target,
    cpu_outputs: dict[str, Any] | None,
    recorded: dict[str, Any] | None,
    *,
    same_as_target: bool,
) -> Numeric:
    """Each output against the reference (the recorded outputs, else the CPU EP's)."""
    reference = recorded if recorded is not None else cpu_outputs
    failed_to_open = target.coverage.get("source") == "session_error"
    numeric: Numeric = {
        "reference": "recorded outputs"
        if recorded is not None
        else ("CPU EP, fp32 graph (the target itself)" if same_as_target else "CPU EP, fp32 graph"),
        "outputs": {},
        "error": None if failed_to_open else target.error,
        "bit_identical_to_cpu": None,
    }
    if reference is None:
        numeric["error"] = (
            "no reference: the artifact has neither recorded outputs nor an fp32 graph"
        )
    elif target.outputs is not None:
        for name, ref_value in reference.items():
            if name not in target.outputs:
                numeric["outputs"][name] = {
                    "missing": True,
                    "rel_l2": float("inf"),
                    "max_abs": float("inf"),
                    "cosine": 0.0,
                    "shape_match": False,
                }
                continue
            numeric["outputs"][name] = compare(target.outputs[name], ref_value)
        if cpu_outputs is not None and target.ep != CPU_EP:
            numeric["bit_identical_to_cpu"] = _bit_identical(target.outputs, cpu_outputs)
    return numeric


# ---- judging -----------------------------------------------------------------------


@dataclass
class Judgement:
    passed: bool
    refusals: list[Refusal] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def judge(
    record: Measurement,
    *,
    artifact_name: str,
    device_id: str,
    min_coverage: float,
    tolerance: Tolerance,
    target_only: bool = False,
    precisions: tuple[str, ...] = (),
) -> Judgement:
    """The verdict a measurement implies under the current thresholds: the coverage verdict
    (:func:`_coverage_refusals`), the numeric verdict (:func:`_numeric_refusals`) and the
    warning for a claim that looks hollow.

    ``target_only`` (the stage's setting) and ``precisions`` (the graphs the
    artifact has) only shape the remedies: a remedy names what this user can
    change — never a setting they did not set, never a precision the artifact
    does not have.
    """
    cov: Coverage = record.get("coverage") or Coverage()
    num: Numeric = record.get("numeric") or Numeric()
    ep = cov.get("ep", record.get("ep", "?"))
    precision = record.get("precision", "?")
    what = _What(
        device_id,
        ep,
        f"{artifact_name} [{precision}] on {device_id}",
        f"this refuses {artifact_name} at {precision} on {ep} only, not the model and not {precision} in general",
        _elsewhere(ep, precision, precisions),
    )
    out = Judgement(passed=True)
    out.refusals += _coverage_refusals(cov, what, min_coverage, target_only)
    if cov.get("source") != "session_error":
        out.refusals += _numeric_refusals(num, what, tolerance)
    if record.get("suspicious"):
        out.warnings.append(
            f"suspicious: {ep} claims {cov.get('taken')} of {cov.get('total')} nodes of {what.graph}, yet every "
            f"output is bit-identical to the CPU EP's; check that the EP really executed them "
            f"(VitisAI, for one, can claim nodes and run them on its own CPU path)"
        )
    out.passed = not out.refusals
    return out


@dataclass(frozen=True)
class _What:
    """What a refusal of one measurement names: the device, the EP, the graph (artifact,
    precision, device), its scope (what is refused and what is not), and where else to go."""

    device: str
    ep: str
    graph: str
    scope: str
    elsewhere: str


def _coverage_refusals(
    cov: Coverage, w: _What, min_coverage: float, target_only: bool
) -> list[Refusal]:
    """A session the EP could not build, or fewer nodes taken than ``min_coverage``."""
    if cov.get("source") == "session_error":
        if target_only:
            remedy = (
                f"{w.scope}. With target_only the EP must take every node: allow CPU fallback (target_only: false) "
                f"and let the coverage gate measure the split, export a graph without the ops the EP rejects, or {w.elsewhere}"
            )
        else:
            # With CPU fallback allowed, a failed session means the EP claimed nodes and
            # then failed to compile them: no threshold or fallback setting changes that.
            remedy = (
                f"{w.scope}. The EP claimed part of the graph and failed to compile it (the error names the construct): "
                f"export a graph without that construct, or {w.elsewhere}"
            )
        return [
            Refusal(
                RefusalCode.EXECUTION_PROVIDER_DECLINED_GRAPH,
                w.device,
                f"{w.ep} could not build a session for {w.graph}: {brief_error(str(cov.get('session_error')))}",
                remedy,
            )
        ]
    # The verdict follows the counts, never a recorded fraction: a record saying
    # "taken 0 of 2685, fraction 1.0" is judged as 0 %.
    taken, total = _count(cov.get("taken")), _count(cov.get("total"))
    frac = min(taken, total) / total if total else 0.0
    if frac >= min_coverage and total != 0:
        return []
    left = (
        ", ".join(f"{op}×{n}" for op, n in list(cov.get("fallback_op_types", {}).items())[:8])
        or "none listed"
    )
    parts = cov.get("partitions")
    parts_txt = f" in {parts} partition(s)" if parts is not None else ""
    lower = (
        f"lower min_ep_coverage for this stage (now {min_coverage:g}) if a partial offload is what you want, "
        if taken
        else ""  # with no node taken there is no partial offload to admit
    )
    return [
        Refusal(
            RefusalCode.EXECUTION_PROVIDER_DECLINED_GRAPH,
            w.device,
            f"{w.ep} took {taken} of {total} nodes ({frac:.1%}){parts_txt} of {w.graph}; the minimum is "
            f"{min_coverage:.0%}. Left to the CPU EP: {left}",
            f"{w.scope}. Export a graph whose ops the EP compiles (the ones left to the CPU above), "
            f"{lower}or {w.elsewhere}",
        )
    ]


def _numeric_refusals(num: Numeric, w: _What, tolerance: Tolerance) -> list[Refusal]:
    """A run that failed on the reference inputs, an output of the wrong shape, or one out of
    tolerance (judged as "not within", so that a NaN fails)."""
    out: list[Refusal] = []
    elsewhere = f"{w.elsewhere[0].upper()}{w.elsewhere[1:]}"
    if num.get("error"):
        out.append(
            Refusal(
                RefusalCode.NUMERIC_GATE_FAILED,
                w.device,
                f"{w.ep} on {w.graph}: {brief_error(str(num['error']))}",
                f"{w.scope}. The EP built the session but failed on the reference inputs: compare their shapes and "
                f"dtypes with the graph's inputs (the error names the one it refused), or {w.elsewhere}",
            )
        )
    for name, m in (num.get("outputs") or {}).items():
        if not m.get("shape_match", False):
            out.append(
                Refusal(
                    RefusalCode.NUMERIC_GATE_FAILED,
                    w.device,
                    f"{w.ep} output {name!r} of {w.graph} has shape {m.get('shape')} but the reference ({num.get('reference')}) has {m.get('reference_shape')}"
                    + (" (missing from the outputs)" if m.get("missing") else ""),
                    f"{w.scope}. {elsewhere}",
                )
            )
            continue
        bad = []
        if not m["rel_l2"] <= tolerance.rel_l2:
            bad.append("rel L2")
        if not m["max_abs"] <= tolerance.max_abs:
            bad.append("max abs")
        if not m["cosine"] >= tolerance.cosine_min:
            bad.append("cosine")
        if bad:
            out.append(
                Refusal(
                    RefusalCode.NUMERIC_GATE_FAILED,
                    w.device,
                    f"{w.ep} output {name!r} of {w.graph} differs from the reference ({num.get('reference')}): "
                    f"rel L2 {m['rel_l2']:.3g} (max {tolerance.rel_l2:g}), max abs {m['max_abs']:.3g} "
                    f"(max {tolerance.max_abs:g}), cosine {m['cosine']:.6f} (min {tolerance.cosine_min:g}); "
                    f"out of tolerance: {', '.join(bad)}",
                    f"{w.scope}. {elsewhere}; "
                    f"widen `tolerance` in the stage config only if this difference is acceptable for {name!r}",
                )
            )
    return out


def _count(value: Any) -> int:
    """A node count as recorded, or 0 when it is not a non-negative integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _elsewhere(ep: str, precision: str, precisions: tuple[str, ...]) -> str:
    """The alternatives that exist: the artifact's other precisions, other EPs or devices."""
    others = [p for p in precisions if p != precision]
    parts = [f"use another precision of this artifact ({', '.join(others)})"] if others else []
    parts.append(
        "place the stage on another backend or device"
        if ep == CPU_EP
        else f"place the stage on another backend or device (e.g. the CPU EP, {EP_BACKENDS[CPU_EP]})"
    )
    return " or ".join(parts)


BRIEF_ERROR_CHARS = 600
"""Longest runtime error quoted whole in a refusal; the evidence record keeps the full text."""


def brief_error(message: str) -> str:
    """A runtime error as a user reads it: its first line up to the C++ source
    location, then its last line — where OpenVINO and ONNX Runtime put the actual
    reason ("CPU plug-in doesn't support Parameter operation with dynamic rank ...").
    Short messages are returned unchanged."""
    text = message.strip()
    if len(text) <= BRIEF_ERROR_CHARS:
        return text
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    head = re.split(r"\s/\S+\.(?:cc|cpp|h|hpp):\d+", lines[0], maxsplit=1)[0].strip()
    tail = lines[-1]
    if len(tail) > BRIEF_ERROR_CHARS:
        tail = tail[-BRIEF_ERROR_CHARS:]
    return f"{head[:BRIEF_ERROR_CHARS]} … {tail}" if tail not in head else head[:BRIEF_ERROR_CHARS]
