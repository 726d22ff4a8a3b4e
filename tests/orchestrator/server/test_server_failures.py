"""One mapping of a request's exception (``orchestrator.server.failures``): the HTTP endpoints'
error body and a realtime session's error event say the same status, type and code."""

from __future__ import annotations

import json

import pytest

from orchestrator.core.errors import BadRequest, PipelineBusy, Problem, StageFailed
from orchestrator.server import error_for
from orchestrator.server.realtime_reply import Replies

CASES = [
    (BadRequest.single("request.sampling.top_p", "is 2: over 1", "use 0 to 1"), 400, "bad_request"),
    (PipelineBusy(4, 4, 8, 8), 429, "pipeline_busy"),
    (StageFailed("asr", "npu", "route worker /home/a/bin/python exited 1"), 503, "stage_failed"),
]


@pytest.mark.parametrize(("exc", "status", "code"), CASES)
def test_http_and_realtime_read_one_mapping(exc: Exception, status: int, code: str) -> None:
    response = error_for(exc)
    body = json.loads(bytes(response.body))["error"]
    state, http, err = Replies._failure(exc)
    assert (response.status_code, body["code"], body["type"]) == (status, code, err["type"])
    assert (state, http, err["code"]) == ("failed", status, code)
    assert "/home/a" not in body["message"] + err["message"]


def test_a_bad_request_reads_in_full_over_http_and_on_one_line_in_an_event() -> None:
    exc = BadRequest([Problem("prompt", "is empty", "send text"), Problem("x", "y")])
    body = json.loads(bytes(error_for(exc).body))["error"]
    assert body["message"] == str(exc) and body["param"] == "messages"
    assert Replies._failure(exc)[2]["message"] == "prompt: is empty"


def test_a_fault_of_the_server_is_raised_over_http_and_an_internal_error_in_a_session() -> None:
    exc = KeyError("voice")
    with pytest.raises(KeyError):
        error_for(exc)
    assert Replies._failure(exc) == (
        "failed",
        500,
        {"type": "server_error", "code": "internal_error", "message": "KeyError (the log has it)"},
    )


def test_a_stage_coming_back_is_a_503_to_retry_and_a_crash_loop_one_not_to() -> None:
    """``stage_restarting`` (its device actor is being restarted) asks the client to retry:
    ``Retry-After``, and the same code in a realtime session's error; ``crash_loop`` names
    itself with no retry; the cause (paths, a worker's output) stays in the log."""
    restarting = StageFailed("voice", "cpu", "pid 4242 died: /opt/x", code="stage_restarting")
    response = error_for(restarting)
    body = json.loads(bytes(response.body))["error"]
    assert response.status_code == 503 and response.headers["retry-after"] == "5"
    assert body["code"] == "stage_restarting" and body["param"] == "voice"
    assert "is coming back" in body["message"] and "/opt/x" not in body["message"]
    assert Replies._failure(restarting)[2]["code"] == "stage_restarting"
    loop = error_for(StageFailed("voice", "cpu", "crashed", code="crash_loop"))
    assert loop.status_code == 503 and "retry-after" not in loop.headers
    assert json.loads(bytes(loop.body))["error"]["code"] == "crash_loop"
    # any other code of a stage's failure reads as stage_failed, as before
    other = error_for(StageFailed("voice", "cpu", "x", code="device_actor_died"))
    assert json.loads(bytes(other.body))["error"]["code"] == "stage_failed"
