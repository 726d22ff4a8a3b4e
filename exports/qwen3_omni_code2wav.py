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

import json
import math
import subprocess
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import safe_open

from stages.exported_graph.artifact import artifact_hook

if TYPE_CHECKING:
    import numpy as np

    from stages.payloads import AudioItem

TINY_SEED = 20
"""The seed the tiny code2wav's weights are drawn under (issue 20)."""
TINY_CODEBOOKS = 4
"""Codebooks per frame: the tiny Qwen3-Omni talker's ``num_code_groups`` (real: 16)."""
TINY_CODEBOOK_SIZE = 64
"""Codes per codebook: the tiny talker's codec (real: 2,048)."""


def tiny_code2wav_config() -> Any:
    """The tiny ``Qwen3OmniMoeCode2WavConfig``: the real layout, the inside scaled down.

    Derived from transformers' defaults, which are Qwen/Qwen3-Omni-30B-A3B's
    ``code2wav_config``. The codes match the tiny talker's (its codec is scaled
    down with it): ``num_quantizers`` 16 → 4 (codebooks per frame),
    ``codebook_size`` 2048 → 64 (codes per codebook). Kept as in the real model,
    because the stage's ports or the listener see them: ``upsample_rates``
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
        num_quantizers=TINY_CODEBOOKS,
        codebook_size=TINY_CODEBOOK_SIZE,
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
    weights on every machine: a tiny Qwen3-Omni checkpoint takes this module's
    ``state_dict()`` as its ``code2wav.*`` tensors, so the checkpoint and the
    exported graph hold the same weights.
    """
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
                module.weight.normal_(
                    0.0, 1.0 / math.sqrt(module.weight.shape[1] * module.weight.shape[2])
                )
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


