"""``vad``: voice activity detection in front of a pipeline — audio in, speech segments out.

A stage of this kind names one ``omni-edge.export/1`` artifact of Silero VAD
(``exports/silero-vad``: the package's plain ``silero_vad.onnx``;
``exports/silero-vad-op18``: its opset-18 graph without the dynamic-rank
``If``). Planning treats the graph exactly as an ``exported_graph`` stage would
(:func:`graph_config`: the same describe, precision choice and refusals,
reservations, session spec and gate, asked of an :class:`ExportedGraphKind`).
So on OpenVINO the plain graph is a placement ``omni-edge verify`` measures
and refuses by name (``execution_provider_declined_graph``: the CPU plug-in
cannot compile a Parameter of dynamic rank), and the planner takes the stage's
next candidate, the CPU EP; the op18 graph is the one to name for OpenVINO.

What this kind adds is the loop the graph needs (``stages.vad.runner``): the
audio resampled to the graph's rate (16 kHz), cut into 512-sample windows, each
scored with the previous window's last 64 samples and the recurrent state of
the window before; and the segmentation of those scores
(``stages.vad.segments``): silence trimmed, speech cut at pauses, each
segment one audio item at the input's own sample rate.

Payloads (``stages.payloads``): ``audio`` in, any rate (the items of one request
are consecutive pieces of one recording, at one rate), ``audio`` out (one item
per speech segment, at the input's rate). A request entering here must be one
audio item (``validate_request``).
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from orchestrator.core import backends as ort_backends
from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import BadRequest, ConfigError, Problem
from orchestrator.core.ledger import Reservation
from orchestrator.core.plan import Refusal
from stages.base import (
    ArtifactInfo,
    GateSpec,
    StageConfig,
    StageKind,
    StageRunner,
    TurnDetection,
)
from stages.exported_graph.artifact import ExportedArtifact
from stages.exported_graph.kind import (
    ExportedGraphConfig,
    ExportedGraphKind,
    GraphStageConfig,
    as_graph_stage,
)
from stages.payloads import sample_rate_problem
from stages.requests import AudioRequest, OtherRequest, Request

if TYPE_CHECKING:
    from orchestrator.core.plan import StagePlan
    from orchestrator.core.profile import Device, Route

METADATA_KEYS = ("sample_rate", "chunk_samples", "context_samples")
"""What the runner reads from the artifact's manifest ``metadata``."""
INPUTS = ("input", "sr", "state")
OUTPUTS = ("output", "stateN")


class VadConfig(GraphStageConfig):
    """A voice-activity-detection stage in a pipeline config."""

    kind: Literal["vad"] = Field(description="Always vad for this kind.")
    artifact: str = Field(
        description="The Silero VAD artifact directory (exports/silero-vad, or exports/silero-vad-op18 for "
        "OpenVINO), relative to the config file, or package://<package>/<dir>.",
    )
    threshold: float = Field(
        0.5, gt=0, lt=1, description="A window at this speech probability or above is speech."
    )
    neg_threshold: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="Once speech started, a window below this is silence (default: threshold - 0.15).",
    )
    min_speech_ms: int = Field(
        250, ge=0, le=10_000, description="Shorter speech (before padding) is dropped."
    )
    min_silence_ms: int = Field(
        400,
        ge=32,
        le=10_000,
        description="A pause this long ends a segment (shorter ones stay inside it).",
    )
    speech_pad_ms: int = Field(
        100,
        ge=0,
        le=2_000,
        description="Kept before and after each segment's speech (at most min_silence_ms).",
    )
    no_speech: Literal["refuse", "nothing"] = Field(
        "refuse",
        description="A request whose audio holds no speech: refuse it (a BadRequest naming the seconds heard and the "
        "highest speech probability, so nothing downstream answers an empty prompt), or yield nothing.",
    )
    max_segment_s: float = Field(
        30.0,
        ge=1,
        le=600,
        description="Longest segment, padding included; longer speech is cut there (30: one Whisper window).",
    )

    @model_validator(mode="after")
    def _pad_within_pause(self) -> VadConfig:
        if self.speech_pad_ms > self.min_silence_ms:
            raise ValueError(
                f"speech_pad_ms ({self.speech_pad_ms}) must not exceed min_silence_ms "
                f"({self.min_silence_ms}): the end pad is cut from the pause that ends a segment"
            )
        if self.neg_threshold is not None and self.neg_threshold > self.threshold:
            raise ValueError(
                f"neg_threshold ({self.neg_threshold}) must not exceed threshold ({self.threshold})"
            )
        return self


def graph_config(stage: VadConfig) -> ExportedGraphConfig:
    """The ``exported_graph`` stage the VAD's graph would be, with this stage's settings."""
    return as_graph_stage(stage, stage.artifact)


