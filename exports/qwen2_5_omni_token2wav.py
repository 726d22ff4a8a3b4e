"""Qwen2.5-Omni's token2wav as graphs: the DiT's velocity step and the BigVGAN vocoder.

Qwen2.5-Omni's token2wav (transformers' ``Qwen2_5OmniToken2WavModel``) is not one
network: a DiT predicts a mel spectrogram by flow matching — ``sample`` integrates
its velocity field with a fixed-step Runge-Kutta-4 solver over 10 time points
(``sway_coefficient`` bends the schedule), each evaluation a batch of two for
classifier-free guidance (``guidance_scale``), from Gaussian noise, conditioned on
the codes, a speaker embedding and a reference mel — then BigVGAN turns the mel
into a 24 kHz waveform.

What exports (tests/exports/test_qwen2_5_omni_token2wav.py measures it):
:func:`dit_step` (one guided velocity evaluation: the solver stays in the
caller) and :func:`traceable_bigvgan` (its anti-aliasing filters given their
channel count, which transformers computes from the input at run time and the
tracer cannot). :func:`build` exports both from a checkpoint directory's
``token2wav.*`` tensors with ``omni-edge export`` (gated on the CPU EP there) and
writes the checkpoint's voices (``spk_dict.pt``: each speaker's ``cond`` and
``ref_mel``) into the DiT artifact as ``voices.npz``, so the ``token2wav`` stage
(``stages/token2wav``) runs the solver loop in numpy with no torch at run time.
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from safetensors import safe_open

from orchestrator.core.fileio import file_sha256
from stages.exported_graph.artifact import save_npz

if TYPE_CHECKING:
    import numpy as np
    import torch


def dit_step(dit: Any) -> Any:
    """A module computing one guided DiT evaluation: ``(x [1, T, mel], reference_mel [1, R, mel],
    speaker [1, T, enc_emb], code [1, N], t [])`` → velocity ``[2, T, mel]`` (conditioned,
    then with the code dropped: the solver mixes them with ``guidance_scale``)."""
    import torch

    class DiTStep(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dit = dit

        def forward(self, x: Any, reference_mel: Any, speaker: Any, code: Any, t: Any) -> Any:
            return self.dit(
                hidden_states=x,
                condition_vector=reference_mel,
                speaker_embedding=speaker,
                quantized_code=code,
                time_step=t,
                apply_cfg=True,
            )

    return DiTStep().eval()


def traceable_bigvgan(vocoder: Any, mel_dim: int) -> Any:
    """``vocoder`` (a ``Qwen2_5OmniToken2WavBigVGANModel``) with each anti-aliasing up- and
    down-sampler's filter expanded once to its channel count (found by one forward on a
    short mel): transformers expands it from the input's shape on every call, which the
    ONNX tracer turns into a convolution kernel of unknown shape. Same output."""
    import torch
    import torch.nn.functional as F
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
        Qwen2_5OmniDownSample1d,
        Qwen2_5OmniUpSample1d,
    )

    samplers = [
        m
        for m in vocoder.modules()
        if isinstance(m, (Qwen2_5OmniUpSample1d, Qwen2_5OmniDownSample1d))
    ]
    channels: dict[int, int] = {}
    hooks = [
        m.register_forward_pre_hook(
            lambda mod, inp: channels.__setitem__(id(mod), int(inp[0].shape[1]))
        )
        for m in samplers
    ]
    with torch.no_grad():
        vocoder(torch.zeros(1, mel_dim, 4))
    for h in hooks:
        h.remove()

    def up(self: Any, x: Any) -> Any:
        x = F.pad(x, (self.pad, self.pad), mode="replicate")
        x = self.ratio * F.conv_transpose1d(
            x, self.fixed_filter, stride=self.stride, groups=self.fixed_filter.shape[0]
        )
        return x[..., self.pad_left : x.shape[-1] - self.pad_right]

    def down(self: Any, x: Any) -> Any:
        x = F.pad(x, (self.pad_left, self.pad_right), mode="replicate")
        return F.conv1d(x, self.fixed_filter, stride=self.stride, groups=self.fixed_filter.shape[0])

    for m in samplers:
        m.register_buffer(
            "fixed_filter", m.filter.expand(channels[id(m)], -1, -1).clone(), persistent=False
        )
        m.forward = types.MethodType(up if isinstance(m, Qwen2_5OmniUpSample1d) else down, m)  # type: ignore[method-assign]
    return vocoder.eval()


OUTPUT_GAIN = 0.003
"""Scale on the redrawn vocoder's last convolution: at unit gain its output has a standard
deviation of about 80 before the [-1, 1] clamp (measured on the tiny DiT's mel from random
codes); 0.003 brings it to about 0.25."""


def audible_bigvgan(vocoder: Any, seed: int) -> None:
    """Redraw ``vocoder``'s convolutions at unit gain (normal, std 1/√fan-in, zero bias) under
    ``seed``, its last one scaled by :data:`OUTPUT_GAIN`: transformers' initialisation (std 0.02)
    shrinks the signal at every layer, so a random tiny BigVGAN says ~1e-7 — silence in a
    16-bit WAV. For the tiny checkpoint only (``exports/omni_tiny.py``); a trained one has learnt them."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, module in sorted(vocoder.named_modules(), key=lambda kv: kv[0]):
            if isinstance(module, torch.nn.Conv1d):  # weight: [out, in / groups, kernel]
                fan_in: float = module.weight.shape[1] * module.weight.shape[2]
            elif isinstance(module, torch.nn.ConvTranspose1d):  # weight: [in, out, kernel]
                fan_in = module.weight.shape[0] * module.weight.shape[2] / module.stride[0]
            else:
                continue
            module.weight.copy_(torch.randn(module.weight.shape, generator=g) / math.sqrt(fan_in))
            if module.bias is not None:
                module.bias.zero_()
        vocoder.conv_post.weight.mul_(OUTPUT_GAIN)


