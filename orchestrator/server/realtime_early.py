"""Early responses of a realtime session (``orchestrator.server.realtime``): started in the
pause that may end the turn, their events held until the turn is confirmed.

Once the pause after speech has lasted the segment's end pad (``prefix_padding_ms``), the segment
it would close is known exactly (``Segmenter.pending``), so the session starts the response then
(``Session._early_start``) while it waits for the rest of ``silence_duration_ms``. The response's
events are held (:attr:`Response.held`). When the pause closes the turn with that same segment,
the response is adopted (``Session._adopt``: the held events go out); speech resuming, the client
committing or clearing the buffer, or the session ending drops it unseen. Each outcome is counted
(``omni_edge_realtime_early_responses_total``: adopted, dropped, failed).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.documents import JsonObject
from orchestrator.server.metrics import ServerMetrics
from orchestrator.server.realtime_events import new_id
from stages.requests import ChatMessage
from stages.vad.runner import Cutter

TIMING_MARKS = ("request", "turn_end", "transcript", "first_token", "first_sentence", "first_audio")
"""What ``response.done``'s ``timing`` stamps, each in ms after the end of the user's speech: the
pipeline request started (before ``turn_end`` when the response started early), the pause closed
the turn (``speech_stopped``), the transcript was final, the first reply token, the first
sentence cut for the voice, the first reply audio sent."""


@dataclass
class Response:
    """One response of a session: its ids, its task, what it said and sent, and, while it is
    early, its held events and the segment it answers."""

    id: str
    item_id: str
    user_item_id: str
    task: asyncio.Task[None] | None = None
    reason: str | None = None
    """Why it was cancelled (``turn_detected``, ``client_cancelled``), once it was."""
    quiet: bool = False
    """Cancelled because the session ended, or an early start the turn did not confirm: nothing more is sent."""
    text: list[str] = field(default_factory=list)
    chunks: list[str] = field(default_factory=list)
    audio_chunks: int = 0
    audio_ms: float = 0.0
    transcript: list[str] = field(default_factory=list)
    told_user: bool = False
    held: list[tuple[str, JsonObject]] | None = None
    """Events of an early response (started in the pause, before the turn closed), kept until the
    turn is confirmed; None once they go straight out."""
    span: tuple[int, int] | None = None
    """An early response's segment bounds (the VAD's samples): the closed turn must be the same."""
    failed_early: bool = False
    """An early response that failed (e.g. ``pipeline_busy``) before its turn was confirmed: the
    confirmed turn starts a response of its own, which reports whatever happens then."""
    history: list[ChatMessage] = field(default_factory=list)
    """What it adds to the conversation, once it is over (applied when it goes out)."""
    typed: bool = False
    """It answers the conversation's items (``response.create`` after ``conversation.item.create``),
    not a spoken turn: no user item of its own."""
    tool_call: JsonObject | None = None
    """The tools it offers (the decode stage's ``tool_call`` sampling); None: it decodes text."""
    own_tools: bool = False
    """``tool_call`` is its ``response.create``'s own, not the session's."""
    call: JsonObject | None = None
    """Its ``function_call`` item, when its reply was a call."""
    audio_ends: list[float] = field(default_factory=list)
    """When each audio chunk sent ended (ms of its audio): a sentence each."""
    speech_end: float = 0.0
    """When the user's speech ended (``time.monotonic``): the zero of ``marks``."""
    seconds: float | None = None
    """The user audio's length, when the audio the reply was given is not all of it yet (an
    early reply's segment, its end pad on its way)."""
    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str, at: float | None = None) -> None:
        self.marks.setdefault(name, time.monotonic() if at is None else at)

    def timing(self) -> JsonObject:
        """``response.done``'s ``timing``: each mark in ms after the end of speech (None: did not happen)."""
        doc: JsonObject = {
            f"{k}_ms": (
                round(1000 * (self.marks[k] - self.speech_end)) if k in self.marks else None
            )
            for k in TIMING_MARKS
        }
        doc["early_start"] = self.span is not None
        return doc


class EarlyReply:
    """A session's early response (at most one, :attr:`response`) and the pause it answers.

    ``metrics`` is the app's ``ServerMetrics``: each early response's outcome is counted in its
    ``early_responses``."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.response: Response | None = None
        """The response started in the current pause, not yet confirmed."""
        self.pause_at: tuple[int, float] | None = None
        """The current pause's start (the VAD's sample) and when that audio arrived (``time.monotonic``)."""

    def start(self, span: tuple[int, int], user_item_id: str, speech_end: float) -> Response:
        """A response to the segment ``span`` the current pause will close, its events held."""
        r = Response(
            new_id("resp"), new_id("item"), user_item_id, held=[], span=span, speech_end=speech_end
        )
        self.response = r
        return r

    async def drop(self, r: Response) -> None:
        if not r.failed_early:
            self.metrics.early_responses.labels("dropped").inc()
        r.quiet = True
        if r.task is not None:
            r.task.cancel()
            await asyncio.gather(r.task, return_exceptions=True)

    async def drop_current(self) -> None:
        """Drop the early response, if there is one (the turn ends otherwise than by this pause)."""
        if self.response is not None:
            early, self.response = self.response, None
            await self.drop(early)

    async def drop_stale(self, pending: tuple[tuple[int, int], Any] | None) -> None:
        """Drop the early response when the current pause would no longer close its segment
        (``pending``: what ``Cutter.pending`` says the pause would close now)."""
        early = self.response
        if early is not None and (pending is None or pending[0] != early.span):
            self.response = None
            await self.drop(early)

    def discard(self) -> None:
        """The buffer is cleared: the early response's segment is gone with it (cancelled, not
        waited for), and so is the pause."""
        if self.response is not None:
            early, self.response = self.response, None
            self.metrics.early_responses.labels("dropped").inc()
            early.quiet = True
            if early.task is not None:
                early.task.cancel()
        self.pause_at = None

    async def confirmed(self, span: tuple[int, int]) -> Response | None:
        """The early response, if it answers exactly the turn just closed (dropped otherwise)."""
        r, self.response = self.response, None
        if r is None:
            return None
        if r.span == span and not r.failed_early:
            return r
        if r.failed_early:
            self.metrics.early_responses.labels("failed").inc()
        await self.drop(r)
        return None

    def adopted(self, r: Response) -> None:
        """The turn ``r`` answers is confirmed: it ended when the pause closed it."""
        r.mark("turn_end")
        self.metrics.early_responses.labels("adopted").inc()

    def speech_end_at(self, cutter: Cutter, index: int, arrived: float) -> float:
        """When the speech that ended at the VAD's sample ``index`` ended, as this server heard it:
        the time the append holding the pause's start arrived, less the audio after it in that
        append (a client streaming faster than real time makes the figures look longer)."""
        if self.pause_at is not None and self.pause_at[0] == index:
            return self.pause_at[1]
        return arrived - max(cutter.graph_samples - index, 0) / cutter.runner.rate

    def note_pause(self, cutter: Cutter, arrived: float) -> None:
        index = cutter.segmenter.pause_start
        if index is not None and (self.pause_at is None or self.pause_at[0] != index):
            self.pause_at = (
                index,
                arrived - max(cutter.graph_samples - index, 0) / cutter.runner.rate,
            )
