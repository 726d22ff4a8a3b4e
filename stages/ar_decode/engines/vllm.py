"""vLLM as a decode engine (``vllm-cuda``, ``vllm-cpu``): a decoder-only text model, in the device actor.

Planning charges what vLLM holds: its weights, the KV cache it allocates after the load
(``kv_cache_memory_bytes``: the plan's own figure), one prefill chunk's activations and the
sampler's logits, the engine's workspace and the load; on CUDA the graph pool (unless eager)
and the host process. It refuses what it cannot run here: an Omni sub-model (it yields text
only), a weight format its kernels lack, a layer layout it rejects. Before the run a GGUF is
converted once into a cached checkpoint (``prepare``); the actor runs the engine in its own
process with the plan's threads as OpenMP's (``actor_env``), and the runner
(``stages.ar_decode.engines.vllm_runner``) imports vLLM only there. A request's
``response_format`` and ``tools`` decode under the grammar llama.cpp's would
(``check_sampling``), through vLLM's structured outputs; its ``logprobs`` are vLLM's own.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import BadRequest, RefusalCode
from orchestrator.core.ledger import Reservation, holder_peak
from orchestrator.core.plan import Refusal
from orchestrator.core.units import GiB, MiB, fmt_bytes
from stages.ar_decode.config import MODEL_STAGE_PORTS, ArDecodeConfig
from stages.ar_decode.engines.base import (
    ACTIVATION_LIVE_TENSORS,
    QUIET_ENV,
    CheckpointEngine,
    effective_dtype,
    format_refusals,
    host_process_reservation,
    kv_block_refusal,
    kv_reservation,
    shard_transient,
    weights_reservation,
    workspace_reservation,
)
from stages.ar_decode.engines.vllm_runner import CPU_ENGINE_ENV, VllmRunner
from stages.ar_decode.formats import FormatRule
from stages.ar_decode.kv import KV_BLOCK_TYPES, KVBudget, layer_kinds
from stages.ar_decode.tool_grammar import decode_grammar
from stages.base import ArtifactInfo, StageConfig

if TYPE_CHECKING:
    from orchestrator.core.plan import StagePlan
    from orchestrator.core.profile import Device
    from stages.requests import Sampling

LOGITS_BYTES_PER_VOCAB = 4
"""vLLM's sampler holds logits in fp32, one row per sequence (only the last position
of each sequence is gathered before sampling)."""
RUNTIME_BYTES = {"vllm-cuda": 512 * MiB, "vllm-cpu": 1 * GiB}
"""Backend workspace on the device's pool. CUDA: context, cuBLAS and attention
scratch. CPU: the interpreter with torch and vLLM imported plus the engine's own
buffers, which live in host RAM next to the weights (docs/runtime.md, "The decode
stage on vLLM": 1.42 GiB of RSS after start for SmolLM2-135M, whose weights are
0.25 GiB and KV cache 0.25 GiB)."""
GRAPH_CAPTURE_BYTES = 2 * GiB
"""CUDA graph pool when enforce_eager is false; conservative for small models."""

VLLM_FORMATS: tuple[FormatRule, ...] = (
    # vLLM, CUDA
    FormatRule("vllm-cuda", "bf16", True, "bf16 GEMMs need Ampere or newer", min_cc=8.0),
    FormatRule("vllm-cuda", "fp16", True, "fp16 GEMMs run on every supported GPU"),
    FormatRule("vllm-cuda", "fp32", True, "fp32 runs everywhere (slowly)"),
    FormatRule(
        "vllm-cuda",
        "fp8",
        True,
        "fp8 weights use fp8 tensor cores (Ada, cc 8.9) or the Marlin fallback from Ampere",
        min_cc=8.0,
    ),
    FormatRule(
        "vllm-cuda",
        "int8",
        True,
        "w8a8 int8 goes through cutlass scaled_mm, which has int8 kernels up to Hopper (cc 9.0); "
        "the c3x kernels for cc >= 10.0 (Blackwell) have no int8 scaled_mm, so the first forward raises",
        min_cc=7.5,
        max_cc=10.0,
    ),
    FormatRule(
        "vllm-cuda",
        "awq-4bit",
        True,
        "AWQ runs through the Marlin/AWQ kernels from Turing (cc 7.5)",
        min_cc=7.5,
    ),
    FormatRule(
        "vllm-cuda",
        "gptq-4bit",
        True,
        "GPTQ runs through the Marlin/exllama kernels from Turing (cc 7.5)",
        min_cc=7.5,
    ),
    FormatRule(
        "vllm-cuda",
        "gptq-8bit",
        True,
        "GPTQ 8-bit runs through Marlin from Turing (cc 7.5)",
        min_cc=7.5,
    ),
    FormatRule(
        "vllm-cuda", "bnb-4bit", True, "bitsandbytes 4-bit is supported on CUDA", min_cc=7.0
    ),
    FormatRule("vllm-cuda", "gguf", True, "vLLM loads GGUF checkpoints (experimental)", min_cc=6.0),
    # vLLM, CPU
    FormatRule(
        "vllm-cpu",
        "bf16",
        True,
        "bf16 runs on the CPU backend (native with AVX512-BF16/AMX, emulated on AVX2)",
    ),
    FormatRule("vllm-cpu", "fp32", True, "fp32 runs on the CPU backend"),
    FormatRule(
        "vllm-cpu",
        "fp16",
        True,
        "fp16 checkpoints are run by the CPU backend (computed in a wider type)",
    ),
    FormatRule(
        "vllm-cpu", "int8", True, "w8a8 int8 runs through oneDNN int8 GEMMs on the CPU backend"
    ),
    FormatRule(
        "vllm-cpu",
        "awq-4bit",
        True,
        "AWQ 4-bit runs on the CPU backend through its dequantizing kernels",
    ),
    FormatRule(
        "vllm-cpu",
        "gptq-4bit",
        True,
        "GPTQ 4-bit runs on the CPU backend through its dequantizing kernels",
    ),
    FormatRule(
        "vllm-cpu",
        "fp8",
        False,
        "the CPU backend has no fp8 weight GEMMs (fp8 is accepted for the KV cache only)",
    ),
    FormatRule("vllm-cpu", "bnb-4bit", False, "bitsandbytes quantization is CUDA-only in vLLM"),
    FormatRule("vllm-cpu", "bnb-8bit", False, "bitsandbytes quantization is CUDA-only in vLLM"),
    FormatRule(
        "vllm-cpu",
        "gguf",
        False,
        "GGUF loading is not supported by the CPU backend; materialize the GGUF as safetensors",
    ),
)

ARCHITECTURE_RULES: tuple[tuple[frozenset[str], str], ...] = (
    (
        frozenset({"qwen2", "qwen3", "qwen2_moe", "qwen3_moe"}),
        "vLLM rejects Qwen2/Qwen3 models whose layers mix sliding-window and full attention "
        "('Sliding window for some but all layers is not supported')",
    ),
)


def architecture_refusal(text_config: dict[str, Any], layer_kinds: list[str]) -> str | None:
    """None when vLLM accepts this layer layout, else why not (any device)."""
    model_type = str(text_config.get("model_type", ""))
    mixed = "sliding_attention" in layer_kinds and "full_attention" in layer_kinds
    for types, reason in ARCHITECTURE_RULES:
        if model_type in types and mixed:
            return reason
    return None


class VllmEngine(CheckpointEngine):
    """vLLM (see the module docstring)."""

    name = "vllm"
    default_for = ("gguf", "checkpoint")
    format_rules = VLLM_FORMATS

    def check(
        self, stage: ArDecodeConfig, info: ArtifactInfo, device: Device, backend: str
    ) -> list[Refusal]:
        """An Omni sub-model, a cache type it lacks; else the weight format's and the layout's."""
        if stage.model_stage in MODEL_STAGE_PORTS:
            return [_model_stage_refusal(stage, device, backend)]
        if stage.kv_cache_dtype in KV_BLOCK_TYPES:
            return [kv_block_refusal(stage, device, backend)]
        out = format_refusals(self, stage, info, device, backend)
        tcfg = info.internal["text_config"]
        arch = architecture_refusal(tcfg, layer_kinds(tcfg))
        if arch:
            out.append(
                Refusal(
                    RefusalCode.MODEL_ARCHITECTURE_UNSUPPORTED,
                    device.id,
                    f"{tcfg.get('model_type')} with mixed sliding/full attention layers: {arch}",
                    "use a build with uniform attention (use_sliding_window: false), or a model family vLLM accepts with mixed layers (Llama, Gemma 3)",
                )
            )
        return out

    def check_sampling(self, sampling: Sampling, backend: str) -> str | None:
        """The grammar of the request's tools or ``json_schema`` — the one llama.cpp decodes
        under (``tool_grammar.decode_grammar``: a keyword it would not enforce is refused by
        name), handed to vLLM's structured outputs — else None. ``logprobs`` are vLLM's own.
        The grammar is written by llama-cpp-python's schema converter: without it installed, a
        request that needs one is refused naming its key, never decoded unconstrained."""
        super().check_sampling(sampling, backend)
        try:
            return decode_grammar(sampling)
        except ImportError as exc:
            key = "tool_call" if sampling.get("tool_call") is not None else "json_schema"
            raise BadRequest.single(
                f"request.sampling.{key}",
                f"the stage's backend {backend} constrains it with a grammar written by "
                f"llama-cpp-python's JSON-schema converter, which does not import here ({exc})",
                "install llama-cpp-python (docs/llamacpp.md), or leave "
                f"{'tools' if key == 'tool_call' else 'response_format'} out",
            ) from None

    def reservations(
        self,
        stage: ArDecodeConfig,
        info: ArtifactInfo,
        kv: KVBudget,
        device: Device,
        backend: str,
        pool: str,
        max_model_len: int | None,
    ) -> list[Reservation]:
        """What a vLLM stage holds: its weights, the KV cache it allocates after the load, one
        prefill chunk's activations and the sampler's logits, the engine's workspace and the load;
        on CUDA the graph pool (unless eager) and the host process."""
        tcfg = info.internal["text_config"]
        act_bytes = 4 if effective_dtype(stage, info) == "float32" else 2
        hidden = int(tcfg.get("hidden_size") or 0)
        vocab = int(tcfg.get("vocab_size") or 0)
        batched = min(stage.batched_tokens, max_model_len or stage.max_model_len)
        rs = [
            weights_reservation(info, pool),
            kv_reservation(
                pool,
                kv,
                f"{kv.bytes_per_token} B/token × {kv.max_model_len} tokens × {kv.max_num_seqs} seq"
                + (
                    f"; {kv.sliding_window_layers} sliding layers held to {kv.sliding_window} tokens (flat: {fmt_bytes(kv.bytes_total_flat)})"
                    if kv.sliding_window_layers
                    else ""
                ),
            ),
            Reservation(
                pool,
                "activations",
                batched * hidden * act_bytes * ACTIVATION_LIVE_TENSORS
                + stage.max_num_seqs * vocab * LOGITS_BYTES_PER_VOCAB,
                "request",
                "E",
                f"{batched}-token prefill chunk × {ACTIVATION_LIVE_TENSORS} live [tokens, hidden] tensors + fp32 logits",
            ),
            workspace_reservation(
                pool,
                RUNTIME_BYTES[backend],
                "interpreter with torch + vLLM and the engine's buffers"
                if self.on_cpu(backend)
                else "CUDA context, cuBLAS and attention scratch",
            ),
            Reservation(
                pool,
                "load_transient",
                shard_transient(info),
                "load",
                "E",
                "freed once the weights are resident; one shard copied at a time",
            ),
        ]
        if not self.on_cpu(backend):
            rs.extend(_cuda_reservations(stage, pool))
        return rs

    def engine_kwargs(
        self,
        stage: ArDecodeConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        reservations: list[Reservation],
        pool_capacity: int,
    ) -> JsonObject:
        budget = holder_peak(reservations, reservations[0].pool)
        kv = next(r.bytes for r in reservations if r.purpose == "kv_cache")
        # The flag is named for the GPU and is not GPU-only: on the CPU backend vLLM
        # reads it as the fraction of host RAM. The plan's own budget sets it on both.
        total = device.memory_bytes if device.memory_bytes else pool_capacity
        kwargs: dict[str, Any] = {
            "model": info.path,
            "dtype": effective_dtype(stage, info),
            "max_model_len": stage.max_model_len,
            "max_num_seqs": stage.max_num_seqs,
            "max_num_batched_tokens": stage.batched_tokens,
            "enforce_eager": stage.enforce_eager,
            "enable_prefix_caching": False,
            "kv_cache_memory_bytes": kv,
            "gpu_memory_utilization": min(0.95, math.ceil(budget / max(total, 1) * 100) / 100),
        }
        if stage.kv_cache_dtype != "auto":
            kwargs["kv_cache_dtype"] = stage.kv_cache_dtype
        return kwargs

    def actor_env(self, stage_plan: StagePlan) -> dict[str, str]:
        """vLLM in the actor's own process, with the plan's CPU threads as OpenMP's
        (``OMP_NUM_THREADS``, read once when torch loads; none planned: OpenMP's own
        default), and quiet."""
        env = {**CPU_ENGINE_ENV, **QUIET_ENV}
        if self.on_cpu(stage_plan.backend or "") and stage_plan.cpu_threads is not None:
            env["OMP_NUM_THREADS"] = str(stage_plan.cpu_threads)
        return env

    def runner(self, stage_plan: StagePlan, stage: StageConfig) -> VllmRunner:
        return VllmRunner(stage_plan, stage)


def _model_stage_refusal(stage: ArDecodeConfig, device: Device, backend: str) -> Refusal:
    """vLLM here yields text only: it can run neither Omni sub-model (``MODEL_STAGE_PORTS``)."""
    what = (
        (
            "yields a thinker's text only, not the hidden states its hidden_states port declares (a talker "
            "reading them would get none)"
        )
        if stage.model_stage == "thinker"
        else (
            "runs no Omni talker: it cannot take the thinker's hidden states or yield codec codes"
        )
    )
    return Refusal(
        RefusalCode.MODEL_STAGE_UNSUPPORTED,
        device.id,
        f"model_stage {stage.model_stage}: {backend} {what}",
        f"run it on transformers: list {'transformers-cuda' if backend == 'vllm-cuda' else 'transformers-cpu'} in "
        f"stages.{stage.name}.backends, or leave backends out so the planner tries it next"
        + (
            "; for the thinker's text alone on vLLM, drop model_stage"
            if stage.model_stage == "thinker"
            else ""
        ),
    )


def _cuda_reservations(stage: ArDecodeConfig, pool: str) -> list[Reservation]:
    """vLLM on CUDA also holds the graph pool (unless eager) and a host process in host RAM."""
    out = []
    if not stage.enforce_eager:
        out.append(
            Reservation(
                pool,
                "graph_capture",
                GRAPH_CAPTURE_BYTES,
                "session",
                "E",
                "CUDA graph pool (enforce_eager: false)",
                at_load=False,
            )
        )
    out.append(
        host_process_reservation(
            "the engine's host process: Python, torch, CUDA runtime, pinned buffers"
        )
    )
    return out


ENGINE = VllmEngine()
