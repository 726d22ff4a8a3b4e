"""``/v1/realtime`` on a real ``omni-edge serve configs/examples/voice-chat.yaml`` (Silero VAD →
Whisper tiny.en → SmolLM2 on vLLM → Piper), started as a user starts it (a subprocess on a
port it picks, ``--realtime-idle-timeout 2 --max-waiting 0``: no turn waits for a slot, so
concurrent sessions beyond the pipeline's in-flight limit are refused as busy at once).

The client is the ``openai`` package's own realtime client
(``AsyncOpenAI(websocket_base_url=...).beta.realtime.connect``): it connects to a local
``ws://`` base URL, sends every client event these tests need (a malformed one too: it sends
a dict as it is) and parses the server's events into its typed models. The idle test uses
the ``websockets`` package directly, to read the close code and reason the client hides.

Questions are spoken by the project's Piper voice (noise 0; ``tests.helpers.speech``) and
streamed as a microphone streams: pcm16 at 24 kHz in chunks, silence before and after and
between turns, for as long as the session lasts. The first test streams at real time
(40 ms chunks, a sleep after each); the others send 100 ms chunks at twice real time:
turn detection counts samples, not wall-clock time, so the pace changes nothing the server
decides, and it spares the 2-core machine minutes of waiting. Never asserted: what the
model says."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.runtime.audio import resample
from tests.helpers import REPO
from tests.helpers.serve import ServeProcess
from tests.helpers.waiting import NEVER_HANGS_S

openai = pytest.importorskip("openai")
websockets = pytest.importorskip("websockets")

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow, pytest.mark.ort]

CONFIG = REPO / "configs/examples/voice-chat.yaml"
QUESTION = "What is the tallest mountain in the world?"
SECOND = "How far away is the Moon from the Earth?"
RATE = 24000
IDLE_S = 2.0
MAX_SESSIONS = 16
"""Concurrent sessions at most in the busy test: 16 streams of 24 kHz audio are ~2% of a core."""
REPLY_TIMEOUT_S = 240.0
LEAD_S = 0.6
"""Silence streamed before the first question: the VAD hears silence before speech, as from a microphone."""


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    if not (REPO / "exports/whisper-tiny-en-encoder/fp32.onnx").is_file():
        pytest.skip("Whisper's graphs are not built: python -m exports.whisper_asr build")
    s = ServeProcess(
        CONFIG,
        "--realtime-idle-timeout",
        str(IDLE_S),
        "--max-waiting",
        "0",
        cwd=tmp_path_factory.mktemp("serve-realtime"),
        start_timeout_s=600,
    )
    yield s
    rc = s.stop()
    assert rc == 0, s.output()


@pytest.fixture(scope="module")
def speech() -> dict[str, np.ndarray]:
    from tests.helpers.speech import speak

    out = {}
    for text in (QUESTION, SECOND):
        samples, rate = speak(text)
        out[text] = resample(samples, rate, RATE)
    return out


def _b64(samples: np.ndarray) -> str:
    return base64.b64encode((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()).decode(
        "ascii"
    )


def _pcm(delta: str) -> np.ndarray:
    raw = base64.b64decode(delta, validate=True)
    assert raw and len(raw) % 2 == 0, f"{len(raw)} bytes is no pcm16"
    return np.frombuffer(raw, dtype="<i2")


class Talk:
    """One realtime session as a microphone and a listener: ``say`` queues speech, silence streams
    otherwise; every server event is kept in ``events`` with the time it arrived."""

    def __init__(self, conn: Any, chunk_s: float = 0.1, pace: float = 2.0) -> None:
        self.conn, self.chunk, self.pace = conn, int(RATE * chunk_s), pace
        self.events: list[Any] = []
        self.times: list[float] = []
        self.clips: list[tuple[np.ndarray, float]] = []
        self.spoken_at: list[float] = []
        """When the last chunk of each clip was sent (time.perf_counter)."""
        self.silent = False
        self._new = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Talk:
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._mic())]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def say(self, samples: np.ndarray, pace: float | None = None) -> None:
        """Queue speech, streamed at ``pace`` × real time (the session's own pace by default)."""
        self.clips.append((samples, pace or self.pace))

    async def _read(self) -> None:
        async for event in self.conn:
            self.events.append(event)
            self.times.append(time.perf_counter())
            self._new.set()

    async def _mic(self) -> None:
        clip: np.ndarray | None = None
        pos = 0
        pace = self.pace
        while True:
            if clip is None and self.clips:
                (clip, pace), pos = self.clips.pop(0), 0
            if clip is not None:
                chunk = clip[pos : pos + self.chunk]
                pos += self.chunk
                if pos >= clip.size:
                    clip = None
            else:
                chunk = np.zeros(self.chunk, dtype=np.float32)
                pace = self.pace
            if not self.silent:
                await self.conn.input_audio_buffer.append(audio=_b64(chunk))
            if clip is None and pos:
                self.spoken_at.append(time.perf_counter())
                pos = 0
            await asyncio.sleep(self.chunk / RATE / pace)

    async def until(
        self, found: Callable[[Any], bool], after: int = 0, timeout: float = REPLY_TIMEOUT_S
    ) -> int:
        """Index of the first event from ``after`` on that is ``found``."""
        deadline = time.monotonic() + timeout
        i = after
        while True:
            while i < len(self.events):
                if found(self.events[i]):
                    return i
                i += 1
            left = deadline - time.monotonic()
            assert left > 0, (
                f"no such event within {timeout:g} s; got {[e.type for e in self.events[after:]]}"
            )
            self._new.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), min(left, 1.0))

    def of(self, kind: str, after: int = 0) -> list[Any]:
        return [e for e in self.events[after:] if e.type == kind]


