"""A request's exception as the client reads it: one mapping for every endpoint.

The HTTP endpoints answer it as OpenAI's error body and status (``app.error_for``); a realtime
session as an ``error`` event and a failed ``response.done`` (``realtime_reply.Replies._failure``).
Both read the same :class:`Failure`: the error's ``type`` and ``code``, the HTTP status, the
message. A ``StageFailed``'s cause (interpreter paths, a worker's stderr tail) goes to the log
only; the client reads the stage, its device and the code (``StageFailed.public_message``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from orchestrator.core.errors import BadRequest, PipelineBusy, Problem, StageFailed

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
"""What a 429 asks a client to wait: requests finish in seconds, and the queue frees a slot as each does."""
RESTART_RETRY_AFTER_S = 5
"""What a 503 ``stage_restarting`` asks a client to wait: a device actor's restart is its
back-off (1 s first) plus an actor's start and its stages' loads, seconds on a small machine."""
PASSED_ON = frozenset({"stage_restarting", "crash_loop"})
"""The ``StageFailed`` codes a client reads as they are (a stage coming back: retry; a crash
loop: do not); every other is ``stage_failed``."""
REQUEST_ERRORS = (BadRequest, PipelineBusy, StageFailed)
"""The exceptions a request may end with that are the client's to read (:func:`failure`)."""


@dataclass(frozen=True)
class Failure:
    """One failed request as a client reads it."""

    status: int
    """The HTTP status (a realtime session counts it in the metrics)."""
    type: str
    """OpenAI's error type: ``invalid_request_error``, ``rate_limit_error``, ``server_error``."""
    code: str
    message: str
    """The whole message: every problem of a ``BadRequest``, each with its fix."""
    line: str
    """The message on one line (a realtime ``error`` event): a ``BadRequest``'s first problem,
    ``where: what``; the same as ``message`` otherwise."""
    param: str | None = None
    """The request field at fault, in the OpenAI request's terms, or the failed stage."""
    retry_after_s: int | None = None
    """For a busy pipeline: how long to wait (``Retry-After``)."""


def failure(exc: BaseException, what: str = "request") -> Failure | None:
    """``exc`` as the client reads it, or None for an exception that is not one of a request
    (``REQUEST_ERRORS``): a fault of the server. A ``StageFailed`` is logged (``what`` failed:
    its cause), since the client does not read the cause."""
    if isinstance(exc, BadRequest):
        if any(q.where.startswith(SCHEMA_WHERES) for q in exc.problems):
            # the stage's name for a request's schema is no field the client sent: say theirs
            exc = BadRequest([_as_sent(q) for q in exc.problems])
        p = exc.problems[0] if exc.problems else Problem("request", str(exc))
        return Failure(
            400,
            "invalid_request_error",
            "bad_request",
            str(exc),
            f"{p.where}: {p.what}",
            param=_openai_param(exc.problems[0].where) if exc.problems else None,
        )
    if isinstance(exc, PipelineBusy):
        return Failure(
            429,
            "rate_limit_error",
            "pipeline_busy",
            str(exc),
            str(exc),
            retry_after_s=RETRY_AFTER_S,
        )
    if isinstance(exc, StageFailed):
        # the cause may hold interpreter paths and a worker's stderr: the log has it, the client
        # gets the stage, the device and the code
        log.warning("%s failed: %s", what, exc)
        message = exc.public_message()
        code = exc.code if exc.code in PASSED_ON else "stage_failed"
        retry = RESTART_RETRY_AFTER_S if code == "stage_restarting" else None
        return Failure(
            503, "server_error", code, message, message, param=exc.stage, retry_after_s=retry
        )
    return None


def internal_failure(exc: BaseException, what: str) -> Failure:
    """A fault of this server (no ``REQUEST_ERRORS``), where the session that met it goes on:
    logged with its traceback; the client reads its type's name only."""
    log.error("%s failed", what, exc_info=exc)
    message = f"{type(exc).__name__} (the log has it)"
    return Failure(500, "server_error", "internal_error", message, message)


SCHEMA_WHERE = "request.sampling.json_schema"
"""Where a decode stage names a request's schema: OpenAI's ``response_format`` on the wire."""
TOOLS_WHERE = "request.sampling.tool_call"
"""Where a decode stage names a request's tools: OpenAI's ``tools`` and ``tool_choice``."""
SCHEMA_WHERES = (SCHEMA_WHERE, TOOLS_WHERE)


def _as_sent(problem: Problem) -> Problem:
    if not problem.where.startswith(SCHEMA_WHERES):
        return problem
    return Problem(_openai_param(problem.where), problem.what, problem.fix)


def _openai_param(where: str) -> str:
    """The request field a stage's ``BadRequest`` names, in the OpenAI request's terms."""
    if where == "request.sampling.json_schema":
        return "response_format"
    if where.startswith("request.sampling.json_schema."):
        return "response_format.json_schema.schema" + where.removeprefix(
            "request.sampling.json_schema"
        )
    if where.startswith(TOOLS_WHERE):
        return _tools_param(where.removeprefix(TOOLS_WHERE))
    if where.startswith("request.sampling."):
        return where.removeprefix("request.sampling.")
    if where in ("prompt", "request.prompt", "request.messages"):
        return "messages"
    return where


def _tools_param(rest: str) -> str:
    """``.tools[1].parameters.x`` (a tool's schema, as the stage names it) as the request's
    ``tools[1].function.parameters.x``; ``.name`` as ``tool_choice.function.name``."""
    if rest.startswith(".tools[") and "].parameters" in rest:
        head, tail = rest.split("].parameters", 1)
        return f"{head.removeprefix('.')}].function.parameters{tail}"
    if rest == ".name":
        return "tool_choice.function.name"
    return "tools"
