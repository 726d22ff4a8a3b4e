"""Omni sub-models on transformers: the thinker's hand-over, and the talker fed from it.

Imported only by :mod:`stages.ar_decode.engines.transformers_runner` inside a device actor; torch and
transformers are imported inside the functions.

The hand-over is what transformers' ``Qwen2_5OmniForConditionalGeneration.generate``
and ``Qwen3OmniMoeForConditionalGeneration.generate`` take from
``thinker.generate(output_hidden_states=True)`` — and what vLLM-Omni's thinker2talker
hands its talker: for every forward step of the thinker, the input embeddings of the
tokens it fed (layer 0 of ``hidden_states``) and their hidden states at the layer the
talker reads, with the token ids. One step is one item on the thinker's
``hidden_states`` port (:func:`handover_item`), plain numpy arrays:

==================  ==============  ====================================================
key                 dtype, shape    what
==================  ==============  ====================================================
``step``            int64 [1]       the forward step (0: the prompt)
``token_ids``       int64 [n]       the tokens this step fed (the prompt, then one)
``embeds``          float32 [n, H]  their input embeddings (H: the thinker's hidden size)
``hidden``          float32 [n, H]  their hidden states at ``layer``
``next_token``      int64 [1]       the token this step sampled
``eos_token_ids``   int64 [k]       the thinker's end-of-sequence ids
``layer``           int64 [1]       which of ``hidden_states`` ``hidden`` is (-1: the last)
==================  ==============  ====================================================

:class:`Qwen25Talker` and :class:`Qwen3Talker` rebuild the talker's inputs from the
items line for line as the model's own ``generate()`` builds them (text prompts: the
audio/image/video masking those methods apply only when such inputs were given is
not needed), then call the talker's own ``generate()``.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from orchestrator.core.errors import BadRequest
from stages.payloads import split_input

if TYPE_CHECKING:
    import numpy as np

    from stages.requests import Sampling

log = logging.getLogger(__name__)

OMNI_MODEL_TYPES = {
    "qwen2_5_omni": (
        "Qwen2_5OmniForConditionalGeneration",
        "Qwen2_5OmniTalkerForConditionalGeneration",
    ),
    "qwen3_omni_moe": (
        "Qwen3OmniMoeForConditionalGeneration",
        "Qwen3OmniMoeTalkerForConditionalGeneration",
    ),
}
"""``model_type`` of an Omni checkpoint → (its whole model class, its talker class) in transformers."""
HANDOVER_KEYS = ("step", "token_ids", "embeds", "hidden", "next_token", "eos_token_ids", "layer")
DEFAULT_SPEAKER = {"qwen2_5_omni": "Chelsie", "qwen3_omni_moe": "ethan"}
"""The speaker each model's own ``generate()`` uses when none is named."""
QWEN25_TALKER_EOS = ("tts_codec_pad_token_id", "tts_codec_end_token_id")
"""Qwen2.5-Omni's ``generate()`` stops the talker at ``[8292, 8294]``: its codec pad and end ids
(read here from talker_config, so a scaled-down vocabulary keeps the same meaning)."""


def model_type(model_dir: Path) -> str | None:
    try:
        return str(
            json.loads((model_dir / "config.json").read_text(encoding="utf-8")).get("model_type")
        )
    except (OSError, ValueError):
        return None


@functools.lru_cache(maxsize=4)
def tokenizer_for(model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)


@dataclass(frozen=True)
class HandoverSpec:
    """What a thinker hands over: the layer of ``hidden_states`` the talker reads, its end ids."""

    layer: int
    eos_token_ids: tuple[int, ...]