class VadKind(StageKind):
    """Silero VAD on an ONNX Runtime EP; the window loop and segmentation in the runner."""

    kind = "vad"
    config_model = VadConfig
    backends = ort_backends.TableBackends()
    runner_imports = ("numpy", "onnxruntime")
    needs_gates = True
    consumes = ("audio",)
    produces = ("audio",)

    def __init__(self) -> None:
        self.graph = ExportedGraphKind()
        """Asked about the graph as if it were an exported_graph stage (it memoises the manifest)."""

    @classmethod
    def resolve_paths(cls, stage: StageConfig, base_dir: Path) -> StageConfig:
        cfg = _cfg(stage)
        resolved = ExportedGraphKind.resolve_paths(graph_config(cfg), base_dir)
        assert isinstance(resolved, ExportedGraphConfig)
        return cfg.model_copy(update={"artifact": resolved.artifact})

    def artifact(self, stage: StageConfig) -> ExportedArtifact:
        return self.graph.artifact(graph_config(_cfg(stage)))

    # -- planning ------------------------------------------------------------
    def describe(self, stage: StageConfig) -> ArtifactInfo:
        """The graph as exported_graph describes it, plus a check that the manifest is a VAD's
        (the metadata and the tensor names the runner feeds)."""
        cfg = _cfg(stage)
        info = self.graph.describe(graph_config(cfg))
        manifest = self.graph.artifact(graph_config(cfg)).manifest
        problems = []
        missing = [k for k in METADATA_KEYS if not isinstance(manifest.metadata.get(k), int)]
        if missing:
            problems.append(
                Problem(
                    f"{cfg.artifact}/manifest.yaml: metadata",
                    f"{', '.join(missing)} missing or not whole "
                    "numbers: the window loop needs them",
                    "e.g. sample_rate: 16000, chunk_samples: 512, "
                    "context_samples: 64 (exports/silero-vad-op18)",
                )
            )
        names_in, names_out = {i.name for i in manifest.inputs}, {o.name for o in manifest.outputs}
        if not set(INPUTS) <= names_in or not set(OUTPUTS) <= names_out:
            problems.append(
                Problem(
                    f"{cfg.artifact}/manifest.yaml",
                    f"inputs {sorted(names_in)}, outputs "
                    f"{sorted(names_out)}: a vad stage feeds {', '.join(INPUTS)} and reads "
                    f"{', '.join(OUTPUTS)}",
                    "name a Silero VAD artifact (exports/silero-vad)",
                )
            )
        if problems:
            raise ConfigError(problems)
        return info

    def check(
        self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str
    ) -> list[Refusal]:
        return self.graph.check(graph_config(_cfg(stage)), info, device, backend)

    def reservations(
        self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str, pool: str
    ) -> list[Reservation]:
        return self.graph.reservations(graph_config(_cfg(stage)), info, device, backend, pool)

    def engine_kwargs(
        self,
        stage: StageConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        reservations: list[Reservation],
        pool_capacity: int,
    ) -> JsonObject:
        cfg = _cfg(stage)
        kwargs = self.graph.engine_kwargs(
            graph_config(cfg), info, device, backend, reservations, pool_capacity
        )
        if not kwargs:
            return {}
        return {
            **kwargs,
            "segments": {
                "threshold": cfg.threshold,
                "neg_threshold": cfg.neg_threshold,
                "min_speech_ms": cfg.min_speech_ms,
                "min_silence_ms": cfg.min_silence_ms,
                "speech_pad_ms": cfg.speech_pad_ms,
                "max_segment_s": cfg.max_segment_s,
                "no_speech": cfg.no_speech,
            },
        }

    def gate_spec(
        self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str
    ) -> GateSpec | None:
        return self.graph.gate_spec(graph_config(_cfg(stage)), info, device, backend)

    def remedy_for_budget(
        self,
        stage: StageConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        pool: str,
        available: int,
    ) -> str:
        return self.graph.remedy_for_budget(
            graph_config(_cfg(stage)), info, device, backend, pool, available
        )

    def validate_request(self, stage_plan: StagePlan, stage: StageConfig, request: Request) -> None:
        """A request entering here is one recording (``AudioRequest``): mono samples, at least
        one, at a rate that is read; anything else is a ``BadRequest`` before it reaches the
        actor."""
        check_audio_request(request, f"request (stage {stage.name}, kind vad)")

    def turn_detection(self, stage_plan: StagePlan) -> TurnDetection | None:
        """The planned segmentation as a spoken turn's end: its speech threshold, its padding
        before speech and the silence that closes a segment (``min_silence_ms``)."""
        segments = stage_plan.engine_kwargs.get("segments")
        if not isinstance(segments, dict):
            return None
        return TurnDetection(
            float(segments["threshold"]),
            int(segments["speech_pad_ms"]),
            int(segments["min_silence_ms"]),
        )

    # -- runtime -------------------------------------------------------------
    def runner(
        self, stage_plan: StagePlan, stage: StageConfig, route: Route | None = None
    ) -> StageRunner:
        """The runner for an admitted placement, its session in the route ``route_for`` finds."""
        module = import_module(
            "stages.vad.runner"
        )  # numpy and soxr at its top: never while planning
        runner: StageRunner = module.VadRunner(
            stage_plan, self.artifact(stage), module.route_for(stage_plan, route)
        )
        return runner


def check_audio_request(request: Request, where: str) -> None:
    """``BadRequest`` unless ``request`` is one recording: mono, a rate that is read, samples."""
    import numpy as np

    if not isinstance(request, AudioRequest):
        got = (
            "a chat request"
            if isinstance(request, OtherRequest) and isinstance(request.value, dict)
            else request.described
        )
        raise BadRequest.single(
            where,
            f"the stage takes audio, got {got}",
            'send {"audio": float32 mono samples, "sample_rate": Hz} '
            "(omni-edge run --audio FILE.wav; an input_audio content part on the server)",
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


def _cfg(stage: StageConfig) -> VadConfig:
    if not isinstance(stage, VadConfig):
        raise TypeError(f"stage {stage.name!r} is not a vad stage")
    return stage
