"""A decode request checked before it reaches an engine: its prompt, its sampling, its length.

Every decode engine's runner reads a request the same way (:func:`request_parts`: a string,
or a dict with ``prompt`` or ``messages`` and optional ``sampling`` overrides; the stage's
system prompt first), counts it with the tokenizer its engine reads (:func:`encode`) and
refuses one that cannot fit the context (:func:`check_length`) — in the device actor, and
before it gets there (``ArDecodeKind.validate_request``, with the engine's
``request_tokenizer``: :func:`checkpoint_tokenizer` for an engine that loads a checkpoint).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pydantic import ValidationError

from orchestrator.core.errors import BadRequest
from stages.ar_decode.model_cache import DEFAULT_DTYPE, lookup
from stages.ar_decode.tool_grammar import as_call, tools_messages, with_family
from stages.requests import SAMPLING_KEYS, Sampling, asked

if TYPE_CHECKING:
    from orchestrator.core.plan import StagePlan

log = logging.getLogger(__name__)


def request_parts(
    stage: Any, items: list[Any], template: str | None = None
) -> tuple[list[dict[str, str]], Sampling]:
    """The chat messages (the stage's system prompt first) and the sampling of a
    request made of ``items`` (strings, or dicts with ``prompt`` or ``messages`` and
    optional ``sampling`` overrides). ``BadRequest`` for anything the engine would
    misread: no prompt, a blank one, a prompt that is not text, an unknown or
    out-of-range sampling value. Tools are offered in the tool syntax of ``template`` (the
    chat template the prompt is rendered with: ``tool_grammar.with_family``), which the
    sampling's ``tool_call`` then names for the grammar."""
    base = stage.sampling.model_dump() if hasattr(stage, "sampling") else {}
    overrides: dict[str, object] = {}
    messages: list[dict[str, str]] = []
    texts: list[str] = []
    how = "pass the prompt as a string, or as {'prompt': '...', 'sampling': {'max_tokens': 64}}"
    for item in items:
        if isinstance(item, dict):
            unknown = sorted(set(item) - {"prompt", "messages", "sampling"})
            if unknown:
                raise BadRequest.single(f"request.{unknown[0]}", "is not a field of a request", how)
            if "messages" in item:
                msgs = item["messages"]
                if not isinstance(msgs, list) or not all(
                    isinstance(m, dict)
                    and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str)
                    for m in msgs
                ):
                    raise BadRequest.single(
                        "request.messages",
                        "must be a list of {role, content} with text content",
                        "e.g. [{'role': 'user', 'content': 'Hello'}]",
                    )
                messages.extend({"role": m["role"], "content": m["content"]} for m in msgs)
            if "prompt" in item:
                texts.append(_text(item["prompt"], "request.prompt", how))
            sampling = item.get("sampling") or {}
            if not isinstance(sampling, dict):
                raise BadRequest.single(
                    "request.sampling",
                    f"a {type(sampling).__name__} is not a mapping",
                    "e.g. {'max_tokens': 64, 'temperature': 0.3}",
                )
            unknown = sorted(set(sampling) - set(SAMPLING_KEYS))
            if unknown:
                raise BadRequest.single(
                    f"request.sampling.{unknown[0]}",
                    "is not a sampling setting",
                    f"use one of {', '.join(SAMPLING_KEYS)}",
                )
            overrides.update(sampling)
        else:
            texts.append(_text(item, "prompt", how))
    if texts:
        messages.append({"role": "user", "content": " ".join(t.strip() for t in texts)})
    if not messages or not any(m["content"].strip() for m in messages if m["role"] != "system"):
        raise BadRequest.single(
            "prompt",
            "is empty or only whitespace: the model would answer its system prompt",
            "say something, e.g. --prompt 'Tell me one fact about the Moon.'",
        )
    merged: dict[str, object] = {**base, **overrides}
    # the config's sampling is the stage's validated model; a request's overrides are checked
    checked = _checked_sampling(stage, merged, base) if overrides else cast(Sampling, merged)
    system = getattr(stage, "system_prompt", None)
    if system and messages[0].get("role") != "system":
        messages.insert(0, {"role": "system", "content": system})
    with_family(cast(dict[str, object], checked), template)
    call = checked.get("tool_call")
    return (tools_messages(messages, as_call(call)) if call else messages), checked


def _text(value: Any, where: str, how: str) -> str:
    if not isinstance(value, str):
        shown = "None" if value is None else f"a {type(value).__name__} ({str(value)[:40]})"
        raise BadRequest.single(where, f"{shown} is not text", how)
    return value


