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
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core.errors import BadRequest
from stages.payloads import split_input

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


class _Cancel:
    """A stopping criterion that ends ``generate()`` once the request's consumer is gone."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        return torch.full(
            (input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device
        )


class _Streamer:
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


def _sampling_kwargs(sampling: dict[str, Any]) -> dict[str, Any]:
    """``generate()`` arguments for the stage's sampling (vLLM's names)."""
    temperature = float(sampling.get("temperature", 1.0))
    kwargs: dict[str, Any] = {
        "max_new_tokens": int(sampling.get("max_tokens", 16)),
        "do_sample": temperature > 0,
    }
    if int(sampling.get("min_tokens") or 0):
        kwargs["min_new_tokens"] = int(sampling["min_tokens"])
    if temperature > 0:
        kwargs["temperature"] = temperature
        kwargs["top_p"] = float(sampling.get("top_p", 1.0))
        top_k = int(sampling.get("top_k", -1))
        kwargs["top_k"] = top_k if top_k > 0 else None
    penalty = float(sampling.get("repetition_penalty", 1.0))
    if penalty != 1.0:
        kwargs["repetition_penalty"] = penalty
    return kwargs


def _seed(sampling: dict[str, Any]) -> None:
    if sampling.get("seed") is not None:
        import torch

        torch.manual_seed(int(sampling["seed"]))


def _finish(
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
    sampling: dict[str, Any],
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

    streamer = _Streamer(token)
    kwargs = _sampling_kwargs(sampling)
    if spec is not None:
        kwargs.update(
            eos_token_id=list(spec.eos_token_ids) or None,
            output_hidden_states=True,
            return_dict_in_generate=True,
            use_audio_in_video=False,
        )
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
    _seed(sampling)
    try:
        with torch.no_grad():
            model.generate(
                input_ids=ids,
                streamer=streamer,
                stopping_criteria=StoppingCriteriaList([_Cancel(cancel)]),
                **kwargs,
            )
    finally:
        if hook is not None:
            hook.remove()
    eos = set(spec.eos_token_ids) if spec else set(_as_list(model.generation_config.eos_token_id))
    return _finish(cancel, streamer.last, eos, streamer.count, kwargs["max_new_tokens"])


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def handover_item(spec: HandoverSpec, step: dict[str, Any], next_token: int) -> dict[str, Any]:
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
        self.steps: list[dict[str, Any]] = []
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


def _load_prefixed(model_dir: Path, prefixes: tuple[str, ...]) -> dict[str, Any]:
    """Every tensor of the checkpoint whose name starts with one of ``prefixes`` (read from the
    safetensors files; nothing else is read)."""
    from safetensors import safe_open

    out: dict[str, Any] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                if name.startswith(prefixes):
                    out[name] = f.get_tensor(name)
    return out


_EXPERT = re.compile(
    r"^(?P<base>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$"
)


def _fuse_experts(state: dict[str, Any]) -> dict[str, Any]:
    """MoE experts as the model holds them: the checkpoint stores one ``gate_proj``, ``up_proj`` and
    ``down_proj`` per expert; transformers' MoE layers hold ``experts.gate_up_proj`` [E, 2·I, H] (each
    expert's gate rows, then its up rows) and ``experts.down_proj`` [E, H, I], which its own loader
    builds when it loads the whole model (the same stacking, checked against it by the parity test)."""
    import torch

    out: dict[str, Any] = {}
    experts: dict[str, dict[int, dict[str, Any]]] = {}
    for name, tensor in state.items():
        m = _EXPERT.match(name)
        if m is None:
            out[name] = tensor
        else:
            experts.setdefault(m["base"], {}).setdefault(int(m["e"]), {})[m["proj"]] = tensor
    for base, by_expert in experts.items():
        order = sorted(by_expert)
        out[f"{base}.gate_up_proj"] = torch.stack(
            [torch.cat([by_expert[e]["gate_proj"], by_expert[e]["up_proj"]], dim=0) for e in order]
        )
        out[f"{base}.down_proj"] = torch.stack([by_expert[e]["down_proj"] for e in order])
    return out


class Talker:
    """An Omni talker with the thinker's token embeddings; ``generate`` streams codec codes."""

    def __init__(
        self, config: Any, talker: Any, embed_tokens: Any, speaker: str, device: str
    ) -> None:
        self.config = config
        self.talker = talker
        self.embed_tokens = embed_tokens
        self.speaker = speaker
        self.device = device

    @property
    def thinker_width(self) -> int:
        raise NotImplementedError

    def check(self, handover: Handover) -> None:
        self._check_width(handover.embeds[0].shape[1])

    def _check_width(self, width: int) -> None:
        """``BadRequest`` unless the thinker's hidden states are as wide as this talker reads."""
        if width != self.thinker_width:
            raise BadRequest.single(
                "thinker.hidden_states",
                f"hidden states are {width} wide; this talker reads "
                f"{self.thinker_width} (its thinker's hidden size)",
                "feed the talker from the thinker of the same checkpoint",
            )

    def generate(
        self,
        handover: Handover,
        sampling: dict[str, Any],
        *,
        on_codes: Callable[[list[int]], None],
        cancel: threading.Event,
    ) -> str:
        raise NotImplementedError

    def _tensor(self, array: Any) -> Any:
        import torch

        return torch.as_tensor(array, device=self.device).to(self.talker.dtype).unsqueeze(0)


