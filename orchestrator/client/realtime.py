"""A recording spoken to a running server's ``/v1/realtime``: ``omni-edge chat --url URL --audio-in FILE.wav``.

:class:`VoiceSession` is the client half of a realtime session, in the event
shapes of OpenAI's Realtime API (the ``openai`` package's
``openai.types.beta.realtime`` models name every field used here; the server
is ``orchestrator/server/realtime.py``). It speaks over the ``websockets``
package:

* ``connect``: the WebSocket upgrade at ``ws(s)://HOST/v1/realtime`` with the
  key as ``Authorization: Bearer KEY``; no redirect is followed (the key stays
  with the URL given), no proxy is asked (``$HTTP_PROXY`` never sees the key or
  the audio);
* ``configure``: ``session.update`` — pcm16 in at 16 kHz (what the speech
  models hear: the server resamples nothing) and out at 24 kHz (OpenAI's
  rate), server VAD with the server's own defaults;
* ``speak``: the samples in 20 ms ``input_audio_buffer.append`` events at the
  pace of the audio (``speed`` 1.0: real time, as a microphone delivers them;
  resampled to the session's input rate first), then silence — at least
  :data:`TAIL_SILENCE_S` and twice the session's ``silence_duration_ms``, so
  that server VAD ends the turn — until every turn heard so far is answered
  (a microphone left open while the reply plays).

Each turn is a :class:`Turn`: the user's transcript, the reply's text and
audio, and the times the client saw. **Latency** is the voice-to-voice
figure: from the end of the user's speech in the stream to the first byte of
the reply's audio. The end of speech is where the server's VAD placed it
(``input_audio_buffer.speech_stopped``'s ``audio_end_ms``, less the
``prefix_padding_ms`` this server pads a segment's end with), taken at the
moment the client sent that sample. The **breakdown** is what the client can
see, each step from the previous one: ``end_of_turn`` (→ ``speech_stopped``:
the VAD's pause, ``silence_duration_ms``, plus the server's scoring),
``transcript`` (→ ``…input_audio_transcription.completed``: the pipeline's
vad trim and the asr stage), ``first_token`` (→ the first
``response.audio_transcript.delta``), ``first_sentence`` (→ the delta that
ends the reply's first sentence, ``.``/``!``/``?``), ``first_audio`` (→ the
first ``response.audio.delta``). When the server answered early (it started
the reply in the pause and held its events until the pause closed the turn),
the transcript and the first tokens arrive with ``speech_stopped``: the
client's steps then say when events arrived, not when the work was done. The
**server's timing** (``response.done``'s ``timing``, an omni-edge extension)
says that: each mark in ms after the end of speech as the server heard it —
``request``, ``turn_end``, ``transcript``, ``first_token``,
``first_sentence``, ``first_audio`` — and ``early_start``.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import terminal_text
from orchestrator.runtime.audio import OPENAI_PCM_RATE, WavStreamWriter, pcm16_bytes, resample

REALTIME_PATH = "/v1/realtime"
CHUNK_MS = 20
"""One append: 20 ms of audio, the frame a microphone's capture callback delivers (WebRTC's
10-20 ms frames; the page's AudioWorklet posts 128-sample quanta, batched to this)."""
INPUT_RATE = 16000
"""The rate asked of the session for the audio sent: Whisper and Silero hear 16 kHz, so the
server resamples nothing (the server takes 16000 or 24000)."""
OUTPUT_RATE = OPENAI_PCM_RATE
"""The rate asked for the reply's audio: OpenAI's pcm16 (24 kHz), what ``--out`` is written at."""
TAIL_SILENCE_S = 1.0
"""Silence streamed after the recording at least: more than the server VAD's pause that ends a
turn (the example's vad ``min_silence_ms``, 400 ms; OpenAI's default 500 ms) with room to spare."""
CONNECT_TIMEOUT_S = 10.0
"""The WebSocket handshake's limit: on loopback it takes milliseconds; a server that accepts
the TCP connection but never upgrades is stuck."""
REPLY_TIMEOUT_S = 300.0
"""Longest wait for a turn's reply to finish once the recording was sent: a cold engine's first
token on a slow CPU (``chat.HTTP_TIMEOUT_S``, the same bound for HTTP)."""
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The largest server event taken: one sentence's audio is ~0.3 MB of base64 at 24 kHz; 16 MiB
is uvicorn's own frame cap (websockets' default of 1 MiB would drop a long sentence)."""
SENTENCE_END = re.compile(r"[.!?](\s|$)")


class SessionError(Exception):
    """The session cannot go on: ``code`` is the exit code (1: the server or the connection;
    2: the input, e.g. a key the server refused)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def realtime_url(url: str) -> str:
    """``ws(s)://HOST[:PORT]/…/v1/realtime`` of ``--url``: http → ws, https → wss; the path
    ``/v1/realtime`` added unless the URL ends with it (``/v1`` is taken, as OpenAI's base URL)."""
    scheme, sep, rest = url.partition("://")
    scheme = {"http": "ws", "https": "wss"}.get(scheme.lower(), scheme.lower())
    rest = rest.rstrip("/")
    if rest.endswith(REALTIME_PATH):
        return f"{scheme}{sep}{rest}"
    if rest.endswith("/v1"):
        rest = rest[: -len("/v1")]
    return f"{scheme}{sep}{rest}{REALTIME_PATH}"


