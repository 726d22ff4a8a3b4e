"""Qwen3-Omni's code2wav as an exported codes → waveform stage.

Qwen3-Omni's code2wav (transformers' ``Qwen3OmniMoeCode2Wav``) is a causal
decoder: the talker's 16 codebooks of codec codes per frame are embedded and
averaged, a small sliding-window transformer adds context, and a ConvNet of
transposed convolutions upsamples 1,920× to a 24 kHz waveform (12.5 frames a
second).

The tiny model here keeps the real model's layout and every dimension the
talker or the listener sees, and scales the inside down (:func:`tiny_code2wav_config`);
its weights are drawn under a fixed seed (:func:`tiny_code2wav`). It tests the
code path, not the voice: its audio is noise-like by construction.
"""

from __future__ import annotations

from typing import Any

TINY_SEED = 20
"""The seed the tiny code2wav's weights are drawn under (issue 20)."""


def tiny_code2wav_config() -> Any:
    """The tiny ``Qwen3OmniMoeCode2WavConfig``: the real layout, the inside scaled down.

    Derived from transformers' defaults, which are Qwen/Qwen3-Omni-30B-A3B's
    ``code2wav_config``. Kept as in the real model, because the talker, the
    stage's ports or the listener see them: ``num_quantizers`` 16 (codebooks per
    frame), ``codebook_size`` 2048 (codes per codebook), ``upsample_rates``
    (8, 5, 4, 3) and ``upsampling_ratios`` (2, 2) (1,920 samples per frame: 24 kHz
    at 12.5 frames/s), ``max_position_embeddings`` 8000, RoPE θ 10,000, SiLU.
    Scaled down (real → tiny): ``hidden_size`` 1024 → 32, ``num_attention_heads``
    and ``num_key_value_heads`` 16 → 2, ``intermediate_size`` 3072 → 64,
    ``num_hidden_layers`` 8 → 2, ``sliding_window`` 72 → 8, ``decoder_dim`` 1536 → 64
    (the last decoder block is 64 / 2⁴ = 4 channels wide).

    The scaled-down attention reaches back 2 × (8 − 1) = 14 frames, inside the
    25-frame left context vLLM-Omni gives each chunk, so chunked decoding
    reproduces the whole-sequence waveform exactly with this model; the real
    model's 8 × 71 frames do not fit in 25, and upstream accepts that
    approximation at chunk boundaries (docs/omni.md, code2wav).
    """
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
        Qwen3OmniMoeCode2WavConfig,
    )

    return Qwen3OmniMoeCode2WavConfig(
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        num_hidden_layers=2,
        sliding_window=8,
        decoder_dim=64,
    )


RESIDUAL_GAIN = 0.3
"""Scale on each decoder residual unit's 1×1 output convolution: with unit-gain
convolutions the 12 residual units would grow the signal ~3× per block."""
OUTPUT_GAIN = 0.1
"""Scale on the last convolution: brings the tiny model's waveform to a standard
deviation of about 0.25, inside the [-1, 1] clamp (measured on random codes)."""
BRANCH_SCALE = 0.5
"""The transformer's layer scales and the ConvNeXt blocks' gamma (transformers
initialises them at 0.01 and 1e-6, where a trained model has learnt them; at
those values the random transformer would hardly touch the waveform)."""


def tiny_code2wav(seed: int = TINY_SEED) -> Any:
    """transformers' ``Qwen3OmniMoeCode2Wav`` at :func:`tiny_code2wav_config`, fp32,
    eager attention, in ``eval()`` mode, its weights drawn under ``seed``.

    transformers' own initialisation draws every weight; the convolutions are then
    redrawn at unit gain (normal, std 1/√fan-in) and the branch scales set so the
    random model makes a waveform of audible range in which every part of the
    model shows (transformers' initialisation gives a waveform of ~1e-6: its
    convolutions shrink the signal at every layer). The same seed gives the same
    weights on every machine: the tiny Qwen3-Omni checkpoint copies this
    module's ``state_dict()`` into its ``code2wav.*`` tensors, so the checkpoint
    and the exported graph hold the same weights.
    """
    import math

    import torch
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeCode2Wav,
        Qwen3OmniMoeCode2WavDecoderResidualUnit,
    )

    config = tiny_code2wav_config()
    config._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        model = Qwen3OmniMoeCode2Wav(config)
        for module in model.modules():
            if isinstance(module, torch.nn.Conv1d):
                # weight: [out, in / groups, kernel]
                module.weight.normal_(0.0, 1.0 / math.sqrt(module.weight.shape[1] * module.weight.shape[2]))
            elif isinstance(module, torch.nn.ConvTranspose1d):
                # weight: [in, out, kernel]; each output sample sums in × kernel / stride terms
                fan_in = module.weight.shape[0] * module.weight.shape[2] / module.stride[0]
                module.weight.normal_(0.0, 1.0 / math.sqrt(fan_in))
            else:
                continue
            if module.bias is not None:
                module.bias.zero_()
        for module in model.modules():
            if isinstance(module, Qwen3OmniMoeCode2WavDecoderResidualUnit):
                module.conv2.conv.weight.mul_(RESIDUAL_GAIN)
        for name, param in model.named_parameters():
            if name.endswith("layer_scale.scale") or name.endswith(".gamma"):
                param.fill_(BRANCH_SCALE)
        last: Any = model.decoder[-1]
        last.conv.weight.mul_(OUTPUT_GAIN)
    model.float()
    return model.eval()
