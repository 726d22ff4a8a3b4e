"""transformers as a decode engine (``transformers-cuda``, ``transformers-cpu``): what vLLM cannot run here.

vLLM runs a decoder-only text model; it cannot hand an Omni thinker's hidden states on, nor run
the talker that reads them. transformers' own ``generate()`` runs both
(``stages.ar_decode.engines.transformers_runner``), and any plain causal LM, on unquantized
weights. Planning charges its weights (a sub-model's own), the KV cache its DynamicCache grows
to (the same arithmetic as vLLM's), one prefill of the whole prompt (``generate()`` does not
chunk it), the interpreter and the load; on CUDA the host process. A GGUF is converted once
before the run (``prepare``), as for vLLM; on the CPU the engine runs on torch's intra-op pool,
shared with every torch engine in its actor (``cpu_thread_pool``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from orchestrator.core.documents import JsonObject
from orchestrator.core.ledger import Reservation
from orchestrator.core.plan import Refusal
from orchestrator.core.units import MiB
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
from stages.ar_decode.engines.transformers_runner import TransformersRunner
from stages.ar_decode.formats import FormatRule
from stages.ar_decode.kv import KV_BLOCK_TYPES, KVBudget
from stages.base import ArtifactInfo, StageConfig

if TYPE_CHECKING:
    from orchestrator.core.plan import StagePlan
    from orchestrator.core.profile import Device

RUNTIME_BYTES = {"transformers-cuda": 512 * MiB, "transformers-cpu": 768 * MiB}
"""Backend workspace on the device's pool. On the CPU: 446 MiB of RSS after importing torch,
transformers and the Omni model classes in a fresh interpreter on the project's 2-core machine,
with generate()'s buffers and the allocator's slack on top; on CUDA the same context and cuBLAS
figure as vLLM's."""

TRANSFORMERS_FORMATS: tuple[FormatRule, ...] = (
    # transformers' own modules (stages.ar_decode.engines.transformers_runner): unquantized weights only; the
    # quantized formats need kernels (autoawq, gptq, bitsandbytes, fp8) omni-edge does not install
    *(
        FormatRule(b, f, True, f"{f} runs through torch's own kernels")
        for b in ("transformers-cpu", "transformers-cuda")
        for f in ("fp32", "bf16", "fp16")
    ),
    *(
        FormatRule(
            b,
            f,
            False,
            "the transformers backend here runs unquantized weights (fp32, bf16, fp16) only: "
            f"{f} needs quantization kernels omni-edge does not install",
        )
        for b in ("transformers-cpu", "transformers-cuda")
        for f in (
            "int8",
            "fp8",
            "awq-4bit",
            "gptq-4bit",
            "gptq-8bit",
            "bnb-4bit",
            "bnb-8bit",
            "gguf",
        )
    ),
)


class TransformersEngine(CheckpointEngine):
    """transformers (see the module docstring)."""

    name = "transformers"
    unserved_sampling: ClassVar[dict[str, str]] = {
        key: "leave it out, or list llamacpp-cpu or a vllm backend first in the stage's backends"
        for key in ("stop", "presence_penalty", "frequency_penalty", "json_schema")
    } | {
        "tool_call": "leave tools out, or list llamacpp-cpu or a vllm backend first in the "
        "stage's backends: a call's arguments are constrained there (a grammar)",
        "logprobs": "leave logprobs out, or list llamacpp-cpu or a vllm backend first in the "
        "stage's backends: log-probabilities are returned there",
    }
    format_rules = TRANSFORMERS_FORMATS

    def check(
        self, stage: ArDecodeConfig, info: ArtifactInfo, device: Device, backend: str
    ) -> list[Refusal]:
        """A cache type it lacks; else a weight format it does not run."""
        if stage.kv_cache_dtype in KV_BLOCK_TYPES:
            return [kv_block_refusal(stage, device, backend)]
        return format_refusals(self, stage, info, device, backend)

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
        """What a transformers stage holds: its weights (a sub-model's own), the KV cache
        transformers' DynamicCache grows to (the same arithmetic as vLLM's), one prefill pass of
        the whole prompt (generate() does not chunk it), the interpreter, and the load."""
        length = max_model_len or stage.max_model_len
        talker = stage.model_stage == "talker"
        rs = [
            weights_reservation(info, pool),
            kv_reservation(
                pool,
                kv,
                f"{kv.bytes_per_token} B/token × {kv.max_model_len} tokens × {kv.max_num_seqs} seq "
                "(transformers' DynamicCache grows to it)",
            ),
            _activations(stage, info, pool, length),
            workspace_reservation(
                pool,
                RUNTIME_BYTES[backend],
                "interpreter with torch + transformers"
                if self.on_cpu(backend)
                else "CUDA context and cuBLAS scratch",
            ),
            Reservation(
                pool,
                "load_transient",
                info.weight_bytes if talker else shard_transient(info),
                "load",
                "E",
                "the talker module is built, then its tensors are read: two copies until the load ends"
                if talker
                else "freed once the weights are resident; one shard copied at a time",
            ),
        ]
        if not self.on_cpu(backend):
            rs.append(
                host_process_reservation(
                    "the stage's host process: Python, torch, the CUDA runtime"
                )
            )
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
        return {
            "model": info.path,
            "dtype": effective_dtype(stage, info),
            "max_model_len": stage.max_model_len,
            "max_num_seqs": stage.max_num_seqs,
            "model_stage": stage.model_stage,
            "torch_device": "cpu"
            if self.on_cpu(backend)
            else f"cuda:{device.local_id.split(':')[1]}",
        }

    def actor_env(self, stage_plan: StagePlan) -> dict[str, str]:
        """Quiet (its threads are set with torch.set_num_threads when it loads)."""
        return dict(QUIET_ENV)

    def runner(self, stage_plan: StagePlan, stage: StageConfig) -> TransformersRunner:
        return TransformersRunner(stage_plan, stage)


def _activations(stage: ArDecodeConfig, info: ArtifactInfo, pool: str, length: int) -> Reservation:
    """transformers' ``generate()`` prefills the whole prompt in one pass: the live [tokens,
    hidden] tensors of ``length`` tokens and the logits its head computes."""
    tcfg = info.internal["text_config"]
    act_bytes = 4 if effective_dtype(stage, info) == "float32" else 2
    hidden, vocab = int(tcfg.get("hidden_size") or 0), int(tcfg.get("vocab_size") or 0)
    omni_stage = stage.model_stage in MODEL_STAGE_PORTS
    # The Omni models' forward runs their head over every prompt position (no logits_to_keep);
    # a plain causal LM keeps the last position's only.
    logits = (length if omni_stage else 1) * vocab * act_bytes * stage.max_num_seqs
    return Reservation(
        pool,
        "activations",
        length * hidden * act_bytes * ACTIVATION_LIVE_TENSORS + logits,
        "request",
        "E",
        f"a {length}-token prefill in one pass × {ACTIVATION_LIVE_TENSORS} live [tokens, hidden] tensors + "
        + (f"logits over all {length} positions" if omni_stage else "the last position's logits"),
    )


ENGINE = TransformersEngine()
