"""Log-probabilities on ``POST /v1/chat/completions``: OpenAI's ``logprobs`` and
``top_logprobs`` in, ``choices[].logprobs.content[]`` out.

The guarantees:

* ``logprobs: true`` asks the decode stage for each reply token's log-probability, with
  ``top_logprobs`` (0 to 20) most likely alternatives: its sampling's ``logprobs``
  (:func:`logprobs_of`); ``top_logprobs`` above 0 without ``logprobs: true`` is a 400 naming
  it (as OpenAI's), never read as a request for nothing;
* a stage whose backend cannot return them refuses the request with a 400 naming
  ``logprobs``, the backend and the remedy (the engines' ``unserved_sampling``:
  transformers; llama.cpp and vLLM return them), never a reply without them;
* they come back in OpenAI's shape (:func:`choice_logprobs`: ``{"content": [{"token",
  "logprob", "bytes", "top_logprobs"}]}``), as the decode stage computed them
  (``stages.ar_decode.engines.llamacpp_logprobs``, ``vllm_logprobs``: the model's own
  distribution at each step); streamed, in one chunk after the reply's last content delta
  (the stage hands them over with its closing figures).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core.errors import BadRequest, Problem
from stages.requests import TOP_LOGPROBS_MAX

LOGPROB_FIXES = {
    "logprobs": "true or false",
    "top_logprobs": f"a whole number from 0 to {TOP_LOGPROBS_MAX}, with logprobs: true",
}
"""The remedies for a ``logprobs`` or ``top_logprobs`` of the wrong type or range."""


class LogprobFields(BaseModel):
    """The chat body's ``logprobs`` and ``top_logprobs`` (OpenAI's types and range)."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=TOP_LOGPROBS_MAX)


def logprobs_of(body: LogprobFields) -> int | None:
    """The decode stage's ``logprobs`` sampling of a body (how many alternatives per token),
    or None when it asks for none; ``BadRequest`` for ``top_logprobs`` without ``logprobs``."""
    if body.logprobs:
        return body.top_logprobs or 0
    if body.top_logprobs:
        raise BadRequest(
            [
                Problem(
                    "top_logprobs",
                    f"{body.top_logprobs}: is set, and logprobs is not true",
                    "send logprobs: true with top_logprobs (or leave top_logprobs out)",
                )
            ]
        )
    return None


def choice_logprobs(stats: Mapping[str, Any]) -> dict[str, Any] | None:
    """A choice's ``logprobs`` from the decode stages' closing figures (stage → its stats),
    None when no stage computed them."""
    for figures in stats.values():
        content = figures.get("logprobs") if isinstance(figures, Mapping) else None
        if isinstance(content, list):
            return {"content": content, "refusal": None}
    return None