def _client(serve: ServeProcess) -> Any:
    ws = serve.url.replace("http://", "ws://")
    return openai.AsyncOpenAI(
        base_url=f"{serve.url}/v1", websocket_base_url=f"{ws}/v1", api_key="unused", max_retries=0
    )


def _is(kind: str) -> Callable[[Any], bool]:
    return lambda e: bool(e.type == kind)


def _sent_ms(events: list[Any], rid: str) -> int:
    """Milliseconds of a reply's audio in its deltas (24 kHz, the session's default output rate)."""
    return int(
        sum(
            _pcm(e.delta).size
            for e in events
            if e.type == "response.audio.delta" and e.response_id == rid
        )
        * 1000
        / RATE
    )


def _done(e: Any) -> bool:
    return bool(e.type == "response.done")


async def _barrier(conn: Any, talk: Talk) -> int:
    """A ``session.update`` round trip; the index of its ``session.updated``. The server handles a
    session's client events one at a time, and a handler that cancels or drops a response waits
    for its task to end: whatever those responses sent came before this reply, on any machine."""
    mark = len(talk.events)
    await conn.session.update(session={})
    return await talk.until(_is("session.updated"), after=mark, timeout=NEVER_HANGS_S)


def test_a_spoken_question_streamed_at_real_time_is_heard_and_answered(
    serve: ServeProcess, speech: dict[str, np.ndarray]
) -> None:
    from tests.helpers.speech import heard

    async def main() -> None:
        async with (
            _client(serve).beta.realtime.connect(model="voice-chat") as conn,
            Talk(conn, chunk_s=0.04, pace=1.0) as talk,
        ):
            first = await talk.until(lambda e: e.type == "session.created", timeout=30)
            assert (
                talk.events[first].session.turn_detection.silence_duration_ms == 400
            )  # the vad stage's
            await conn.session.update(session={"output_audio_sample_rate": 16000})
            updated = talk.events[await talk.until(_is("session.updated"), timeout=30)]
            assert updated.session.model_extra["output_audio_sample_rate"] == 16000
            talk.say(np.zeros(int(LEAD_S * RATE), dtype=np.float32))
            talk.say(speech[QUESTION])
            done = await talk.until(_done)
            order = [e.type for e in talk.events]
            for kind in (
                "input_audio_buffer.speech_started",
                "input_audio_buffer.speech_stopped",
                "input_audio_buffer.committed",
                "conversation.item.created",
                "conversation.item.input_audio_transcription.completed",
                "response.created",
                "response.audio_transcript.delta",
                "response.audio.delta",
                "response.audio.done",
                "response.done",
            ):
                assert kind in order, f"no {kind}: {order}"
            assert (
                order.index("input_audio_buffer.speech_started")
                < order.index("input_audio_buffer.speech_stopped")
                < order.index("input_audio_buffer.committed")
                < order.index("response.created")
                < order.index("response.audio.delta")
                < order.index("response.done")
            )
            started = talk.of("input_audio_buffer.speech_started")[0]
            stopped = talk.of("input_audio_buffer.speech_stopped")[0]
            committed = talk.of("input_audio_buffer.committed")[0]
            said_ms = 1000 * speech[QUESTION].size / RATE
            assert stopped.item_id == committed.item_id == started.item_id
            # the turn the VAD cut is the speech we streamed (Piper's own leading and trailing quiet aside)
            assert 0 <= started.audio_start_ms < LEAD_S * 1000 + said_ms
            assert 0.5 * said_ms < stopped.audio_end_ms - started.audio_start_ms < said_ms + 1000
            user = talk.of("conversation.item.created")[0].item
            assert user.role == "user" and user.id == committed.item_id
            transcript = talk.of("conversation.item.input_audio_transcription.completed")[0]
            assert transcript.item_id == committed.item_id
            heard(QUESTION, transcript.transcript)  # the words, within the suite's WER bound
            assert user.content[0].transcript == transcript.transcript
            response = talk.events[done].response
            assert response.status == "completed"
            assert (
                response.usage.output_tokens >= 12 and response.usage.input_tokens > 0
            )  # min_tokens: 12
            deltas = talk.of("response.audio_transcript.delta")
            assert "".join(d.delta for d in deltas).strip()
            audio = np.concatenate([_pcm(d.delta) for d in talk.of("response.audio.delta")])
            assert audio.size / 16000 > 0.5, f"{audio.size / 16000:.2f} s of reply audio"
            assert np.sqrt(np.mean((audio / 32768.0) ** 2)) > 0.01  # speech, not silence
            assert all(d.response_id == response.id for d in talk.of("response.audio.delta"))
            # the server's own breakdown, in ms after the end of speech: the reply started in the
            # pause (early) but nothing of it went out before the pause closed the turn
            timing = response.model_extra["timing"]
            assert set(timing) == {
                "request_ms",
                "turn_end_ms",
                "transcript_ms",
                "first_token_ms",
                "first_sentence_ms",
                "first_audio_ms",
                "early_start",
            }, timing
            assert timing["early_start"] is True
            # request_ms < 0 when a quiet pass transcribed the speech before the pause was heard
            assert timing["request_ms"] < timing["turn_end_ms"] <= timing["first_audio_ms"]
            assert timing["transcript_ms"] >= 0
            assert (
                timing["request_ms"]
                <= timing["transcript_ms"]
                <= timing["first_token_ms"]
                <= timing["first_audio_ms"]
            )
            assert (
                talk.times[order.index("input_audio_buffer.speech_stopped")]
                <= talk.times[order.index("response.created")]
            )
            first_audio = talk.times[order.index("response.audio.delta")]
            print(
                f"\nvoice-to-voice (end of the streamed question → first reply audio): "
                f"{first_audio - talk.spoken_at[1]:.2f} s, reply {audio.size / 16000:.2f} s of audio"
            )

    asyncio.run(main())