def load_text_model(
    model_dir: Path, *, model_stage: str | None, dtype: Any, device: str
) -> tuple[Any, HandoverSpec | None]:
    """The model ``generate()`` runs for a text stage, and the hand-over a thinker makes (else None)."""
    import transformers

    mtype = model_type(model_dir)
    if mtype in OMNI_MODEL_TYPES:
        if model_stage not in (None, "thinker"):
            raise ValueError(f"model_stage {model_stage!r} of {mtype} is not a text stage")
        config = transformers.AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
        config.enable_audio_output = (
            False  # the thinker only: the talker's and vocoder's weights stay on disk
        )
        whole = getattr(transformers, OMNI_MODEL_TYPES[mtype][0]).from_pretrained(
            model_dir, config=config, dtype=dtype, trust_remote_code=False, use_safetensors=True
        )
        whole.eval().to(device)
        eos = whole.generation_config.eos_token_id
        eos_ids = (
            tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
            if eos is not None
            else ()
        )
        layer = int(config.talker_config.accept_hidden_layer) if mtype == "qwen3_omni_moe" else -1
        return whole.thinker, HandoverSpec(layer, eos_ids)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=dtype, trust_remote_code=False, use_safetensors=True
    )
    return model.eval().to(device), None


class Cancel:
    """A stopping criterion that ends ``generate()`` once the request's consumer is gone."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        return torch.full(
            (input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device
        )


class Streamer:
    """``generate()``'s streamer: the first ``put`` is the prompt, each later one a sampled token."""

    def __init__(self, on_token: Callable[[int], None]) -> None:
        self.on_token = on_token
        self.prompt_seen = False
        self.last: int | None = None
        self.count = 0

    def put(self, value: Any) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.last = int(value.reshape(-1)[0])
        self.count += 1
        self.on_token(self.last)

    def end(self) -> None:
        pass


class GenerateKwargs(TypedDict, total=False):
    """transformers' ``generate()`` arguments a request's sampling sets (and, for a thinker
    that hands over, what its hand-over needs)."""

    max_new_tokens: int
    do_sample: bool
    min_new_tokens: int
    temperature: float
    top_p: float
    top_k: int | None
    repetition_penalty: float
    eos_token_id: list[int] | None
    output_hidden_states: bool
    return_dict_in_generate: bool
    use_audio_in_video: bool


def sampling_kwargs(sampling: Sampling) -> GenerateKwargs:
    """``generate()`` arguments for the stage's sampling (vLLM's names)."""
    temperature = float(sampling.get("temperature", 1.0))
    kwargs = GenerateKwargs(
        max_new_tokens=int(sampling.get("max_tokens", 16)), do_sample=temperature > 0
    )
    min_tokens = int(sampling.get("min_tokens") or 0)
    if min_tokens:
        kwargs["min_new_tokens"] = min_tokens
    if temperature > 0:
        kwargs["temperature"] = temperature
        kwargs["top_p"] = float(sampling.get("top_p", 1.0))
        top_k = int(sampling.get("top_k", -1))
        kwargs["top_k"] = top_k if top_k > 0 else None
    penalty = float(sampling.get("repetition_penalty", 1.0))
    if penalty != 1.0:
        kwargs["repetition_penalty"] = penalty
    return kwargs


def seed_from(sampling: Sampling) -> None:
    seed = sampling.get("seed")
    if seed is not None:
        import torch

        torch.manual_seed(int(seed))


def finish_reason_of(
    cancel: threading.Event, last: int | None, eos: set[int], produced: int, max_new: int
) -> str:
    if cancel.is_set():
        return "abort"
    if last is not None and last in eos:
        return "stop"
    return "length" if produced >= max_new else "stop"


