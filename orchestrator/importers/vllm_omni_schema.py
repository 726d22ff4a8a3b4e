"""vLLM-Omni's vocabulary as the importer reads it (``orchestrator.importers.vllm_omni``): the
stage topologies it knows (which model stages a pipeline has, what each carries to the
next), upstream's pipeline names, and what each upstream key means here or why it has no
equivalent."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# ---- the known topologies --------------------------------------------------------


@dataclass(frozen=True)
class TopologyStage:
    """One stage of a model's pipeline, as vLLM-Omni's pipeline definition has it."""

    stage_id: int
    model_stage: str
    kind: str
    """The omni-edge stage kind that runs it (ar_decode, exported_graph)."""
    inputs: tuple[str, ...]
    """``request``, the model_stage names of the stages feeding it, or their output ports
    (``thinker.hidden_states``: ``stages.payloads.split_input``)."""
    carries: str
    """What travels into it, in words (for the report)."""
    final_output_type: str | None = None
    """What it returns to the caller in the full pipeline (None: it only feeds the next stage)."""
    hands_on: str | None = None
    """The payload it gives (``stages.payloads``): its ``final_output_type`` when ``--only``
    leaves out the stages it fed."""


@dataclass(frozen=True)
class Topology:
    name: str
    architectures: tuple[str, ...]
    description: str
    stages: tuple[TopologyStage, ...]
    pipelines: tuple[str, ...] = ()
    """vLLM-Omni's pipeline registry keys for it (``vllm_omni/config/pipeline_registry.py``,
    ``OMNI_PIPELINES``): what a deploy file's ``pipeline:`` names."""
    streaming_talker: bool = False
    """The talker may start on the thinker's first steps here (``join: latest``:
    ``stages.ar_decode.kind.STREAMING_TALKERS``), what vLLM-Omni's ``async_chunk`` asks for."""
    chunked_code2wav: bool = False
    """code2wav decodes windows of frames with left context here (the exported_graph
    kind's ``chunk:``), as vLLM-Omni's ``talker2code2wav_async_chunk`` does."""

    def by_id(self, stage_id: int) -> TopologyStage | None:
        return next((s for s in self.stages if s.stage_id == stage_id), None)

    def by_model_stage(self, model_stage: str) -> TopologyStage | None:
        return next((s for s in self.stages if s.model_stage == model_stage), None)


_OMNI_STAGES = (
    TopologyStage(
        0, "thinker", "ar_decode", ("request",), "the request (text)", "text", hands_on="text"
    ),
    TopologyStage(
        1,
        "talker",
        "ar_decode",
        ("thinker.hidden_states", "thinker.text"),
        "the thinker's hidden states and its text, two ports joined (vLLM-Omni's thinker2talker)",
        hands_on="token_ids",
    ),
    TopologyStage(
        2,
        "code2wav",
        "exported_graph",
        ("talker",),
        "the talker's codec codes",
        "audio",
        hands_on="audio",
    ),
)
_QWEN2_5_ARCHS = ("Qwen2_5OmniModel", "Qwen2_5OmniForConditionalGeneration")
TOPOLOGIES: tuple[Topology, ...] = (
    Topology(
        "qwen2.5-omni",
        _QWEN2_5_ARCHS,
        "Qwen2.5-Omni: thinker (text, hidden states) → talker (codec codes) → code2wav (token2wav: DiT + BigVGAN, audio)",
        _OMNI_STAGES,
        pipelines=("qwen2_5_omni",),
        streaming_talker=True,
    ),
    Topology(
        "qwen3-omni-moe",
        ("Qwen3OmniMoeForConditionalGeneration",),
        "Qwen3-Omni-MoE: thinker (text, hidden states) → talker (RVQ codec codes) → code2wav (audio)",
        _OMNI_STAGES,
        pipelines=("qwen3_omni_moe",),
        chunked_code2wav=True,
    ),
    Topology(
        "qwen2.5-omni-thinker-only",
        _QWEN2_5_ARCHS,
        "Qwen2.5-Omni's thinker alone (text)",
        _OMNI_STAGES[:1],
        pipelines=("qwen2_5_omni_thinker_only",),
    ),
    Topology(
        "qwen3-omni-moe-thinker-only",
        ("Qwen3OmniMoeForConditionalGeneration",),
        "Qwen3-Omni-MoE's thinker alone (text): a checkpoint without audio output",
        _OMNI_STAGES[:1],
    ),
)
"""vLLM-Omni's pipeline definitions for the models whose configs this importer reads,
keyed by the checkpoint's ``architectures`` (the first listed for an architecture is
the one ``--model`` selects) and by vLLM-Omni's pipeline registry keys. Stage ids
and what feeds what follow vLLM-Omni's pipelines for these models
(``vllm_omni/model_executor/models/qwen2_5_omni/pipeline.py``,
``qwen3_omni/pipeline.py``: stage 0 thinker, 1 talker, 2 code2wav; 0 → 1 → 2)."""

