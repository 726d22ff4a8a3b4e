"""Tiny Qwen2.5-Omni and Qwen3-Omni checkpoints, built at set-up from the real architecture classes.

Real Omni checkpoints (7-70 GB) cannot be had here, so — as the model libraries
test a model's code path — this module builds one tiny checkpoint of each from
transformers' own classes: ``Qwen2_5OmniForConditionalGeneration`` (thinker with
its audio and vision towers, talker, token2wav: DiT + BigVGAN) and
``Qwen3OmniMoeForConditionalGeneration`` (MoE thinker with its towers, MoE talker
with its multi-codebook code predictor, code2wav). The config layout is the real
one (``thinker_config``, ``talker_config``, ``token2wav_config`` /
``code2wav_config``), the tensor names are the real ones, the dimensions are
scaled down (:data:`SCALE_DOWN` says each against the real default), the weights
are random with a fixed seed, and a byte-level tokenizer with Qwen's chat
template is made here (:func:`build_tokenizer`). They test the path, never the
quality: the README written beside each says so.

``python -m exports.omni_tiny build`` writes ``exports/qwen2_5-omni-tiny`` and
``exports/qwen3-omni-tiny`` (git-ignored; ``scripts/bootstrap.sh`` runs it when
either is missing; a directory that exists is kept). Each is written in a
temporary directory and renamed into place, so a half-built one never lands.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from exports import qwen2_5_omni_token2wav, qwen3_omni_code2wav

EXPORTS = Path(__file__).resolve().parent
QWEN2_5_OMNI_DIR = EXPORTS / "qwen2_5-omni-tiny"
QWEN3_OMNI_DIR = EXPORTS / "qwen3-omni-tiny"
SEED = 20
"""The seed of every random weight: the same checkpoint on every machine that builds it."""

# ---- the tokenizer: 256 bytes, then Qwen's special tokens -----------------------------
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "system",
    "user",
    "assistant",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|tts_pad|>",
    "<|tts_bos|>",
    "<|tts_eos|>",
)
"""Ids 256.. in this order. The role names are single tokens as in Qwen's vocabulary
(Qwen3-Omni's ``generate`` finds a turn's role as the one token after ``<|im_start|>``)."""
TOKEN = {t: 256 + i for i, t in enumerate(SPECIAL_TOKENS)}
TEXT_VOCAB = 288
"""256 byte tokens + 16 special tokens, padded to a multiple of 32 (Qwen's real vocabulary: 151,936 / 152,064)."""
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Qwen's ChatML, as the real checkpoints' tokenizer_config.json writes it (without tools)."""

# ---- Qwen2.5-Omni's codec vocabulary (talker) ------------------------------------------
Q25_CODES = 256
"""Codec codes 0..255 (real: 8,192), then the specials at the real offsets above the codes."""
Q25_CODEC = {
    "pad": Q25_CODES + 100,
    "bos": Q25_CODES + 101,
    "eos": Q25_CODES + 102,
    "mask": Q25_CODES + 104,
}
"""Real: pad 8292, start 8293, end 8294, mask 8296 — 8,192 + 100/101/102/104."""
Q25_TALKER_VOCAB = Q25_CODES + 128
"""Real: 8,448 = 8,192 codes + 256."""

# ---- Qwen3-Omni's codec vocabulary (talker, code predictor, code2wav) -------------------
Q3_CODEBOOK = 64
"""Codes per codebook (real: 2,048)."""
Q3_CODE_GROUPS = 4
"""Codebooks per frame: the talker's first plus the code predictor's (real: 16)."""
Q3_TALKER_VOCAB = Q3_CODEBOOK + 1024
"""The talker's vocabulary: the codebook plus 1,024 specials, as the real 3,072 = 2,048 + 1,024
(``generate`` suppresses the last 1,024 ids but end-of-speech, so it cannot be smaller)."""
Q3_CODEC = {
    "pad": Q3_CODEBOOK + 100,
    "bos": Q3_CODEBOOK + 101,
    "eos": Q3_CODEBOOK + 102,
    "nothink": Q3_CODEBOOK + 107,
    "think_bos": Q3_CODEBOOK + 108,
    "think_eos": Q3_CODEBOOK + 109,
}
"""Real: pad 2148, bos 2149, eos 2150, nothink 2155, think_bos 2156, think_eos 2157 (2,048 + offset)."""
Q3_SPEAKERS = {"chelsie": Q3_CODEBOOK + 253, "ethan": Q3_CODEBOOK + 254, "aiden": Q3_CODEBOOK + 255}

SCALE_DOWN: dict[str, list[tuple[str, Any, Any]]] = {
    "qwen2_5-omni-tiny": [
        (
            "thinker text: hidden_size / layers / heads / KV heads / head_dim",
            "3584 / 28 / 28 / 4 / 128",
            "64 / 2 / 4 / 2 / 16",
        ),
        ("thinker text: intermediate_size / vocab_size", "18944 / 152064", f"128 / {TEXT_VOCAB}"),
        ("thinker text: rope mrope_section", "[16, 24, 24]", "[2, 3, 3]"),
        ("audio tower: d_model / layers / heads / ffn", "1280 / 32 / 20 / 5120", "32 / 1 / 2 / 64"),
        (
            "vision tower: hidden / depth / heads / intermediate",
            "1280 / 32 / 16 / 3420",
            "32 / 1 / 2 / 64",
        ),
        (
            "talker: hidden / layers / heads / KV heads / head_dim",
            "896 / 24 / 14 / 2 / 64 (3B)",
            "32 / 2 / 2 / 1 / 16",
        ),
        ("talker: embedding_size (the thinker's width)", "3584", "64"),
        ("talker: codec vocab_size", "8448", str(Q25_TALKER_VOCAB)),
        ("token2wav DiT: hidden / layers / heads", "1024 / 22 / 16", "32 / 2 / 2"),
        ("token2wav BigVGAN: upsample_initial_channel", "1536", "128"),
    ],
    "qwen3-omni-tiny": [
        (
            "thinker text: hidden_size / layers / heads / KV heads / head_dim",
            "2048 / 48 / 32 / 4 / 128 (30B-A3B)",
            "64 / 2 / 4 / 2 / 16",
        ),
        (
            "thinker text: experts / per token / moe_intermediate_size",
            "128 / 8 / 768",
            "4 / 2 / 32",
        ),
        ("thinker text: vocab_size", "152064", str(TEXT_VOCAB)),
        ("audio tower: d_model / layers / heads / ffn", "1280 / 32 / 20 / 5120", "32 / 1 / 2 / 64"),
        ("vision tower: hidden / depth / heads", "1152 / 27 / 16", "32 / 1 / 2"),
        (
            "talker text: hidden / layers / heads / KV heads / head_dim",
            "1024 / 20 / 16 / 2 / 128",
            "32 / 2 / 2 / 1 / 16",
        ),
        ("talker text: experts / per token / moe_intermediate_size", "128 / 8 / 384", "4 / 2 / 32"),
        ("talker: accept_hidden_layer (the thinker layer it reads)", "24", "1"),
        ("talker: num_code_groups / codebook", "16 / 2048", f"{Q3_CODE_GROUPS} / {Q3_CODEBOOK}"),
        ("code predictor: hidden / layers / heads", "1024 / 5 / 16", "32 / 1 / 2"),
        (
            "code2wav: hidden / layers / heads / sliding window / decoder_dim",
            "1024 / 8 / 16 / 72 / 1536",
            "32 / 2 / 2 / 8 / 64",
        ),
    ],
}
"""What each tiny checkpoint scaled down, against the real configuration (transformers'
config defaults, which follow the released 7B / 30B-A3B checkpoints; the 3B talker's
figures from configs/models/qwen2.5-omni-3b/config.json). Written into each README."""


def build_tokenizer() -> Any:
    """A byte-level tokenizer (every UTF-8 byte is a token, no merges) with Qwen's special
    tokens and chat template, as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_to_char = _bytes_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(256)}
    assert set(vocab) == set(alphabet)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character table (the ByteLevel pre-tokenizer's alphabet)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def qwen2_5_omni_config() -> Any:
    from transformers import Qwen2_5OmniConfig

    text = {
        "vocab_size": TEXT_VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "max_window_layers": 2,
        "tie_word_embeddings": False,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": [2, 3, 3],
        },
        "eos_token_id": TOKEN["<|im_end|>"],
        "pad_token_id": TOKEN["<|endoftext|>"],
    }
    thinker = {
        "text_config": text,
        "audio_config": {
            "d_model": 32,
            "encoder_layers": 1,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 64,
            "output_dim": 64,
            "num_mel_bins": 128,
        },
        "vision_config": {
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "fullatt_block_indexes": [0],
        },
        "audio_token_index": TOKEN["<|AUDIO|>"],
        "image_token_index": TOKEN["<|IMAGE|>"],
        "video_token_index": TOKEN["<|VIDEO|>"],
        "audio_start_token_id": TOKEN["<|audio_bos|>"],
        "audio_end_token_id": TOKEN["<|audio_eos|>"],
        "user_token_id": TOKEN["user"],
        # read by the thinker's rope index but not fields of its config class; the released
        # checkpoints' thinker_config carries them
        "vision_start_token_id": TOKEN["<|vision_bos|>"],
        "vision_end_token_id": TOKEN["<|vision_eos|>"],
        "tie_word_embeddings": False,
    }
    talker = {
        "vocab_size": Q25_TALKER_VOCAB,
        "embedding_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "max_position_embeddings": 2048,
        "max_window_layers": 2,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": [2, 3, 3],
        },
        "tts_text_start_token_id": TOKEN["<|tts_bos|>"],
        "tts_text_end_token_id": TOKEN["<|tts_eos|>"],
        "tts_text_pad_token_id": TOKEN["<|tts_pad|>"],
        "tts_codec_start_token_id": Q25_CODEC["bos"],
        "tts_codec_end_token_id": Q25_CODEC["eos"],
        "tts_codec_pad_token_id": Q25_CODEC["pad"],
        "tts_codec_mask_token_id": Q25_CODEC["mask"],
        "audio_token_index": TOKEN["<|AUDIO|>"],
        "image_token_index": TOKEN["<|IMAGE|>"],
        "video_token_index": TOKEN["<|VIDEO|>"],
        "vision_start_token_id": TOKEN["<|vision_bos|>"],
        "vision_end_token_id": TOKEN["<|vision_eos|>"],
        "audio_start_token_id": TOKEN["<|audio_bos|>"],
        "audio_end_token_id": TOKEN["<|audio_eos|>"],
    }
    token2wav = {
        "dit_config": {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "head_dim": 16,
            "ff_mult": 2,
            "emb_dim": 16,
            "num_embeds": Q25_TALKER_VOCAB,
            "mel_dim": 80,
            "look_ahead_layers": [1],
            "look_backward_layers": [0],
            "block_size": 24,
            "enc_emb_dim": 16,
            "enc_dim": 16,
            "enc_channels": [32, 32, 32, 32, 96],
            "enc_attention_channels": 16,
            "enc_se_channels": 16,
            "dropout": 0.0,
        },
        "bigvgan_config": {
            "mel_dim": 80,
            "upsample_initial_channel": 128,
            "resblock_kernel_sizes": [3],
            "resblock_dilation_sizes": [[1, 3, 5]],
        },
    }
    return Qwen2_5OmniConfig(
        thinker_config=thinker,
        talker_config=talker,
        token2wav_config=token2wav,
        enable_audio_output=True,
    )


