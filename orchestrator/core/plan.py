"""The plan (contract ``omni-edge.plan/1``): plain frozen data, JSON and a summary.

The planner returns a :class:`PipelinePlan`; the runtime carries it out and
never re-decides. ``to_json()`` is the documented contract (docs/plan-format.md);
``from_json()`` reads it back. A stage's kind- and backend-specific parts — its
``engine_kwargs`` (the backend's own settings, which only that backend's runner
reads), ``artifact`` summary, kind ``details``, gate ``verification.details`` and
``calibration`` — are JSON objects of the plan document as docs/plan-format.md
describes them (``JsonObject``): the plan carries them for the kind and the
backend that wrote them, and every reader checks the keys it reads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypedDict

from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import RefusalCode
from orchestrator.core.ledger import Reservation, holder_peak

PLAN_FORMAT = "omni-edge.plan/1"
STAGE_FIELDS = frozenset(
    {
        "name",
        "kind",
        "admitted",
        "device",
        "backend",
        "route",
        "inputs",
        "final_output",
        "final_output_type",
        "budget_bytes",
        "reservations",
        "refusals",
        "engine_kwargs",
        "artifact",
        "verification",
        "calibration",
        "cpu_threads",
        "cpu_threads_from",
        "replicas",
        "restart",
        "on_device_loss",
    }
)
"""The keys of a stage in the plan JSON that are the plan's own; any other key is
one of the kind's ``details``."""


@dataclass(frozen=True)
class Refusal:
    """A named reason a device was not chosen for a stage, with the remedy."""

    code: RefusalCode
    device: str
    message: str
    remedy: str

    def to_dict(self) -> JsonObject:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Refusal:
        """A refusal read back from the plan JSON (the code as the enum again)."""
        return cls(RefusalCode(d["code"]), d["device"], d["message"], d["remedy"])


@dataclass(frozen=True)
class Verification:
    """State of an exported placement's gates (coverage, numerics).

    ``status``: 'unverified' (no evidence yet), 'verified' (evidence M passed),
    'failed' (evidence M refused), 'not_needed' (checkpoint stages).
    """

    status: str
    evidence: str = ""
    """'M' with where and when, or '' when unverified."""
    details: JsonObject = field(default_factory=dict)

    def to_dict(self) -> JsonObject:
        return asdict(self)


@dataclass(frozen=True)
class ReplicaPlan:
    """One instance of a stage with ``replicas: N``: where it runs and what it holds. Its
    ledger holder is ``name#index`` (``voice#1``); a stage of one instance has none in the
    JSON, and ``StagePlan.placements()`` makes its one from the stage's own fields."""

    index: int
    holder: str
    device: str | None
    backend: str | None
    route: str | None
    reservations: tuple[Reservation, ...]
    engine_kwargs: JsonObject
    verification: Verification | None = None
    calibration: JsonObject | None = None
    cpu_threads: int | None = None
    cpu_threads_from: str | None = None
    node: str | None = None
    """The cluster node it runs on (cluster plans only)."""

    @property
    def pool(self) -> str | None:
        return self.reservations[0].pool if self.reservations else None

    def budget_bytes(self) -> int:
        """This replica's own peak on its device's pool: max(load path, steady state)."""
        return holder_peak(self.reservations, self.pool)

    def to_dict(self) -> JsonObject:
        d: JsonObject = {
            "index": self.index,
            "holder": self.holder,
            "device": self.device,
            "backend": self.backend,
            "route": self.route,
            "budget_bytes": self.budget_bytes(),
            "reservations": [r.to_dict() for r in self.reservations],
            "engine_kwargs": self.engine_kwargs,
            "cpu_threads": self.cpu_threads,
            "cpu_threads_from": self.cpu_threads_from,
        }
        if self.node is not None:
            d["node"] = self.node
        if self.verification is not None:
            d["verification"] = self.verification.to_dict()
        if self.calibration is not None:
            d["calibration"] = self.calibration
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReplicaPlan:
        ver = d.get("verification")
        return cls(
            index=d["index"],
            holder=d["holder"],
            device=d.get("device"),
            backend=d.get("backend"),
            route=d.get("route"),
            reservations=tuple(Reservation(**r) for r in d.get("reservations", [])),
            engine_kwargs=dict(d.get("engine_kwargs", {})),
            verification=Verification(**ver) if ver else None,
            calibration=d.get("calibration"),
            cpu_threads=d.get("cpu_threads"),
            cpu_threads_from=d.get("cpu_threads_from"),
            node=d.get("node"),
        )