def _trimmed(samples: np.ndarray, floor: float = 0.01) -> np.ndarray:
    """The clip without Piper's own leading and trailing quiet."""
    loud = np.flatnonzero(np.abs(samples) > floor)
    return samples[loud[0] : loud[-1] + 1]


def _metric(serve: ServeProcess, name: str, **labels: str) -> float:
    import httpx

    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in httpx.get(f"{serve.url}/metrics").text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


def test_a_short_pause_inside_a_turn_drops_the_early_reply_unseen(
    serve: ServeProcess, speech: dict[str, np.ndarray]
) -> None:
    """Two questions with 300 ms of silence between them are one turn (the VAD hears a pause of
    about 200 ms: its probability falls a few windows after the sound stops and rises with the
    next word; under the 400 ms that ends a turn, over the 100 ms pad after which a reply starts
    early): the reply started early in that pause is dropped without a trace in the session, and
    the turn is answered once, from all of its audio. Appends of 20 ms, so the session sees the
    pause at that grain."""
    one, two = _trimmed(speech[QUESTION]), _trimmed(speech[SECOND])
    gap_s = 0.3
    dropped, adopted = (
        _metric(serve, "omni_edge_realtime_early_responses_total", outcome=o)
        for o in ("dropped", "adopted")
    )

    async def main() -> None:
        async with (
            _client(serve).beta.realtime.connect(model="voice-chat") as conn,
            Talk(conn, chunk_s=0.02) as talk,
        ):
            talk.say(
                np.concatenate(
                    [
                        np.zeros(int(LEAD_S * RATE), np.float32),
                        one,
                        np.zeros(int(gap_s * RATE), np.float32),
                        two,
                    ]
                )
            )
            done = await talk.until(_done)
            assert talk.events[done].response.status == "completed"
            talk.silent = True  # no more audio: nothing new to detect
            # the dropped early reply was waited out when it was dropped (an earlier event's
            # handler): nothing of it can come after the barrier's reply
            seen = talk.events[: await _barrier(conn, talk)]
            for kind in (
                "input_audio_buffer.speech_started",
                "input_audio_buffer.committed",
                "response.created",
                "conversation.item.input_audio_transcription.completed",
                "response.done",
            ):
                assert sum(e.type == kind for e in seen) == 1, f"{kind}: {[e.type for e in seen]}"
            started = talk.of("input_audio_buffer.speech_started")[0]
            stopped = talk.of("input_audio_buffer.speech_stopped")[0]
            heard_ms = stopped.audio_end_ms - started.audio_start_ms
            assert heard_ms > 1000 * (one.size + two.size) / RATE, (
                heard_ms
            )  # both questions, one turn
            assert talk.events[done].response.model_extra["timing"]["early_start"] is True

    asyncio.run(main())
    assert (
        _metric(serve, "omni_edge_realtime_early_responses_total", outcome="dropped") >= dropped + 1
    )
    assert (
        _metric(serve, "omni_edge_realtime_early_responses_total", outcome="adopted") == adopted + 1
    )


