"""transformers' own end-to-end Omni generation on the tiny checkpoints: the reference the
pipeline's thinker tokens and talker codes are compared with, computed in the same test on
the same machine from the same weights (greedy, fp32).

The models' ``generate()`` returns the text tokens and the waveform; the talker's codes are
read where the model itself hands them on: Qwen2.5-Omni's ``talker.generate`` result (cut at
the first stop code, as ``generate`` cuts it for token2wav), Qwen3-Omni's codes as passed
to ``code2wav.chunked_decode`` ([1, code groups, frames]). Both are observed by wrapping
the model's own method, not reimplemented."""

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
    """Qwen3-Omni: the audio ``generate()`` returned (code2wav on those codes), float32, mono."""


def prompt_ids(model_dir: Path, prompt: str) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def reference(model_dir: Path, prompt: str, *, thinker_max: int, talker_max: int, talker_min: int = 0,
              repetition_penalty: float = 1.05) -> Reference:
    import torch
    import transformers
    from transformers import AutoTokenizer

    ids = prompt_ids(model_dir, prompt)
    input_ids = torch.tensor([ids])
    config = transformers.AutoConfig.from_pretrained(model_dir)
    captured: dict[str, Any] = {}
    common = {"thinker_max_new_tokens": thinker_max, "thinker_do_sample": False, "thinker_eos_token_id": THINKER_EOS,
              "talker_max_new_tokens": talker_max, "talker_do_sample": False,
              "talker_repetition_penalty": repetition_penalty}
    if talker_min:
        common["talker_min_new_tokens"] = talker_min
    if config.model_type == "qwen2_5_omni":
        model = transformers.Qwen2_5OmniForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
        original = model.talker.generate

        def spy_talker(*args: Any, **kwargs: Any) -> Any:
            captured["talker"] = out = original(*args, **kwargs)
            captured["prompt"] = kwargs["input_ids"].shape[1]
            return out

        model.talker.generate = spy_talker
        stop = [model.talker.codec_pad_token, model.talker.codec_eos_token]  # generate's [8292, 8294], tiny ids
        sequences, _wav = model.generate(input_ids, talker_eos_token_id=stop, token2wav_num_steps=2, **common)
        generated = captured["talker"][0, captured["prompt"]:].tolist()
        cut = next((i for i, c in enumerate(generated) if c in stop), len(generated))
        codes = [[c] for c in generated[:cut]]
        waveform = None  # token2wav is not exported (docs/omni.md)
    else:
        model = transformers.Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
        decode = model.code2wav.chunked_decode

        def spy_code2wav(codes: Any, *args: Any, **kwargs: Any) -> Any:
            captured["codes"] = codes
            return decode(codes, *args, **kwargs)

        model.code2wav.chunked_decode = spy_code2wav
        sequences, wav = model.generate(input_ids, **common)
        codes = captured["codes"][0].transpose(0, 1).tolist()  # [groups, frames] → per frame
        waveform = wav.detach().float().reshape(-1).numpy()
    tokens = sequences[0, len(ids):].tolist()
    text = AutoTokenizer.from_pretrained(model_dir).decode(tokens, skip_special_tokens=True)
    return Reference(ids, tokens, text, codes, waveform)