@dataclass
class Turn:
    """One spoken turn and its reply, as the client saw them (times: ``time.perf_counter``)."""

    index: int
    item_id: str
    speech_start_ms: int | None = None
    speech_end_ms: int | None = None
    """Where the user's speech ended in the stream (the VAD's end less its padding)."""
    speech_end_at: float | None = None
    """When the client sent that sample."""
    stopped_at: float | None = None
    transcript: str | None = None
    transcript_at: float | None = None
    response_id: str | None = None
    reply: list[str] = field(default_factory=list)
    first_token_at: float | None = None
    first_sentence_at: float | None = None
    first_audio_at: float | None = None
    audio_samples: int = 0
    status: str | None = None
    """``response.done``'s status: completed, cancelled (barge-in), failed."""
    reason: str | None = None
    usage: dict[str, object] = field(default_factory=dict)
    server_timing: dict[str, object] = field(default_factory=dict)
    """``response.done``'s ``timing``: the server's own marks, in ms after the end of speech."""

    @property
    def latency_s(self) -> float | None:
        """End of the user's speech → the first byte of the reply's audio."""
        if self.speech_end_at is None or self.first_audio_at is None:
            return None
        return self.first_audio_at - self.speech_end_at

    def breakdown_s(self) -> dict[str, float | None]:
        """Each step's share of the latency, from the previous step the client saw (they add up to
        it). A step that came after the first audio is None: the voice may start on the reply's
        first words, before its first sentence is complete."""
        steps = [
            ("end_of_turn", self.stopped_at),
            ("transcript", self.transcript_at),
            ("first_token", self.first_token_at),
            ("first_sentence", self.first_sentence_at),
            ("first_audio", self.first_audio_at),
        ]
        out: dict[str, float | None] = {}
        last = self.speech_end_at
        end = self.first_audio_at
        for name, at in steps:
            if (
                at is None
                or last is None
                or (end is not None and name != "first_audio" and at > end)
            ):
                out[name] = None
                continue
            out[name] = round(at - last, 4)
            last = at
        return out

    def as_json(self, out_rate: int) -> JsonObject:
        latency = self.latency_s
        return {
            "turn": self.index,
            "item_id": self.item_id,
            "response_id": self.response_id,
            "status": self.status,
            "reason": self.reason,
            "transcript": self.transcript,
            "reply": "".join(self.reply),
            "speech_start_ms": self.speech_start_ms,
            "speech_end_ms": self.speech_end_ms,
            "latency_s": None if latency is None else round(latency, 4),
            "breakdown_s": self.breakdown_s(),
            "server_timing_ms": self.server_timing,
            "reply_audio_s": round(self.audio_samples / out_rate, 3),
            "usage": self.usage,
        }


