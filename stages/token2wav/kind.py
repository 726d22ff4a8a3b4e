"""``token2wav``: Qwen2.5-Omni's codes → waveform as two exported graphs and a solver loop.

Qwen2.5-Omni's token2wav (transformers' ``Qwen2_5OmniToken2WavModel``) is a DiT that
predicts a mel spectrogram by flow matching — an ODE integrated from Gaussian noise,
conditioned on the codes, a speaker embedding and a reference mel — and a BigVGAN
vocoder that turns the mel into a 24 kHz waveform. A stage of this kind names two
``omni-edge.export/1`` artifacts: ``dit`` (one guided velocity evaluation:
``exports/qwen2_5_omni_token2wav.py:dit_step``; its directory also holds the
checkpoint's voices, ``voices.npz``) and ``vocoder`` (BigVGAN). The solver loop, the
noise and the voice's conditioning are the runner's (``stages.token2wav.runner``), in
numpy: no torch at run time.

Planning is each graph's, as an ``exported_graph`` stage
(``stages.exported_graph.graphs``: describe, refusals, reservations, one gate per
graph); what this kind adds is the voice (``voice:``, checked against the DiT
artifact's ``voices.npz`` while planning — its names, read from the zip's directory
without numpy), the solver's steps and the noise's seed.

Payloads: ``token_ids`` in (the talker's codes, one or more per item, all of a
request's codes decoded at once when its input ends: the DiT attends over the whole
sequence), ``audio`` out (one item: ``{"audio": float32 mono, "sample_rate": int}``).
"""

from __future__ import annotations

import zipfile
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from orchestrator.core.errors import ConfigError
from stages.base import ArtifactInfo, StageConfig, StageRunner
from stages.exported_graph.graphs import GraphsKind
from stages.exported_graph.kind import GraphStageConfig
from stages.payloads import Ports, parse_payloads
from stages.token2wav import VOICES, voices_file

if TYPE_CHECKING:
    from orchestrator.core.plan import StagePlan
    from orchestrator.core.profile import Route

"""The DiT artifact's voices: ``<speaker>.cond`` [enc_emb_dim] and ``<speaker>.ref_mel``
[frames, mel_dim] float32 arrays (a Qwen2.5-Omni checkpoint's ``spk_dict.pt``, read at export)."""
BUILD_HINT = "build the graphs: python -m exports.qwen2_5_omni_token2wav build (after python -m exports.omni_tiny build)"


class Token2WavConfig(GraphStageConfig):
    """A Qwen2.5-Omni token2wav stage in a pipeline config."""

    kind: Literal["token2wav"] = Field(description="Always token2wav for this kind.")
    dit: str = Field(
        description="The DiT step's artifact directory (with the voices), relative to the config file, or package://<package>/<dir>."
    )
    vocoder: str = Field(description="The vocoder's (BigVGAN's) artifact directory, same rules.")
    voice: str | None = Field(
        None,
        min_length=1,
        description="The speaker (a name in the DiT artifact's voices.npz); default: the first one.",
    )
    steps: int | None = Field(
        None,
        ge=2,
        le=64,
        description="Time points of the RK4 solver (default: the DiT manifest's num_steps, transformers' 10).",
    )
    seed: int = Field(
        0,
        ge=0,
        description="Seed of the initial noise (numpy's default generator), the same for every request.",
    )


def voice_names(dit_dir: str | Path) -> list[str]:
    """The speakers in ``dit_dir``'s ``voices.npz``, in file order, from the zip's directory."""
    with zipfile.ZipFile(voices_file(dit_dir)) as z:
        names = [n.removesuffix(".npy") for n in z.namelist()]
    return list(
        dict.fromkeys(n.rsplit(".", 1)[0] for n in names if n.endswith((".cond", ".ref_mel")))
    )


class Token2WavKind(GraphsKind):
    """DiT step + vocoder on ONNX Runtime EPs; the flow-matching solver in the runner."""

    kind = "token2wav"
    config_model = Token2WavConfig
    graph_names = ("dit", "vocoder")
    primary = "dit"
    build_hint = BUILD_HINT
    consumes = ("token_ids",)
    produces = ("audio",)

    def ports(self, stage: StageConfig) -> Ports:
        """``token_ids`` in; the vocoder manifest's ``produces`` (e.g. ``audio@24000``) where it says, else ``audio``."""
        default = super().ports(stage)
        try:
            produces = self.artifacts(stage)["vocoder"].manifest.produces
        except ConfigError:
            return default
        return Ports(default.consumes, parse_payloads(produces) if produces else default.produces)

    def describe(self, stage: StageConfig) -> ArtifactInfo:
        """Both graphs (``GraphsKind.describe``), and the voice: a DiT artifact without
        ``voices.npz``, or a ``voice:`` it does not have, is a ``ConfigError`` naming the voices there."""
        info = super().describe(stage)
        cfg = _cfg(stage)
        where = f"stages.{cfg.name}.voice"
        try:
            names = voice_names(cfg.dit)
        except (OSError, zipfile.BadZipFile) as exc:
            raise ConfigError.single(
                f"stages.{cfg.name}.dit",
                f"the DiT artifact has no readable {VOICES} ({exc})",
                BUILD_HINT,
            ) from None
        if not names:
            raise ConfigError.single(
                f"stages.{cfg.name}.dit",
                f"{VOICES} holds no voice (<speaker>.cond, <speaker>.ref_mel)",
                BUILD_HINT,
            )
        if cfg.voice is not None and cfg.voice not in names:
            raise ConfigError.single(
                where,
                f"no voice {cfg.voice!r} in {cfg.dit}/{VOICES}",
                f"use one of: {', '.join(names)}",
            )
        info.details["voice"] = cfg.voice or names[0]
        return info

    def runner(
        self, stage_plan: StagePlan, stage: StageConfig, route: Route | None = None
    ) -> StageRunner:
        """The runner for an admitted placement; both sessions in the route ``route_for`` finds."""
        module = import_module("stages.token2wav.runner")  # numpy at its top: never while planning
        cfg = _cfg(stage)
        runner: StageRunner = module.Token2WavRunner(
            stage_plan,
            self.artifacts(stage),
            module.route_for(stage_plan, route),
            voice=cfg.voice,
            steps=cfg.steps,
            seed=cfg.seed,
        )
        return runner


def _cfg(stage: StageConfig) -> Token2WavConfig:
    if not isinstance(stage, Token2WavConfig):
        raise TypeError(f"stage {stage.name!r} is not a token2wav stage")
    return stage
