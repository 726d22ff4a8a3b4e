"""What ``POST /v1/chat/completions`` does with each field of OpenAI's request: honoured,
accepted and ignored, or refused with a 400 naming it.

The guarantee: a field that changes what the caller gets is honoured or refused, never
silently dropped. A client that asks for token biases, a reasoning effort or a moderation pass
and would get plain text with a 200 could not tell; so such a field, set to anything but
its "off" value (:data:`NEUTRAL`), is a 400 naming it and saying what to do instead
(:func:`refusal`). Fields that leave the reply as it is (an end-user id, metadata,
caching and billing hints) are accepted and ignored, as OpenAI's server ignores keys it
does not know. ``docs/serving.md`` lists the three groups; a test walks the ``openai``
package's own list of request fields and holds each to this table and to that page.
"""

from __future__ import annotations

from typing import Literal

Treatment = Literal["honoured", "ignored", "refused"]

HONOURED: dict[str, str] = {
    "messages": "the conversation, through the decode stage's chat template",
    "model": "any name; the served pipeline answers (its name is in /v1/models)",
    "stream": "server-sent events",
    "stream_options": "include_usage",
    "modalities": "['text'] or ['text', 'audio'] on a pipeline with a voice",
    "audio": "format wav or pcm16; the voice is the pipeline's own",
    "n": "1 only: another n is a 400 naming it",
    "max_tokens": "bounded by the config's sampling.max_tokens",
    "max_completion_tokens": "the same as max_tokens",
    "temperature": "0 to 2",
    "top_p": "above 0, at most 1",
    "seed": "int64",
    "stop": "a string or up to 4 (1 to 256 characters each); the reply ends before the "
    "first one, which is not sent (finish_reason stop)",
    "response_format": "text, json_object or json_schema: the reply is JSON valid against the "
    "schema by constrained decoding (llama.cpp, vLLM); a backend that cannot constrain "
    "(transformers), or a schema keyword the grammar would not enforce, is a 400 naming it",
    "tools": "functions (at most 128): offered in the prompt (the chat template's convention); "
    "a reply is text or one call, its arguments valid JSON for the tool's parameters by "
    "constrained decoding (llama.cpp, vLLM); a backend that cannot constrain (transformers) is "
    "a 400 naming it",
    "tool_choice": "auto, none (no tool offered), required, or a named function (the reply is "
    "that call)",
    "presence_penalty": "-2 to 2, over the reply's tokens",
    "frequency_penalty": "-2 to 2, over the reply's tokens",
    "logprobs": "true: each reply token's log-probability under the model (llama.cpp, vLLM; a "
    "backend that cannot return them, transformers, is a 400 naming logprobs and the backend), "
    "in choices[].logprobs; streamed, in one chunk after the last content delta",
    "top_logprobs": "0 to 20 most likely alternatives per token, with logprobs: true (else a 400 "
    "naming it)",
}
"""OpenAI's fields the server acts on, with the bound or the meaning it gives them."""

EXTENSIONS: dict[str, str] = {
    "min_tokens": "vLLM's: end-of-sequence is not sampled before this many tokens",
    "top_k": "vLLM's: -1 (off) or at least 1",
    "repetition_penalty": "vLLM's: above 0, 1.0 is none; over the prompt and the reply",
}
"""Fields beyond OpenAI's that the server honours (vLLM's own extensions of the request;
the ``openai`` client sends them as ``extra_body``)."""

IGNORED: dict[str, str] = {
    "user": "an end-user id for abuse tracking",
    "safety_identifier": "an end-user id for abuse tracking",
    "metadata": "tags for stored completions; nothing is stored",
    "store": "nothing is stored",
    "service_tier": "one tier: the local pipeline",
    "prompt_cache_key": "a routing hint for OpenAI's prompt cache; the decode engines reuse "
    "a shared prompt head on their own",
    "prompt_cache_retention": "a routing hint for OpenAI's prompt cache",
    "prompt_cache_options": "breakpoints for OpenAI's prompt cache",
    "parallel_tool_calls": "a reply makes at most one call, which keeps either value",
    "prediction": "a speed hint (Predicted Outputs): the reply is the same without it",
}
"""OpenAI's fields accepted and ignored: none changes the reply's content."""

REFUSED: dict[str, str] = {
    "functions": "send tools instead (the deprecated functions are not read)",
    "function_call": "send tool_choice instead (the deprecated function_call is not read)",
    "logit_bias": "leave logit_bias out: token biases are not applied",
    "reasoning_effort": "leave reasoning_effort out: the served model's reasoning is not "
    "controlled by the request",
    "verbosity": "leave verbosity out: the reply's length is set with max_tokens",
    "web_search_options": "leave web_search_options out: the pipeline has no web search",
    "moderation": "leave moderation out: no moderation pass runs on the input or the reply",
}
"""OpenAI's fields the server does not honour and that would change what the caller gets:
each, set to anything but its :data:`NEUTRAL` value, is a 400 naming it with this remedy."""

NEUTRAL: dict[str, tuple[object, ...]] = {
    "logit_bias": ({},),
    "functions": ([],),
}
"""The values of a refused field that ask for nothing (as leaving it out or ``null`` does)."""

MESSAGE_HONOURED: dict[str, str] = {
    "tool_calls": "an assistant's earlier calls, back into the prompt as the model wrote them",
    "tool_call_id": "a tool message's: its result goes back in the order sent (a reply makes "
    "one call)",
}
"""Keys of a message that carry a tool round trip (``orchestrator.server.chat_tools``)."""

MESSAGE_REFUSED: dict[str, str] = {
    "function_call": "send the earlier call as tool_calls (the deprecated function_call is "
    "not read)",
}
"""Keys of a message refused with a 400 naming the message's key
(``messages[2].function_call``) rather than dropped from the conversation."""

MESSAGE_IGNORED: dict[str, str] = {
    "name": "a participant's name: the chat templates served have no place for it",
    "refusal": "an earlier reply's refusal text",
}
"""Keys of a message accepted and ignored."""


def treatment(name: str) -> Treatment | None:
    """How the chat endpoint treats OpenAI's (or vLLM's) request field ``name``; None for a
    key it does not know (ignored, as OpenAI's server ignores unknown keys)."""
    if name in HONOURED or name in EXTENSIONS:
        return "honoured"
    if name in IGNORED:
        return "ignored"
    if name in REFUSED:
        return "refused"
    return None


def refusal(name: str, value: object) -> str | None:
    """The remedy for a refused field set to ``value``; None when ``value`` asks for nothing
    (``null`` or the field's off value)."""
    if name not in REFUSED or value is None or value in NEUTRAL.get(name, ()):
        return None
    return REFUSED[name]


def first_refused(body: dict[str, object]) -> tuple[str, object, str] | None:
    """(where, value, remedy) of the first refused field a chat body sets — a top-level one
    (``tools``) or a message's (``messages[2].tool_calls``) — or None when it sets none."""
    for name in REFUSED:
        fix = refusal(name, body.get(name))
        if fix is not None:
            return name, body[name], fix
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        if not isinstance(message, dict):
            continue
        for key, fix in MESSAGE_REFUSED.items():
            if message.get(key) not in (None, []):
                return f"messages[{i}].{key}", message[key], fix
    return None
