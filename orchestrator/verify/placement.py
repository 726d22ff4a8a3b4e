"""One gated placement to verify, and the result of verifying it.

A :class:`Placement` is a stage kind's :class:`~stages.base.GateSpec` (plain
data: the artifact and precision, the session spec, the thresholds, what the
evidence key is made of) placed in a route: the route's interpreter and its
onnxruntime build, which completes the evidence key. :func:`verify_placement`
measures it in a host of its route (or reuses the cached evidence), writes the
evidence, and judges it; :func:`cached_verdict` does the plan-time half
(lookup and judge, nothing opened).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TypedDict, cast

from orchestrator.core.backends import DISABLE_CPU_FALLBACK, SessionSpec
from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import RefusalCode, VerificationError
from orchestrator.core.plan import Refusal, Verification
from orchestrator.core.profile import Host, Route
from orchestrator.ort.routes import resolve, runtime_identity
from orchestrator.ort.sessions import RemoteError, ResolvedRoute, Sessions
from orchestrator.verify.evidence import EvidenceKey, EvidenceStore, machine_identity
from orchestrator.verify.gates import Coverage, Judgement, Measurement, Numeric, judge, measure
from stages.base import GateSpec
from stages.exported_graph.artifact import ExportedArtifact, Tolerance, load_artifact


@dataclass(frozen=True)
class Placement:
    """A kind's gate spec in the route that runs it."""

    gate: GateSpec
    route: ResolvedRoute
    runtime: str | None
    """The route's onnxruntime build (``distribution==version``); None when unknown."""
    machine: str = ""
    """The cluster node's machine (``evidence.machine_identity``) when the placement is
    measured on a node by ``verify --address`` or looked up for one; empty for this machine."""

    @property
    def stage(self) -> str:
        return self.gate.stage

    @property
    def precision(self) -> str:
        return self.gate.precision

    @property
    def backend(self) -> str:
        return self.gate.backend

    @property
    def device_id(self) -> str:
        return self.gate.device_id

    @property
    def device_name(self) -> str:
        return self.gate.device_name

    @property
    def ep(self) -> str:
        return self.gate.ep

    @property
    def min_coverage(self) -> float:
        return self.gate.min_coverage

    @property
    def reference_graph(self) -> str | None:
        """The fp32 graph the CPU reference runs, or None when the artifact has none."""
        return self.gate.reference_graph

    @cached_property
    def spec(self) -> SessionSpec:
        return self.gate.session

    @cached_property
    def tolerance(self) -> Tolerance:
        return Tolerance(**self.gate.tolerance)

    @cached_property
    def artifact(self) -> ExportedArtifact:
        """The artifact (its manifest read now): only measuring needs its reference data."""
        return load_artifact(self.gate.artifact)

    @property
    def target_only(self) -> bool:
        """Whether the stage set target_only (the session may not fall back to the CPU EP)."""
        return self.spec.session_config.get(DISABLE_CPU_FALLBACK) == "1"

    @property
    def key(self) -> EvidenceKey | None:
        """None while the runtime is unknown: evidence cannot be matched then."""
        if not self.runtime:
            return None
        g = self.gate
        return EvidenceKey(
            artifact=g.artifact_name,
            graph_sha256=g.graph_sha256,
            reference_sha256=g.reference_sha256,
            precision=g.precision,
            backend=g.backend,
            ep=g.ep,
            runtime=self.runtime,
            device_id=g.device_id,
            device_name=g.device_name,
            options=g.options,
            machine=self.machine,
        )

    def with_runtime(self, runtime: str | None) -> Placement:
        """The same placement keyed by the runtime a probe of the route reported."""
        return replace(self, runtime=runtime) if runtime else self


def placement_for(
    gate: GateSpec,
    route: Route,
    *,
    base_dir: Path | None = None,
    runtime: str | None = None,
    machine: str = "",
) -> Placement:
    """``gate`` in the profile's ``route``. ``runtime`` (from a probe of the route)
    wins over the plan-time lookup of the route's onnxruntime build; ``machine``
    keys it by a cluster node's machine."""
    return Placement(
        gate, resolve(route, base_dir), runtime or runtime_identity(route, base_dir), machine
    )


class _ResultBase(TypedDict):
    """What every result of a placement names: the stage, its device, backend, route and
    precision (a ``PlacementResult``'s first fields)."""

    stage: str
    device: str
    backend: str
    route: str
    precision: str | None