# ---- the tiny checkpoint's token2wav as two artifacts ---------------------------------------

EXPORTS = Path(__file__).resolve().parent
REPO = EXPORTS.parent
CHECKPOINT = EXPORTS / "qwen2_5-omni-tiny"
"""The tiny Qwen2.5-Omni (``python -m exports.omni_tiny build``) whose token2wav is exported."""
DIT_DIR = EXPORTS / "qwen2_5-omni-token2wav-tiny-dit"
BIGVGAN_DIR = EXPORTS / "qwen2_5-omni-token2wav-tiny-bigvgan"
VOICES = "voices.npz"
"""The DiT artifact's file of voices: ``<speaker>.cond`` float32 [enc_emb_dim] and
``<speaker>.ref_mel`` float32 [frames, mel_dim], from the checkpoint's ``spk_dict.pt``."""
SAMPLE_RATE = 24000
"""Qwen2.5-Omni's output rate (BigVGAN at 100 mel frames a second, 240 samples a frame)."""
NUM_STEPS = 10
GUIDANCE_SCALE = 0.5
SWAY_COEFFICIENT = -1.0
"""``Qwen2_5OmniToken2WavModel.forward``'s defaults, which ``generate()`` uses: 10 time
points of the RK4 solver, classifier-free guidance 0.5, sway -1."""
REFERENCE_CODES = 40
"""Codes in the DiT's reference input (80 mel frames: more than three 24-frame attention
blocks, so the gate covers the look-ahead and look-back blocks in full)."""
CALIBRATION_CODES = (7, 33)
REFERENCE_FRAMES = 80
CALIBRATION_FRAMES = (14, 66)
"""Mel frames of the vocoder's reference and calibration inputs (the DiT's lengths × 2)."""