class Qwen25Talker(Talker):
    """Qwen2.5-Omni's talker: one codec code per step (``Qwen2_5OmniForConditionalGeneration.generate``).

    :meth:`generate` (the whole hand-over) and :meth:`generate_streaming` (the hand-over as it
    arrives) build the same inputs from the same steps: the prompt ids (:meth:`_prompt_ids`), the
    speaker's and the text end's embeddings (:meth:`_embed`), and run the talker the same way
    (:meth:`_talk`)."""

    def __init__(self, *args: Any, speakers: dict[str, Any]) -> None:
        super().__init__(*args)
        if self.speaker not in speakers:
            raise ValueError(
                f"speaker {self.speaker!r} is not in spk_dict.pt ({', '.join(speakers)})"
            )
        self.speaker_params = speakers[self.speaker]

    @property
    def thinker_width(self) -> int:
        return int(self.config.talker_config.embedding_size)

    @property
    def _bos(self) -> int:
        return int(self.speaker_params["bos_token"])

    def _embed(self, token: int) -> Any:
        """The thinker's input embedding of one token id, [1, 1, H]."""
        import torch

        return self.embed_tokens(torch.full((1, 1), token, dtype=torch.long, device=self.device))

    def _prompt_ids(self, input_ids: Any, first_reply: Any) -> tuple[Any, Any]:
        """The talker's ``(input_text_ids, input_ids)``: the thinker's prompt, the speaker's bos and
        the reply's first token; the codec ids mask the prompt, then pad and bos."""
        import torch

        talker, dev = self.talker, self.device
        text_ids = torch.cat(
            [input_ids, torch.full((1, 1), self._bos, dtype=torch.long, device=dev), first_reply],
            dim=-1,
        )
        codec_ids = torch.cat(
            [
                torch.full_like(input_ids, fill_value=talker.codec_mask_token),
                torch.full((1, 1), talker.codec_pad_token, dtype=torch.long, device=dev),
                torch.full((1, 1), talker.codec_bos_token, dtype=torch.long, device=dev),
            ],
            dim=1,
        )
        return text_ids, codec_ids

    def _end_after_eos(
        self, reply: Any, gen_ids: Any, eos_token_ids: list[int], eos_embed: Any, pad_embed: Any
    ) -> Any:
        """``reply`` ended where the thinker ended: the text end in place of the reply's entry
        before its first end-of-sequence token, padding from there on."""
        import torch

        dev = self.device
        eos_ids = torch.as_tensor(eos_token_ids, device=dev).flatten()
        is_eos = (gen_ids.unsqueeze(-1) == eos_ids).any(dim=-1)
        n = gen_ids.shape[1]
        positions = torch.arange(n, device=dev)
        first = torch.where(is_eos, positions, n).min(dim=-1).values.clamp(min=1, max=n - 1)
        reply_positions = torch.arange(reply.shape[1], device=dev).unsqueeze(0)
        reply = torch.where((reply_positions >= first.unsqueeze(1)).unsqueeze(-1), pad_embed, reply)
        return torch.where(
            (reply_positions == (first - 1).unsqueeze(1)).unsqueeze(-1), eos_embed, reply
        )

    def _talk(
        self,
        ids: tuple[Any, Any],
        embeds: Any,
        reply: Any,
        sampling: dict[str, Any],
        on_codes: Callable[[list[int]], None],
        cancel: threading.Event,
    ) -> str:
        """Run the talker's own ``generate()`` on the built inputs, streaming each code but the
        stop ids to ``on_codes``; the finish reason."""
        import torch
        from transformers import StoppingCriteriaList

        talker = self.talker
        text_ids, codec_ids = ids
        stop = [int(getattr(self.config.talker_config, k)) for k in QWEN25_TALKER_EOS]
        kwargs = _sampling_kwargs(sampling)
        streamer = _Streamer(lambda t: None if t in stop else on_codes([t]))
        _seed(sampling)
        with torch.no_grad():
            talker.generate(
                input_ids=codec_ids,
                input_text_ids=text_ids,
                thinker_reply_part=reply,
                inputs_embeds=embeds,
                attention_mask=None,
                suppress_tokens=[talker.codec_bos_token],
                eos_token_id=stop,
                pad_token_id=talker.codec_pad_token,
                use_audio_in_video=False,
                streamer=streamer,
                stopping_criteria=StoppingCriteriaList([_Cancel(cancel)]),
                **kwargs,
            )
        return _finish(cancel, streamer.last, set(stop), streamer.count, kwargs["max_new_tokens"])

    def generate(
        self,
        handover: Handover,
        sampling: dict[str, Any],
        *,
        on_codes: Callable[[list[int]], None],
        cancel: threading.Event,
    ) -> str:
        import torch

        self.check(handover)
        dev = self.device
        input_ids = torch.tensor([handover.prompt_ids], dtype=torch.long, device=dev)
        gen_ids = torch.tensor([handover.generated_ids], dtype=torch.long, device=dev)
        token_embeds = [self._tensor(e) for e in handover.embeds]
        hidden = [self._tensor(h) for h in handover.hidden]
        ids = self._prompt_ids(input_ids, gen_ids[:, :1])
        width = token_embeds[0].shape[-1]
        if len(hidden) > 1:
            reply = torch.cat(hidden[1:], dim=1) + torch.cat(token_embeds[1:], dim=1)
        else:
            reply = token_embeds[0].new_zeros((1, 0, width))
        embeds = hidden[0] + token_embeds[0]
        embeds = torch.cat([embeds, self._embed(self._bos), reply[:, :1, :]], dim=1)
        eos_embed = self._embed(self.talker.text_eos_token)
        pad_embed = self._embed(self.talker.text_pad_token)
        reply = torch.cat([reply[:, 1:, :], eos_embed, pad_embed], dim=1)
        if handover.eos_token_ids:
            reply = self._end_after_eos(
                reply, gen_ids, handover.eos_token_ids, eos_embed, pad_embed
            )
        return self._talk(ids, embeds, reply, sampling, on_codes, cancel)

    def generate_streaming(
        self,
        feed: HandoverFeed,
        sampling: dict[str, Any],
        *,
        on_codes: Callable[[list[int]], None],
        cancel: threading.Event,
    ) -> str:
        """The same talker started on the thinker's first two steps (vLLM-Omni's ``async_chunk``):
        the prefill reads the prompt's step and the first generated token's; each later step reads
        the next entry of what ``generate`` would have built whole (the next fed token's hidden
        state + embedding, then the text end, then padding), waiting for the thinker when it is
        behind. Codes are those of :meth:`generate` (the parity test runs both)."""
        import torch

        if not feed.wait(0, cancel):
            if cancel.is_set():
                return "abort"
            raise BadRequest.single(
                feed.key,
                "the thinker handed over no hidden states (did it generate a token?)",
                HOW_TO_FEED,
            )
        feed.wait(1, cancel)
        dev = self.device
        first = feed.steps[0]
        self._check_width(int(first["embeds"].shape[1]))
        input_ids = torch.tensor(
            [[int(t) for t in first["token_ids"]]], dtype=torch.long, device=dev
        )
        gen0 = int(first["next_token"].reshape(-1)[0])
        ids = self._prompt_ids(input_ids, torch.tensor([[gen0]], dtype=torch.long, device=dev))
        entry = self._step_entry
        embeds = torch.cat(
            [
                entry(feed.steps[0]),
                self._embed(self._bos),
                *([entry(feed.steps[1])] if len(feed.steps) > 1 else []),
            ],
            dim=1,
        )
        eos_embed = self._embed(self.talker.text_eos_token)
        pad_embed = self._embed(self.talker.text_pad_token)
        before = self._reply_feeder(feed, cancel, eos_embed, pad_embed)
        hook = self.talker.register_forward_pre_hook(before, with_kwargs=True)
        try:
            reply = torch.cat([pad_embed, pad_embed], dim=1)
            return self._talk(ids, embeds, reply, sampling, on_codes, cancel)
        finally:
            hook.remove()

    def _step_entry(self, step: dict[str, Any]) -> Any:
        """A hand-over step's hidden state + embedding, as :meth:`generate` adds them."""
        return self._tensor(step["hidden"]) + self._tensor(step["embeds"])

    def _reply_feeder(
        self, feed: HandoverFeed, cancel: threading.Event, eos_embed: Any, pad_embed: Any
    ) -> Callable[[Any, Any, dict[str, Any]], Any]:
        """A forward pre-hook that hands each decode step the next entry of ``thinker_reply_part``
        as :meth:`generate` would have built it whole, waiting for the thinker when it is behind."""
        import torch

        decoded = [0]

        def remaining(j: int) -> Any:
            # generate()'s thinker_reply_part after the prefill took its first entry: the steps
            # from the third on, the text end, then padding
            if feed.wait(j + 2, cancel):
                return self._step_entry(feed.steps[j + 2])
            return eos_embed if j == max(len(feed.steps) - 2, 0) else pad_embed

        def before(module: Any, args: Any, kwargs: dict[str, Any]) -> Any:
            if (
                kwargs.get("inputs_embeds") is None
            ):  # a decode step: it reads thinker_reply_part's first entry
                kwargs["thinker_reply_part"] = torch.cat([remaining(decoded[0]), pad_embed], dim=1)
                decoded[0] += 1
            return args, kwargs

        return before