def qwen3_omni_config() -> Any:
    from transformers import Qwen3OmniMoeConfig

    text = {
        "vocab_size": TEXT_VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 2048,
        "moe_intermediate_size": 32,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": [4, 2, 2],
            "interleaved": True,
        },
        "eos_token_id": TOKEN["<|im_end|>"],
        "pad_token_id": TOKEN["<|endoftext|>"],
    }
    thinker = {
        "text_config": text,
        "audio_config": {
            "d_model": 32,
            "encoder_layers": 1,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 64,
            "output_dim": 64,
            "num_mel_bins": 128,
            "downsample_hidden_size": 16,
        },
        "vision_config": {
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "deepstack_visual_indexes": [0],
            "num_position_embeddings": 64,
        },
        "audio_token_id": TOKEN["<|AUDIO|>"],
        "image_token_id": TOKEN["<|IMAGE|>"],
        "video_token_id": TOKEN["<|VIDEO|>"],
        "audio_start_token_id": TOKEN["<|audio_bos|>"],
        "user_token_id": TOKEN["user"],
        "vision_start_token_id": TOKEN["<|vision_bos|>"],
        "vision_end_token_id": TOKEN["<|vision_eos|>"],
    }
    talker = {
        "text_config": {
            "vocab_size": Q3_TALKER_VOCAB,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "max_position_embeddings": 2048,
            "moe_intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "shared_expert_intermediate_size": 32,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1000000.0,
                "mrope_section": [4, 2, 2],
                "interleaved": True,
            },
        },
        "code_predictor_config": {
            "vocab_size": Q3_CODEBOOK,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "max_position_embeddings": 2048,
            "num_code_groups": Q3_CODE_GROUPS,
        },
        "num_code_groups": Q3_CODE_GROUPS,
        "thinker_hidden_size": 64,
        "accept_hidden_layer": 1,
        "codec_eos_token_id": Q3_CODEC["eos"],
        "codec_nothink_id": Q3_CODEC["nothink"],
        "codec_think_bos_id": Q3_CODEC["think_bos"],
        "codec_think_eos_id": Q3_CODEC["think_eos"],
        "codec_pad_id": Q3_CODEC["pad"],
        "codec_bos_id": Q3_CODEC["bos"],
        "audio_token_id": TOKEN["<|AUDIO|>"],
        "image_token_id": TOKEN["<|IMAGE|>"],
        "video_token_id": TOKEN["<|VIDEO|>"],
        "vision_start_token_id": TOKEN["<|vision_bos|>"],
        "audio_start_token_id": TOKEN["<|audio_bos|>"],
        "speaker_id": dict(Q3_SPEAKERS),
        # read by the talker's rope index (multimodal positions) but not a field of its config class;
        # the vision tower's value, as the released checkpoints' talker_config carries it
        "spatial_merge_size": 2,
    }
    return Qwen3OmniMoeConfig(
        thinker_config=thinker,
        talker_config=talker,
        code2wav_config=tiny_code2wav_config(),
        enable_audio_output=True,
        im_start_token_id=TOKEN["<|im_start|>"],
        im_end_token_id=TOKEN["<|im_end|>"],
        tts_pad_token_id=TOKEN["<|tts_pad|>"],
        tts_bos_token_id=TOKEN["<|tts_bos|>"],
        tts_eos_token_id=TOKEN["<|tts_eos|>"],
        system_token_id=TOKEN["system"],
        user_token_id=TOKEN["user"],
        assistant_token_id=TOKEN["assistant"],
    )


