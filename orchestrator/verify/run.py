"""Verify every gated placement a plan would consider, route by route.

The candidates are the planner's (``planner.stage_candidates``), before
memory, for the stages whose kind ``needs_gates``: each allowed device that the
profile has and the mask does not hide, each backend in the stage's (or
device's) order that the device offers. A candidate the profile already shows
unreachable, or that the kind's ``check`` refuses (no runnable precision), is
refused without starting anything; the rest are measured, from the kind's
``gate_spec``, in one host per route (the interpreter starts once, and its
probe answer supplies the runtime part of the evidence key).

On a cluster (``verify --address``), :func:`verify_on_node` is what a Ray task
pinned to one node runs there: the cluster's candidates on that node, in that
node's own routes, each record keyed by the node's machine
(``evidence.machine_identity``); :func:`keep_node_evidence` is the driver's
half: each record the node returns checked as a cached one is, then written to
this machine's evidence store, where ``plan`` looks.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchestrator.config import PipelineConfig
from orchestrator.core import settings
from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import ConfigError
from orchestrator.core.fileio import write_json_atomic, write_text_atomic
from orchestrator.core.plan import Refusal
from orchestrator.core.profile import HardwareProfile
from orchestrator.ort.routes import (
    RouteReport,
    probe_refusal,
    report_from_probe,
    require_startable_routes,
    resolve,
    static_refusal,
)
from orchestrator.ort.sessions import RouteError, Sessions, open_sessions
from orchestrator.planner import Candidate, Excluded, stage_candidates
from orchestrator.probe.host import cpu_model, host_os, running_in_wsl
from orchestrator.verify.evidence import (
    EvidenceKey,
    EvidenceStore,
    machine_identity,
    machine_identity_here,
    record_problem,
)
from orchestrator.verify.placement import PlacementResult, placement_for, verify_placement
from stages.registry import get_kind


@dataclass
class VerifyReport:
    """Everything ``omni-edge verify`` shows: one result per candidate, plus skips."""

    pipeline: str
    profile: str
    results: list[PlacementResult] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    routes: dict[str, RouteReport] = field(default_factory=dict)
    evidence_dir: str = ""
    route_start_s: dict[str, float] = field(default_factory=dict)
    """Seconds each route took to start and answer its probe (not part of verify_s)."""
    nodes: dict[str, str] = field(default_factory=dict)
    """``verify --address``: each node verified → the Ray node id its task ran on."""

    @property
    def refused(self) -> bool:
        return any(r.status == "refused" for r in self.results)

    @property
    def errors(self) -> bool:
        return any(r.status == "error" for r in self.results)

    def to_json(self) -> JsonObject:
        return {
            "format": "omni-edge.verify/1",
            "pipeline": self.pipeline,
            "profile": self.profile,
            "evidence_dir": self.evidence_dir,
            "results": [r.to_dict() for r in self.results],
            "skipped": self.skipped,
            "routes": {k: v.to_dict() for k, v in self.routes.items()},
            **({"nodes": dict(self.nodes)} if self.nodes else {}),
        }


def candidates(
    config: PipelineConfig,
    profile: HardwareProfile,
    mask: frozenset[str] = frozenset(),
) -> tuple[list[Candidate], list[dict[str, str]]]:
    """(candidates, skipped): what the planner would try for the stages that need gates."""
    out: list[Candidate] = []
    skipped: list[dict[str, str]] = []
    for stage in config.topological():
        kind = get_kind(stage.kind)
        if not kind.needs_gates:
            continue
        for found in stage_candidates(stage, kind, kind.describe(stage), profile, mask):
            if isinstance(found, Excluded):
                skipped.append(
                    {
                        "stage": stage.name,
                        "device": found.device,
                        "why": _skip_reason(found, profile),
                    }
                )
            else:
                out.append(found)
    return out, skipped


def _skip_reason(excluded: Excluded, profile: HardwareProfile) -> str:
    if excluded.why == "masked":
        return "excluded by --mask"
    if excluded.why == "absent":
        return f"{profile.name} has no {excluded.device}"
    if excluded.why == "unavailable":
        return f"{excluded.device} ({excluded.backend}): {excluded.reason}"
    return f"{excluded.device} offers no ONNX Runtime backend the stage allows"


Step = Callable[[Candidate, str], None]


def require_this_machine(profile: HardwareProfile) -> None:
    """``ConfigError`` (exit 2) when ``profile`` describes another machine."""
    foreign = foreign_profile(profile)
    if foreign:
        raise ConfigError.single(
            f"profile {profile.name!r}",
            foreign,
            "verification measures the devices it runs on: run omni-edge verify on that machine, "
            "or pass a profile of this one (omni-edge probe --save FILE)",
        )


def foreign_profile(profile: HardwareProfile) -> str | None:
    """Why ``profile`` is not this machine, or None.

    Evidence is keyed by the profile's device names; measuring here under another
    machine's names would record a result that machine never produced. Profiles
    that leave ``host.cpu_name`` empty (hand-written ones) are taken at their word.
    """
    here_os = host_os()
    if profile.host.os != here_os:
        return f"it describes a {profile.host.os} host; this process runs on {here_os}"
    here_wsl = running_in_wsl()
    if profile.host.wsl != here_wsl:
        return f"it describes a host {'inside' if profile.host.wsl else 'outside'} WSL2; this process runs {'inside' if here_wsl else 'outside'} it"
    if profile.host.cpu_name:
        here = cpu_model()[0]
        if here and profile.host.cpu_name.strip() != here.strip():
            return (
                f"it describes a machine with CPU {profile.host.cpu_name!r}; this one has {here!r}"
            )
    return None


def verify_pipeline(
    config: PipelineConfig,
    profile: HardwareProfile,
    *,
    mask: frozenset[str] = frozenset(),
    force: bool = False,
    store: EvidenceStore | None = None,
    base_dir: Path | None = None,
    on_step: Step | None = None,
    on_done: Callable[[PlacementResult], None] | None = None,
) -> VerifyReport:
    """Run the gates for every candidate; write evidence; never raise for a refusal."""
    require_this_machine(profile)
    require_startable_routes(profile)  # the gates start the routes' interpreters
    store = store or EvidenceStore()
    # Evidence is what verify is for: refuse before measuring when it cannot be kept.
    settings.require_cache_dir(store.root, "gate evidence")
    found, skipped = candidates(config, profile, mask)
    report = VerifyReport(config.name, profile.name, skipped=skipped, evidence_dir=str(store.root))
    _Run(profile, report, store, force, base_dir, on_step, on_done).verify(found)
    return report


@dataclass
class _Run:
    """One verification in this process: the report it fills, and the route hosts it
    started (one per route, each started once and shut down at the end)."""

    profile: HardwareProfile
    report: VerifyReport
    store: EvidenceStore
    force: bool = False
    base_dir: Path | None = None
    on_step: Step | None = None
    on_done: Callable[[PlacementResult], None] | None = None
    machine: str = ""
    """The cluster node's machine the evidence is keyed by (``verify_on_node``); empty here."""
    hosts: dict[str, Sessions] = field(default_factory=dict)

    def verify(self, found: list[Candidate]) -> None:
        try:
            for c in found:
                self.candidate(c)
        finally:
            for host in self.hosts.values():
                host.shutdown()

    def candidate(self, c: Candidate) -> None:
        """Refuse ``c`` from the profile, its precision or its route's probe, or run
        its gates: one per session the stage opens (asr: encoder, decoder)."""
        static = static_refusal(self.profile, c.device, c.backend)
        if static is not None:
            self.refuse(c, static)
            return
        precision_refusals = c.kind.check(c.stage, c.info, c.device, c.backend)
        if precision_refusals:
            self.refuse(c, precision_refusals[0])
            return
        route_report = self.route(c)
        unreachable = probe_refusal(route_report, c.device, c.backend)
        if unreachable is not None:
            self.refuse(c, unreachable)
            return
        gates = c.kind.gate_specs(c.stage, c.info, c.device, c.backend)
        assert gates  # check() found a runnable precision
        for gate in gates:
            placement = placement_for(
                gate,
                c.route,
                base_dir=self.base_dir,
                runtime=route_report.runtime,
                machine=self.machine,
            )
            self.step(c, f"gates on {placement.ep} [{placement.precision}]")
            self.done(
                verify_placement(
                    placement, self.hosts[c.route.name], store=self.store, force=self.force
                )
            )

    def route(self, c: Candidate) -> RouteReport:
        """The probe of ``c``'s route, starting its host the first time it is needed."""
        report = self.report
        if c.route.name not in report.routes:
            resolved = resolve(c.route, self.base_dir)
            self.step(c, f"starting route {c.route.name}")
            t0 = time.perf_counter()
            try:
                host = open_sessions(resolved)
                report.routes[c.route.name] = report_from_probe(resolved, host.probe())
                self.hosts[c.route.name] = host
            except RouteError as exc:
                report.routes[c.route.name] = RouteReport(
                    c.route.name,
                    c.route.kind,
                    resolved.python,
                    False,
                    str(exc),
                    exc.remedy,
                )
            report.route_start_s[c.route.name] = time.perf_counter() - t0
        return report.routes[c.route.name]

    def step(self, c: Candidate, what: str) -> None:
        if self.on_step:
            self.on_step(c, what)

    def done(self, result: PlacementResult) -> None:
        self.report.results.append(result)
        if self.on_done:
            self.on_done(result)

    def refuse(self, c: Candidate, refusal: Refusal, precision: str | None = None) -> None:
        self.done(
            PlacementResult(
                c.stage.name,
                c.device.id,
                c.backend,
                c.route.name,
                precision,
                "refused",
                refusals=[refusal],
            )
        )


