"""A hostile client of ``/v1/realtime`` against a real ``omni-edge serve`` on loopback (a
subprocess, started as a user starts it), with a raw WebSocket client: what one session may do
to the server. The WebSocket's counterpart of ``test_server_hostile.py`` (the HTTP side). Each
attack is an ``error`` event naming the field and its cap, at once, and the session goes on:

* ``session.update`` with 8 MiB of ``instructions`` (accepted without a word before: that text
  is the system message of every turn) names ``session.instructions`` and the server's
  ``--max-content-chars``; instructions at the cap are taken, one character more is refused
  and the ones taken are kept;
* a ``voice`` over 256 characters, ``modalities`` of three entries and an ``event_id`` over 256
  characters (which the ``error`` would echo) each name their cap;
* an event over the 15 MiB event cap, and a burst of malformed events, are each answered, and
  the session serves on; uncommitted audio past ``max_buffer_s`` names that cap;
* a typed item over ``--max-content-chars`` names the cap and nothing is added; tools, and a
  response to typed items, on a pipeline with no decode stage are refused by name, and more
  tools than OpenAI's 128 name that cap.

The server is the Silero VAD alone (an audio entry, so a session opens; no model weights).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.core.units import GiB, MiB
from tests.helpers import REPO
from tests.helpers.profiles import make_profile
from tests.helpers.serve import ServeProcess

websockets = pytest.importorskip("websockets")

pytestmark = [pytest.mark.ray, pytest.mark.ort]

CONTENT_CAP = 4096
"""``serve --max-content-chars`` for this server: a small cap, so the boundary is cheap to send."""
QUICK_S = 30.0
"""What "at once" allows: an answer takes milliseconds; the rest is a loaded 2-core machine's slack."""


