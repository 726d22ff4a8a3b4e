"""KV-cache arithmetic from the real layer layout.

Per layer, from the model's text config:

* full attention: ``2 (K,V) × num_key_value_heads × head_dim × dtype`` bytes
  per token, held for the whole context;
* sliding-window attention: the same per token, held for at most
  ``sliding_window`` tokens (``layer_types``, or Gemma's
  ``sliding_window_pattern``, or Qwen's ``use_sliding_window`` +
  ``max_window_layers``);
* MLA (DeepSeek-style ``kv_lora_rank``): one latent of
  ``kv_lora_rank + qk_rope_head_dim`` per token (no separate K and V);
* linear attention / mamba layers: a fixed recurrent state per sequence,
  independent of the context length.

``bytes_per_token`` is the flat figure (every attention layer, per token);
``bytes_total_flat`` charges every attention layer the full context;
``bytes_total`` is the hybrid figure that holds sliding layers to their
window. All figures are exact arithmetic on the config (evidence E: the
layout is read, the allocator's block rounding is not modelled).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
}

KV_BLOCK_TYPES = {"q8_0": (32, 34)}
"""Block-quantized cache types (llama.cpp's ``type_k``/``type_v``): ``(elements per block, bytes
per block)`` — ggml's ``block_q8_0`` is 32 int8 values and one fp16 scale, 34 bytes (ggml-common.h;
gguf's ``GGML_QUANT_SIZES`` says the same). A row is rounded up to whole blocks."""

FULL = "full_attention"
SLIDING = "sliding_attention"
LINEAR = "linear_attention"
MAMBA = "mamba"


@dataclass(frozen=True)
class LayerKV:
    index: int
    kind: str
    bytes_per_token: int
    window: int | None = None
    state_bytes: int = 0
    """Fixed per-sequence state (linear attention / mamba)."""


@dataclass(frozen=True)
class KVBudget:
    bytes_per_token: int
    bytes_total: int
    bytes_total_flat: int
    full_attention_layers: int
    sliding_window_layers: int
    recurrent_layers: int
    max_model_len: int
    max_num_seqs: int
    dtype: str
    sliding_window: int | None = None
    mla: bool = False

    layers: tuple[LayerKV, ...] = field(default=(), repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("layers")
        return d

    def with_len(self, max_model_len: int) -> KVBudget:
        """The same layout at another context length."""
        return _budget(
            self.layers, max_model_len, self.max_num_seqs, self.dtype, self.sliding_window, self.mla
        )


def text_config(config: dict[str, Any], model_stage: str | None = None) -> dict[str, Any]:
    """The language model's config inside a (possibly multimodal) config.json.

    ``thinker_config.text_config`` for Qwen2.5-Omni (or ``talker_config`` when
    ``model_stage='talker'``), ``text_config`` for Gemma 3 / Llava-style
    models, else the root.
    """
    if model_stage:
        sub = config.get(f"{model_stage}_config")
        if isinstance(sub, dict):
            return text_config(sub)
        raise KeyError(f"config has no {model_stage}_config")
    for key in ("thinker_config",):
        if isinstance(config.get(key), dict):
            return text_config(config[key])
    if isinstance(config.get("text_config"), dict):
        merged = dict(config["text_config"])
        merged.setdefault("model_type", config.get("model_type"))
        return merged
    return config


def decoder_weight_params(cfg: dict[str, Any]) -> int:
    """Parameters of a Qwen2-style decoder from its config alone (evidence E): token
    embeddings (``vocab_size × embedding_size``, else ``hidden_size``), a projection from
    ``embedding_size`` to ``hidden_size`` when they differ (Qwen2.5-Omni's talker takes the
    thinker's width), per layer q/k/v with biases, o, a gated MLP and two norms, a final
    norm and an untied output head of ``vocab_size``. For a sub-model whose tensors a
    partial index does not list; real safetensors headers are the better figure."""
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    hd = head_dim(cfg)
    inter = int(cfg.get("intermediate_size") or 4 * hidden)
    vocab = int(cfg.get("vocab_size") or 0)
    emb = int(cfg.get("embedding_size") or hidden)
    layer = (
        (hidden * heads * hd + heads * hd)
        + 2 * (hidden * kv_heads * hd + kv_heads * hd)
        + heads * hd * hidden
        + 3 * hidden * inter
        + 2 * hidden
    )
    proj = emb * hidden + hidden if emb != hidden else 0
    return vocab * emb + proj + int(cfg["num_hidden_layers"]) * layer + hidden + hidden * vocab


def head_dim(cfg: dict[str, Any]) -> int:
    if cfg.get("head_dim"):
        return int(cfg["head_dim"])
    return int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])