def test_response_cancel_stops_the_reply(
    serve: ServeProcess, speech: dict[str, np.ndarray]
) -> None:
    async def main() -> None:
        async with (
            _client(serve).beta.realtime.connect(model="voice-chat") as conn,
            Talk(conn) as talk,
        ):
            talk.say(speech[QUESTION])
            # cancelled once its text streams: its audio goes out faster than real time here, so
            # waiting for the first audio would race the reply's end
            first = await talk.until(_is("response.audio_transcript.delta"))
            rid = talk.events[first].response_id
            await conn.response.cancel()
            done = await talk.until(_done, after=first)
            assert talk.events[done].response.status == "cancelled"
            assert talk.events[done].response.status_details.reason == "client_cancelled"
            truncated = talk.of("conversation.item.truncated", after=first)
            assert truncated and truncated[0].audio_end_ms == _sent_ms(talk.events[:done], rid)
            # response.cancel's handler waited for the reply's task to end before the server read
            # the barrier's event: anything still coming from it came before the barrier's reply
            barrier = await _barrier(conn, talk)
            late = [
                e
                for e in talk.events[done + 1 : barrier]
                if e.type == "response.audio.delta" and e.response_id == rid
            ]
            assert not late, f"{len(late)} audio deltas after response.done"

    asyncio.run(main())