@pytest.fixture(scope="module")
def hears(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    if not (REPO / "exports/silero-vad/manifest.yaml").is_file():
        pytest.skip(
            "capability: the Silero VAD artifact is not built: python -m exports.silero_vad build"
        )
    tmp = tmp_path_factory.mktemp("hostile-realtime")
    (tmp / "vad.yaml").write_text(f"""name: hears
stages:
  - {{name: vad, kind: vad, artifact: {REPO}/exports/silero-vad, devices: [cpu], backends: [ort-cpu],
     final_output: true, final_output_type: audio}}
""")
    prof = tmp / "profile.json"
    prof.write_text(make_profile(ram_available=8 * GiB).model_dump_json())
    s = ServeProcess(
        tmp / "vad.yaml",
        "--profile",
        str(prof),
        "--skip-verify",
        "--max-content-chars",
        str(CONTENT_CAP),
        cwd=tmp,
        start_timeout_s=180,
    )
    yield s
    assert s.stop() == 0, s.output()


class _Session:
    """One realtime session over a raw WebSocket: send an event, read the server's next one."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        created = self.next()
        assert created["type"] == "session.created", created

    def send(self, doc: dict[str, Any] | str) -> None:
        self.ws.send(doc if isinstance(doc, str) else json.dumps(doc))

    def next(self) -> dict[str, Any]:
        return dict(json.loads(self.ws.recv(timeout=QUICK_S)))

    def error(self) -> dict[str, Any]:
        event = self.next()
        assert event["type"] == "error", event
        return dict(event["error"])

    def updated(self, **session: Any) -> dict[str, Any]:
        """A ``session.update`` that is taken: the session as the server now holds it."""
        self.send({"type": "session.update", "session": session})
        event = self.next()
        assert event["type"] == "session.updated", event
        return dict(event["session"])


@pytest.fixture
def session(hears: ServeProcess) -> Iterator[_Session]:
    from websockets.sync.client import connect

    url = hears.url.replace("http://", "ws://") + "/v1/realtime"
    with connect(url, open_timeout=QUICK_S, max_size=None) as ws:
        yield _Session(ws)


def test_eight_mib_of_instructions_are_refused_naming_the_cap_and_the_session_goes_on(
    session: _Session,
) -> None:
    session.send(
        {"type": "session.update", "session": {"instructions": "x" * (8 * MiB)}, "event_id": "e1"}
    )
    err = session.error()
    assert err["param"] == "session.instructions" and err["code"] == "invalid_value", err
    assert f"{8 * MiB} characters: over the cap of {CONTENT_CAP} characters" in err["message"]
    assert "--max-content-chars" in err["message"] and err["event_id"] == "e1"
    # nothing of it was taken; at the cap is taken; one more refused, the taken ones kept
    assert session.updated()["instructions"] is None
    at_cap = "y" * CONTENT_CAP
    assert session.updated(instructions=at_cap)["instructions"] == at_cap
    session.send({"type": "session.update", "session": {"instructions": "z" * (CONTENT_CAP + 1)}})
    assert f"over the cap of {CONTENT_CAP} characters" in session.error()["message"]
    assert session.updated()["instructions"] == at_cap


@pytest.mark.parametrize(
    ("event", "param", "cap"),
    [
        ({"type": "session.update", "session": {"voice": "v" * 257}}, "session.voice", "256"),
        (
            {"type": "session.update", "session": {"modalities": ["text", "audio", "text"]}},
            "session.modalities",
            "at most 2 items",
        ),
        ({"type": "session.update", "session": {}, "event_id": "e" * 10_000}, "event_id", "256"),
    ],
)
def test_a_field_over_its_cap_is_an_error_naming_the_cap(
    session: _Session, event: dict[str, Any], param: str, cap: str
) -> None:
    session.send(event)
    err = session.error()
    assert err["param"] == param and cap in err["message"], err
    assert err["event_id"] is None or len(err["event_id"]) <= 256  # never echoed past its cap
    assert session.updated()["voice"] == "default"


def test_an_event_over_the_event_cap_and_a_burst_of_bad_events_are_answered(
    session: _Session,
) -> None:
    session.send(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (15 * MiB)}))
    assert session.error()["code"] == "event_too_large"
    burst = 2000
    for i in range(burst):
        session.send("{not json" if i % 2 else json.dumps({"type": "no.such.event"}))
    codes = [session.error()["code"] for _ in range(burst)]
    assert codes.count("invalid_json") == codes.count("invalid_event") == burst // 2
    assert session.updated(voice="still-here")["voice"] == "still-here"


def test_uncommitted_audio_past_the_buffer_cap_names_it(session: _Session) -> None:
    session.updated(turn_detection=None, input_audio_sample_rate=16000)
    second = base64.b64encode(b"\0\0" * 16000).decode()
    for _ in range(60):  # 60 s: the cap (RealtimeLimits.max_buffer_s)
        session.send({"type": "input_audio_buffer.append", "audio": second})
    session.send({"type": "input_audio_buffer.append", "audio": second})
    err = session.error()
    assert err["param"] == "audio" and "over the cap of 60 s of uncommitted audio" in err["message"]
    session.send({"type": "input_audio_buffer.clear"})
    assert session.next()["type"] == "input_audio_buffer.cleared"


def _item(text: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": text}],
        **fields,
    }


def test_a_typed_item_over_the_content_cap_names_it_and_nothing_is_added(
    session: _Session,
) -> None:
    session.send(
        {
            "type": "conversation.item.create",
            "item": _item("x" * (CONTENT_CAP + 1), id="item_big"),
            "event_id": "e_big",
        }
    )
    err = session.error()
    assert (err["param"], err["event_id"]) == ("item.content", "e_big"), err
    assert f"over the cap of {CONTENT_CAP} characters" in err["message"]
    assert "--max-content-chars" in err["message"]
    session.send({"type": "conversation.item.retrieve", "item_id": "item_big"})
    assert session.error()["code"] == "item_not_found"
    # at the cap it is taken
    session.send({"type": "conversation.item.create", "item": _item("y" * CONTENT_CAP)})
    created = session.next()
    assert created["type"] == "conversation.item.created", created
    assert created["item"]["content"] == [{"type": "input_text", "text": "y" * CONTENT_CAP}]


def test_tools_and_a_typed_turn_on_a_pipeline_with_no_decode_stage_are_refused_by_name(
    session: _Session,
) -> None:
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    session.send(
        {
            "type": "session.update",
            "session": {"tools": [tool], "tool_choice": "required"},
            "event_id": "e_tools",
        }
    )
    err = session.error()
    assert (err["param"], err["event_id"]) == ("session.tools", "e_tools"), err
    assert "no decode stage" in err["message"]
    held = session.updated()  # nothing of the refused update was kept
    assert (held["tools"], held["tool_choice"]) == ([], "auto")
    # more tools than OpenAI takes: named with the cap
    session.send({"type": "session.update", "session": {"tools": [tool] * 129}})
    err = session.error()
    assert err["param"] == "session.tools" and "at most 128 items" in err["message"], err
    # a typed turn is kept, but this pipeline has no stage to answer it
    session.send({"type": "conversation.item.create", "item": _item("Hello")})
    assert session.next()["type"] == "conversation.item.created"
    session.send({"type": "response.create", "event_id": "e_answer"})
    err = session.error()
    assert (err["param"], err["event_id"]) == ("response", "e_answer"), err
    assert "no decode stage" in err["message"]
