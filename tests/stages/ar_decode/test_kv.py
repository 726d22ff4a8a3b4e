"""KV arithmetic against hand computations on the shipped real model configs."""

from __future__ import annotations

import json

import pytest

from stages.ar_decode.kv import kv_budget, layer_kinds, text_config
from tests.helpers import REPO

MODELS = REPO / "configs" / "models"


def load(name: str) -> dict:
    return text_config(json.loads((MODELS / name / "config.json").read_text()))


@pytest.mark.parametrize(
    ("model", "per_token"),
    [
        # layers × 2 (K and V) × KV heads × head_dim × 2 bytes (bf16)
        ("llama-3.2-1b-instruct", 16 * 2 * 8 * 64 * 2),  # 32768
        ("qwen3-4b", 36 * 2 * 8 * 128 * 2),  # 147456
        ("gemma-3-1b-it", 26 * 2 * 1 * 256 * 2),  # 26624
        ("qwen2.5-omni-3b", 36 * 2 * 2 * (2048 // 16) * 2),  # thinker text model: 36864
        ("smollm2-135m-instruct", 30 * 2 * 3 * (576 // 9) * 2),  # 23040
    ],
)
def test_bytes_per_token_matches_hand_computation(model, per_token):
    kv = kv_budget(load(model), max_model_len=4096, max_num_seqs=1, kv_dtype="bfloat16")
    assert kv.bytes_per_token == per_token
    assert kv.bytes_total_flat == per_token * 4096


def test_gemma3_sliding_layers_hold_only_their_window():
    cfg = load("gemma-3-1b-it")
    kv = kv_budget(cfg, max_model_len=8192, max_num_seqs=2)
    per_layer = 2 * 1 * 256 * 2
    # 26 layers, every 6th global: layers 5, 11, 17, 23 → 4 full, 22 sliding (window 512)
    assert (kv.full_attention_layers, kv.sliding_window_layers) == (4, 22)
    assert kv.bytes_total == 4 * per_layer * 8192 * 2 + 22 * per_layer * 512 * 2
    assert kv.bytes_total_flat == 26 * per_layer * 8192 * 2
    # a context shorter than the window is not charged the window
    short = kv_budget(cfg, max_model_len=256)
    assert short.bytes_total == short.bytes_total_flat == 26 * per_layer * 256


def test_layer_types_list_wins_and_qwen_max_window_layers():
    cfg = {
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 8,
        "sliding_window": 16,
        "layer_types": [
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "full_attention",
        ],
    }
    assert layer_kinds(cfg) == ["sliding_attention", "full_attention"] * 2
    qwen = {
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "head_dim": 8,
        "sliding_window": 16,
        "use_sliding_window": True,
        "max_window_layers": 2,
    }
    assert layer_kinds(qwen) == [
        "full_attention",
        "full_attention",
        "sliding_attention",
        "sliding_attention",
    ]
    # use_sliding_window false (Qwen3-4B): all full, whatever max_window_layers says
    assert set(layer_kinds(load("qwen3-4b"))) == {"full_attention"}


def test_mla_latent_is_one_vector_per_token():
    cfg = {
        "num_hidden_layers": 3,
        "num_attention_heads": 16,
        "hidden_size": 2048,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
    }
    kv = kv_budget(cfg, max_model_len=100)
    assert kv.mla
    assert kv.bytes_per_token == 3 * (512 + 64) * 2


def test_linear_attention_layers_hold_a_fixed_state():
    cfg = {
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_size": 512,
        "layer_types": [
            "linear_attention",
            "linear_attention",
            "linear_attention",
            "full_attention",
        ],
        "linear_num_value_heads": 8,
        "linear_num_key_heads": 4,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "linear_conv_kernel_dim": 4,
    }
    kv = kv_budget(cfg, max_model_len=1000, max_num_seqs=3)
    state = (8 * 32 * 32 + 3 * (2 * 4 * 32 + 8 * 32)) * 2
    assert kv.recurrent_layers == 3
    assert kv.bytes_per_token == 2 * 2 * 64 * 2  # only the full layer grows with context
    assert kv.bytes_total == 2 * 2 * 64 * 2 * 1000 * 3 + 3 * state * 3
    # doubling the context grows only the attention part
    assert kv.with_len(2000).bytes_total - kv.bytes_total == 2 * 2 * 64 * 2 * 1000 * 3


def test_fp8_cache_halves_bf16_and_unknown_dtype_is_refused():
    cfg = load("llama-3.2-1b-instruct")
    assert (
        kv_budget(cfg, max_model_len=10, kv_dtype="fp8").bytes_per_token * 2
        == kv_budget(cfg, max_model_len=10).bytes_per_token
    )
    with pytest.raises(ValueError, match="unknown KV cache dtype 'int3'"):
        kv_budget(cfg, max_model_len=10, kv_dtype="int3")


def test_nested_thinker_text_config_is_found():
    root = json.loads((MODELS / "qwen2.5-omni-3b" / "config.json").read_text())
    assert "thinker_config" in root
    assert text_config(root)["num_hidden_layers"] == 36
