"""``exported_graph``: an ONNX artifact run by ONNX Runtime with a chosen EP.

Planning reads the artifact's manifest and graph statistics (never a session,
never onnxruntime); the backend table (``orchestrator.core.backends``)
supplies providers, options and EP memory; ``gate_spec`` says what the
coverage and numeric gates must measure, and the planner reads their verdict
from the evidence cache. The runtime half is ``stages.exported_graph.runner``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from orchestrator.core import backends as ort_backends
from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import ConfigError, RefusalCode
from orchestrator.core.ledger import RETAINED_GROWTH, Reservation
from orchestrator.core.packages import PACKAGE_SCHEME
from orchestrator.core.plan import Refusal
from orchestrator.core.units import MiB, fmt_bytes
from orchestrator.core.validation import Strict, refusal, unique
from stages.base import ArtifactInfo, GateSpec, StageConfig, StageKind, StageRunner
from stages.exported_graph.artifact import (
    ExportedArtifact,
    Precision,
    Tolerance,
    load_artifact,
)
from stages.exported_graph.graph_stats import check_against_graph, describe_graph
from stages.exported_graph.runner import (
    ChunkSettings,
    ExportedGraphRunner,
    feeds_for,
    manifest_inputs,
    route_for,
)
from stages.payloads import Ports, parse_payloads
from stages.requests import Request
from stages.text_chunks import FIRST_MIN_CUT_CHARS, MAX_CHARS

if TYPE_CHECKING:
    from orchestrator.core.plan import StagePlan
    from orchestrator.core.profile import Device, Route

ACTIVATION_FLOOR = 64 * MiB
"""One inference's intermediate tensors, at least: above what the Piper voice was
measured to add on a long sentence on the CPU EP (docs/benchmarks.md)."""
ACTIVATION_WEIGHT_FRACTION = 0.5
"""…and at most half the weights again for larger graphs (conv vocoders and
encoders keep activations well below their weight bytes at one item a call)."""


class ToleranceOverride(Strict):
    """Per-stage tightening or loosening of the manifest's numeric tolerance."""

    rel_l2: float | None = Field(
        None, ge=0, description="Overrides the manifest's tolerance.rel_l2."
    )
    max_abs: float | None = Field(
        None, ge=0, description="Overrides the manifest's tolerance.max_abs."
    )
    cosine_min: float | None = Field(
        None, ge=-1, le=1, description="Overrides the manifest's tolerance.cosine_min."
    )