def tiny_code2wav_config() -> dict[str, Any]:
    """Qwen3-Omni's code2wav scaled down (real: hidden 1024, 8 layers, 16 heads, sliding window 72,
    decoder_dim 1536, codebook 2048, 16 quantizers): the exported code2wav's own tiny config
    (``exports.qwen3_omni_code2wav.tiny_code2wav_config``), whose codebooks and codebook size are
    the tiny talker's codes; the checkpoint takes that module's weights too (``_build_one``), so
    the checkpoint's code2wav and the exported graph are the same network."""
    config: dict[str, Any] = qwen3_omni_code2wav.tiny_code2wav_config().to_dict()
    return config


def _readme(name: str, model_class: str, config: Any, params: int, size: int) -> str:
    rows = "\n".join(f"| {what} | {real} | {tiny} |" for what, real, tiny in SCALE_DOWN[name])
    return f"""# {name} (generated: `python -m exports.omni_tiny build`)

**Random weights; tests the code path, never the quality.** A tiny
`{model_class}` built from transformers' real configuration and model classes
({type(config).__name__}: the real `thinker_config` / `talker_config` /
`{"token2wav_config" if "token2wav_config" in config.to_dict() else "code2wav_config"}`
layout, the real tensor names), with every dimension scaled down and weights drawn
with seed {SEED}. Its output is noise by design: what it shows is that each Omni stage
(thinker, talker, {"token2wav" if "token2wav_config" in config.to_dict() else "code2wav"})
runs, hands its outputs over in the shapes the next stage reads, and agrees with
transformers' own `generate()` on the same weights. A real checkpoint directory drops
in through a stage's `model:` with nothing else changed.

* {params:,} parameters, {size:,} bytes of safetensors (fp32).
* Tokenizer: made here (`exports/omni_tiny.py`, `build_tokenizer`): every UTF-8 byte is
  a token (no merges), then Qwen's special tokens at ids 256..271, vocabulary {TEXT_VOCAB};
  Qwen's ChatML chat template. The role names `system`, `user`, `assistant` are single
  tokens, as in Qwen's vocabulary.

## Scale-down against the real configuration

| what | real | tiny |
| --- | --- | --- |
{rows}
"""