class RestartDoc(TypedDict):
    """A stage's ``restart`` policy as a plan carries it: ``stages.base.RestartConfig``'s
    fields."""

    max: int
    window_s: float
    backoff_s: float
    backoff_max_s: float


@dataclass(frozen=True)
class StagePlan:
    name: str
    kind: str
    admitted: bool
    device: str | None
    backend: str | None
    route: str | None
    reservations: tuple[Reservation, ...]
    refusals: tuple[Refusal, ...]
    engine_kwargs: JsonObject
    artifact: JsonObject
    """Summary of what describe() read: path, weight bytes/format, digest..."""
    details: JsonObject = field(default_factory=dict)
    """Kind-specific plan fields (``StageKind.plan_details``, e.g. ar_decode's
    ``kv_cache``), written at the stage's top level in the JSON."""
    verification: Verification | None = None
    inputs: tuple[str, ...] = ()
    final_output: bool = False
    final_output_type: str | None = None
    calibration: JsonObject | None = None
    """What the measurement store did to this stage's reservations (``match``,
    ``before_bytes``, ``after_bytes``, ``evidence``, ``margin``, ``provenance``);
    None when the stage was planned from metadata alone (docs/calibration.md)."""
    cpu_threads: int | None = None
    """Threads the stage's engine runs on the CPU (vLLM's OpenMP threads, llama.cpp's
    ``n_threads``, torch's, ONNX Runtime's ``intra_op_num_threads``): the planner's share of
    the host's cores (``orchestrator.core.cpu_threads``) or the config's ``cpu_threads``. None off
    the CPU, when the profile does not know the host's cores, or when thread budgets are off:
    the engine then picks its own."""
    cpu_threads_from: str | None = None
    """Where ``cpu_threads`` came from: ``plan`` (the split of the cores) or ``config``."""
    replicas: tuple[ReplicaPlan, ...] = ()
    """With ``replicas: N`` > 1 in the config, each instance in index order (the stage's own
    ``device``, ``reservations``, ... are replica 0's); empty for a stage of one instance."""
    restart: RestartDoc | Literal["never"] | None = None
    """The config's ``restart`` when it is not the default: ``"never"``, or the policy's fields
    (``max``, ``window_s``, ``backoff_s``, ``backoff_max_s``); None: the default policy
    (``stages.base.RestartConfig``). In the JSON only when set, so plans of stages that keep
    the default are unchanged."""
    on_device_loss: str = "fail"
    """The config's ``on_device_loss``: ``fail`` (the default; not in the JSON) or ``fallback``."""

    def __post_init__(self) -> None:
        clash = sorted(set(self.details) & STAGE_FIELDS)
        if clash:
            raise ValueError(
                f"stage {self.name!r}: kind-specific plan fields {clash} clash with the plan's own"
            )

    @property
    def pool(self) -> str | None:
        return self.reservations[0].pool if self.reservations else None

    def budget_bytes(self) -> int:
        """This stage's own peak on its device's pool: max(load path, steady state)."""
        return holder_peak(self.reservations, self.pool)

    def placements(self) -> tuple[ReplicaPlan, ...]:
        """Every instance of the stage: its ``replicas``, or one made of its own fields (holder:
        the stage's name) for a stage of one instance; none for a refused stage."""
        if self.replicas or not self.admitted:
            return self.replicas
        node = self.details.get("node")
        return (
            ReplicaPlan(
                index=0,
                holder=self.name,
                device=self.device,
                backend=self.backend,
                route=self.route,
                reservations=self.reservations,
                engine_kwargs=self.engine_kwargs,
                verification=self.verification,
                calibration=self.calibration,
                cpu_threads=self.cpu_threads,
                cpu_threads_from=self.cpu_threads_from,
                node=node if isinstance(node, str) else None,
            ),
        )

    def to_dict(self) -> JsonObject:
        d: JsonObject = {
            "name": self.name,
            "kind": self.kind,
            "admitted": self.admitted,
            "device": self.device,
            "backend": self.backend,
            "route": self.route,
            "inputs": list(self.inputs),
            "final_output": self.final_output,
            "final_output_type": self.final_output_type,
            "budget_bytes": self.budget_bytes(),
            "reservations": [r.to_dict() for r in self.reservations],
            "refusals": [r.to_dict() for r in self.refusals],
            "engine_kwargs": self.engine_kwargs,
            "artifact": self.artifact,
        }
        d["cpu_threads"] = self.cpu_threads
        d["cpu_threads_from"] = self.cpu_threads_from
        d.update(self.details)
        if self.verification is not None:
            d["verification"] = self.verification.to_dict()
        if self.calibration is not None:
            d["calibration"] = self.calibration
        if (
            self.replicas
        ):  # only with replicas: N > 1, so plans of one instance per stage are unchanged
            d["replicas"] = [r.to_dict() for r in self.replicas]
        if self.restart is not None:  # only when the config sets it: the default is said nowhere
            d["restart"] = self.restart
        if self.on_device_loss != "fail":
            d["on_device_loss"] = self.on_device_loss
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StagePlan:
        ver = d.get("verification")
        return cls(
            name=d["name"],
            kind=d["kind"],
            admitted=d["admitted"],
            device=d.get("device"),
            backend=d.get("backend"),
            route=d.get("route"),
            reservations=tuple(Reservation(**r) for r in d.get("reservations", [])),
            refusals=tuple(Refusal.from_dict(r) for r in d.get("refusals", [])),
            engine_kwargs=dict(d.get("engine_kwargs", {})),
            artifact=dict(d.get("artifact", {})),
            details={k: v for k, v in d.items() if k not in STAGE_FIELDS},
            verification=Verification(**ver) if ver else None,
            inputs=tuple(d.get("inputs", ())),
            final_output=bool(d.get("final_output", False)),
            final_output_type=d.get("final_output_type"),
            calibration=d.get("calibration"),
            cpu_threads=d.get("cpu_threads"),
            cpu_threads_from=d.get("cpu_threads_from"),
            replicas=tuple(ReplicaPlan.from_dict(r) for r in d.get("replicas", ())),
            restart=d.get("restart"),
            on_device_loss=str(d.get("on_device_loss", "fail")),
        )