def layer_kinds(cfg: dict[str, Any]) -> list[str]:
    """One entry per decoder layer: full_attention, sliding_attention, linear_attention or mamba."""
    n = int(cfg["num_hidden_layers"])
    if isinstance(cfg.get("layer_types"), list) and len(cfg["layer_types"]) == n:
        out = []
        for t in cfg["layer_types"]:
            t = str(t)
            if "sliding" in t or t in ("local", "chunked_attention"):
                out.append(SLIDING)
            elif "linear" in t:
                out.append(LINEAR)
            elif "mamba" in t or t in ("ssm", "recurrent"):
                out.append(MAMBA)
            else:
                out.append(FULL)
        return out
    window = cfg.get("sliding_window")
    pattern = cfg.get("sliding_window_pattern")
    if window and isinstance(pattern, int) and pattern > 1:
        # Gemma 2/3: every pattern-th layer is global, the others local.
        return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n)]
    if window and cfg.get("use_sliding_window"):
        # Qwen2/Qwen3: layers at index >= max_window_layers use the window.
        first_sliding = int(cfg.get("max_window_layers", n))
        return [SLIDING if i >= first_sliding else FULL for i in range(n)]
    if isinstance(cfg.get("attn_type_list"), list):
        return [FULL if int(t) == 1 else LINEAR for t in cfg["attn_type_list"]]
    return [FULL] * n


def recurrent_state_bytes(cfg: dict[str, Any], kind: str, dtype_bytes: int) -> int:
    """Fixed per-sequence state of a linear-attention or mamba layer (bytes)."""
    if kind == LINEAR and cfg.get("linear_num_value_heads"):
        # Gated DeltaNet (Qwen3-Next): recurrent state [v_heads, k_dim, v_dim] plus a
        # causal-conv state of (kernel-1) × (2·key_dim + value_dim) channels.
        v_heads = int(cfg["linear_num_value_heads"])
        k_heads = int(cfg.get("linear_num_key_heads", v_heads))
        k_dim = int(cfg["linear_key_head_dim"])
        v_dim = int(cfg["linear_value_head_dim"])
        kernel = int(cfg.get("linear_conv_kernel_dim", 4))
        conv = (kernel - 1) * (2 * k_heads * k_dim + v_heads * v_dim)
        return (v_heads * k_dim * v_dim + conv) * dtype_bytes
    if kind == MAMBA or cfg.get("mamba_d_state") or cfg.get("state_size"):
        d_inner = int(cfg.get("mamba_expand", cfg.get("expand", 2))) * int(cfg["hidden_size"])
        d_state = int(cfg.get("mamba_d_state", cfg.get("state_size", 16)))
        d_conv = int(cfg.get("mamba_d_conv", cfg.get("conv_kernel", 4)))
        return (d_inner * d_state + (d_conv - 1) * d_inner) * dtype_bytes
    return 0