def _build_one(
    out: Path, name: str, model_class: str, config: Any, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    import torch
    import transformers

    t0 = time.perf_counter()
    torch.manual_seed(SEED)
    model = getattr(transformers, model_class)(config).eval()
    _initialise_uninitialised(model)
    if getattr(model, "code2wav", None) is not None:  # Qwen3-Omni: the exported graph's weights
        model.code2wav.load_state_dict(qwen3_omni_code2wav.tiny_code2wav().state_dict())
    if (
        getattr(model, "token2wav", None) is not None
    ):  # Qwen2.5-Omni: a vocoder whose audio is audible
        qwen2_5_omni_token2wav.audible_bigvgan(model.token2wav.code2wav_bigvgan_model, SEED)
    params = sum(p.numel() for p in model.parameters())
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=out.parent) as tmp:
        work = Path(tmp) / name
        model.save_pretrained(work, safe_serialization=True)
        build_tokenizer().save_pretrained(work)
        for file, value in (extra or {}).items():
            torch.save(value, work / file)
        size = sum(p.stat().st_size for p in work.glob("*.safetensors"))
        (work / "README.md").write_text(
            _readme(name, model_class, config, params, size), encoding="utf-8"
        )
        if out.exists():
            shutil.rmtree(out)
        work.rename(out)
    return {
        "name": name,
        "path": str(out),
        "parameters": params,
        "bytes": size,
        "build_s": round(time.perf_counter() - t0, 2),
    }


