"""Qwen2.5-Omni's token2wav: its DiT step and its BigVGAN export to ONNX graphs that hold
the default gate tolerance against transformers' own modules (same weights, computed
here), at lengths other than the traced one. The token2wav stage runs the solver loop
between them (tests/stages/token2wav, docs/omni.md)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from exports import qwen2_5_omni_token2wav as t2w

pytestmark = [pytest.mark.ort, pytest.mark.slow]

GATE = {"rel_l2": 1e-3, "cosine_min": 0.999}
"""The exporter's default tolerance (docs/exported-artifacts.md)."""


def _tiny() -> Any:
    """transformers' token2wav at a tiny size (DiT: 2 layers of 64; BigVGAN: 64 channels)."""
    import torch
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import (
        Qwen2_5OmniToken2WavConfig,
    )
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

    config = Qwen2_5OmniToken2WavConfig(
        dit_config={
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "head_dim": 32,
            "ff_mult": 2,
            "emb_dim": 32,
            "num_embeds": 384,
            "enc_dim": 32,
            "enc_channels": [32, 32, 32, 32, 96],
            "enc_attention_channels": 16,
            "enc_res2net_scale": 2,
            "enc_se_channels": 16,
            "look_ahead_layers": [1],
            "look_backward_layers": [0],
        },
        bigvgan_config={
            "upsample_initial_channel": 64,
            "resblock_kernel_sizes": [3],
            "resblock_dilation_sizes": [[1, 3, 5]],
        },
    )
    torch.manual_seed(0)
    return Qwen2_5OmniToken2WavModel(config).eval()


def _export(module: Any, feeds: dict[str, Any], path: Path, axes: dict[str, dict[int, str]]) -> Any:
    import onnxruntime as ort
    import torch

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            tuple(feeds.values()),
            str(path),
            input_names=list(feeds),
            output_names=["out"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _within_gate(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.shape == ref.shape and float(np.abs(ref).max()) > 0
    rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    cos = float(got.ravel() @ ref.ravel() / (np.linalg.norm(got) * np.linalg.norm(ref)))
    assert rel <= GATE["rel_l2"] and cos >= GATE["cosine_min"], (rel, cos)


def test_the_dit_step_exports_and_holds_the_gate(tmp_path: Path) -> None:
    import torch

    model = _tiny()
    dit = model.code2wav_dit_model
    mel, spk, repeats = dit.config.mel_dim, dit.config.enc_emb_dim, dit.repeats
    step = t2w.dit_step(dit)

    def feeds(codes: int, seed: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(seed)
        frames = codes * repeats
        return {
            "x": torch.randn(1, frames, mel, generator=g),
            "reference_mel": torch.randn(1, 30, mel, generator=g),
            "speaker": torch.randn(1, 1, spk, generator=g).repeat(1, frames, 1),
            "code": torch.randint(0, 256, (1, codes), generator=g),
            "t": torch.tensor(0.3),
        }

    session = _export(
        step,
        feeds(20, 0),
        tmp_path / "dit.onnx",
        {
            "x": {1: "frames"},
            "reference_mel": {1: "ref"},
            "speaker": {1: "frames"},
            "code": {1: "codes"},
            "out": {1: "frames"},
        },
    )
    for codes in (20, 33, 7):
        f = feeds(codes, codes)
        with torch.no_grad():
            ref = step(*f.values()).numpy()
        assert ref.shape == (2, codes * repeats, mel)  # conditioned and unconditioned velocities
        _within_gate(session.run(None, {k: v.numpy() for k, v in f.items()})[0], ref)


def test_bigvgan_exports_with_fixed_filters_and_holds_the_gate(tmp_path: Path) -> None:
    import torch

    model = _tiny()
    mel = model.config.bigvgan_config.mel_dim
    reference = (
        _tiny().code2wav_bigvgan_model
    )  # the same weights (seeded), left as transformers has it
    vocoder = t2w.traceable_bigvgan(model.code2wav_bigvgan_model, mel)
    session = _export(
        vocoder,
        {"mel": torch.randn(1, mel, 40)},
        tmp_path / "bigvgan.onnx",
        {"mel": {2: "frames"}, "out": {0: "samples"}},
    )
    for frames in (40, 66, 13):
        spectrogram = torch.randn(1, mel, frames, generator=torch.Generator().manual_seed(frames))
        with torch.no_grad():
            ref = reference(spectrogram).numpy()
        assert ref.shape == (frames * 240,)  # 24 kHz at 100 mel frames a second
        _within_gate(session.run(None, {"mel": spectrogram.numpy()})[0], ref)