class _Qwen3Shim:
    """What ``Qwen3OmniMoeForConditionalGeneration``'s talker-input methods read from ``self``."""

    def __init__(self, config: Any, talker: Any) -> None:
        self.config = config
        self.talker = talker


class Qwen3Talker(Talker):
    """Qwen3-Omni's talker: per step one frame of ``num_code_groups`` codes — its own first codebook
    and its code predictor's (MTP) residual codebooks (``Qwen3OmniMoeForConditionalGeneration.generate``).

    :meth:`generate` builds the talker's inputs in the model's own order: the user turn
    (:meth:`_user_part`), the assistant turn (:meth:`_assistant_part`) with its trailing text
    ended where the thinker ended (:meth:`_end_after_eos`), then runs the talker (:meth:`_talk`)."""

    @property
    def thinker_width(self) -> int:
        return int(self.config.talker_config.thinker_hidden_size)

    def generate(
        self,
        handover: Handover,
        sampling: dict[str, Any],
        *,
        on_codes: Callable[[list[int]], None],
        cancel: threading.Event,
    ) -> str:
        import torch

        self.check(handover)
        tcfg, dev = self.config.talker_config, self.device
        speaker_id = tcfg.speaker_id.get(self.speaker.lower())
        if speaker_id is None:
            raise ValueError(f"speaker {self.speaker!r} is not one of {', '.join(tcfg.speaker_id)}")
        input_ids = torch.tensor([handover.prompt_ids], dtype=torch.long, device=dev)
        sequences = torch.tensor(
            [handover.prompt_ids + handover.generated_ids], dtype=torch.long, device=dev
        )
        thinker_embed = torch.cat([self._tensor(e) for e in handover.embeds], dim=1)
        thinker_hidden = torch.cat([self._tensor(h) for h in handover.hidden], dim=1)
        user_embeds, user_ids, user_attention = self._user_part(
            input_ids, sequences, thinker_hidden, thinker_embed
        )
        assistant_embeds, assistant_ids, trailing, tts_pad, tts_eos = self._assistant_part(
            input_ids, sequences, speaker_id, thinker_embed
        )
        if handover.eos_token_ids:
            trailing = self._end_after_eos(
                trailing,
                sequences[:, input_ids.shape[1] :],
                handover.eos_token_ids,
                tts_pad,
                tts_eos,
            )
        embeds = torch.cat((user_embeds, assistant_embeds), dim=1)
        ids = torch.cat((user_ids, assistant_ids), dim=1)
        mask = torch.cat(
            (user_attention, user_attention.new_ones((1, assistant_embeds.shape[1]))), dim=1
        )
        inputs = {
            "inputs_embeds": embeds,
            "trailing_text_hidden": trailing,
            "tts_pad_embed": tts_pad,
            "talker_input_ids": ids,
            "attention_mask": mask,
        }
        return self._talk(inputs, sampling, on_codes, cancel)

    def _shim(self) -> Any:
        """This talker read like the whole model's ``self``, and the whole model's class."""
        import transformers

        return transformers.Qwen3OmniMoeForConditionalGeneration, _Qwen3Shim(
            self.config, self.talker
        )

    def _user_part(
        self, input_ids: Any, sequences: Any, thinker_hidden: Any, thinker_embed: Any
    ) -> tuple[Any, Any, Any]:
        """The user turns' ``(embeds, ids, attention)`` as ``generate()`` builds them: the thinker's
        states of every token whose turn starts with the user role, left-padded."""
        import torch

        whole, shim = self._shim()
        cfg, dev = self.config, self.device
        th = cfg.thinker_config
        multimodal_mask = (
            (sequences == th.audio_token_id)
            | (sequences == th.image_token_id)
            | (sequences == th.video_token_id)
        )
        attention = input_ids.new_ones(input_ids.shape)
        length = input_ids.shape[1]
        positions = torch.arange(length, device=dev).unsqueeze(0).expand_as(input_ids)
        im_start = torch.where(
            input_ids == cfg.im_start_token_id, positions, positions.new_full((), -1)
        )
        previous = torch.cummax(im_start, dim=-1).values.clamp_min(0)
        roles = input_ids.gather(1, (previous + 1).clamp_max(length - 1))
        user_mask = (roles == cfg.user_token_id) & attention.bool()
        user_lengths = user_mask.sum(dim=-1)
        max_user = int(user_lengths.max().item())
        user_indices = torch.where(user_mask, length + positions, positions).argsort(dim=-1)[
            :, -max_user:
        ]
        full_user = whole._get_talker_user_parts(
            shim, 0, length, multimodal_mask, thinker_hidden, thinker_embed
        )
        user_embeds = full_user.gather(
            1, user_indices.unsqueeze(-1).expand(-1, -1, full_user.shape[-1])
        )
        user_ids = sequences[:, :length].gather(1, user_indices)
        user_attention = (
            torch.arange(max_user, device=dev).unsqueeze(0)
            >= (max_user - user_lengths).unsqueeze(1)
        ).to(attention.dtype)
        return user_embeds, user_ids, user_attention

    def _assistant_part(
        self, input_ids: Any, sequences: Any, speaker_id: int, thinker_embed: Any
    ) -> tuple[Any, Any, Any, Any, Any]:
        """The last assistant turn's ``(embeds, ids, trailing text)`` as ``generate()`` builds them,
        with the projected text pad and end embeddings (``BadRequest`` when the prompt has no
        assistant turn)."""
        import torch

        whole, shim = self._shim()
        cfg, dev = self.config, self.device
        starts = (input_ids[:, :-1] == cfg.im_start_token_id) & (
            input_ids[:, 1:] == cfg.assistant_token_id
        )
        found = torch.nonzero(starts[0], as_tuple=False).flatten()
        if found.numel() == 0:
            raise BadRequest.single(
                "thinker.hidden_states",
                "the thinker's prompt has no assistant turn",
                "the thinker must apply its chat template with the generation prompt",
            )
        assistant_start = int(found[-1].item())
        special = torch.tensor(
            [[cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id]],
            device=dev,
            dtype=input_ids.dtype,
        )
        tts_bos, tts_eos, tts_pad = self.talker.text_projection(self.embed_tokens(special)).chunk(
            3, dim=1
        )
        assistant_embeds, assistant_ids, trailing = whole._get_talker_assistant_parts(
            shim,
            assistant_start,
            sequences.shape[-1],
            speaker_id,
            thinker_embed,
            tts_pad,
            tts_bos,
            tts_eos,
        )
        return assistant_embeds, assistant_ids, trailing, tts_pad, tts_eos

    def _end_after_eos(
        self, trailing: Any, gen: Any, eos_token_ids: list[int], tts_pad: Any, tts_eos: Any
    ) -> Any:
        """``trailing`` ended where the thinker ended: the text end at its first end-of-sequence
        token, padding after it."""
        import torch

        dev = self.device
        eos_ids = torch.as_tensor(eos_token_ids, device=dev).flatten()
        is_eos = (gen.unsqueeze(-1) == eos_ids).any(dim=-1)
        n = gen.shape[1]
        first = torch.where(is_eos, torch.arange(n, device=dev), n).min(dim=-1).values
        trailing_positions = torch.arange(trailing.shape[1], device=dev).unsqueeze(0)
        trailing = torch.where(
            (trailing_positions > first.unsqueeze(1)).unsqueeze(-1),
            tts_pad.to(trailing.dtype),
            trailing,
        )
        return torch.where(
            (trailing_positions == first.unsqueeze(1)).unsqueeze(-1),
            tts_eos.to(trailing.dtype),
            trailing,
        )

    def _talk(
        self,
        inputs: dict[str, Any],
        sampling: dict[str, Any],
        on_codes: Callable[[list[int]], None],
        cancel: threading.Event,
    ) -> str:
        """Run the talker's own ``generate()`` on the built inputs, handing each step's frame of
        codes (its code predictor's output) to ``on_codes``; the finish reason."""
        import torch
        from transformers import StoppingCriteriaList

        tcfg = self.config.talker_config
        vocab = int(tcfg.text_config.vocab_size)
        suppressed = [i for i in range(vocab - 1024, vocab) if i != tcfg.codec_eos_token_id]
        kwargs = _sampling_kwargs(sampling)

        def capture(module: Any, args: Any, output: Any) -> None:
            codes = output.hidden_states[-1]
            if codes is not None:
                on_codes([int(c) for c in codes.reshape(-1).tolist()])

        hook = self.talker.register_forward_hook(capture)
        streamer = _Streamer(lambda t: None)
        _seed(sampling)
        try:
            with torch.no_grad():
                self.talker.generate(
                    **inputs,
                    eos_token_id=tcfg.codec_eos_token_id,
                    suppress_tokens=suppressed,
                    output_hidden_states=True,
                    return_dict_in_generate=True,
                    streamer=streamer,
                    stopping_criteria=StoppingCriteriaList([_Cancel(cancel)]),
                    **kwargs,
                )
        finally:
            hook.remove()
        return _finish(
            cancel,
            streamer.last,
            {int(tcfg.codec_eos_token_id)},
            streamer.count,
            kwargs["max_new_tokens"],
        )