class GraphStageConfig(StageConfig):
    """The EP settings every stage that runs exported graphs has (``exported_graph``, and the
    kinds that run their graphs through it: ``asr``, ``vad``); each kind subclasses it."""

    precision: list[Precision] = Field(
        default_factory=lambda: ["fp32"],  # type: ignore[arg-type]
        min_length=1,
        description="Precisions to use, in preference order; each graph takes the first one it has and the backend runs.",
    )
    min_ep_coverage: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Overrides the manifest's (each graph's) minimum fraction of nodes the target EP must take.",
    )
    target_only: bool = Field(
        False,
        description="Run on the target EP alone: sets session.disable_cpu_ep_fallback=1, so a node the EP declines fails the session instead of running on the CPU.",
    )
    provider_options: dict[ort_backends.OrtBackendKey, dict[str, str | int | float | bool]] = Field(
        default_factory=dict,
        description="Per backend, provider options that override the backend table (e.g. ort-vitisai: {config_file: ...}).",
    )

    @field_validator("precision")
    @classmethod
    def _precisions(cls, value: list[str]) -> list[str]:
        unique(value, "precision")
        return value

    @field_validator("provider_options")
    @classmethod
    def _allowed_options(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Only the options each backend's row declares (``ort_backends.config_option_problem``):
        a config cannot name a library to load or make an EP write outside omni-edge's cache."""
        for backend_name, options in value.items():
            for option, given in options.items():
                problem = ort_backends.config_option_problem(backend_name, option, given)
                if problem is not None:
                    raise refusal(*problem)
        return value


SAMPLES_PER_FRAME_KEY = "samples_per_frame"
"""The manifest ``metadata`` key a chunked stage reads: waveform samples per input frame."""


class ChunkConfig(Strict):
    """Decode frames of codes in windows with left context (stages/exported_graph/chunking.py).
    The defaults are vLLM-Omni's for Qwen3-Omni (its deploy file's connector extras)."""

    frames: int | None = Field(
        25,
        ge=1,
        description="New frames per call (vLLM-Omni's codec_chunk_frames); null: the whole input in one "
        "call once it has ended (vLLM-Omni without async_chunk).",
    )
    left_context: int = Field(
        25,
        ge=1,
        description="Frames already decoded that each later call takes again before its new ones "
        "(codec_left_context_frames); their samples are not kept.",
    )
    first_frames: int = Field(
        4,
        ge=0,
        description="New frames in the first call (initial_codec_chunk_frames), so audio starts "
        "early; 0: the first call takes `frames` too.",
    )


class ExportedGraphConfig(GraphStageConfig):
    """An exported-graph stage in a pipeline config."""

    kind: Literal["exported_graph"] = Field(description="Always exported_graph for this kind.")
    artifact: str = Field(
        description="Artifact directory (holding manifest.yaml), relative to the config file, or package://<package>/<dir>.",
    )
    tolerance: ToleranceOverride | None = Field(
        None, description="Overrides fields of the manifest's numeric tolerance."
    )
    chunk: ChunkConfig | None = Field(
        None,
        description="Run the graph on windows of frames (items are frames of codes) instead of item by item; "
        "the artifact's metadata must give samples_per_frame.",
    )
    first_chunk_chars: int | None = Field(
        None,
        gt=FIRST_MIN_CUT_CHARS,
        le=MAX_CHARS,
        description="A voice fed text: cut the reply's first chunk at a clause mark or a space once it runs past "
        "this many characters, so speech starts on a few words while the first sentence is still being "
        "decoded (later chunks are whole sentences); null: every chunk is a sentence.",
    )
    warmup: bool = Field(
        True,
        description="Run once at load (a short text through the hooks for a voice, else the reference inputs), "
        "so the first request does not pay the first run's one-off costs; false: a faster load.",
    )


def as_graph_stage(stage: GraphStageConfig, artifact: str) -> ExportedGraphConfig:
    """The ``exported_graph`` stage that ``artifact`` would be with ``stage``'s devices and
    EP settings — for kinds that run their graphs through this one (asr, vad)."""
    return ExportedGraphConfig(
        name=stage.name,
        kind="exported_graph",
        devices=stage.devices,
        backends=stage.backends,
        artifact=artifact,
        precision=stage.precision,
        min_ep_coverage=stage.min_ep_coverage,
        target_only=stage.target_only,
        provider_options=stage.provider_options,
    )


class ExportedGraphKind(StageKind):
    """ONNX artifacts on ONNX Runtime EPs. Stateless apart from a per-path artifact memo."""

    kind = "exported_graph"
    config_model = ExportedGraphConfig
    backends = ort_backends.TableBackends()
    runner_imports = ("numpy", "onnxruntime")
    needs_gates = True

    def __init__(self) -> None:
        self._artifacts: dict[str, tuple[float, ExportedArtifact]] = {}

    @classmethod
    def resolve_paths(cls, stage: StageConfig, base_dir: Path) -> StageConfig:
        assert isinstance(stage, ExportedGraphConfig)
        if stage.artifact.startswith(PACKAGE_SCHEME) or Path(stage.artifact).is_absolute():
            return stage
        return stage.model_copy(update={"artifact": str((base_dir / stage.artifact).resolve())})

    def ports(self, stage: StageConfig) -> Ports:
        """The manifest's ``consumes``/``produces`` where it declares them, else any payload.
        An artifact that cannot be read answers "any": ``describe`` reports it while planning."""
        default = super().ports(stage)
        try:
            manifest = self.artifact(stage).manifest
        except ConfigError:
            return default
        return Ports(
            parse_payloads(manifest.consumes) if manifest.consumes else default.consumes,
            parse_payloads(manifest.produces) if manifest.produces else default.produces,
        )

    # -- planning ------------------------------------------------------------
    def artifact(self, stage: StageConfig) -> ExportedArtifact:
        """The stage's artifact (manifest re-read when it changes on disk)."""
        cfg = _cfg(stage)
        manifest = Path(cfg.artifact) / "manifest.yaml"
        try:
            mtime = manifest.stat().st_mtime
        except OSError:
            mtime = -1.0
        hit = self._artifacts.get(cfg.artifact)
        if hit is None or hit[0] != mtime:
            hit = (mtime, load_artifact(cfg.artifact))
            self._artifacts[cfg.artifact] = hit
        return hit[1]

    def describe(self, stage: StageConfig) -> ArtifactInfo:
        cfg = _cfg(stage)
        art = self.artifact(cfg)
        missing = art.manifest.not_exported
        if (
            missing is not None
        ):  # refused (no_exported_graph) before any question about the graph, chunk's too
            return ArtifactInfo(
                kind="exported",
                path=str(art.dir),
                weight_bytes=missing.weight_bytes,
                weight_format="not exported",
                details={
                    "name": art.name,
                    "version": art.manifest.version,
                    "available_precisions": [],
                    "precisions": {},
                    "not_exported": missing.model_dump(),
                    "source": art.manifest.source.model_dump(),
                },
            )
        if cfg.chunk is not None:
            samples_per_frame(art, where=f"stages.{cfg.name}.chunk")
        fed = art.feed_problems()
        if fed:
            raise ConfigError(fed)
        wanted = [p for p in cfg.precision if p in art.manifest.precisions]
        if "fp32" in art.manifest.precisions and "fp32" not in wanted:
            wanted.append("fp32")  # the numeric gate's reference graph
        precisions: dict[str, Any] = {}
        for p in wanted:
            stats = describe_graph(art.graph_path(p))
            problems = check_against_graph(art, p, stats)
            if problems:
                raise ConfigError(problems)
            precisions[p] = {
                "graph": stats.path,
                "sha256": stats.sha256,
                "initializer_bytes": stats.initializer_bytes,
                "file_bytes": stats.file_bytes,
                "node_count": stats.node_count,
                "opset": stats.opset,
                "op_histogram": dict(list(stats.op_histogram.items())[:12]),
            }
        first = next((p for p in cfg.precision if p in precisions), None)
        return ArtifactInfo(
            kind="exported",
            path=str(art.dir),
            weight_bytes=precisions[first]["initializer_bytes"] if first else 0,
            weight_format=first or "none",
            details={
                "name": art.name,
                "version": art.manifest.version,
                "activation_bytes": art.manifest.activation_bytes,
                "activation_note": art.manifest.activation_note,
                "available_precisions": list(art.manifest.precisions),
                "precisions": precisions,
                "reference_sha256": art.reference_digest(),
                "min_ep_coverage": self._min_coverage(cfg, art),
                "tolerance": self._tolerance(cfg, art).model_dump(),
                **self._tolerances(cfg, art, precisions),
                "source": art.manifest.source.model_dump(),
            },
        )

    def choose_precision(
        self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str
    ) -> str | None:
        """The first preferred precision the artifact has and the backend runs on this device."""
        runnable = ort_backends.runnable_precisions(backend, device.kind)
        for p in _cfg(stage).precision:
            if p in info.details["precisions"] and p in runnable:
                return p
        return None

    def check(
        self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str
    ) -> list[Refusal]:
        missing = info.details.get("not_exported")
        if missing is not None:
            return [
                Refusal(
                    RefusalCode.NO_EXPORTED_GRAPH,
                    device.id,
                    f"{info.details['name']} is not exported: no graph to run on {device.id}; its weights would be "
                    f"{fmt_bytes(missing['weight_bytes'])} (evidence {missing['evidence']}: {missing['note']})",
                    missing["remedy"],
                )
            ]
        if self.choose_precision(stage, info, device, backend) is not None:
            return []
        cfg = _cfg(stage)
        has = info.details["available_precisions"]
        why = []
        for p in dict.fromkeys([*cfg.precision, *has]):
            rule = ort_backends.precision_rule(backend, device.kind, p)
            if rule is not None and not rule.supported:
                why.append(f"{p}: {rule.reason}")
        runnable = ort_backends.runnable_precisions(backend, device.kind)
        return [
            Refusal(
                RefusalCode.NO_EXPORTED_GRAPH,
                device.id,
                f"{info.details['name']} has {', '.join(has)} graph(s) and the stage prefers {', '.join(cfg.precision)}, "
                f"but {backend} on {device.id} ({device.kind}) runs {', '.join(runnable)}"
                + (f" — {'; '.join(why)}" if why else ""),
                f"export a {' or '.join(p for p in runnable if p not in has) or runnable[0]} graph of this artifact "
                f"and add it to the manifest's precisions (and to the stage's precision list), or place the stage on another device",
            )
        ]

    @staticmethod
    def _activations(pool: str, info: ArtifactInfo, weights: int) -> Reservation:
        declared = info.details.get("activation_bytes")
        if declared is not None:
            note = info.details.get("activation_note") or "declared by the artifact's manifest"
            return Reservation(
                pool,
                "activations",
                int(declared),
                "request",
                "E",
                f"manifest activation_bytes: {note}",
                at_load=False,
            )
        return Reservation(
            pool,
            "activations",
            max(ACTIVATION_FLOOR, int(ACTIVATION_WEIGHT_FRACTION * weights)),
            "request",
            "E",
            "one inference's intermediate tensors (ACTIVATION_FLOOR / ACTIVATION_WEIGHT_FRACTION)",
            at_load=False,
        )

    def reservations(
        self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str, pool: str
    ) -> list[Reservation]:
        precision = self.choose_precision(stage, info, device, backend)
        if precision is None:
            return []
        g = info.details["precisions"][precision]
        weights = int(g["initializer_bytes"])
        row = ort_backends.backend(backend)
        name = info.details["name"]
        out = [
            Reservation(
                pool,
                "weights",
                weights,
                "session",
                "D",
                f"initializers of {name} [{precision}], read from the graph",
            ),
            self._activations(pool, info, weights),
            Reservation(
                pool,
                "ep_workspace",
                ort_backends.workspace_bytes(backend, weights),
                "session",
                "E",
                f"{row.ep}: {row.workspace_reason}",
            ),
            Reservation(
                pool,
                "load_transient",
                int(g["file_bytes"]),
                "load",
                "E",
                "ONNX Runtime holds the parsed model proto while it builds the session",
            ),
        ]
        dims = _data_dependent_dims(self.artifact(stage))
        grows = row.shape_memory
        if grows is not None and dims:
            # Requests in flight do not multiply the activations: a route worker (and an
            # in-process session) runs one call at a time (orchestrator/ort/sessions.py), so
            # concurrent requests queue. What grows is the EP's memory per new shape.
            out.append(
                Reservation(
                    pool,
                    RETAINED_GROWTH,
                    grows.per_item * grows.items,
                    "request",
                    "E",
                    f"{grows.who} keeps memory per new shape and {name}'s output dimension(s) {', '.join(dims)} come from "
                    f"the data: {fmt_bytes(grows.per_item)} an item ({grows.per_item_name}, measured) "
                    f"x {grows.items} items ({grows.items_name}); it keeps growing beyond, measure to calibrate",
                    at_load=False,
                )
            )
        return out

    def session_spec(
        self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str, precision: str
    ) -> ort_backends.SessionSpec:
        cfg = _cfg(stage)
        g = info.details["precisions"][precision]
        return ort_backends.session_spec(
            backend,
            graph=g["graph"],
            device_kind=device.kind,
            device_id=device.id,
            precision=precision,
            cache_key=f"{info.details['name']}-{precision}-{g['sha256'][:12]}",
            overrides=cfg.provider_options.get(backend),
            target_only=cfg.target_only,
        )

    def engine_kwargs(
        self,
        stage: StageConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        reservations: list[Reservation],
        pool_capacity: int,
    ) -> JsonObject:
        precision = self.choose_precision(stage, info, device, backend)
        if precision is None:
            return {}
        spec = self.session_spec(stage, info, device, backend, precision)
        return {
            "ep": spec.providers[0],
            "precision": precision,
            "artifact": info.path,
            "session": spec.to_dict(),
            "target_only": _cfg(stage).target_only,
            # the plan says how the stage calls its graph: in windows of frames, or item by item
            **({"chunk": chunk.model_dump()} if (chunk := _cfg(stage).chunk) is not None else {}),
        }

    def gate_spec(
        self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str
    ) -> GateSpec | None:
        """The coverage and numeric gates of the precision ``check`` chose on this
        device, or None when none runs there. Read from ``info`` alone."""
        precision = self.choose_precision(stage, info, device, backend)
        if precision is None:
            return None
        spec = self.session_spec(stage, info, device, backend, precision)
        graphs = info.details["precisions"]
        return GateSpec(
            stage=stage.name,
            artifact=info.path,
            artifact_name=info.details["name"],
            artifact_precisions=tuple(info.details["available_precisions"]),
            precision=precision,
            backend=backend,
            device_id=device.id,
            device_name=device.name,
            session=spec,
            graph_sha256=graphs[precision]["sha256"],
            reference_sha256=info.details["reference_sha256"],
            reference_graph=graphs.get("fp32", {}).get("graph"),
            options=ort_backends.keyed_options(backend, spec),
            min_coverage=float(info.details["min_ep_coverage"]),
            tolerance=dict(
                info.details.get("tolerances", {}).get(precision, info.details["tolerance"])
            ),
        )

    def remedy_for_budget(
        self,
        stage: StageConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        pool: str,
        available: int,
    ) -> str:
        smaller = [
            p
            for p in ("int8", "int4", "fp16", "bf16")
            if p in ort_backends.runnable_precisions(backend, device.kind)
        ]
        return (
            f"{info.details['name']} needs more than the {fmt_bytes(available)} left in {pool} on {backend}: "
            f"export a smaller precision ({', '.join(smaller) or 'none runs on this backend'}) and list it in the "
            f"stage's precision, or place the stage on a device with a larger pool"
        )

    def _min_coverage(self, cfg: ExportedGraphConfig, art: ExportedArtifact) -> float:
        return (
            cfg.min_ep_coverage if cfg.min_ep_coverage is not None else art.manifest.min_ep_coverage
        )

    def _tolerance(
        self, cfg: ExportedGraphConfig, art: ExportedArtifact, precision: str | None = None
    ) -> Tolerance:
        """The manifest's tolerance (``precision``'s own when given: ``tolerances`` over
        ``tolerance``), with the stage's ``tolerance`` fields over it."""
        base = (
            art.manifest.tolerance if precision is None else art.manifest.tolerance_for(precision)
        )
        if cfg.tolerance is None:
            return base
        update = {k: v for k, v in cfg.tolerance.model_dump().items() if v is not None}
        return base.model_copy(update=update)

    def _tolerances(
        self, cfg: ExportedGraphConfig, art: ExportedArtifact, precisions: dict[str, Any]
    ) -> JsonObject:
        """``{"tolerances": {precision: tolerance}}`` for the described graphs when the manifest
        gives any precision its own tolerance; nothing otherwise (a plan of an artifact
        without ``tolerances`` is what it was)."""
        if not art.manifest.tolerances:
            return {}
        return {"tolerances": {p: self._tolerance(cfg, art, p).model_dump() for p in precisions}}

    # -- runtime -------------------------------------------------------------
    def validate_request(self, stage_plan: StagePlan, stage: StageConfig, request: Request) -> None:
        """A request this stage takes (its inputs name ``request``), checked in the caller's
        process before anything reaches the session: without a preprocess hook, an array (or a
        mapping of arrays) must be what the graph's inputs are as the manifest declares them —
        names, dtype, rank and fixed sizes (``runner.feeds_for``'s check; a ``BadRequest``
        naming the stage and the input). A hook, or a chunked stage, takes what it takes."""
        cfg = _cfg(stage)
        art = self.artifact(cfg)
        if (
            art.manifest.preprocess is not None
            or cfg.chunk is not None
            or art.manifest.not_exported is not None
        ):
            return
        feeds_for(
            request.item(),
            manifest_inputs(art),
            f"request (stage {stage_plan.name}, kind {stage_plan.kind})",
        )

    def runner(
        self, stage_plan: StagePlan, stage: StageConfig, route: Route | None = None
    ) -> StageRunner:
        """The runner for an admitted placement, in the route ``route_for`` finds."""
        cfg = _cfg(stage)
        art = self.artifact(stage)
        chunk = None
        if cfg.chunk is not None:
            chunk = ChunkSettings(
                cfg.chunk.frames,
                cfg.chunk.left_context,
                cfg.chunk.first_frames,
                samples_per_frame(art, where=f"stages.{cfg.name}.chunk"),
            )
        return ExportedGraphRunner(
            stage_plan, art, route_for(stage_plan, route), chunk=chunk, warmup=cfg.warmup
        )


def samples_per_frame(art: ExportedArtifact, *, where: str) -> int:
    """The artifact's ``metadata.samples_per_frame`` (a positive integer), or a ``ConfigError`` at ``where``."""
    value = art.metadata.get(SAMPLES_PER_FRAME_KEY)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError.single(
            where,
            f"{art.name}'s manifest gives no metadata.{SAMPLES_PER_FRAME_KEY} (got {value!r}): "
            "a chunked stage keeps each call's new samples by it",
            f"add metadata.{SAMPLES_PER_FRAME_KEY} (waveform samples per input frame) to {art.dir}/manifest.yaml, "
            "or remove `chunk` from the stage",
        )
    return value


def _data_dependent_dims(art: ExportedArtifact) -> list[str]:
    """Named output dimensions that no input has: the graph computes them from the data."""
    given = {d for t in art.manifest.inputs for d in t.shape if isinstance(d, str)}
    return sorted(
        {d for t in art.manifest.outputs for d in t.shape if isinstance(d, str) and d not in given}
    )


def _cfg(stage: StageConfig) -> ExportedGraphConfig:
    if not isinstance(stage, ExportedGraphConfig):
        raise TypeError(f"stage {stage.name!r} is not an exported_graph stage")
    return stage