@dataclass(frozen=True)
class PoolPlan:
    id: str
    capacity_bytes: int
    peak_bytes: int
    contributors: dict[str, int]
    parent: str | None = None
    note: str = ""

    def to_dict(self) -> JsonObject:
        return asdict(self)


@dataclass(frozen=True)
class PipelinePlan:
    pipeline: str
    admitted: bool
    profile: str
    stages: tuple[StagePlan, ...]
    pools: tuple[PoolPlan, ...]
    shared_reservations: tuple[Reservation, ...] = ()
    """Reservations held by the pipeline itself (the Ray runtime, pool margins)."""
    config_path: str = ""
    notes: tuple[str, ...] = ()

    def stage(self, name: str) -> StagePlan:
        return next(s for s in self.stages if s.name == name)

    @property
    def refusal_codes(self) -> list[RefusalCode]:
        return [r.code for s in self.stages if not s.admitted for r in s.refusals]

    def to_json(self) -> JsonObject:
        return {
            "format": PLAN_FORMAT,
            "pipeline": self.pipeline,
            "admitted": self.admitted,
            "profile": self.profile,
            "config_path": self.config_path,
            "stages": [s.to_dict() for s in self.stages],
            "pools": [p.to_dict() for p in self.pools],
            "shared_reservations": [r.to_dict() for r in self.shared_reservations],
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PipelinePlan:
        if d.get("format") != PLAN_FORMAT:
            raise ValueError(f"not an {PLAN_FORMAT} document (format={d.get('format')!r})")
        return cls(
            pipeline=d["pipeline"],
            admitted=d["admitted"],
            profile=d.get("profile", ""),
            config_path=d.get("config_path", ""),
            stages=tuple(StagePlan.from_dict(s) for s in d["stages"]),
            pools=tuple(PoolPlan(**p) for p in d["pools"]),
            shared_reservations=tuple(Reservation(**r) for r in d.get("shared_reservations", [])),
            notes=tuple(d.get("notes", [])),
        )