def verify_on_node(
    config: PipelineConfig,
    cluster: HardwareProfile,
    node: str,
    mask: frozenset[str] = frozenset(),
    *,
    force: bool = False,
    seed: dict[str, str] | None = None,
) -> VerifyReport:
    """Runs on cluster node ``node`` (a Ray task pinned to it): the gates of the
    cluster's candidates on that node, in the node's own routes (its profile's, as
    its probe found them), each record keyed by this machine's identity, read here.

    ``ConfigError`` when the node's profile is not the machine this runs on. The
    records go to a temporary store here, seeded with ``seed`` (file name → its text:
    the driver's records for this machine, reused unless ``force``); they come back
    in the results' ``record`` for the driver to check and keep."""
    local = cluster.nodes[node].profile
    require_this_machine(local)
    require_startable_routes(local, f"node {node}")  # by this machine's own settings
    machine = machine_identity_here()
    found, _ = candidates(config, cluster, mask)
    mine = [_on_node(c, local) for c in found if c.device.node == node]
    with tempfile.TemporaryDirectory(prefix="omni-edge-evidence-") as tmp:
        store = EvidenceStore(Path(tmp))
        for name, text in (seed or {}).items():
            write_text_atomic(store.root / Path(name).name, text, durable=False)
        report = VerifyReport(config.name, f"node {node} of {cluster.name}", evidence_dir=tmp)
        _Run(local, report, store, force, machine=machine).verify(mine)
    return report