def load_token2wav(checkpoint: Path | str) -> Any:
    """The ``Qwen2_5OmniToken2WavModel`` of a Qwen2.5-Omni checkpoint directory (its
    ``config.json``'s ``token2wav_config`` and its ``token2wav.*`` tensors), fp32, in
    ``eval()`` mode. A tensor the model has and the checkpoint lacks (or the reverse) is a
    ``ValueError`` naming it."""
    import torch
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import (
        Qwen2_5OmniToken2WavConfig,
    )
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

    root = Path(checkpoint)
    config = Qwen2_5OmniToken2WavConfig(
        **json.loads((root / "config.json").read_text())["token2wav_config"]
    )
    model = Qwen2_5OmniToken2WavModel(config)
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(root.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (a safe_open handle is not a mapping)
                if key.startswith("token2wav."):
                    state[key.removeprefix("token2wav.")] = f.get_tensor(key).to(torch.float32)
    wanted = set(model.state_dict())
    if wanted != set(state):
        missing, extra = sorted(wanted - set(state)), sorted(set(state) - wanted)
        raise ValueError(f"{root}: token2wav tensors missing {missing[:5]}, unexpected {extra[:5]}")
    model.load_state_dict(state)
    model.float()
    return model.eval()


def voices(checkpoint: Path | str) -> dict[str, np.ndarray]:
    """The checkpoint's ``spk_dict.pt`` as numpy arrays: ``<speaker>.cond`` [enc_emb_dim],
    ``<speaker>.ref_mel`` [frames, mel_dim] (what ``generate()`` hands token2wav)."""
    import torch

    out: dict[str, np.ndarray] = {}
    for name, params in torch.load(Path(checkpoint) / "spk_dict.pt", weights_only=True).items():
        out[f"{name}.cond"] = params["cond"].float().reshape(-1).numpy()
        out[f"{name}.ref_mel"] = (
            params["ref_mel"].float().reshape(-1, params["ref_mel"].shape[-1]).numpy()
        )
    return out


def _dit_feeds(dit: Any, codes: int, seed: int, ref_mel: Any, cond: Any) -> dict[str, torch.Tensor]:
    import torch

    g = torch.Generator().manual_seed(seed)
    frames = codes * dit.repeats
    return {
        "x": torch.randn(1, frames, dit.config.mel_dim, generator=g),
        "reference_mel": ref_mel[None],
        "speaker": cond.reshape(1, 1, -1).repeat(1, frames, 1),
        "code": torch.randint(0, dit.config.num_embeds, (1, codes), generator=g),
        "t": torch.tensor(0.1 + 0.2 * (seed % 4), dtype=torch.float32),
    }


def dit_factory(checkpoint: Path | str = CHECKPOINT) -> dict[str, Any]:
    """``--from torch``: :func:`dit_step` of ``checkpoint``'s DiT, the first voice's conditioning
    in its reference and calibration inputs, dynamic in codes, mel frames and reference frames."""
    import torch

    dit = load_token2wav(checkpoint).code2wav_dit_model
    first = voices(checkpoint)
    name = next(iter(first)).rsplit(".", 1)[0]
    ref_mel, cond = (
        torch.from_numpy(first[f"{name}.ref_mel"]),
        torch.from_numpy(first[f"{name}.cond"]),
    )
    return {
        "module": dit_step(dit),
        "inputs": _dit_feeds(dit, REFERENCE_CODES, 0, ref_mel, cond),
        "outputs": ["velocity"],
        "dynamic_axes": {
            "x": {1: "frames"},
            "reference_mel": {1: "reference_frames"},
            "speaker": {1: "frames"},
            "code": {1: "codes"},
            "velocity": {1: "frames"},
        },
        "calibration": [
            _dit_feeds(dit, n, i + 1, ref_mel, cond) for i, n in enumerate(CALIBRATION_CODES)
        ],
    }


def bigvgan_factory(checkpoint: Path | str = CHECKPOINT) -> dict[str, Any]:
    """``--from torch``: ``checkpoint``'s BigVGAN (:func:`traceable_bigvgan`): ``mel`` float32
    ``[1, mel_dim, frames]`` in, ``waveform`` float32 ``[samples]`` out (240 per frame)."""
    import torch

    vocoder = load_token2wav(checkpoint).code2wav_bigvgan_model
    mel = int(vocoder.config.mel_dim)

    def feeds(frames: int, seed: int) -> dict[str, Any]:
        # a log-mel around what the DiT makes: the vocoder's input range, not unit noise
        return {
            "mel": torch.randn(1, mel, frames, generator=torch.Generator().manual_seed(seed)) - 5.0
        }

    return {
        "module": traceable_bigvgan(vocoder, mel),
        "inputs": feeds(REFERENCE_FRAMES, 0),
        "outputs": ["waveform"],
        "dynamic_axes": {"mel": {2: "frames"}, "waveform": {0: "samples"}},
        "calibration": [feeds(n, i + 1) for i, n in enumerate(CALIBRATION_FRAMES)],
    }


def checkpoint_digest(checkpoint: Path = CHECKPOINT) -> str:
    """sha256 over the checkpoint's safetensors and ``spk_dict.pt``: recorded in both
    manifests (``metadata.checkpoint_sha256``), so a rebuilt checkpoint is noticed."""
    h = hashlib.sha256()
    for f in [*sorted(checkpoint.glob("*.safetensors")), checkpoint / "spk_dict.pt"]:
        h.update(bytes.fromhex(file_sha256(f)))
    return h.hexdigest()


def export_args(graph: str, out: Path) -> list[str]:
    """The ``omni-edge export`` arguments that make the tiny checkpoint's ``dit`` or ``bigvgan`` artifact."""
    common = [
        "--precision",
        "fp32",
        "--license",
        "Apache-2.0",
        "--metadata",
        f"checkpoint_sha256={checkpoint_digest()}",
        "--origin",
        "transformers' Qwen2_5OmniToken2WavModel of exports/qwen2_5-omni-tiny "
        "(python -m exports.omni_tiny build: random weights)",
    ]
    if graph == "dit":
        dit = {
            "repeats": 2,
            "num_embeds": 8193,  # the config class's defaults, where config.json leaves them out
            **json.loads((CHECKPOINT / "config.json").read_text())["token2wav_config"][
                "dit_config"
            ],
        }
        return [
            "export",
            "--from",
            "torch",
            "exports.qwen2_5_omni_token2wav:dit_factory",
            "-o",
            str(out),
            "--name",
            "qwen2_5-omni-token2wav-tiny-dit",
            *common,
            "--description",
            "Qwen2.5-Omni token2wav's DiT, one guided velocity evaluation (conditioned, then "
            "with the code dropped), scaled down with random weights: the solver loop is the "
            "token2wav stage's.",
            "--metadata",
            f"repeats={dit['repeats']}",
            "--metadata",
            f"num_embeds={dit['num_embeds']}",
            "--metadata",
            f"voices={VOICES}",
            "--metadata",
            f"num_steps={NUM_STEPS}",
            "--metadata",
            f"guidance_scale={GUIDANCE_SCALE}",
            "--metadata",
            f"sway_coefficient={SWAY_COEFFICIENT}",
        ]
    return [
        "export",
        "--from",
        "torch",
        "exports.qwen2_5_omni_token2wav:bigvgan_factory",
        "-o",
        str(out),
        "--name",
        "qwen2_5-omni-token2wav-tiny-bigvgan",
        *common,
        "--description",
        "Qwen2.5-Omni token2wav's BigVGAN vocoder, scaled down with random weights: "
        f"a log-mel spectrogram in, {SAMPLE_RATE} Hz mono audio out.",
        "--produces",
        f"audio@{SAMPLE_RATE}",
        "--metadata",
        f"sample_rate={SAMPLE_RATE}",
    ]


def build(
    checkpoint: Path = CHECKPOINT, dit_dir: Path = DIT_DIR, bigvgan_dir: Path = BIGVGAN_DIR
) -> int:
    """Export both graphs with ``omni-edge export`` from the repository root, then write the
    checkpoint's voices into the DiT artifact (its exit status: the first failure's)."""
    import numpy as np

    if checkpoint != CHECKPOINT:
        raise ValueError(
            "the factories read exports/qwen2_5-omni-tiny; export another checkpoint with "
            "omni-edge export --from torch and a factory of your own (docs/omni.md)"
        )
    for graph, out in (("dit", dit_dir), ("bigvgan", bigvgan_dir)):
        where = out.relative_to(REPO) if out.is_relative_to(REPO) else out
        rc = subprocess.call(
            [sys.executable, "-m", "orchestrator.cli", *export_args(graph, where), "--force"],
            cwd=REPO,
        )
        if rc:
            return rc
        if graph == "dit":
            save_npz(
                out / VOICES, {k: np.ascontiguousarray(v) for k, v in voices(checkpoint).items()}
            )
    return 0


def ensure_built() -> None:
    """Build both artifacts unless both exist and were exported from the checkpoint as it is now."""
    digest = checkpoint_digest()
    for out in (DIT_DIR, BIGVGAN_DIR):
        manifest = out / "manifest.yaml"
        meta = (
            (yaml.safe_load(manifest.read_text()) or {}).get("metadata", {})
            if manifest.is_file()
            else {}
        )
        if meta.get("checkpoint_sha256") != digest or not (DIT_DIR / VOICES).is_file():
            if build():
                raise RuntimeError(
                    "python -m exports.qwen2_5_omni_token2wav build failed (its output is above)"
                )
            return


if __name__ == "__main__":  # python -m exports.qwen2_5_omni_token2wav build
    if sys.argv[1:] != ["build"]:
        print("usage: python -m exports.qwen2_5_omni_token2wav build", file=sys.stderr)
        sys.exit(2)
    sys.exit(build())
