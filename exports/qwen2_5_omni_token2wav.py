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
tracer cannot). What is not built: the stage that runs the solver loop between
the two graphs and feeds it the voice's conditioning (the checkpoint's
``spk_dict.pt``); until it is, the pipeline's token2wav stage is refused with
``no_exported_graph`` (configs/models/qwen2.5-omni-3b/code2wav, docs/omni.md).
"""

from __future__ import annotations

import types
from typing import Any


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
            return self.dit(hidden_states=x, condition_vector=reference_mel, speaker_embedding=speaker,
                            quantized_code=code, time_step=t, apply_cfg=True)

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

    samplers = [m for m in vocoder.modules() if isinstance(m, (Qwen2_5OmniUpSample1d, Qwen2_5OmniDownSample1d))]
    channels: dict[int, int] = {}
    hooks = [m.register_forward_pre_hook(lambda mod, inp: channels.__setitem__(id(mod), int(inp[0].shape[1])))
             for m in samplers]
    with torch.no_grad():
        vocoder(torch.zeros(1, mel_dim, 4))
    for h in hooks:
        h.remove()

    def up(self: Any, x: Any) -> Any:
        x = F.pad(x, (self.pad, self.pad), mode="replicate")
        x = self.ratio * F.conv_transpose1d(x, self.fixed_filter, stride=self.stride, groups=self.fixed_filter.shape[0])
        return x[..., self.pad_left:x.shape[-1] - self.pad_right]

    def down(self: Any, x: Any) -> Any:
        x = F.pad(x, (self.pad_left, self.pad_right), mode="replicate")
        return F.conv1d(x, self.fixed_filter, stride=self.stride, groups=self.fixed_filter.shape[0])

    for m in samplers:
        m.register_buffer("fixed_filter", m.filter.expand(channels[id(m)], -1, -1).clone(), persistent=False)
        m.forward = types.MethodType(up if isinstance(m, Qwen2_5OmniUpSample1d) else down, m)  # type: ignore[method-assign]
    return vocoder.eval()