def row_bytes(kv_dtype: str, elements: int) -> int:
    """Bytes of one cache row of ``elements`` values in ``kv_dtype`` (whole blocks for a
    block-quantized type, :data:`KV_BLOCK_TYPES`)."""
    if kv_dtype in KV_BLOCK_TYPES:
        block, size = KV_BLOCK_TYPES[kv_dtype]
        return -(-elements // block) * size
    return elements * DTYPE_BYTES[kv_dtype]


def layers_for(cfg: dict[str, Any], kv_dtype: str) -> tuple[LayerKV, ...]:
    """One ``LayerKV`` per decoder layer for a cache of ``kv_dtype`` (a ``DTYPE_BYTES`` or
    ``KV_BLOCK_TYPES`` name): per token, a K and a V row of ``num_key_value_heads × head_dim``
    values per attention layer (MLA: one latent row)."""
    kinds = layer_kinds(cfg)
    window = cfg.get("sliding_window")
    mla = bool(cfg.get("kv_lora_rank"))
    # recurrent states are not block-quantized: a block type keeps them in fp16
    dtype_bytes = DTYPE_BYTES.get(kv_dtype, 2)
    if mla:
        per_token = row_bytes(
            kv_dtype, int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim", 0))
        )
    else:
        kv_heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
        per_token = 2 * row_bytes(kv_dtype, kv_heads * head_dim(cfg))
    out = []
    for i, kind in enumerate(kinds):
        if kind in (LINEAR, MAMBA):
            out.append(LayerKV(i, kind, 0, None, recurrent_state_bytes(cfg, kind, dtype_bytes)))
        elif kind == SLIDING:
            out.append(LayerKV(i, kind, per_token, int(window) if window else None))
        else:
            out.append(LayerKV(i, kind, per_token))
    return tuple(out)


def _budget(
    layers: tuple[LayerKV, ...],
    max_model_len: int,
    max_num_seqs: int,
    dtype: str,
    window: int | None,
    mla: bool,
) -> KVBudget:
    per_token = sum(layer.bytes_per_token for layer in layers)
    flat = per_token * max_model_len * max_num_seqs
    hybrid = 0
    for layer in layers:
        if layer.kind == SLIDING and layer.window:
            hybrid += layer.bytes_per_token * min(layer.window, max_model_len) * max_num_seqs
        else:
            hybrid += layer.bytes_per_token * max_model_len * max_num_seqs
        hybrid += layer.state_bytes * max_num_seqs
    flat += sum(layer.state_bytes for layer in layers) * max_num_seqs
    return KVBudget(
        bytes_per_token=per_token,
        bytes_total=hybrid,
        bytes_total_flat=flat,
        full_attention_layers=sum(1 for layer in layers if layer.kind == FULL),
        sliding_window_layers=sum(1 for layer in layers if layer.kind == SLIDING),
        recurrent_layers=sum(1 for layer in layers if layer.kind in (LINEAR, MAMBA)),
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        dtype=dtype,
        sliding_window=window,
        mla=mla,
        layers=layers,
    )


def kv_budget(
    config: dict[str, Any], *, max_model_len: int, max_num_seqs: int = 1, kv_dtype: str = "bfloat16"
) -> KVBudget:
    """KV (and recurrent state) bytes for ``max_model_len × max_num_seqs`` on this layout.

    ``config`` is the text config (see :func:`text_config`). ``kv_dtype`` is
    the cache dtype name (bfloat16, float16, float32, fp8..., or llama.cpp's q8_0).
    """
    if kv_dtype not in DTYPE_BYTES and kv_dtype not in KV_BLOCK_TYPES:
        raise ValueError(
            f"unknown KV cache dtype {kv_dtype!r}; use one of {', '.join([*DTYPE_BYTES, *KV_BLOCK_TYPES])}"
        )
    layers = layers_for(config, kv_dtype)
    window = (
        config.get("sliding_window") if any(layer.kind == SLIDING for layer in layers) else None
    )
    return _budget(
        layers, max_model_len, max_num_seqs, kv_dtype, window, bool(config.get("kv_lora_rank"))
    )


ROPE_TYPES_WITHOUT_EXTENSION = frozenset({"default", "mrope", "su", "longrope", "llama3"})
"""rope_scaling types whose ``max_position_embeddings`` is already the extended
length (vLLM's ``_get_and_verify_max_len`` does not multiply them by ``factor``)."""


def model_context_limit(config: dict[str, Any]) -> int | None:
    """The longest context the model can have, in tokens, as vLLM derives it:
    ``max_position_embeddings`` (a GGUF's ``<arch>.context_length``), times the
    ``rope_scaling`` factor for the scaling types that extend it (yarn from its
    ``original_max_position_embeddings``). ``None`` when the config says nothing."""
    raw = config.get("max_position_embeddings")
    if isinstance(raw, bool) or not isinstance(raw, int) or raw <= 0:
        return None
    limit = raw
    scaling = config.get("rope_scaling")
    if isinstance(scaling, dict):
        rope_type = scaling.get("rope_type") or scaling.get("type")
        factor = scaling.get("factor")
        if (
            isinstance(rope_type, str)
            and rope_type not in ROPE_TYPES_WITHOUT_EXTENSION
            and isinstance(factor, (int, float))
            and not isinstance(factor, bool)
            and factor > 1
        ):
            base = scaling.get("original_max_position_embeddings") if rope_type == "yarn" else None
            if not isinstance(base, int) or isinstance(base, bool) or base <= 0:
                base = raw
            limit = int(base * factor)
    return limit


TEXT_CONFIG_LIMITS: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, 10_000),
    "num_attention_heads": (1, 65_536),
    "hidden_size": (1, 1 << 20),
    "num_key_value_heads": (1, 65_536),
    "head_dim": (1, 1 << 16),
    "intermediate_size": (1, 1 << 24),
    "vocab_size": (1, 1 << 32),
    "max_position_embeddings": (1, 1 << 32),
    "sliding_window": (1, 1 << 32),
    "max_window_layers": (0, 10_000),
    "sliding_window_pattern": (0, 10_000),
    "kv_lora_rank": (0, 1 << 20),
    "qk_rope_head_dim": (0, 1 << 16),
    **{
        k: (0, 1 << 20)
        for k in (
            "linear_num_value_heads",
            "linear_num_key_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_conv_kernel_dim",
            "mamba_expand",
            "mamba_d_state",
            "state_size",
            "mamba_d_conv",
            "conv_kernel",
        )
    },
}
"""The numbers the KV arithmetic reads, with the range a real model's lie in:
``(lowest, highest)``. Anything else (a negative layer count, a string, 10^30
layers) is a broken or hostile config, refused before any arithmetic."""
REQUIRED_TEXT_KEYS = ("num_hidden_layers", "num_attention_heads", "hidden_size")


def text_config_problems(cfg: dict[str, Any]) -> list[tuple[str, str]]:
    """``(key, what is wrong)`` for each number the KV arithmetic would read wrongly."""
    out: list[tuple[str, str]] = []
    for key in REQUIRED_TEXT_KEYS:
        if cfg.get(key) is None:
            out.append((key, "is missing"))
    for key, (lo, hi) in TEXT_CONFIG_LIMITS.items():
        value = cfg.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            out.append((key, f"must be a whole number, got {value!r}"[:200]))
        elif not lo <= value <= hi:
            shown = (
                str(value)
                if len(str(value)) <= 24
                else f"{str(value)[:12]}… ({len(str(value))} digits)"
            )
            out.append((key, f"is {shown}; a real model's lies in {lo}..{hi}"))
    types = cfg.get("layer_types")
    if types is not None and not (
        isinstance(types, list) and all(isinstance(t, str) for t in types)
    ):
        out.append(("layer_types", "must be a list of strings"))
    attn = cfg.get("attn_type_list")
    if attn is not None and not (
        isinstance(attn, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in attn)
    ):
        out.append(("attn_type_list", "must be a list of whole numbers"))
    return out
