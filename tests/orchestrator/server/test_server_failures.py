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
