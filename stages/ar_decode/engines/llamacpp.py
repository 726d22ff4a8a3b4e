"""llama.cpp as a decode engine (``llamacpp-cpu``, ``llamacpp-vulkan``: llama-cpp-python).

Which stages it refuses, what it holds on the pool, and what its runner
(``stages.ar_decode.engines.llamacpp_runner``) is handed. llama.cpp loads a GGUF as it is
(nothing is prepared before the run) and allocates its cache and compute buffers when the
context is created; the constants below size them, each fitted to what llama-cpp-python
prints at load. A request is counted with the GGUF's own vocabulary and chat template
(``stages.ar_decode.gguf_vocab``: no weights read). The CPU build was made for this CPU's
instructions (the probe's verdict on the route's recorded build:
``orchestrator.probe.engines``); its threads are the context's own (``n_threads``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import RefusalCode
from orchestrator.core.ledger import Evidence, Reservation
from orchestrator.core.plan import Refusal
from orchestrator.core.units import MiB
from stages.ar_decode.config import ArDecodeConfig
from stages.ar_decode.engines.base import NO_TELEMETRY_ENV, DecodeEngine, workspace_reservation
from stages.ar_decode.engines.llamacpp_runner import LlamaCppRunner
from stages.ar_decode.engines.llamacpp_turn import LlamaCppTurnScorer
from stages.ar_decode.formats import FormatRule
from stages.ar_decode.gguf_vocab import gguf_path, gguf_vocab
from stages.ar_decode.kv import KVBudget
from stages.ar_decode.tool_grammar import decode_grammar
from stages.base import ArtifactInfo, StageConfig

if TYPE_CHECKING:
    from orchestrator.core.plan import StagePlan
    from orchestrator.core.profile import Device
    from stages.requests import Sampling

log = logging.getLogger(__name__)


LLAMACPP_UBATCH_MAX = 512
"""llama.cpp's default physical batch (``n_ubatch``): the prefill chunk ``n_batch`` is split into
pieces of at most this many tokens, and the compute buffer is sized for one piece."""
LLAMACPP_LOGITS_EMBD_ROWS = 2
"""[n_ubatch, n_embd] fp32 rows llama.cpp's CPU compute buffer holds beside the logits of a whole
physical batch ([n_ubatch, n_vocab] fp32) at the graph's output end. Fitted to what llama-cpp-python
0.3.36 prints at load ("sched_reserve: CPU compute buffer size") for SmolLM2-135M's Q4_1 GGUF
(n_vocab 49152, n_embd 576, 9 heads), n_threads 1, f16 cache, flash attention off, on the
project's 2-core Xeon: n_ubatch 512 → 98.25 MiB at n_ctx 512 and 99.38 MiB at n_ctx 2048 and
4096; 256 → 49.13 MiB (n_ctx 512); 128 → 24.84 MiB (n_ctx 2048); 64 → 12.42 MiB (n_ctx 4096);
32 → 6.14 MiB (n_ctx 512). 512 × (49152 + 2 × 576) × 4 B is exactly 98.25 MiB."""
LLAMACPP_FLASH_EMBD_ROWS = 6
"""The same rows with flash attention on (the q8_0 cache needs it): 1024-cell q8_0 caches measured
102.67 MiB at n_ubatch 512, 51.35 MiB at 256, 24.84 MiB at 128; 99.38 MiB at n_ctx 2048 to 8192
(n_ubatch 512) and 12.42 MiB at n_ubatch 64, n_ctx 8192. 512 × (49152 + 6 × 576) × 4 B = 102.75 MiB."""
LLAMACPP_ATTENTION_EMBD_ROWS = 6
"""Without flash attention the other end of the graph can be the wider one: the attention scores
of one layer, [n_ctx, n_ubatch, n_head] fp32, and the mask beside them ([n_ctx, n_ubatch], one
more head's worth), plus this many [n_ubatch, n_embd] fp32 rows (q, k, v, the attention output,
the residual). Fitted to n_ctx 8192: 166.38 MiB at n_ubatch 512, 20.80 MiB at 64 (the formula:
166.75 and 20.84)."""
LLAMACPP_COMPUTE_OVERHEAD_BYTES = int(1.5 * MiB)
"""Above the larger of the two ends: the 1.13 MiB n_ubatch 512 grew by from n_ctx 512 to
2048 (the graph's inputs and node metadata), with room: the estimate is then 0.4-16 % above every
point measured (24 % at n_ubatch 32, where the whole buffer is 6 MiB), never below."""
LLAMACPP_RUNTIME_BYTES = 64 * MiB
"""The interpreter with llama_cpp (libllama, libggml, OpenMP) imported and its backend started:
44.3 MiB of RSS in a fresh ``python -c 'import llama_cpp; llama_cpp.llama_backend_init()'`` on
the project's 2-core machine (13.3 MiB for the bare interpreter), with room for the runner's own
objects and the OpenMP threads' stacks."""


def llamacpp_compute_bytes(
    n_ubatch: int, n_ctx: int, n_vocab: int, n_embd: int, n_head: int, *, flash_attn: bool
) -> int:
    """llama.cpp's CPU compute buffer for one physical batch of ``n_ubatch`` tokens: the wider end
    of its graph — the logits of every token of the batch plus a few [n_ubatch, n_embd] rows, or
    (without flash attention) one layer's attention scores over ``n_ctx`` cells — and the
    overhead (constants above, fitted to what llama.cpp prints at load)."""
    rows = LLAMACPP_FLASH_EMBD_ROWS if flash_attn else LLAMACPP_LOGITS_EMBD_ROWS
    logits = n_ubatch * (n_vocab + rows * n_embd) * 4
    scores = (
        0
        if flash_attn
        else n_ubatch * (n_ctx * (n_head + 1) + LLAMACPP_ATTENTION_EMBD_ROWS * n_embd) * 4
    )
    return max(logits, scores) + LLAMACPP_COMPUTE_OVERHEAD_BYTES


LLAMACPP_CELL_PAD = 256
"""llama.cpp gives each sequence its own cache of ``n_ctx / n_seq_max`` cells rounded up to a
multiple of this (the runner keeps sequences apart: ``kv_unified`` off), and raises ``n_ctx`` to
match: llama-cpp-python 0.3.36 on SmolLM2 made n_ctx 1000 → 1024 cells, 1000 over 2 sequences →
2 × 512, 300 over 3 → 3 × 256 (``llama_n_ctx_seq``)."""


def llamacpp_cells_per_seq(max_model_len: int) -> int:
    """The cache cells llama.cpp gives each sequence for ``max_model_len`` tokens (``LLAMACPP_CELL_PAD``)."""
    return -(-max_model_len // LLAMACPP_CELL_PAD) * LLAMACPP_CELL_PAD


LLAMACPP_KV_TYPES = {"auto": "f16", "float16": "f16", "q8_0": "q8_0"}
"""``kv_cache_dtype`` → llama.cpp's ``type_k``/``type_v``: auto is f16 (llama.cpp's default cache type)."""


def flash_attn(stage: ArDecodeConfig) -> bool:
    """Flash attention on for a q8_0 cache only: llama.cpp refuses a quantized V cache without it
    ("quantized V cache requires flash_attn to be enabled", llama-cpp-python 0.3.36); off otherwise."""
    return LLAMACPP_KV_TYPES.get(stage.kv_cache_dtype) == "q8_0"


LLAMACPP_FORMATS: tuple[FormatRule, ...] = (
    # llama.cpp (llama-cpp-python): GGUF files as they are, every quant type the file holds; nothing else
    *(
        FormatRule(
            b, "gguf", True, "llama.cpp loads the GGUF as it is (every ggml quant type it holds)"
        )
        for b in ("llamacpp-cpu", "llamacpp-vulkan")
    ),
    *(
        FormatRule(b, f, False, "llama.cpp loads GGUF files only")
        for b in ("llamacpp-cpu", "llamacpp-vulkan")
        for f in (
            "bf16",
            "fp16",
            "fp32",
            "int8",
            "fp8",
            "awq-4bit",
            "gptq-4bit",
            "gptq-8bit",
            "bnb-4bit",
            "bnb-8bit",
        )
    ),
)


class LlamaCppEngine(DecodeEngine):
    """llama.cpp (see the module docstring)."""

    name = "llamacpp"
    default_for = ("gguf",)
    format_rules = LLAMACPP_FORMATS

    def check_sampling(self, sampling: Sampling, backend: str) -> str | None:
        """The grammar of the request's tools or ``json_schema`` (``tool_grammar.decode_grammar``:
        a keyword it would not enforce is refused by name), else None."""
        super().check_sampling(sampling, backend)
        return decode_grammar(sampling)

    def kv_layout(self, stage: ArDecodeConfig, info: ArtifactInfo, length: int) -> tuple[int, str]:
        """``(cells per sequence, dtype)`` of llama.cpp's KV cache for ``length`` tokens: auto is
        f16, q8_0 ggml's 34-byte blocks of 32 values."""
        dtype = "q8_0" if LLAMACPP_KV_TYPES.get(stage.kv_cache_dtype) == "q8_0" else "float16"
        return llamacpp_cells_per_seq(length), dtype

    def check(
        self, stage: ArDecodeConfig, info: ArtifactInfo, device: Device, backend: str
    ) -> list[Refusal]:
        """Why llama.cpp cannot run this stage on ``device``: an Omni sub-model, a model that is not
        a GGUF file, a cache type it does not hold here."""
        if stage.model_stage:
            return [
                Refusal(
                    RefusalCode.MODEL_STAGE_UNSUPPORTED,
                    device.id,
                    f"model_stage {stage.model_stage}: {backend} runs a plain decoder's text, not an Omni sub-model",
                    f"list {'transformers-cpu' if device.kind == 'cpu' else 'transformers-cuda'} in stages.{stage.name}.backends, "
                    "or leave backends out so the planner tries it next",
                )
            ]
        weight_format = "gguf" if info.kind == "gguf" else info.weight_format
        reason = self.format_refusal(backend, device, weight_format)
        if reason:
            return [
                Refusal(
                    RefusalCode.WEIGHT_FORMAT_UNSUPPORTED,
                    device.id,
                    f"the checkpoint is {weight_format} ({info.path}) and {backend} cannot run it: {reason}",
                    f"point stages.{stage.name}.model at a GGUF build of this model (a .gguf file), or list vllm-cpu "
                    f"(vllm-cuda on an NVIDIA GPU) in stages.{stage.name}.backends to run this checkpoint",
                )
            ]
        if stage.kv_cache_dtype not in LLAMACPP_KV_TYPES:
            return [
                Refusal(
                    RefusalCode.KV_CACHE_DTYPE_UNSUPPORTED,
                    device.id,
                    f"kv_cache_dtype {stage.kv_cache_dtype}: {backend}'s KV cache here is f16 or q8_0",
                    f"set stages.{stage.name}.kv_cache_dtype to auto (f16), float16 or q8_0, or list a vLLM backend "
                    f"in stages.{stage.name}.backends for {stage.kv_cache_dtype}",
                )
            ]
        return []

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
        """What a llama.cpp stage holds, all of it from the load on (llama.cpp allocates its cache
        and compute buffers when the context is created): the GGUF's tensors as stored, the
        KV cache of ``n_ctx`` cells in its cache type (one part per sequence), the compute buffer for one
        ``n_ubatch``, and the interpreter with libllama. On an iGPU (Vulkan) the same bytes,
        on the memory it shares with the host. ``kv``: the kind's KV budget for this backend
        (``ArDecodeKind.kv``, its cells from :meth:`kv_layout`)."""
        tcfg = info.internal["text_config"]
        length = max_model_len or stage.max_model_len
        n_batch = min(stage.batched_tokens, length)
        n_ubatch = min(LLAMACPP_UBATCH_MAX, n_batch)
        vocab, hidden = int(tcfg.get("vocab_size") or 0), int(tcfg.get("hidden_size") or 0)
        quant = info.details["manifest"].get("quantization") or {}
        stored = quant.get("gguf_tensor_bytes")
        types = ", ".join(
            f"{t} ×{n}" for t, n in sorted((quant.get("gguf_tensor_types") or {}).items())
        )
        evidence: Evidence
        if isinstance(stored, int):
            weights, evidence = stored, "D"
            what = f"the GGUF's {info.details['manifest'].get('tensor_count')} tensors as stored ({types})"
        else:  # a ggml type without a known size: the file, header included, bounds its tensors
            weights, evidence = int(quant.get("gguf_file_bytes") or info.weight_bytes), "E"
            what = f"the GGUF file's size (a tensor type without a known block size among {types})"
        cells = llamacpp_cells_per_seq(length) * stage.max_num_seqs
        heads = int(tcfg.get("num_attention_heads") or 0)
        flash = flash_attn(stage)
        compute = llamacpp_compute_bytes(n_ubatch, cells, vocab, hidden, heads, flash_attn=flash)
        output = stage.max_num_seqs * vocab * 4
        return [
            Reservation(
                pool,
                "weights",
                weights,
                "session",
                evidence,
                f"{what}; llama.cpp maps the file (mmap) and computes on the blocks as they are: charged "
                "to the pool as resident all the same, since every page is read in as the model runs",
            ),
            Reservation(
                pool,
                "kv_cache",
                kv.bytes_total,
                "session",
                "E",
                f"{kv.bytes_per_token} B/token ({kv.dtype}) × n_ctx {cells} "
                f"({llamacpp_cells_per_seq(length)} cells × {stage.max_num_seqs} seq, one cache per "
                f"sequence: {length} tokens rounded up to llama.cpp's {LLAMACPP_CELL_PAD})",
            ),
            Reservation(
                pool,
                "compute_buffer",
                compute + output,
                "session",
                "E",
                f"llama.cpp's compute buffer for n_ubatch {n_ubatch} over n_ctx {cells} (flash attention "
                f"{'on' if flash else 'off'}; fitted to what it prints at load) and its output buffer "
                f"({stage.max_num_seqs} × n_vocab {vocab} fp32 logits)",
            ),
            workspace_reservation(
                pool,
                LLAMACPP_RUNTIME_BYTES,
                "the interpreter with llama_cpp (libllama, libggml) imported",
            ),
        ]

    def engine_kwargs(
        self,
        stage: ArDecodeConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        reservations: list[Reservation],
        pool_capacity: int,
    ) -> JsonObject:
        """What a llama.cpp placement hands its runner (docs/design.md, the llama.cpp contract): the
        GGUF as it is; ``n_ctx`` the whole cache (``max_model_len`` per sequence × ``max_num_seqs``,
        each sequence's part rounded up by llama.cpp: ``LLAMACPP_CELL_PAD``), the per-sequence limit the runner enforces, the prefill chunk and its
        physical batch, the cache types, and every layer offloaded on Vulkan, none on the CPU.
        Flash attention stays off but for a q8_0 cache, which llama.cpp loads only with it."""
        n_batch = stage.batched_tokens
        cache = LLAMACPP_KV_TYPES.get(stage.kv_cache_dtype, "f16")
        flash = flash_attn(stage)
        return {
            "model": info.path,
            "n_ctx": stage.max_model_len * stage.max_num_seqs,
            "n_seq_max": stage.max_num_seqs,
            "max_model_len": stage.max_model_len,
            "n_batch": n_batch,
            "n_ubatch": min(LLAMACPP_UBATCH_MAX, n_batch),
            "type_k": cache,
            "type_v": cache,
            "n_gpu_layers": 0 if self.on_cpu(backend) else -1,
            "flash_attn": flash,
        }

    def actor_env(self, stage_plan: StagePlan) -> dict[str, str]:
        """Neither vLLM's process model nor OpenMP's threads (its threads are ``n_threads`` from
        the plan); a tokenizer's thread pool stays off, telemetry off."""
        return {"TOKENIZERS_PARALLELISM": "false", **NO_TELEMETRY_ENV}

    def runner(self, stage_plan: StagePlan, stage: StageConfig) -> LlamaCppRunner:
        return LlamaCppRunner(stage_plan, stage)

    def turn_scorer(self, stage_plan: StagePlan, stage: StageConfig) -> LlamaCppTurnScorer | None:
        """The stage's GGUF scoring a transcript's end (``llamacpp_turn``), one thread."""
        model = stage_plan.engine_kwargs.get("model")
        if not model:
            return None
        return LlamaCppTurnScorer(gguf_path(str(model)), getattr(stage, "system_prompt", None))

    def request_tokenizer(self, stage_plan: StagePlan) -> Any | None:
        """The GGUF's own vocabulary and chat template (no weights read; once per process)."""
        model = stage_plan.engine_kwargs.get("model")
        if not model:
            return None
        try:
            return gguf_vocab(str(model))
        except Exception as exc:  # no vocabulary to read: llama.cpp's own check stays
            log.debug("no GGUF vocabulary to check the request's length with: %s", exc)
            return None


ENGINE = LlamaCppEngine()
