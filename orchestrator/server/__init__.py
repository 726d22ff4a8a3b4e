"""An OpenAI-compatible HTTP front for one started pipeline (``omni-edge serve``).

The app drives a :class:`~orchestrator.api.Pipeline` that was planned, verified
and started once (``Pipeline.from_config``, the path ``run`` takes); every
request that runs the pipeline is one ``pipeline.stream`` call. The shapes are
OpenAI's, so the official ``openai`` client works unchanged (docs/serving.md
has every endpoint, shape and metric):

* ``POST /v1/chat/completions``: ``messages`` go to the stage that takes the
  request as ``{"messages": [...], "sampling": {...}}`` (the ar_decode stage
  applies its chat template to the whole list, system message and history
  included); ``max_tokens`` (or ``max_completion_tokens``), ``temperature``,
  ``top_p`` and ``seed`` become the request's ``sampling``. The reply is the
  text of the pipeline's text output; ``stream: true`` sends it as server-sent
  events (``data: {chat.completion.chunk}`` lines, then ``data: [DONE]``).
  ``modalities: ["text", "audio"]`` adds the audio output stage's audio as
  OpenAI does: ``message.audio`` (base64 WAV at the voice's rate, or pcm16 at
  24 kHz, and the transcript); streamed, ``delta.audio`` chunks carry the
  transcript as it is generated and each audio chunk (pcm16, 24 kHz) the moment
  the voice yields it. ``usage`` carries the decode stage's token counts.
  A user message may carry the request as audio, OpenAI's ``input_audio``
  content part (``{"type": "input_audio", "input_audio": {"data": base64 WAV,
  "format": "wav"}}``), for a pipeline whose entry stage takes audio (a VAD or
  ASR stage): the recording alone is the request then (one such part, no other
  text and no sampling fields, since nothing but the audio reaches the entry
  stage), and the reply is the text of the text output stages downstream of
  another one (the thinker's, not the transcript). A pipeline without an audio
  entry answers 400. For a pipeline whose entry stage consumes a tensor, the
  request may be arrays: ``input_tensor`` parts (omni-edge's own:
  ``{"type": "input_tensor", "input_tensor": {"name": INPUT, "data": base64
  .npy}}``), read without unpickling under ``ServerLimits.max_tensor_bytes``
  and checked against the entry graph's inputs before anything runs (a 400
  whose ``param`` is the part); the items of ``tensor`` final outputs come
  back in ``message.outputs`` (streamed: ``delta.outputs``), base64 ``.npy``.
  The reply's text is the ``text`` final outputs', its audio the ``audio``
  ones' (an Omni pipeline: the thinker's text, code2wav's audio; the talker's
  ``token_ids`` are neither).
* ``POST /v1/audio/speech``: ``input`` enters the graph at the speech stage
  (the audio output stage whose kind takes text; ``Pipeline.stream(entry=)``),
  so only it runs; the body streams as ``audio/wav`` (at the voice's rate, the
  header's sizes unknown) or ``audio/pcm`` (24 kHz pcm16), ``X-Sample-Rate``.
  A pipeline with no such stage (an Omni pipeline: code2wav takes codes, and
  the talker needs the thinker's hand-over) answers 400 naming each audio
  stage and what it takes.
* ``POST /v1/audio/transcriptions`` (OpenAI's multipart form): the WAV enters the graph at
  the asr stage, in 30 s windows (one segment each), and each request ends once that stage
  is done; ``POST /v1/embeddings``: each input enters the embedding stage (a tensor-out stage
  that takes text) whole, one vector each. Their fields: ``media_protocol``; a pipeline with
  no such stage answers 400 naming why.
* ``GET /v1/models`` (the pipeline, its modalities and the endpoints that answer for it),
  ``GET /health`` (every stage: device, backend, loaded,
  alive; 503 while one is dead or its engine has stopped, ``failed`` naming each
  one's stage, device and code), ``GET /v1/plan`` (the plan with each stage's
  measured peak next to its budget), ``GET /v1/status`` (stages, pools, the
  last requests' latencies), ``GET /metrics`` (Prometheus text,
  ``server.metrics``), ``GET /`` (the page: ``orchestrator/server/web``, its files
  under ``/static``).

A client that goes away is cancelled all the way down, whenever it leaves:
before the response starts (a watcher on the connection, ``served.Run.until``) or
while it streams (the body generator is closed, ``http.StreamResponse``); either closes the
pipeline's stream, which cancels the request on every device actor (the vLLM
request aborted, queued sentences dropped) and frees its admission slot.

Every body is checked before the pipeline sees it (``protocol``: pydantic models of
OpenAI's shapes, extra keys ignored; the body read under a size cap, 413 over it;
JSON, base64 and WAV decoded in a worker thread, so a large body does not hold up
``/health``; each limit of ``ServerLimits`` named with its flag in the 400).

Errors are OpenAI's ``{"error": {"message", "type", "param", "code"}}``:
``BadRequest`` → 400 (where, what, how to fix; ``param`` the field, e.g.
``messages[0].content``), ``PipelineBusy`` → 429 with
``Retry-After``, ``StageFailed`` → 503 naming the stage and the device (a dead
stage fails only the requests that need it). With an API key every request
but the page's static files needs ``Authorization: Bearer KEY`` (401
otherwise), compared in constant time.

The package: ``protocol`` (the request models, ``ServerLimits``, body → pipeline
request), ``auth`` (the API key, loopback addresses), ``app`` (the endpoints,
``create_app``), ``realtime`` (the WebSocket session).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# The names are looked up on first use (PEP 562), not imported here: the package's
# lightest modules (``protocol``'s limits, ``auth``) are imported by the CLI's parser
# on a core install, where ``app`` and its starlette (the ``run`` extra) are absent.
_WHERE = {
    "WEB_DIR": "app",
    "close_app": "app",
    "create_app": "app",
    "error_for": "app",
    "pcm24k": "app",
    "error_response": "auth",
    "is_loopback": "auth",
    "ServerLimits": "protocol",
    "audio_format": "protocol",
    "chat_request": "protocol",
    "speech_request": "protocol",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)