def _checked_sampling(stage: Any, merged: dict[str, object], base: dict[str, object]) -> Sampling:
    """A request's sampling within the bounds of the stage's own (its config's ``Sampling``:
    seed within int64, temperature finite and at most 2, ...); the config's ``max_tokens``
    is the most a request may ask for."""
    model = type(stage.sampling)
    try:
        checked = model(**merged).model_dump()
    except ValidationError as exc:
        err = exc.errors()[0]
        field_name = ".".join(str(x) for x in err.get("loc", ())) or "sampling"
        shown = repr(merged.get(field_name))
        raise BadRequest.single(
            f"request.sampling.{field_name}",
            f"{shown if len(shown) <= 40 else shown[:37] + '...'}: {err.get('msg')}",
            "use a value in the range the stage's sampling allows (docs/plan-format.md)",
        ) from None
    cap = base.get("max_tokens")
    if isinstance(cap, int) and checked["max_tokens"] > cap:
        raise BadRequest.single(
            "request.sampling.max_tokens",
            f"{checked['max_tokens']} is over the config's sampling.max_tokens of {cap}, "
            "the most a request may ask for",
            f"ask for at most {cap}, or raise sampling.max_tokens in the stage's config",
        )
    if checked["min_tokens"] > checked["max_tokens"]:
        raise BadRequest.single(
            "request.sampling.min_tokens",
            f"{checked['min_tokens']} is more than max_tokens {checked['max_tokens']}",
            "lower min_tokens or raise max_tokens",
        )
    return checked


def check_length(stage: Any, prompt_tokens: int, sampling: Sampling) -> None:
    """``BadRequest`` when the prompt and the reply cannot fit the context (``max_model_len``).

    A reply left at the config's own ``max_tokens`` takes what the prompt leaves of the
    context instead (``sampling["max_tokens"]`` is lowered in place), as vLLM's server
    defaults ``max_tokens`` to the context less the prompt: a config that writes
    ``max_tokens`` up to the context (an imported vLLM-Omni deploy file) means "as long as
    the context allows". A ``max_tokens`` the request chose itself is never shortened."""
    limit = int(getattr(stage, "max_model_len", 0) or 0)
    if not limit:
        return
    max_tokens = int(sampling.get("max_tokens") or 0)
    default = getattr(getattr(stage, "sampling", None), "max_tokens", None)
    room = limit - prompt_tokens
    if (
        prompt_tokens + max_tokens > limit
        and max_tokens == default
        and room >= max(1, int(sampling.get("min_tokens") or 0))
    ):
        sampling["max_tokens"] = room
        return
    if prompt_tokens + max_tokens > limit:
        room = max(0, limit - max_tokens)
        raise BadRequest.single(
            "prompt",
            f"is {prompt_tokens} tokens with the chat template; with max_tokens {max_tokens} for the reply that is "
            f"{prompt_tokens + max_tokens}, over the stage's max_model_len of {limit} tokens",
            f"shorten the prompt to at most {room} tokens (about {room * 3} characters of English), "
            "or raise max_model_len in the config",
        )


def encode(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The token ids the engine reads for ``messages``: the tokenizer's chat template (with the
    generation prompt) when it has one, else the contents joined by new lines."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    return list(tokenizer.encode("\n".join(m["content"] for m in messages)))


@functools.lru_cache(maxsize=4)
def _tokenizer_for(model_dir: str) -> Any:
    """The checkpoint's tokenizer, loaded once per directory."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)


def checkpoint_tokenizer(stage_plan: StagePlan) -> Any | None:
    """The tokenizer of the checkpoint the placement loads (a GGUF's cached conversion; loaded
    once per process), or None when there is none yet: the engine's own check stays."""
    model = stage_plan.engine_kwargs.get("model")
    if not model:
        return None
    dtype = stage_plan.engine_kwargs.get("dtype")
    try:
        p = Path(str(model)).expanduser()
        if p.suffix.lower() == ".gguf":
            found = lookup(p, dtype=dtype if dtype not in (None, "auto") else DEFAULT_DTYPE)
            if found is None:
                return None
            p = found
        return _tokenizer_for(str(p))
    except Exception as exc:  # no tokenizer files: the engine's own check stays
        log.debug("no tokenizer to check the request's length with: %s", exc)
        return None


def check_served(sampling: Sampling, unserved: dict[str, str], backend: str) -> None:
    """``BadRequest`` naming the first key of ``sampling`` that asks for something the engine of
    ``backend`` cannot do (``DecodeEngine.unserved_sampling``: key → remedy)."""
    for key, fix in unserved.items():
        if asked(sampling, key):
            shown = repr(sampling.get(key))
            raise BadRequest.single(
                f"request.sampling.{key}",
                f"{shown if len(shown) <= 40 else shown[:37] + '...'}: the stage's backend "
                f"{backend} cannot apply it, and the reply would differ without it",
                fix,
            )


def check_request(
    stage: Any,
    tokenizer: Any | None,
    prompt: Any,
    check_sampling: Callable[[Sampling], object] | None = None,
) -> None:
    """Check a request for this stage before it reaches a device actor: its shape and sampling
    (:func:`request_parts`; then ``check_sampling``, the engine's: a key it cannot honour, a
    schema it cannot enforce), then its length with ``tokenizer`` — the one its engine reads —
    and the chat template (:func:`check_length`). Raises ``BadRequest``; with no tokenizer
    (none yet) the length is left to the engine."""
    messages, sampling = request_parts(stage, [prompt], getattr(tokenizer, "chat_template", None))
    if check_sampling is not None:
        check_sampling(sampling)
    if tokenizer is not None:
        check_length(stage, len(encode(tokenizer, messages)), sampling)