def generate_text(
    model: Any,
    spec: HandoverSpec | None,
    prompt_ids: list[int],
    sampling: Sampling,
    *,
    on_token: Callable[[int], None],
    on_step: Callable[[Any, Any, Any], None] | None,
    cancel: threading.Event,
    device: str,
) -> str:
    """Run ``model.generate`` on one prompt; ``on_token`` per sampled token, ``on_step(fed, embeds,
    hidden)`` per forward step (a thinker's hand-over). Returns the finish reason."""
    import torch
    from transformers import StoppingCriteriaList

    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    fed: list[list[int]] = [list(prompt_ids)]

    def token(t: int) -> None:
        fed.append([t])
        on_token(t)

    streamer = Streamer(token)
    kwargs = sampling_kwargs(sampling)
    if spec is not None:
        kwargs["eos_token_id"] = list(spec.eos_token_ids) or None
        kwargs["output_hidden_states"] = True
        kwargs["return_dict_in_generate"] = True
        kwargs["use_audio_in_video"] = False
    hook = None
    if on_step is not None and spec is not None:
        layer = spec.layer

        def capture(module: Any, args: Any, output: Any) -> None:
            states = output.hidden_states
            on_step(
                fed[-1],
                states[0][0].detach().float().cpu().numpy(),
                states[layer][0].detach().float().cpu().numpy(),
            )

        hook = model.register_forward_hook(capture)
    seed_from(sampling)
    try:
        with torch.no_grad():
            model.generate(
                input_ids=ids,
                streamer=streamer,
                stopping_criteria=StoppingCriteriaList([Cancel(cancel)]),
                **kwargs,
            )
    finally:
        if hook is not None:
            hook.remove()
    eos = set(spec.eos_token_ids) if spec else set(_as_list(model.generation_config.eos_token_id))
    return finish_reason_of(cancel, streamer.last, eos, streamer.count, kwargs["max_new_tokens"])


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def handover_item(
    spec: HandoverSpec, step: dict[str, np.ndarray], next_token: int
) -> dict[str, np.ndarray]:
    """One forward step of the thinker as its ``hidden_states`` item (the table in the module docstring)."""
    import numpy as np

    return {
        "step": np.asarray([step["step"]], dtype=np.int64),
        "token_ids": np.asarray(step["token_ids"], dtype=np.int64),
        "embeds": np.asarray(step["embeds"], dtype=np.float32),
        "hidden": np.asarray(step["hidden"], dtype=np.float32),
        "next_token": np.asarray([next_token], dtype=np.int64),
        "eos_token_ids": np.asarray(spec.eos_token_ids, dtype=np.int64),
        "layer": np.asarray([spec.layer], dtype=np.int64),
    }


class Detokenizer:
    """Text deltas from tokens, one at a time: a multi-byte character is held until it is whole."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = ""

    def add(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta

    def flush(self) -> str:
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        delta, self.sent = text[len(self.sent) :], text
        return delta


# ---- the talker's side ---------------------------------------------------------------------


@dataclass
class Handover:
    """The thinker's whole hand-over, as the talker reads it (arrays, batch of one)."""

    prompt_ids: list[int]
    generated_ids: list[int]
    embeds: list[Any]
    """float32 [n_i, H] per forward step (the prompt's first)."""
    hidden: list[Any]
    eos_token_ids: list[int]
    layer: int

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)


HOW_TO_FEED = "feed the talker from its thinker: inputs [thinker.hidden_states, thinker.text], join: all (or latest)"


def hidden_key(stage: Any, joined: Any) -> str:
    """The key of a joined item that holds the thinker's hidden states (``BadRequest`` when none)."""
    keys = (
        [k for k in joined if split_input(str(k))[1] == "hidden_states"]
        if isinstance(joined, dict)
        else []
    )
    if len(keys) != 1:
        got = sorted(joined) if isinstance(joined, dict) else type(joined).__name__
        raise BadRequest.single(
            f"stages.{stage.name}.inputs", f"no thinker hidden_states among {got}", HOW_TO_FEED
        )
    return str(keys[0])