UPSTREAM_PIPELINES = (
    "aura_omni",
    "qwen2_5_omni",
    "qwen2_5_omni_thinker_only",
    "personaplex",
    "nemotron_voicechat",
    "nemotron_labs_voicechat",
    "qwen3_omni_moe",
    "qwen3_tts",
    "step_audio_2",
    "step_audio_2_asr",
    "covo_audio",
    "bagel",
    "bagel_think",
    "bagel_single_stage",
    "lance",
    "dreamzero",
    "Gr00tN1d7",
    "pi0",
    "gepard",
    "glm_image",
    "hunyuan_image_3_moe",
    "hunyuan_image3_ar",
    "hunyuan_image3_dit",
    "hunyuan_video_15",
    "wan2_2_ti2v",
    "voxcpm2",
    "dots_tts",
    "cosyvoice3",
    "audex_tts",
    "audex_tta",
    "audex_thinker_only",
    "audex_s2s",
    "nemotron_labs_audex",
    "mimo_audio",
    "ming_tts",
    "ming_tts_moe",
    "voxtral_tts",
    "glm_tts",
    "fish_qwen3_omni",
    "ming_flash_omni",
    "ming_flash_omni_tts",
    "ming_flash_omni_thinker_only",
    "ming_flash_omni_image",
    "moss_tts_nano",
    "omnivoice",
    "mammoth_moda2",
    "mammoth_moda2_ar",
    "moss_tts_delay",
    "moss_tts_realtime",
    "moss_tts_local",
    "minicpmo_4_5",
    "minimax_music3",
    "higgs_audio_v2",
    "higgs_multimodal_qwen3",
    "dynin_omni",
    "indextts2",
    "indextts2_5",
    "soulxsinger_svc",
    "soulxsinger_svs",
)
"""vLLM-Omni's pipeline registry keys (``OMNI_PIPELINES`` in
``vllm_omni/config/pipeline_registry.py``, upstream main of 2026-08-22): how a deploy
file's name is told to be another model's (``fish_qwen3_omni.yaml`` is Fish Speech's,
not Qwen3-Omni's) rather than a file the importer cannot place."""


def topology_for(architectures: list[str]) -> Topology | None:
    for topo in TOPOLOGIES:
        if any(a in topo.architectures for a in architectures):
            return topo
    return None


THINKER_ONLY = {"qwen3-omni-moe": "qwen3-omni-moe-thinker-only"}
"""The topology a checkpoint with ``enable_audio_output: false`` runs (Qwen3-Omni-30B-A3B-Captioner):
vLLM-Omni's ``resolve_qwen3_omni_pipeline`` picks its thinker-only pipeline for it."""


def topology_for_pipeline(key: str) -> Topology | None:
    return next((t for t in TOPOLOGIES if key in t.pipelines), None)


def known_pipelines() -> list[str]:
    return [f"{p} ({t.name})" for t in TOPOLOGIES for p in t.pipelines]


def pipeline_by_file_name(name: str) -> str | None:
    """The vLLM-Omni pipeline a deploy file's name says it is for: vLLM-Omni names its
    bundled deploy files by pipeline (``PipelineConfig.default_deploy_config_name``:
    ``qwen3_omni_moe.yaml``) and their variants ``<pipeline>_<variant>.yaml``
    (``qwen3_omni_moe_mori_intranode.yaml``). The longest registry key that is the name
    or its prefix before ``_``; None when none is."""
    stem = Path(name).stem
    hits = [k for k in UPSTREAM_PIPELINES if stem == k or stem.startswith(k + "_")]
    return max(hits, key=len) if hits else None


# ---- why a key has no equivalent -------------------------------------------------