@dataclass
class PlacementResult:
    """What ``omni-edge verify`` prints for one placement."""

    stage: str
    device: str
    backend: str
    route: str
    precision: str | None
    status: str
    """passed · refused · error"""
    cached: bool = False
    refusals: list[Refusal] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    record: Measurement | None = None
    evidence_path: str | None = None
    error: str | None = None
    verify_s: float | None = None
    """Gate time in the route, excluding the interpreter's start."""

    def to_dict(self) -> JsonObject:
        rec = self.record or {}
        return {
            "stage": self.stage,
            "device": self.device,
            "backend": self.backend,
            "route": self.route,
            "precision": self.precision,
            "status": self.status,
            "cached": self.cached,
            "coverage": _public_coverage(rec.get("coverage")),
            "numeric": rec.get("numeric"),
            "suspicious": bool(rec.get("suspicious")),
            "refusals": [r.to_dict() for r in self.refusals],
            "warnings": list(self.warnings),
            "evidence": self.evidence_path,
            "measured_at": rec.get("measured_at"),
            "runtime": (rec.get("key") or {}).get("runtime"),
            "error": self.error,
            "verify_s": self.verify_s,
        }


def _public_coverage(cov: Coverage | None) -> JsonObject | None:
    if cov is None:
        return None
    return {k: v for k, v in cov.items() if k != "ort_assignment"}


def verify_placement(
    placement: Placement,
    host: Sessions,
    *,
    store: EvidenceStore | None = None,
    force: bool = False,
) -> PlacementResult:
    """Measure (or reuse cached evidence for) one placement, save it, judge it.

    Errors that are not a verdict — the graph does not load on the CPU EP
    either, the route died — come back as ``status='error'`` with the message.
    """
    store = store or EvidenceStore()
    base: _ResultBase = {
        "stage": placement.stage,
        "device": placement.device_id,
        "backend": placement.backend,
        "route": placement.route.name,
        "precision": placement.precision,
    }
    if placement.key is not None and not force:
        cached = _cached_result(placement, store, base)
        if cached is not None:
            return cached
    t0 = time.perf_counter()
    try:
        measurement = measure(
            host,
            placement.artifact,
            placement.precision,
            placement.spec,
            reference_graph=placement.reference_graph,
        )
    except RemoteError as exc:
        return _route_failure(placement, base, exc)
    except VerificationError as exc:
        return PlacementResult(**base, status="error", error=str(exc))
    elapsed = time.perf_counter() - t0
    return _save_and_judge(placement, store, base, measurement, elapsed)


def _cached_result(
    placement: Placement, store: EvidenceStore, base: _ResultBase
) -> PlacementResult | None:
    """The placement judged from the evidence already cached for its key, or None."""
    assert placement.key is not None
    cached = _checked(store.load(placement.key))
    if cached is None:
        return None
    verdict = _judge(placement, cached)
    return PlacementResult(
        **base,
        status="passed" if verdict.passed else "refused",
        cached=True,
        refusals=verdict.refusals,
        warnings=verdict.warnings,
        record=cached,
        evidence_path=str(store.path(placement.key)),
        verify_s=(cached.get("timings") or {}).get("total_s"),
    )


def _route_failure(placement: Placement, base: _ResultBase, exc: RemoteError) -> PlacementResult:
    """A route that lacks the EP is a refusal (the device is unreachable this way);
    anything else the route raised is an error."""
    if exc.type_name == "ProviderUnavailable":
        refusal = Refusal(
            RefusalCode.DEVICE_UNREACHABLE,
            placement.device_id,
            f"{placement.device_id} with {placement.backend}: route {placement.route.name!r}: {exc.message}",
            "install the EP's onnxruntime build in that route, or name a route that has it",
        )
        return PlacementResult(**base, status="refused", refusals=[refusal])
    return PlacementResult(**base, status="error", error=str(exc))


def _save_and_judge(
    placement: Placement,
    store: EvidenceStore,
    base: _ResultBase,
    measurement: Measurement,
    elapsed: float,
) -> PlacementResult:
    """Record where and against which thresholds it was measured, save it under the
    placement's key (when known), and judge what was saved."""
    measurement.pop("target_outputs", None)
    measurement["route"] = {
        "name": placement.route.name,
        "kind": placement.route.kind,
        "python": placement.route.python,
    }
    measurement["thresholds_at_measurement"] = {
        "min_ep_coverage": placement.min_coverage,
        "tolerance": placement.tolerance.model_dump(),
    }
    path = None
    record = measurement
    if placement.key is not None:
        saved = store.save(placement.key, measurement)
        path = str(saved)
        record = _checked(store.load(placement.key)) or measurement
    verdict = _judge(placement, record)
    return PlacementResult(
        **base,
        status="passed" if verdict.passed else "refused",
        refusals=verdict.refusals,
        warnings=verdict.warnings,
        record=record,
        evidence_path=path,
        verify_s=elapsed,
    )


def _checked(record: dict[str, object] | None) -> Measurement | None:
    """An evidence record as the measurement it holds: the store checked it key by key
    (``evidence.record_problem``) before it answered it."""
    return cast(Measurement, record)


def _judge(placement: Placement, record: Measurement) -> Judgement:
    return judge(
        record,
        artifact_name=placement.gate.artifact_name,
        device_id=placement.device_id,
        min_coverage=placement.min_coverage,
        tolerance=placement.tolerance,
        target_only=placement.target_only,
        precisions=placement.gate.artifact_precisions,
    )