def check_step(step: Any, where: str, width: int | None) -> tuple[Any, Any, Any]:
    """One hand-over item's ``(embeds, hidden, token_ids)`` arrays; ``BadRequest`` naming ``where``."""
    import numpy as np

    if not isinstance(step, dict) or set(step) != set(HANDOVER_KEYS):
        got = sorted(step) if isinstance(step, dict) else type(step).__name__
        raise BadRequest.single(
            where, f"is {got}, not the thinker's hand-over {list(HANDOVER_KEYS)}", HOW_TO_FEED
        )
    e, h, t = (
        np.asarray(step["embeds"]),
        np.asarray(step["hidden"]),
        np.asarray(step["token_ids"]).reshape(-1),
    )
    if (
        e.ndim != 2
        or h.shape != e.shape
        or e.shape[0] != t.shape[0]
        or (width is not None and e.shape[1] != width)
    ):
        raise BadRequest.single(
            where,
            f"embeds {e.shape} / hidden {h.shape} / token_ids {t.shape} do not agree: "
            f"each must be [tokens, {width or 'hidden'}]",
            HOW_TO_FEED,
        )
    return e, h, t


class HandoverFeed:
    """The thinker's hand-over as it arrives (a ``latest`` join: one step per joined item), for a
    talker that starts on its first steps; the generation thread waits here for the step it needs."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.steps: list[dict[str, np.ndarray]] = []
        self.finished = False
        self._cond = threading.Condition()

    def add(self, step: Any) -> None:
        """Append the next step (a repeated one — ``latest`` re-sends the newest with each other input's
        item — is skipped); ``BadRequest`` for one out of order or malformed."""
        import numpy as np

        width = self.steps[0]["embeds"].shape[1] if self.steps else None
        check_step(step, f"{self.key}[{len(self.steps)}]", width)
        index = int(np.asarray(step["step"]).reshape(-1)[0])
        with self._cond:
            if index < len(self.steps):
                return
            if index != len(self.steps):
                raise BadRequest.single(
                    f"{self.key}[{len(self.steps)}]",
                    f"is step {index}, not {len(self.steps)}",
                    "the thinker's steps must arrive in order (join: latest or all)",
                )
            self.steps.append({k: np.asarray(v) for k, v in step.items()})
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self.finished = True
            self._cond.notify_all()

    def wait(self, i: int, cancel: threading.Event) -> bool:
        """Whether step ``i`` arrived, waiting for it until the thinker ends or the request is cancelled."""
        with self._cond:
            while len(self.steps) <= i and not self.finished and not cancel.is_set():
                self._cond.wait(0.05)
            return len(self.steps) > i


def joined_handover(stage: Any, items: list[Any]) -> Handover:
    """The talker's joined input (``{"thinker.hidden_states": [...], "thinker.text": [...]}``, as the
    ``all`` join hands it) as a :class:`Handover`; ``BadRequest`` (where, what, fix) for anything else."""
    import numpy as np

    how = HOW_TO_FEED
    if len(items) != 1 or not isinstance(items[0], dict):
        raise BadRequest.single(
            f"stages.{stage.name}.inputs",
            "the talker takes one joined item (its thinker's whole hand-over)",
            how,
        )
    joined = items[0]
    key = hidden_key(stage, joined)
    steps = joined[key]
    if not isinstance(steps, list) or not steps:
        raise BadRequest.single(
            key, "the thinker handed over no hidden states (did it generate a token?)", how
        )
    embeds, hidden, prompt, generated = [], [], [], []
    eos: list[int] = []
    layer = -1
    width = None
    for i, step in enumerate(steps):
        e, h, t = check_step(step, f"{key}[{i}]", width)
        width = e.shape[1]
        embeds.append(e)
        hidden.append(h)
        if i == 0:
            prompt = [int(x) for x in t]
            eos = [int(x) for x in np.asarray(step["eos_token_ids"]).reshape(-1)]
            layer = int(np.asarray(step["layer"]).reshape(-1)[0])
        generated.append(int(np.asarray(step["next_token"]).reshape(-1)[0]))
    return Handover(prompt, generated, embeds, hidden, eos, layer)