NO_EQUIVALENT: dict[str, str] = {
    "worker_cls": "vLLM-Omni's worker class; an omni-edge stage kind brings its own runner",
    "scheduler_cls": "vLLM-Omni's scheduler class; the engine's own scheduler runs each stage",
    "custom_process_input_func": "Python code that turns the previous stage's output into this stage's input; "
    "edges here carry typed payloads (docs/pipelines.md) and no user code runs between stages",
    "custom_process_next_stage_input_func": "Python code run between stages; edges here carry typed payloads and no user code",
    "trust_remote_code": "omni-edge never runs a checkpoint's own Python code",
    "gpu_memory_utilization": "omni-edge computes each stage's budget from its reservations (weights, KV cache, "
    "activations) and sets the engine's fraction itself (the plan's engine_kwargs)",
    "distributed_executor_backend": "each device is one Ray actor process; there is no executor to choose",
    "tensor_parallel_size": "a stage is placed on one device; tensor parallelism is not planned",
    "pipeline_parallel_size": "a stage is placed on one device; pipeline parallelism is not planned",
    "data_parallel_size": "an engine's own data parallelism is not planned; a stage's instances are its "
    "replicas (docs/pipelines.md#replicas), which vLLM-Omni's num_replicas maps to",
    "engine_output_type": "what a stage yields is its kind's payload types (docs/pipelines.md), from the topology",
    "hf_config_name": "the sub-config a stage reads (thinker_config, talker_config) follows its model_stage here",
    "model_arch": "used to choose the topology; the stage's architecture is read from the checkpoint's config.json",
    "is_comprehension": "the stage that takes the request is the one whose inputs name 'request'",
    "process": "every device is already its own Ray actor process",
    "output_connectors": "transport between stages (mooncake, shared memory): payloads travel as Ray objects here",
    "input_connectors": "transport between stages: payloads travel as Ray objects here",
    "connectors": "transport between stages: payloads travel as Ray objects here",
    "detokenize": "an ar_decode stage always yields text",
    "stop_token_ids": "ar_decode's sampling has no per-stage stop tokens; the model's own end-of-sequence ends a reply",
    "async_chunk": "stages always stream their items to the next one as they come",
    "active_stream_window": "stages stream with bounded queues; there is no window to set",
    "window_size": "stages stream with bounded queues; there is no window to set",
    "max_inflight": "a stage takes up to max_num_seqs requests at once",
    "enable_chunked_prefill": "the engine's prefill chunk is max_num_batched_tokens",
    "quantization": "the weight format is read from the checkpoint itself",
    "custom_voice_dir": "the talker's voices are not configurable here",
    "edges": "what feeds what comes from the topology and each stage's inputs",
    "enabled": "a pipeline config always runs its stages",
    "defaults": "per-edge streaming windows do not exist here",
}
NO_EQUIVALENT.update(
    {
        "session_mode": "vLLM-Omni's full-duplex sessions (a realtime conversation kept open); omni-edge serves "
        "requests, one reply each",
        "duplex_session": "the lifetimes and buffers of full-duplex sessions, which omni-edge does not have",
        "enable_prefix_caching": "prefix caching is always off here",
        "async_scheduling": "vLLM's asynchronous scheduler switch; omni-edge leaves the engine's default",
        "mm_processor_cache_gb": "the multimodal processor's cache; the thinker here takes text",
        "enable_flashinfer_autotune": "a CUDA kernel autotuning switch; omni-edge leaves the engine's default",
        "env": "environment variables for the stage's process; a device's Ray actor has the orchestrator's",
        "subtalker_sampling_params": "the code predictor's sampling; the talker's runner samples as the model's "
        "own generate() does",
    }
)
DEFAULT_WHY = "no equivalent in omni-edge; this importer does not know the key"
CONNECTOR_WHY = "transport between stages: payloads travel as Ray objects here"
PLATFORM_WHY = {
    "musa": "overrides for Moore Threads (MUSA) GPUs: not applied; omni-edge has no MUSA backend",
}
"""Why a platform's overrides are not applied, where there is more to say than for any platform."""

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "seed", "repetition_penalty")
ENGINE_KEYS = {
    "max_num_batched_tokens": "max_num_batched_tokens",
    "enforce_eager": "enforce_eager",
    "max_model_len": "max_model_len",
    "max_num_seqs": "max_num_seqs",
    "dtype": "dtype",
}
DTYPES = ("auto", "bfloat16", "float16", "float32")
