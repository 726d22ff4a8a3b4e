"""A reply decoded under tools is cut into sentences for a voice only when it is text: the
router (``orchestrator.runtime.router.Router``'s ``tools``) gives a call's text to no input
that takes sentences, whichever piece boundaries the decoder's tokens fall on, and still
hands it whole to an input that takes text whole (and to the request's own output)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from orchestrator.runtime.router import Route, Router, RouteTable, tool_call_start

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TEXT = "It is sunny in Paris. Take a hat! It will be warm."


def _table() -> RouteTable:
    def route(consumer: str, sentences: bool) -> Route:
        return Route(consumer, "cpu", "thinker", None, sentences, None, False, False)

    return RouteTable(
        "thinker", "cpu", ("text",), True, None, (route("voice", True), route("log", False))
    )


def _handed(pieces: list[str], tools: bool, call_start: str = "<") -> dict[str, list[str]]:
    """What each consumer is handed for a reply streamed as ``pieces``."""
    got: dict[str, list[str]] = {"voice": [], "log": []}

    async def deliver(r: Route, items: list[Any], end: bool, first: Any) -> None:
        got[r.consumer].extend(items)

    async def go() -> None:
        router = Router(_table(), deliver, tools=tools, call_start=call_start)
        for piece in pieces:
            port, payload, _final = router.take(piece)
            await router.route(port, payload)
        await router.finish()

    asyncio.run(go())
    return got


def _pieces(text: str, size: int) -> list[str]:
    return ["", *(text[i : i + size] for i in range(0, len(text), size))]


@pytest.mark.parametrize("size", [1, 3, 12, 200])
def test_a_call_is_cut_into_no_sentence(size: int) -> None:
    got = _handed(_pieces(CALL, size), tools=True)
    assert got["voice"] == []
    assert "".join(got["log"]) == CALL  # a whole-text input still gets the call


@pytest.mark.parametrize("size", [1, 5, 200])
def test_text_under_tools_is_spoken_as_without_them(size: int) -> None:
    under = _handed(_pieces(TEXT, size), tools=True)
    assert under == _handed(_pieces(TEXT, size), tools=False)
    assert under["voice"] == ["It is sunny in Paris.", "Take a hat!", "It will be warm."]


def test_without_tools_a_reply_starting_with_a_bracket_is_spoken() -> None:
    """Only a tool grammar makes the first character decide: free text may start with ``<``."""
    assert _handed(_pieces(CALL, 4), tools=False)["voice"] != []


LLAMA3_CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'


@pytest.mark.parametrize("size", [1, 7, 200])
def test_a_call_in_llama3s_syntax_is_cut_into_no_sentence(size: int) -> None:
    """The request's tool syntax names a call's first character (``tool_call_start``)."""
    start = tool_call_start({"tools": [], "choice": "auto", "family": "llama3_json"})
    assert start == "{" and tool_call_start(None) == "<"
    got = _handed(_pieces(LLAMA3_CALL, size), tools=True, call_start=start)
    assert got["voice"] == [] and "".join(got["log"]) == LLAMA3_CALL
    spoken = _handed(_pieces(TEXT, size), tools=True, call_start=start)
    assert spoken["voice"] == ["It is sunny in Paris.", "Take a hat!", "It will be warm."]
    # read in ChatML's syntax, the same reply would be text, spoken
    assert _handed(_pieces(LLAMA3_CALL, size), tools=True)["voice"] != []


def test_a_request_naming_no_syntax_is_read_in_its_decode_stages() -> None:
    """A Python API request's ``tool_call`` without ``family``: the router reads a call in the
    syntax the decode stage taking the request chooses (its kind's ``tool_family``)."""
    from types import SimpleNamespace

    from orchestrator.runtime.flow import call_start_of
    from stages.base import REQUEST

    asr = SimpleNamespace(name="asr", inputs=[REQUEST])
    thinker = SimpleNamespace(name="thinker", inputs=["asr"])
    voice = SimpleNamespace(name="voice", inputs=["thinker"])
    kinds = {
        "asr": SimpleNamespace(),
        "thinker": SimpleNamespace(tool_family=lambda plan: "llama3_json"),
        "voice": SimpleNamespace(),
    }
    rt = SimpleNamespace(graph=SimpleNamespace(kinds=kinds))
    call = {"tools": [], "choice": "auto"}
    stages: list[Any] = [asr, thinker, voice]
    assert call_start_of(rt, stages, "thinker", call) == "{"  # entered at the thinker
    assert call_start_of(rt, [thinker, voice], None, call) == "<"  # it does not take the request
    thinker.inputs = [REQUEST]
    assert call_start_of(rt, [thinker, voice], None, call) == "{"
    named = {**call, "family": "chatml"}  # the syntax a request names is its own
    assert call_start_of(rt, stages, "thinker", named) == "<"
    assert call_start_of(rt, stages, "thinker", None) == "<"  # no tools