def load_code2wav(checkpoint: Path | str) -> Any:
    """The ``Qwen3OmniMoeCode2Wav`` of a Qwen3-Omni checkpoint directory (its
    ``config.json``'s ``code2wav_config`` and its ``code2wav.*`` tensors, from every
    ``*.safetensors`` file), fp32, eager attention, in ``eval()`` mode. A tensor the
    model has and the checkpoint lacks (or the reverse) is a ``ValueError`` naming it.

    For a real checkpoint: a factory ``def factory(): return export_module(load_code2wav(DIR))``
    exported with ``omni-edge export --from torch`` (docs/omni.md, code2wav)."""
    import torch
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
        Qwen3OmniMoeCode2WavConfig,
    )
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    root = Path(checkpoint)
    config = Qwen3OmniMoeCode2WavConfig(
        **json.loads((root / "config.json").read_text())["code2wav_config"]
    )
    config._attn_implementation = "eager"
    model = Qwen3OmniMoeCode2Wav(
        config
    )  # initialised, then overwritten: its buffers (RoPE, offsets) are computed
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(root.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (a safe_open handle is not a mapping)
                if key.startswith("code2wav."):
                    state[key.removeprefix("code2wav.")] = f.get_tensor(key).to(torch.float32)
    wanted = set(model.state_dict())
    if wanted != set(state):
        missing, extra = sorted(wanted - set(state)), sorted(set(state) - wanted)
        raise ValueError(f"{root}: code2wav tensors missing {missing[:5]}, unexpected {extra[:5]}")
    model.load_state_dict(state)
    model.float()
    return model.eval()


# ---- the exported graph --------------------------------------------------------------

REFERENCE_FRAMES = 40
"""Frames of codes in the reference input (3.2 s of audio): more than one chunk plus
its left context, so the numeric gate covers the sliding window in full."""
CALIBRATION_FRAMES = (7, 29, 50)
"""Further lengths the exporter measures the graph's error on: a first chunk after
vLLM-Omni's ``initial_codec_chunk_frames`` plus context, a chunk with context (25 + 4),
and a long one."""


def _codes(frames: int, seed: int, codebooks: int, codebook_size: int) -> Any:
    import torch

    gen = torch.Generator().manual_seed(seed)
    # codes: [batch 1, codebooks, frames], int64, each in [0, codebook_size)
    return torch.randint(0, codebook_size, (1, codebooks, frames), generator=gen, dtype=torch.int64)


def traceable(model: Any) -> Any:
    """``model`` (a ``Qwen3OmniMoeCode2Wav``) behind a forward that ONNX export can trace:
    the same computation as ``model.forward``, with the transformer's sliding-window
    causal mask built from the frame count with plain tensor ops (transformers'
    mask helpers look for packed sequences with ``torch.diff``, which has no ONNX
    export), and each causal convolution padding by its receptive field alone
    (transformers computes an extra right padding with Python arithmetic on the
    length, which the tracer would freeze at the example's length; for the stride-1
    convolutions code2wav has, that padding is 0 at every length). Same weights,
    same output (checked in tests/exports/test_qwen3_omni_code2wav.py)."""
    import torch
    import torch.nn.functional as F
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCausalConvNet

    def causal_conv(self: Any, hidden: Any) -> Any:
        return self.conv(F.pad(hidden, (self.padding, 0), mode="constant", value=0)).contiguous()

    for module in model.modules():
        if isinstance(module, Qwen3OmniMoeCausalConvNet):
            if module.stride != 1:
                raise ValueError(
                    f"a causal convolution of stride {module.stride}: its extra padding depends on the length"
                )
            module.forward = types.MethodType(causal_conv, module)  # type: ignore[method-assign]

    class Code2WavGraph(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner
            self.window = int(inner.config.sliding_window)

        def forward(self, codes: Any) -> Any:
            inner = self.inner
            # codes: [1, codebooks, frames] → hidden: [1, frames, hidden]
            hidden = inner.code_embedding(codes + inner.code_offset).mean(1)
            frames = torch.arange(codes.shape[-1], device=codes.device)
            back = frames[:, None] - frames[None, :]  # [frames (query), frames (key)]: how far back
            allowed = (back >= 0) & (
                back < self.window
            )  # transformers' sliding window: q - W < k <= q
            mask = torch.where(allowed, 0.0, torch.finfo(hidden.dtype).min).to(hidden.dtype)[
                None, None
            ]
            hidden = inner.pre_transformer(
                inputs_embeds=hidden,
                attention_mask={"sliding_attention": mask, "full_attention": mask},
                position_ids=frames[None],
            ).last_hidden_state
            hidden = hidden.permute(0, 2, 1)  # [1, hidden, frames]
            for blocks in inner.upsample:
                for block in blocks:
                    hidden = block(hidden)
            wav = hidden
            for block in inner.decoder:
                wav = block(wav)
            return wav.clamp(min=-1, max=1)  # waveform: [1, 1, samples]

    return Code2WavGraph(model).eval()


def export_module(model: Any) -> dict[str, Any]:
    """What ``omni-edge export --from torch`` takes for a ``Qwen3OmniMoeCode2Wav``: the
    module, ``codes`` int64 ``[1, codebooks, frames]`` in, ``waveform`` float32
    ``[1, 1, samples]`` out, dynamic in frames and samples, random codes as the
    reference and calibration inputs."""
    cfg = model.config
    q, size = int(cfg.num_quantizers), int(cfg.codebook_size)
    return {
        "module": traceable(model),
        "inputs": {"codes": _codes(REFERENCE_FRAMES, 0, q, size)},
        "outputs": ["waveform"],
        "dynamic_axes": {"codes": {2: "frames"}, "waveform": {2: "samples"}},
        "calibration": [
            {"codes": _codes(n, i + 1, q, size)} for i, n in enumerate(CALIBRATION_FRAMES)
        ],
    }


def tiny_factory() -> dict[str, Any]:
    """``--from torch exports.qwen3_omni_code2wav:tiny_factory``: the tiny code2wav."""
    return export_module(tiny_code2wav())


# ---- the artifact ---------------------------------------------------------------------

EXPORTS = Path(__file__).resolve().parent
REPO = EXPORTS.parent
ARTIFACT_DIR = EXPORTS / "qwen3-omni-code2wav-tiny"
SAMPLE_RATE = 24000
"""Qwen3-Omni's output rate (vLLM-Omni's code2wav writes 24 kHz WAV)."""
SAMPLES_PER_FRAME = 1920
"""8 × 5 × 4 × 3 × 2 × 2: ``upsample_rates`` times ``upsampling_ratios`` (12.5 frames/s at 24 kHz)."""


def export_args(out: Path | str = ARTIFACT_DIR) -> list[str]:
    """The ``omni-edge export`` arguments that make the tiny code2wav artifact at ``out``."""
    return [
        "export",
        "--from",
        "torch",
        "exports.qwen3_omni_code2wav:tiny_factory",
        "-o",
        str(out),
        "--precision",
        "fp32",
        "--name",
        "qwen3-omni-code2wav-tiny",
        "--license",
        "Apache-2.0",
        "--origin",
        f"transformers' Qwen3OmniMoeCode2Wav at exports/qwen3_omni_code2wav.py:tiny_code2wav_config, "
        f"random weights (seed {TINY_SEED})",
        "--description",
        "Qwen3-Omni code2wav, scaled down with random weights (tests the code path, not the voice): "
        f"frames of {TINY_CODEBOOKS} codec codes in, {SAMPLE_RATE} Hz mono audio out.",
        "--preprocess",
        "exports.qwen3_omni_code2wav:preprocess",
        "--postprocess",
        "exports.qwen3_omni_code2wav:postprocess",
        "--consumes",
        "token_ids",
        "--produces",
        f"audio@{SAMPLE_RATE}",
        "--metadata",
        f"samples_per_frame={SAMPLES_PER_FRAME}",
        "--metadata",
        f"sample_rate={SAMPLE_RATE}",
        "--metadata",
        f"codebooks={TINY_CODEBOOKS}",
        "--metadata",
        f"codebook_size={TINY_CODEBOOK_SIZE}",
    ]


@artifact_hook
def preprocess(item: Any, artifact: Any = None) -> dict[str, np.ndarray]:
    """Codes → ``{"codes": int64 [1, codebooks, frames]}``.

    ``item``: one frame (``codebooks`` ints, as the talker streams them), or frames
    ``[codebooks, frames]`` (what a chunked stage hands over). Codes outside
    ``[0, codebook_size)`` or a wrong codebook count are a ``ValueError`` saying which:
    the graph would otherwise read another codebook's embedding."""
    import numpy as np

    meta = artifact.metadata if artifact is not None else {}
    codebooks, size = (
        int(meta.get("codebooks", TINY_CODEBOOKS)),
        int(meta.get("codebook_size", TINY_CODEBOOK_SIZE)),
    )
    codes = np.asarray(item)
    if (
        codes.dtype.kind not in "iu"
        or codes.ndim not in (1, 2)
        or codes.shape[0] != codebooks
        or codes.size == 0
    ):
        raise ValueError(
            f"code2wav takes frames of {codebooks} integer codes ([{codebooks}] or [{codebooks}, frames]), "
            f"got {codes.dtype} {list(codes.shape)}"
        )
    codes = codes.astype(np.int64).reshape(codebooks, -1)
    bad = (codes < 0) | (codes >= size)
    if bad.any():
        q, f = (int(i[0]) for i in np.nonzero(bad))
        raise ValueError(
            f"code {int(codes[q, f])} (codebook {q}, frame {f}) is outside the codebook [0, {size})"
        )
    return {"codes": codes[None]}


@artifact_hook
def postprocess(outputs: dict[str, np.ndarray], artifact: Any = None) -> AudioItem:
    """``waveform`` ``[1, 1, samples]`` → ``{"audio": float32 [samples], "sample_rate": 24000}``."""
    import numpy as np

    rate = int((artifact.metadata if artifact is not None else {}).get("sample_rate", SAMPLE_RATE))
    return {
        "audio": np.asarray(outputs["waveform"], dtype=np.float32).reshape(-1),
        "sample_rate": rate,
    }


def build(out: Path = ARTIFACT_DIR) -> int:
    """Run ``omni-edge export`` with :func:`export_args` from the repository root (its exit status)."""
    where = out.relative_to(REPO) if out.is_relative_to(REPO) else out
    return subprocess.call(
        [sys.executable, "-m", "orchestrator.cli", *export_args(where), "--force"], cwd=REPO
    )


if __name__ == "__main__":  # python -m exports.qwen3_omni_code2wav build
    if sys.argv[1:] != ["build"]:
        print("usage: python -m exports.qwen3_omni_code2wav build", file=sys.stderr)
        sys.exit(2)
    sys.exit(build())
