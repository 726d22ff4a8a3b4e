"""A chat's tool round trip in the decode stage's tool syntax: ``orchestrator.server``'s
``chat_tools`` and ``protocol.read_chat`` write earlier calls and ``role: tool`` results as
the stage's chat template reads them (Llama 3's JSON call and ``ipython`` result; ChatML's
unchanged), read a reply's call back in that syntax, and name the syntax in the request so the
stage and the router agree. No model: the template's family is the stage's own choice
(``test_tool_families.py``)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from orchestrator.server.chat_tools import CallWatch, name_family, reply_call, served_family
from orchestrator.server.limits import ServerLimits
from orchestrator.server.protocol import read_chat
from stages.ar_decode.tool_grammar import call_text, result_text

L3 = "llama3_json"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ROUND_TRIP = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "12 C, rain"},
]


def _read(family: str, **body: Any) -> Any:
    raw = json.dumps({"model": "m", "messages": ROUND_TRIP, **body}).encode()
    return read_chat(
        raw,
        audio_entry=False,
        has_audio=False,
        limits=ServerLimits(),
        family=family,  # type: ignore[arg-type]
    )


def test_a_round_trip_is_written_in_llama3s_syntax() -> None:
    call = _read(L3, tools=[WEATHER])
    messages = [dict(m) for m in call.request.messages]
    assert messages == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        },
        {"role": "ipython", "content": "12 C, rain"},
    ]
    # ChatML's, as before: the call inside <tool_call>, the result a user turn
    chatml = [dict(m) for m in _read("chatml", tools=[WEATHER]).request.messages]
    assert chatml[1]["content"] == call_text("get_weather", {"city": "Paris"})
    assert chatml[2] == {"role": "user", "content": result_text("12 C, rain")}


def test_the_served_family_is_named_in_the_request() -> None:
    call = _read(L3, tools=[WEATHER], tool_choice="required")
    name_family(call.request, L3)
    assert call.request.sampling["tool_call"]["family"] == L3
    assert call.request.item()["sampling"]["tool_call"]["family"] == L3
    plain = _read(L3)  # no tools: nothing to name
    name_family(plain.request, L3)
    assert plain.request.sampling is None or "tool_call" not in plain.request.sampling


def test_the_served_family_is_the_entry_decode_stages() -> None:
    plans = [SimpleNamespace(name="asr"), SimpleNamespace(name="thinker")]
    asked: list[str] = []

    def family(plan: Any) -> str:
        asked.append(plan.name)
        return L3

    kinds = {"asr": SimpleNamespace(), "thinker": SimpleNamespace(tool_family=family)}
    assert served_family(kinds, plans, ["asr", "thinker"]) == L3 and asked == ["thinker"]
    assert served_family(kinds, plans, ["asr"]) == "chatml"  # no decode stage to ask


def test_a_llama3_reply_is_read_back_as_a_call_and_text_stays_text() -> None:
    text = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert reply_call(text, "r1", L3) == [
        {
            "id": "call_r1_0",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
    assert reply_call(text, "r1") is None  # ChatML's reading: not a call
    watch = CallWatch(True, L3)
    assert all(watch.text(text[i : i + 4]) is None for i in range(0, len(text), 4))
    assert watch.is_call and watch.calls("r1") is not None
    spoken = CallWatch(True, L3)
    assert [spoken.text(p) for p in ["<b>It", " rains"]] == ["<b>It", " rains"]
    assert not spoken.is_call and spoken.calls("r1") is None