def _on_node(c: Candidate, node: HardwareProfile) -> Candidate:
    """A cluster candidate as its node sees it: the node's own device and route."""
    device = node.device(c.device.local_id)
    route = node.route(c.route.name.split("/", 1)[1])
    assert device is not None and route is not None  # the cluster was built from this node
    return replace(c, device=device, route=route)


def node_seed(store: EvidenceStore, node: HardwareProfile) -> dict[str, str]:
    """The records in ``store`` keyed by ``node``'s machine (file name → the file's text), which
    :func:`verify_on_node` reuses as cached evidence (and checks as it reads them)."""
    machine = machine_identity(node.host)
    out: dict[str, str] = {}
    for path in sorted(store.root.glob("*.json")):
        try:
            text = path.read_text(encoding="utf-8")
            record = json.loads(text)
        except (OSError, ValueError):
            continue
        key = record.get("key") if isinstance(record, dict) else None
        if isinstance(key, dict) and key.get("machine") == machine:
            out[path.name] = text
    return out


def keep_node_evidence(report: VerifyReport, node: str, store: EvidenceStore) -> VerifyReport:
    """The driver's half of :func:`verify_on_node`: each record the node returned is
    checked (``record_problem``, against the key it carries, which must name a
    machine) and written to ``store`` under that key; one that fails turns its result
    into an error. Devices, routes and refusals are named for the node."""
    for r in report.results:
        r.device, r.route = f"{node}/{r.device}", f"{node}/{r.route}"
        r.refusals = [replace(f, device=f"{node}/{f.device}") for f in r.refusals]
        r.evidence_path = None
        record = r.record
        if not record or "key" not in record:
            continue  # nothing was measured, or the route's runtime was unknown (no key)
        try:
            key = EvidenceKey(**record["key"])
        except TypeError as exc:
            problem: str | None = f"its key is not an evidence key: {exc}"
        else:
            problem = record_problem(record, key) or (
                None if key.machine else "its key names no machine"
            )
        if problem is not None:
            r.status, r.error = (
                "error",
                f"node {node} returned evidence that was rejected: {problem}",
            )
            continue
        path = store.path(key)
        write_json_atomic(path, record, indent=1)
        r.evidence_path = str(path)
    report.routes = {
        f"{node}/{name}": replace(route, name=f"{node}/{name}")
        for name, route in report.routes.items()
    }
    report.route_start_s = {f"{node}/{k}": v for k, v in report.route_start_s.items()}
    return report
