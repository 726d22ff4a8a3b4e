"""``orchestrator.server.chat_tools``'s reply side: a streamed reply under tools is passed on
as content while it is text and held whole while it is a call, sent as OpenAI's
``delta.tool_calls``; a call cut short is neither. No server: the served path is
``test_serve_tools.py``."""

from __future__ import annotations

from orchestrator.server.chat_tools import CallWatch, reply_call
from stages.ar_decode.tool_grammar import call_text

CALL = call_text("get_weather", {"city": "Paris"})


def _pieces(text: str, n: int = 3) -> list[str]:
    return [text[i : i + n] for i in range(0, len(text), n)]


def test_text_streams_as_content_and_a_call_is_held_until_whole() -> None:
    text = CallWatch(tools=True)
    assert [text.text(p) for p in ["", "It is", " <b>sunny"]] == ["", "It is", " <b>sunny"]
    assert text.calls("r1") is None and not text.is_call
    call = CallWatch(tools=True)
    assert [call.text(p) for p in _pieces(CALL)] == [None] * len(_pieces(CALL))
    assert call.is_call
    assert call.calls("r1") == [
        {
            "index": 0,
            "id": "call_r1_0",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]


def test_a_call_cut_short_is_no_call_and_sends_no_content() -> None:
    watch = CallWatch(tools=True)
    assert all(watch.text(p) is None for p in _pieces(CALL[:-5]))
    assert watch.is_call and watch.calls("r1") is None


def test_without_tools_a_reply_that_looks_like_a_call_is_text() -> None:
    watch = CallWatch(tools=False)
    assert [watch.text(p) for p in _pieces(CALL)] == _pieces(CALL)
    assert watch.calls("r1") is None
    assert reply_call("Sunny.", "r1") is None
