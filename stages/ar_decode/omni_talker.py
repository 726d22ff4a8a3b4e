"""An Omni checkpoint's talker, run by transformers: its own tensors loaded from the checkpoint (Qwen3-Omni's experts fused), the hand-over from its thinker turned into codec codes, one class per model family (Qwen25Talker, Qwen3Talker; load_talker picks it)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.errors import BadRequest
from stages.ar_decode.omni import (
    DEFAULT_SPEAKER,
    HOW_TO_FEED,
    OMNI_MODEL_TYPES,
    QWEN25_TALKER_EOS,
    Cancel,
    Handover,
    HandoverFeed,
    Streamer,
    finish_reason_of,
    model_type,
    sampling_kwargs,
    seed_from,
)

if TYPE_CHECKING:
    import torch

    from stages.requests import Sampling


def _load_prefixed(model_dir: Path, prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint whose name starts with one of ``prefixes`` (read from the
    safetensors files; nothing else is read)."""
    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                if name.startswith(prefixes):
                    out[name] = f.get_tensor(name)
    return out


_EXPERT = re.compile(
    r"^(?P<base>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$"
)


def _fuse_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """MoE experts as the model holds them: the checkpoint stores one ``gate_proj``, ``up_proj`` and
    ``down_proj`` per expert; transformers' MoE layers hold ``experts.gate_up_proj`` [E, 2·I, H] (each
    expert's gate rows, then its up rows) and ``experts.down_proj`` [E, H, I], which its own loader
    builds when it loads the whole model (the same stacking, checked against it by the parity test)."""
    import torch

    out: dict[str, torch.Tensor] = {}
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
        sampling: Sampling,
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
        sampling: Sampling,
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
        kwargs = sampling_kwargs(sampling)
        streamer = Streamer(lambda t: None if t in stop else on_codes([t]))
        seed_from(sampling)
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
                stopping_criteria=StoppingCriteriaList([Cancel(cancel)]),
                **kwargs,
            )
        return finish_reason_of(
            cancel, streamer.last, set(stop), streamer.count, kwargs["max_new_tokens"]
        )

    def generate(
        self,
        handover: Handover,
        sampling: Sampling,
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
        sampling: Sampling,
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
        sampling: Sampling,
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
        sampling: Sampling,
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
        kwargs = sampling_kwargs(sampling)

        def capture(module: Any, args: Any, output: Any) -> None:
            codes = output.hidden_states[-1]
            if codes is not None:
                on_codes([int(c) for c in codes.reshape(-1).tolist()])

        hook = self.talker.register_forward_hook(capture)
        streamer = Streamer(lambda t: None)
        seed_from(sampling)
        try:
            with torch.no_grad():
                self.talker.generate(
                    **inputs,
                    eos_token_id=tcfg.codec_eos_token_id,
                    suppress_tokens=suppressed,
                    output_hidden_states=True,
                    return_dict_in_generate=True,
                    streamer=streamer,
                    stopping_criteria=StoppingCriteriaList([Cancel(cancel)]),
                    **kwargs,
                )
        finally:
            hook.remove()
        return finish_reason_of(
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