class VoiceSession:
    """One ``/v1/realtime`` session (see the module docstring). ``on_event(name, turn)`` is told
    ``transcript``, ``delta`` (with the text), ``done`` as they happen, for printing."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        speed: float = 1.0,
        out: Path | None = None,
        on_event: Callable[[str, Turn, str], None] | None = None,
    ) -> None:
        self.url = realtime_url(url)
        self.api_key, self.speed, self.out = api_key, speed, out
        self.on_event = on_event or (lambda kind, turn, text: None)
        self.ws: Any = None
        self.session: dict[str, object] = {}
        self.in_rate, self.out_rate = INPUT_RATE, OUTPUT_RATE
        self.turns: list[Turn] = []
        self.by_item: dict[str, Turn] = {}
        self.by_response: dict[str, Turn] = {}
        self.awaiting: list[Turn] = []
        """Committed turns whose response has not been created yet."""
        self.open_responses = 0
        self.unanswered = 0
        """Committed turns whose ``response.done`` has not come."""
        self.speaking = False
        self.sent_at: list[float] = []
        """When each chunk of the stream was sent …"""
        self.sent_end: list[int] = []
        """… and the sample of the stream it ended at (a recording's last chunk may be short)."""
        self.sent_samples = 0
        self.t0: float | None = None
        self.error: SessionError | None = None
        self.writer: WavStreamWriter | None = None
        self._receiver: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._synced = 0

    # -- connecting ----------------------------------------------------------------
    async def connect(self) -> None:
        """The WebSocket upgrade, then ``session.created``; ``SessionError`` when refused."""

        class NoRedirects(connect):
            def process_redirect(self, exc: Exception) -> Exception | str:
                return exc  # a 3xx is an answer, not a place to send the key

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        where = f"--url {self.url}"
        try:
            self.ws = await NoRedirects(
                self.url,
                additional_headers=headers,
                proxy=None,
                compression=None,
                open_timeout=CONNECT_TIMEOUT_S,
                max_size=MAX_MESSAGE_BYTES,
                ping_interval=None,
            )
        except InvalidStatus as exc:
            raise SessionError(*_refusal(where, exc.response)) from None
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            reason = (
                exc.strerror
                if isinstance(exc, OSError) and exc.strerror
                else str(exc) or type(exc).__name__
            )
            raise SessionError(
                f"{where}: cannot connect ({reason}); start a server there with `omni-edge serve "
                "configs/examples/voice-chat.yaml`, or fix the URL"
            ) from None
        first = await self._next_event()
        if first.get("type") == "error":
            raise SessionError(f"{where}: the server refused the session: {_error_text(first)}")
        if first.get("type") != "session.created":
            raise SessionError(
                f"{where}: expected session.created, got {str(first.get('type'))[:60]!r}: "
                "is this an OpenAI Realtime endpoint?"
            )
        self.session = _object(first.get("session"))

    async def _next_event(self) -> dict[str, object]:

        try:
            raw = await asyncio.wait_for(self.ws.recv(), CONNECT_TIMEOUT_S)
        except (ConnectionClosed, TimeoutError) as exc:
            raise SessionError(
                f"--url {self.url}: the session ended before it began ({_closed(exc)})"
            ) from None
        return _parse(raw)

    async def configure(self, instructions: str | None = None) -> None:
        """``session.update``: pcm16 both ways at :data:`INPUT_RATE`/:data:`OUTPUT_RATE`, server VAD
        with the server's own settings, text and audio; waits for ``session.updated``."""
        session: JsonObject = {
            "modalities": ["text", "audio"],
            "input_audio_format": "pcm16",
            "output_audio_format": "pcm16",
            "input_audio_sample_rate": INPUT_RATE,
            "output_audio_sample_rate": OUTPUT_RATE,
            "turn_detection": {
                "type": "server_vad",
                "create_response": True,
                "interrupt_response": True,
            },
        }
        if instructions is not None:
            session["instructions"] = instructions
        await self._send({"type": "session.update", "session": session})
        doc = await self._next_event()
        while doc.get("type") not in ("session.updated", "error"):
            doc = await self._next_event()
        if doc["type"] == "error":
            raise SessionError(f"session.update refused: {_error_text(doc)}")
        self.session = _object(doc.get("session"))
        self.in_rate = int(_number(self.session.get("input_audio_sample_rate")) or OPENAI_PCM_RATE)
        self.out_rate = int(
            _number(self.session.get("output_audio_sample_rate")) or OPENAI_PCM_RATE
        )
        if self.out is not None:
            self.writer = WavStreamWriter(self.out, self.out_rate)
        self._receiver = asyncio.create_task(self._receive(), name="realtime-client:receive")

    @property
    def turn_detection(self) -> dict[str, object]:
        return _object(self.session.get("turn_detection"))

    # -- sending -------------------------------------------------------------------
    async def _send(self, doc: JsonObject) -> None:

        try:
            await self.ws.send(json.dumps(doc))
        except ConnectionClosed as exc:
            raise SessionError(
                self.error.args[0]
                if self.error
                else f"the server closed the session ({_closed(exc)})"
            ) from None

    async def speak(
        self, audio: np.ndarray, rate: int, *, reply_timeout_s: float = REPLY_TIMEOUT_S
    ) -> None:
        """``audio`` (float mono at ``rate``) streamed at the session's pace, then silence until
        every turn heard is answered (see the module docstring); ``SessionError`` on a server
        ``error`` event, a lost connection or no reply within ``reply_timeout_s``."""
        await self._stream(resample(audio, rate, self.in_rate))
        pause_ms = _number(self.turn_detection.get("silence_duration_ms")) or 500.0
        await self._stream(
            np.zeros(int(self.in_rate * max(TAIL_SILENCE_S, 2 * pause_ms / 1000)), np.float32)
        )
        await self._sync()  # every append so far has been scored: speech_started/stopped are in
        deadline = time.perf_counter() + reply_timeout_s
        chunk = np.zeros(self.in_rate * CHUNK_MS // 1000, np.float32)
        while not self.idle:
            if time.perf_counter() > deadline:
                raise SessionError(
                    f"no reply within {reply_timeout_s:g} s of the end of the recording"
                )
            await self._stream(chunk)  # the microphone stays open while the reply comes
        self._check()

    @property
    def idle(self) -> bool:
        """Nothing heard that waits for a reply: no open speech, every committed turn answered."""
        return not self.speaking and self.unanswered == 0 and self.open_responses == 0

    async def _stream(self, samples: np.ndarray) -> None:
        n = self.in_rate * CHUNK_MS // 1000
        if self.t0 is None:
            self.t0 = time.perf_counter()
        for i in range(0, samples.size, n):
            self._check()
            part = samples[i : i + n]
            due = self.t0 + (self.sent_samples + part.size) / self.in_rate / self.speed
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)  # a chunk leaves once its audio was "captured"
            await self._send(
                {
                    "type": "input_audio_buffer.append",
                    "audio": base64.b64encode(pcm16_bytes(part)).decode("ascii"),
                }
            )
            self.sent_at.append(time.perf_counter())
            self.sent_samples += part.size
            self.sent_end.append(self.sent_samples)

    async def _sync(self) -> None:
        """An empty ``session.update``: its ``session.updated`` comes after every event sent before
        it was handled (the server handles a session's events in order)."""
        target = self._synced + 1
        await self._send({"type": "session.update", "session": {}})
        deadline = time.perf_counter() + REPLY_TIMEOUT_S
        while True:
            self._check()
            if self._synced >= target:
                return
            self._changed.clear()  # no await between the check and this: nothing is missed
            try:
                await asyncio.wait_for(
                    self._changed.wait(), max(deadline - time.perf_counter(), 0.01)
                )
            except TimeoutError:
                raise SessionError("the server stopped answering (no session.updated)") from None

    def _check(self) -> None:
        if self.error is not None:
            raise self.error
        if (
            self._receiver is not None
            and self._receiver.done()
            and self._receiver.exception() is None
        ):
            raise SessionError("the server closed the session")

    def sent_time(self, ms: float) -> float | None:
        """When the stream up to ``ms`` had been sent: the send time of the chunk holding the
        sample just before it (``ms`` is an end, exclusive)."""
        index = bisect.bisect_left(self.sent_end, max(round(ms * self.in_rate / 1000.0), 1))
        return self.sent_at[index] if index < len(self.sent_at) else None

    # -- receiving -----------------------------------------------------------------
    async def _receive(self) -> None:

        try:
            async for raw in self.ws:
                self._handle(_parse(raw), time.perf_counter())
                self._changed.set()
        except ConnectionClosed as exc:
            if self.error is None:
                self.error = SessionError(f"the server closed the session ({_closed(exc)})")
        except SessionError as exc:
            self.error = self.error or exc
        self._changed.set()

    def _turn(self, item_id: str) -> Turn:
        turn = self.by_item.get(item_id)
        if turn is None:
            turn = Turn(len(self.turns) + 1, item_id)
            self.turns.append(turn)
            self.by_item[item_id] = turn
        return turn

    def _handle(self, doc: dict[str, object], now: float) -> None:
        kind = doc.get("type")
        if kind == "error":
            self.error = SessionError(f"the server sent an error: {_error_text(doc)}")
        elif kind == "session.updated":
            self._synced += 1
        elif kind == "input_audio_buffer.speech_started":
            self.speaking = True
            self._turn(str(doc.get("item_id"))).speech_start_ms = _int(doc.get("audio_start_ms"))
        elif kind == "input_audio_buffer.speech_stopped":
            self.speaking = False
            turn = self._turn(str(doc.get("item_id")))
            turn.stopped_at = now
            end = _int(doc.get("audio_end_ms"))
            if end is not None:
                pad = _int(self.turn_detection.get("prefix_padding_ms")) or 0
                turn.speech_end_ms = max(end - pad, turn.speech_start_ms or 0)
                turn.speech_end_at = self.sent_time(turn.speech_end_ms)
        elif kind == "input_audio_buffer.committed":
            self.speaking = False
            turn = self._turn(str(doc.get("item_id")))
            self.awaiting.append(turn)
            self.unanswered += 1
        elif kind == "conversation.item.input_audio_transcription.completed":
            turn = self._turn(str(doc.get("item_id")))
            turn.transcript, turn.transcript_at = str(doc.get("transcript") or ""), now
            self.on_event("transcript", turn, turn.transcript)
        elif kind == "response.created":
            rid = str(_object(doc.get("response")).get("id"))
            turn = self.awaiting.pop(0) if self.awaiting else self._turn(f"(no item for {rid})")
            turn.response_id = rid
            self.by_response[rid] = turn
            self.open_responses += 1
        elif kind in ("response.audio_transcript.delta", "response.text.delta"):
            replying = self.by_response.get(str(doc.get("response_id")))
            if replying is not None and doc.get("delta"):
                replying.first_token_at = replying.first_token_at or now
                replying.reply.append(str(doc["delta"]))
                if replying.first_sentence_at is None and SENTENCE_END.search(
                    "".join(replying.reply)
                ):
                    replying.first_sentence_at = now
                self.on_event("delta", replying, str(doc["delta"]))
        elif kind == "response.audio.delta":
            speaking = self.by_response.get(str(doc.get("response_id")))
            pcm = base64.b64decode(str(doc.get("delta") or ""))
            if speaking is not None and pcm:
                speaking.first_audio_at = speaking.first_audio_at or now
                speaking.audio_samples += len(pcm) // 2
                if self.writer is not None:
                    self.writer.write(
                        np.frombuffer(pcm[: len(pcm) - len(pcm) % 2], "<i2").astype(np.float32)
                        / 32768.0
                    )
        elif kind == "response.done":
            response = _object(doc.get("response"))
            done = self.by_response.get(str(response.get("id")))
            self.open_responses = max(self.open_responses - 1, 0)
            self.unanswered = max(self.unanswered - 1, 0)
            if done is not None:
                done.status = str(response.get("status"))
                reason = _object(response.get("status_details")).get("reason")
                done.reason = reason if isinstance(reason, str) else None
                done.usage = _object(response.get("usage"))
                done.server_timing = _object(response.get("timing"))
                self.on_event("done", done, "")

    # -- ending --------------------------------------------------------------------
    async def close(self, *, keep_audio: bool) -> Path | None:
        """Close the socket; finish ``out`` (``keep_audio``) or remove it. The path written, if any."""
        if self._receiver is not None:
            self._receiver.cancel()
            await asyncio.gather(self._receiver, return_exceptions=True)
        if self.ws is not None:
            await self.ws.close()
        if self.writer is None:
            return None
        if keep_audio and self.writer.samples:
            return self.writer.close()
        self.writer.discard()
        return None


def _refusal(where: str, response: Any) -> tuple[str, int]:
    """The message and exit code of a refused upgrade (the server's HTTP error, OpenAI's shape)."""
    status = int(response.status_code)
    try:
        message = json.loads(bytes(response.body or b""))["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = str(response.reason_phrase or "")
    text = f"{where}: the server refused the WebSocket upgrade: HTTP {status}" + (
        f": {message}" if message else ""
    )
    if status in (401, 403):
        fix = (
            "give the server's key ($OMNI_EDGE_API_KEY, --api-key-file PATH)"
            if status == 401
            else "connect to the address the server was started with"
        )
        return terminal_text(f"{text} ({fix})"), 2
    if 300 <= status < 400:
        location = response.headers.get("Location", "?")
        return terminal_text(
            f"{text}: a redirect to {location}, not followed (the key stays with the URL given); "
            "give the final URL"
        ), 1
    if status == 404:
        return terminal_text(
            f"{text} (no {REALTIME_PATH} there: an omni-edge serve of a version without it?)"
        ), 1
    return terminal_text(text), 1


def _object(value: object) -> dict[str, object]:
    """A JSON object the server sent, as a mapping (anything else: empty)."""
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}


def _number(value: object) -> float:
    """A number the server sent (anything else, or none: 0)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _error_text(doc: dict[str, object]) -> str:
    error = doc.get("error") or {}
    if not isinstance(error, dict):
        return terminal_text(str(error))
    code = f" ({error['code']})" if error.get("code") else ""
    return terminal_text(f"{error.get('message') or error}{code}")


def _closed(exc: Any) -> str:
    rcvd = getattr(exc, "rcvd", None)
    if rcvd is None:
        return "no close frame"
    return terminal_text(f"code {rcvd.code}" + (f": {rcvd.reason}" if rcvd.reason else ""))


def _parse(raw: str | bytes) -> dict[str, object]:
    try:
        doc = json.loads(raw)
    except ValueError:
        raise SessionError("the server sent an event that is not JSON") from None
    if not isinstance(doc, dict):
        raise SessionError("the server sent an event that is not a JSON object")
    return doc


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