def test_barge_in_cancels_the_reply_and_the_new_turn_is_answered(
    serve: ServeProcess, speech: dict[str, np.ndarray]
) -> None:
    from tests.helpers.speech import heard

    async def main() -> None:
        async with (
            _client(serve).beta.realtime.connect(model="voice-chat") as conn,
            Talk(conn) as talk,
        ):
            talk.say(speech[QUESTION])
            # speaking over the reply once its text streams, the speech sent in a burst (20x real
            # time): the VAD hears it within milliseconds, long before any pipeline has answered
            # and spoken a whole reply (here the reply's audio goes out faster than real time, so
            # "after its first audio" would race the reply's end)
            first = await talk.until(_is("response.audio_transcript.delta"))
            rid = talk.events[first].response_id
            talk.say(speech[SECOND], pace=20.0)
            barge = await talk.until(_is("input_audio_buffer.speech_started"), after=first)
            done = await talk.until(lambda e: _done(e) and e.response.id == rid, after=first)
            assert done > barge
            assert talk.events[done].response.status == "cancelled"
            assert talk.events[done].response.status_details.reason == "turn_detected"
            truncated = talk.of("conversation.item.truncated", after=first)
            assert truncated and truncated[0].audio_end_ms == _sent_ms(talk.events[:done], rid)
            second = await talk.until(lambda e: _done(e) and e.response.id != rid, after=done)
            assert talk.events[second].response.status == "completed"
            assert any(
                e.type == "response.audio.delta" and e.response_id != rid
                for e in talk.events[done:second]
            )
            late = [
                e
                for e in talk.events[done + 1 :]
                if e.type == "response.audio.delta" and e.response_id == rid
            ]
            assert not late, (
                f"{len(late)} audio deltas of the cancelled reply after its response.done"
            )
            turns = talk.of("conversation.item.input_audio_transcription.completed")
            assert len(turns) == 2
            heard(QUESTION, turns[0].transcript)
            heard(SECOND, turns[1].transcript)

    asyncio.run(main())


def test_a_malformed_event_is_an_error_and_the_session_goes_on_with_its_history(
    serve: ServeProcess, speech: dict[str, np.ndarray]
) -> None:
    async def main() -> None:
        async with (
            _client(serve).beta.realtime.connect(model="voice-chat") as conn,
            Talk(conn) as talk,
        ):
            talk.say(speech[QUESTION])
            one = await talk.until(_done)
            assert talk.events[one].response.status == "completed"
            talk.silent = True  # nothing but the bad events while they are answered
            bad: list[tuple[dict[str, Any], str]] = [
                (
                    {"type": "input_audio_buffer.append", "audio": 12345, "event_id": "evt_bad1"},
                    "audio",
                ),
                (
                    {
                        "type": "input_audio_buffer.append",
                        "audio": "not base64!",
                        "event_id": "evt_bad2",
                    },
                    "audio",
                ),
                (
                    {
                        "type": "session.update",
                        "session": {"turn_detection": {"silence_duration_ms": "soon"}},
                        "event_id": "evt_bad3",
                    },
                    "session.turn_detection.silence_duration_ms",
                ),
                (
                    {
                        "type": "session.update",
                        "session": {"input_audio_sample_rate": 8000},
                        "event_id": "evt_bad4",
                    },
                    "session.input_audio_sample_rate",
                ),
                ({"type": "no.such.event", "event_id": "evt_bad5"}, "type"),
            ]
            for event, param in bad:
                mark = len(talk.events)
                await conn.send(event)
                err = talk.events[await talk.until(_is("error"), after=mark, timeout=30)].error
                assert err.param == param, err
                assert err.event_id == event["event_id"]
                assert err.type == "invalid_request_error" and err.message.startswith(param)
            talk.silent = False
            talk.say(speech[SECOND])
            two = await talk.until(_done, after=one + 1)
            assert talk.events[two].response.status == "completed"
            # the second turn's prompt carries the first turn (question and reply): more tokens
            first_in = talk.events[one].response.usage.input_tokens
            assert talk.events[two].response.usage.input_tokens > first_in + 12

    asyncio.run(main())