def cached_verdict(
    gate: GateSpec, route: Route, store: EvidenceStore | None = None, *, machine: str = ""
) -> tuple[Verification, list[Refusal]]:
    """Plan time: the evidence recorded for ``gate`` in ``route``, judged against the
    current thresholds; never opens a session. Returns the plan's verification
    record and the refusals a failed gate implies. ``machine``: the evidence a
    cluster node measured (``verify --address``), keyed by its machine."""
    placement = placement_for(gate, route, machine=machine)
    recorded_route = {
        "name": placement.route.name,
        "kind": placement.route.kind,
        "python": placement.route.python,
    }
    if placement.key is None:
        return Verification(
            "unverified",
            "",
            {
                "reason": f"the onnxruntime build of route {placement.route.name!r} is unknown without running it",
                "hint": "run `omni-edge verify CONFIG`",
                "route": recorded_route,
            },
        ), []
    store = store or EvidenceStore()
    found, problem = store.load_checked(placement.key)
    record = _checked(found)
    if problem is not None:
        return Verification(
            "unverified",
            "",
            {
                "reason": f"the evidence file {store.path(placement.key)} was rejected ({problem}); it counts as no evidence",
                "hint": "run `omni-edge verify CONFIG` to measure again (it replaces the file)",
                "key": placement.key.digest()[:16],
                "route": recorded_route,
            },
        ), []
    if record is None:
        return Verification(
            "unverified",
            "",
            {
                "reason": "no evidence for this artifact digest, precision, EP, runtime, device and options",
                "hint": "run `omni-edge verify CONFIG`",
                "key": placement.key.digest()[:16],
                "route": recorded_route,
            },
        ), []
    verdict = _judge(placement, record)
    cov = record.get("coverage") or {}
    machine = (record.get("machine") or {}).get("hostname", "?")
    details: JsonObject = {
        "coverage": {k: cov.get(k) for k in ("ep", "taken", "total", "fraction", "partitions")},
        "numeric": _worst(record.get("numeric") or {}),
        "suspicious": bool(record.get("suspicious")),
        "warnings": verdict.warnings,
        "evidence_file": str(store.path(placement.key)),
        "route": recorded_route,
        "runtime": placement.key.runtime,
        "measured_at": record.get("measured_at"),
        "machine": record.get("machine"),
    }
    return Verification(
        "verified" if verdict.passed else "failed",
        f"M {machine} {str(record.get('measured_at', '?'))[:16]}",
        details,
    ), verdict.refusals


NODE_EVIDENCE_HINT = "run `omni-edge verify CONFIG --address RAY_ADDRESS`: it measures on {node}"
"""What a placement on a cluster node without that node's evidence is told to do."""


def node_verification(
    local: Verification | None,
    gates: list[GateSpec],
    route: Route,
    node: str,
    host: Host,
    *,
    this_machine: bool,
    store: EvidenceStore | None = None,
) -> tuple[Verification | None, list[Refusal]]:
    """Plan time, a placement on cluster node ``node`` (``route`` and the gates as that
    node sees them, ``host`` its profile's): the evidence measured on that node
    (``verify --address``, keyed by its machine) when there is any, judged like
    any other; else ``local`` — this machine's evidence — which counts only when
    the node is this machine (``this_machine``). None without gates."""
    if local is None or not gates:
        return local, []
    machine = machine_identity(host)
    verdicts = [cached_verdict(gate, route, store, machine=machine) for gate in gates]
    verification, failed = min(verdicts, key=lambda vf: (not vf[1], vf[0].status == "verified"))
    if failed or verification.status == "verified":
        if len(verdicts) > 1:
            statuses = {
                g.artifact_name: v.status for g, (v, _) in zip(gates, verdicts, strict=True)
            }
            verification = replace(
                verification, details={**verification.details, "gates": statuses}
            )
        return replace(verification, details={**verification.details, "node": node}), failed
    reason = str(verification.details.get("reason", ""))
    if "rejected" in reason:
        pass  # a forged or foreign record for the node: said, and never counted
    elif local.status == "verified" and not this_machine:
        reason = f"the evidence was measured on this machine; node {node} is another machine"
    else:
        return local, []
    return Verification(
        "unverified",
        "",
        {
            "reason": reason,
            "hint": NODE_EVIDENCE_HINT.format(node=node),
            "node": node,
            "machine": machine,
        },
    ), []


def _worst(numeric: Numeric) -> JsonObject:
    outs = numeric.get("outputs") or {}
    if not outs:
        return {"reference": numeric.get("reference"), "error": numeric.get("error")}
    return {
        "reference": numeric.get("reference"),
        "rel_l2": max(m.get("rel_l2", 0.0) for m in outs.values()),
        "max_abs": max(m.get("max_abs", 0.0) for m in outs.values()),
        "cosine": min(m.get("cosine", 1.0) for m in outs.values()),
    }