def load_talker(model_dir: Path, *, dtype: Any, device: str, speaker: str | None) -> Talker:
    """The talker of an Omni checkpoint: its own weights (``talker.*``) and the thinker's token
    embeddings, nothing else read from disk."""
    import torch
    import transformers

    mtype = model_type(model_dir)
    if mtype not in OMNI_MODEL_TYPES:
        raise ValueError(
            f"{model_dir} is a {mtype!r} checkpoint; a talker needs one of {', '.join(OMNI_MODEL_TYPES)}"
        )
    config = transformers.AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
    talker_cls = getattr(transformers, OMNI_MODEL_TYPES[mtype][1])
    embed_name = "thinker.model.embed_tokens.weight"
    tensors = _load_prefixed(model_dir, ("talker.", embed_name))
    if embed_name not in tensors:
        raise ValueError(
            f"{model_dir} has no {embed_name} (the thinker's token embeddings the talker reads)"
        )
    embed = torch.nn.Embedding.from_pretrained(tensors.pop(embed_name).to(dtype), freeze=True)
    talker = talker_cls._from_config(config.talker_config, dtype=dtype)
    state = {name[len("talker.") :]: t for name, t in tensors.items()}
    if any(
        k.endswith("experts.gate_up_proj") for k in talker.state_dict()
    ):  # transformers >= 5 fuses experts
        state = _fuse_experts(state)
    missing, unexpected = talker.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"the checkpoint's talker.* tensors do not match {talker_cls.__name__}: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    talker.eval().to(device)
    embed.to(device)
    chosen = speaker or DEFAULT_SPEAKER[mtype]
    if mtype == "qwen2_5_omni":
        speakers = torch.load(model_dir / "spk_dict.pt", weights_only=True)
        return Qwen25Talker(config, talker, embed, chosen, device, speakers=speakers)
    return Qwen3Talker(config, talker, embed, chosen, device)