def test_a_session_that_sends_nothing_is_closed_after_the_idle_timeout(serve: ServeProcess) -> None:
    async def main() -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed

        url = serve.url.replace("http://", "ws://") + "/v1/realtime?model=voice-chat"
        t0 = time.monotonic()  # before the session exists: its idle clock starts after this
        async with connect(url) as ws:
            assert '"session.created"' in str(await ws.recv())
            with pytest.raises(ConnectionClosed) as closed:
                while True:  # past the never-hangs deadline: a TimeoutError, not a close
                    await asyncio.wait_for(ws.recv(), NEVER_HANGS_S)
            waited = time.monotonic() - t0
            assert waited >= IDLE_S, f"closed after {waited:.2f} s"
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
            assert (
                "idle" in closed.value.rcvd.reason
                and "--realtime-idle-timeout" in closed.value.rcvd.reason
            )

    asyncio.run(main())


def test_eight_concurrent_sessions_are_each_answered_or_refused_as_busy(
    serve: ServeProcess, speech: dict[str, np.ndarray]
) -> None:
    """Eight sessions (two more than the pipeline's in-flight limit where that is 8 or more, up
    to 16, so that some are refused) say the same question at once: each turn is answered, or
    refused at once as busy (``--max-waiting 0``) — at least the sessions beyond the limit,
    whose turns all end within the same ~100 ms while a reply takes seconds."""
    import httpx

    limit = httpx.get(f"{serve.url}/v1/status", timeout=10).json()["queue"]["limit"]
    sessions = min(max(8, limit + 2), MAX_SESSIONS)
    assert limit < sessions, (
        f"the pipeline takes {limit} requests at once: {MAX_SESSIONS} sessions cannot show a refusal"
    )
    everyone_listening = asyncio.Barrier(sessions)

    async def one(i: int) -> tuple[str, list[str]]:
        async with (
            _client(serve).beta.realtime.connect(model="voice-chat") as conn,
            Talk(conn, chunk_s=0.1, pace=1.0) as talk,
        ):
            await talk.until(_is("session.created"), timeout=NEVER_HANGS_S)
            await everyone_listening.wait()  # every session open before any speaks
            talk.say(speech[QUESTION])
            done = talk.events[await talk.until(_done, timeout=400)]
            codes = [e.error.code for e in talk.of("error")]
            return done.response.status, codes

    async def main() -> list[tuple[str, list[str]]]:
        return list(await asyncio.gather(*(one(i) for i in range(sessions))))

    results = asyncio.run(main())
    statuses = [status for status, _ in results]
    print(f"\n{sessions} sessions, {limit} in flight at most: {statuses}")
    for status, codes in results:
        assert (status == "completed" and not codes) or (
            status == "failed" and codes == ["pipeline_busy"]
        ), results
    assert statuses.count("completed") >= 1
    assert statuses.count("failed") >= 1, f"no session refused with {limit} slots: {results}"


def test_the_startup_line_names_the_end_of_turn_delay(serve: ServeProcess) -> None:
    line = next(x for x in serve.lines if "/v1/realtime" in x)
    assert "400 ms of silence" in line and "min_silence_ms" in line


def test_a_bad_idle_timeout_is_exit_2_before_anything_starts(tmp_path: Path) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "serve",
            str(CONFIG),
            "--port",
            "0",
            "--realtime-idle-timeout",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--realtime-idle-timeout" in proc.stderr and "Traceback" not in proc.stderr