INIT_STD = 0.02
"""``initializer_range`` of every Qwen Omni sub-config (transformers' default and the released ones)."""


def _initialise_uninitialised(model: Any) -> None:
    """Draw, from a seeded generator, the parameters transformers leaves as allocated memory:
    Qwen3-Omni's talker keeps its fused MoE experts (``experts.gate_up_proj``, ``down_proj``)
    out of ``_init_weights``, so they would hold whatever the allocator handed over (different
    on every build, possibly NaN)."""
    import torch

    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if ".experts." in name and param.dim() == 3:
                param.copy_(torch.randn(param.shape, generator=g, dtype=param.dtype) * INIT_STD)


def build_qwen2_5_omni(out: Path = QWEN2_5_OMNI_DIR) -> dict[str, Any]:
    """The tiny Qwen2.5-Omni, with ``spk_dict.pt`` (one speaker, Chelsie: the text token the
    talker starts from, and random DiT conditioning), as ``from_pretrained`` requires."""
    import torch

    config = qwen2_5_omni_config()
    g = torch.Generator().manual_seed(SEED)
    speakers = {
        "Chelsie": {
            "bos_token": TOKEN["<|tts_bos|>"],
            "cond": torch.randn(1, config.token2wav_config.dit_config.enc_emb_dim, generator=g),
            "ref_mel": torch.randn(1, 30, config.token2wav_config.dit_config.mel_dim, generator=g),
        }
    }
    return _build_one(
        out,
        "qwen2_5-omni-tiny",
        "Qwen2_5OmniForConditionalGeneration",
        config,
        {"spk_dict.pt": speakers},
    )


def build_qwen3_omni(out: Path = QWEN3_OMNI_DIR) -> dict[str, Any]:
    return _build_one(
        out, "qwen3-omni-tiny", "Qwen3OmniMoeForConditionalGeneration", qwen3_omni_config()
    )


def ensure_built(force: bool = False) -> list[dict[str, Any]]:
    """Build each tiny checkpoint whose directory is missing (or all, with ``force``)."""
    done = []
    for path, build in ((QWEN2_5_OMNI_DIR, build_qwen2_5_omni), (QWEN3_OMNI_DIR, build_qwen3_omni)):
        if force or not (path / "config.json").is_file():
            done.append(build(path))
        else:
            done.append({"name": path.name, "path": str(path), "skipped": "present"})
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m exports.omni_tiny", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("command", choices=["build"])
    parser.add_argument(
        "--force", action="store_true", help="rebuild even when the directories exist"
    )
    args = parser.parse_args(argv)
    for row in ensure_built(force=args.force):
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
