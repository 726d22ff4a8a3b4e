"""transformers' own end-to-end Omni generation on the tiny checkpoints: the reference the
pipeline's thinker tokens and talker codes are compared with, computed in the same test on
the same machine from the same weights (greedy, fp32).

The models' ``generate()`` returns the text tokens and the waveform; the talker's codes are
read where the model itself hands them on: Qwen2.5-Omni's ``talker.generate`` result (cut at
the first stop code, as ``generate`` cuts it for token2wav), Qwen3-Omni's codes as passed
to ``code2wav.chunked_decode`` ([1, code groups, frames]). Both are observed by wrapping
the model's own method, not reimplemented.

The reference runs at the stages' own thread count (``threads``: what the plan gave the
transformers stages, :func:`torch_threads`): the tokens and codes are compared for equality,
and with seeded random weights a near-tie can flip a token when the matmuls' sums are split
over another number of threads, as they would be between this process's default and the
stage's pool."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exports import omni_tiny

THINKER_EOS = omni_tiny.TOKEN["<|im_end|>"]
"""Qwen3-Omni's ``generate`` defaults ``thinker_eos_token_id`` to the real vocabulary's <|im_end|>
(151645); the tiny vocabulary's is passed instead (the pipeline's thinker reads it from
generation_config.json)."""


@dataclass
class Reference:
    prompt_ids: list[int]
    tokens: list[int]
    text: str
    codes: list[list[int]]
    """Per step: [code] (Qwen2.5-Omni) or the frame's codes, one per codebook (Qwen3-Omni)."""
    waveform: Any = None
    """The audio ``generate()`` returned (Qwen3-Omni: code2wav on those codes; Qwen2.5-Omni:
    token2wav on them, from :func:`seeded_noise`), float32, mono."""


def seeded_noise(seed: int) -> Any:
    """A stand-in for ``torch.randn`` whose draw is numpy's default generator seeded with ``seed``
    (the same numbers the token2wav stage starts its solver from, for any shape)."""
    import numpy as np
    import torch

    def randn(*size: Any, dtype: Any = None, device: Any = None, **_: Any) -> Any:
        shape = (
            tuple(size[0])
            if len(size) == 1 and isinstance(size[0], (list, tuple, torch.Size))
            else size
        )
        draw = np.random.default_rng(seed).standard_normal(
            tuple(int(d) for d in shape), dtype=np.float32
        )
        return torch.from_numpy(draw).to(dtype=dtype or torch.float32, device=device)

    return randn


def token2wav_reference(
    model_dir: Path, codes: list[int], *, seed: int, steps: int, speaker: str = "Chelsie"
) -> Any:
    """transformers' own ``model.token2wav`` (``Qwen2_5OmniForConditionalGeneration.from_pretrained``,
    its speakers read by ``load_speakers`` from ``spk_dict.pt``) on ``codes``, its noise from
    :func:`seeded_noise`: the waveform, float32, mono."""
    from unittest import mock

    import torch
    import transformers

    model = transformers.Qwen2_5OmniForConditionalGeneration.from_pretrained(
        model_dir, dtype=torch.float32
    ).eval()
    voice = model.speaker_map[speaker]
    with mock.patch("torch.randn", seeded_noise(seed)), torch.no_grad():
        wav = model.token2wav(
            torch.tensor([codes]),
            conditioning=voice["cond"].float(),
            reference_mel=voice["ref_mel"].float(),
            num_steps=steps,
        )
    return wav.float().reshape(-1).numpy()


def torch_threads(stages: list[dict[str, Any]]) -> int:
    """The thread count the transformers stages of a plan (``omni-edge.plan/1``'s ``stages``)
    ran torch at: ``cpu_threads``, one for all of them (torch's pool is one per process)."""
    threads = {s["cpu_threads"] for s in stages if str(s["backend"]).startswith("transformers")}
    assert len(threads) == 1 and None not in threads, threads
    return int(threads.pop())


def prompt_ids(model_dir: Path, prompt: str) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def reference(
    model_dir: Path,
    prompt: str,
    *,
    threads: int,
    thinker_max: int,
    talker_max: int,
    talker_min: int = 0,
    repetition_penalty: float = 1.05,
    token2wav_seed: int = 0,
    token2wav_steps: int = 10,
) -> Reference:
    """``generate()``'s output, computed with torch at ``threads`` threads (the stages' own).
    Qwen2.5-Omni's token2wav starts from ``torch.randn``: here from :func:`seeded_noise`
    (``token2wav_seed``), with ``token2wav_steps`` solver time points."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _generate(
            model_dir,
            prompt,
            thinker_max=thinker_max,
            talker_max=talker_max,
            talker_min=talker_min,
            repetition_penalty=repetition_penalty,
            token2wav_seed=token2wav_seed,
            token2wav_steps=token2wav_steps,
        )
    finally:
        torch.set_num_threads(before)


def _generate(
    model_dir: Path,
    prompt: str,
    *,
    thinker_max: int,
    talker_max: int,
    talker_min: int,
    repetition_penalty: float,
    token2wav_seed: int,
    token2wav_steps: int,
) -> Reference:
    from unittest import mock

    import torch
    import transformers
    from transformers import AutoTokenizer

    ids = prompt_ids(model_dir, prompt)
    input_ids = torch.tensor([ids])
    config = transformers.AutoConfig.from_pretrained(model_dir)
    captured: dict[str, Any] = {}
    common = {
        "thinker_max_new_tokens": thinker_max,
        "thinker_do_sample": False,
        "thinker_eos_token_id": THINKER_EOS,
        "talker_max_new_tokens": talker_max,
        "talker_do_sample": False,
        "talker_repetition_penalty": repetition_penalty,
    }
    if talker_min:
        common["talker_min_new_tokens"] = talker_min
    if config.model_type == "qwen2_5_omni":
        model = transformers.Qwen2_5OmniForConditionalGeneration.from_pretrained(
            model_dir, dtype=torch.float32
        ).eval()
        original = model.talker.generate

        def spy_talker(*args: Any, **kwargs: Any) -> Any:
            captured["talker"] = out = original(*args, **kwargs)
            captured["prompt"] = kwargs["input_ids"].shape[1]
            return out

        model.talker.generate = spy_talker
        stop = [
            model.talker.codec_pad_token,
            model.talker.codec_eos_token,
        ]  # generate's [8292, 8294], tiny ids
        with mock.patch("torch.randn", seeded_noise(token2wav_seed)):
            sequences, wav = model.generate(
                input_ids, talker_eos_token_id=stop, token2wav_num_steps=token2wav_steps, **common
            )
        generated = captured["talker"][0, captured["prompt"] :].tolist()
        cut = next((i for i, c in enumerate(generated) if c in stop), len(generated))
        codes = [[c] for c in generated[:cut]]
        waveform = wav.detach().float().reshape(-1).numpy()
    else:
        model = transformers.Qwen3OmniMoeForConditionalGeneration.from_pretrained(
            model_dir, dtype=torch.float32
        ).eval()
        decode = model.code2wav.chunked_decode

        def spy_code2wav(codes: Any, *args: Any, **kwargs: Any) -> Any:
            captured["codes"] = codes
            return decode(codes, *args, **kwargs)

        model.code2wav.chunked_decode = spy_code2wav
        sequences, wav = model.generate(input_ids, **common)
        codes = captured["codes"][0].transpose(0, 1).tolist()  # [groups, frames] → per frame
        waveform = wav.detach().float().reshape(-1).numpy()
    tokens = sequences[0, len(ids) :].tolist()
    text = AutoTokenizer.from_pretrained(model_dir).decode(tokens, skip_special_tokens=True)
    return Reference(ids, tokens, text, codes, waveform)
