"""A realtime session's responses: one turn's reply run through the pipeline, its events sent
as OpenAI's Realtime events (held while the reply is early), the user's item and its
transcript, and ``response.done`` with what was heard of it.

:class:`Replies` runs each response of one session (``realtime.Session``) and speaks through
it; a response's own state is ``realtime_early.Response``.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
from starlette.websockets import WebSocketDisconnect

from orchestrator.core.documents import JsonObject
from orchestrator.runtime.audio import pcm16_bytes, resample
from orchestrator.runtime.events import AudioChunk, StageEvent, TextDelta
from orchestrator.server.failures import failure, internal_failure
from orchestrator.server.realtime_early import Response
from stages.requests import AudioRequest, ChatMessage


class Replies:
    """The responses of one session (the module's guarantees)."""

    def __init__(self, session: Any) -> None:
        # the session (``realtime.Session``), typed Any: naming it here would make the two
        # modules a cycle
        self.s = session

    async def _emit(self, r: Response, type_: str, **fields: Any) -> None:
        if r.held is not None:
            r.held.append((type_, fields))
        else:
            await self.out(r, type_, fields)

    async def out(self, r: Response, type_: str, fields: JsonObject) -> None:
        if type_ == "response.audio.delta" and "first_audio" not in r.marks:
            r.mark("first_audio")
            self.s.rt.app.metrics.voice_to_voice.observe(
                max(r.marks["first_audio"] - r.speech_end, 0.0)
            )
        elif type_ == "response.done":
            fields["response"]["timing"] = r.timing()
        await self.s.send(type_, **fields)

    def _response_doc(
        self,
        r: Response,
        status: str,
        details: JsonObject | None,
        transcript: str,
        usage: dict[str, int] | None,
    ) -> JsonObject:
        content = {
            "type": "audio" if "audio" in self.s.modalities else "text",
            "transcript" if "audio" in self.s.modalities else "text": transcript,
        }
        u = usage or {}
        return {
            "id": r.id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "modalities": self.s.modalities,
            "output_audio_format": "pcm16",
            "voice": self.s.voice,
            "output": [
                {
                    "id": r.item_id,
                    "object": "realtime.item",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed" if status == "completed" else "incomplete",
                    "content": [content],
                }
            ],
            "usage": {
                "total_tokens": u.get("total_tokens", 0),
                "input_tokens": u.get("prompt_tokens", 0),
                "output_tokens": u.get("completion_tokens", 0),
            },
        }

    async def run(self, r: Response, audio: np.ndarray, rate: int, entry: str | None) -> None:
        """One turn's reply: the segment through the pipeline, its events as the session's
        (held while the response is early), then :meth:`_finish`."""
        rt = self.s.rt
        r.mark("request")
        run = rt.make_run(
            rt.app,
            AudioRequest(audio, rate),
            "realtime",
            entry=entry,
            context=self.s.context(),
            conversation=self.s.id,
        )
        chunker = rt.chunker() if rt.chunker else None
        status, http = "completed", 499  # 499 (the client went away) unless it ends otherwise
        details: JsonObject | None = None
        wants_audio = "audio" in self.s.modalities
        seconds = round(audio.size / float(rate), 3)
        try:
            await self._emit(
                r,
                "response.created",
                response={
                    "id": r.id,
                    "object": "realtime.response",
                    "status": "in_progress",
                    "status_details": None,
                    "output": [],
                    "modalities": self.s.modalities,
                    "voice": self.s.voice,
                    "usage": None,
                },
            )
            async for event in run.rest():
                await self._on_event(r, event, chunker, wants_audio, seconds)
            await self._tell_user(r, seconds)
            if wants_audio and r.audio_chunks:
                await self._emit(
                    r,
                    "response.audio.done",
                    response_id=r.id,
                    item_id=r.item_id,
                    output_index=0,
                    content_index=0,
                )
            http = 200
        except asyncio.CancelledError:
            status, details, http = (
                "cancelled",
                {"type": "cancelled", "reason": r.reason or "client_cancelled"},
                499,
            )
        except (WebSocketDisconnect, OSError):  # the client went away mid-reply: nobody to tell
            r.quiet = True
        except Exception as exc:
            status, http, err = self._failure(exc)
            details = {"type": "failed", "error": dict(err)}
            if (
                r.held is not None
            ):  # early: the confirmed turn gets a response of its own, which tells
                r.failed_early = r.quiet = True
            elif not r.quiet:
                await self.s.error(err["message"], type_=err["type"], code=err["code"])
        finally:
            # cancels the request on every stage (if still running) and frees its slot; shielded, so a
            # barge-in arriving while it closes does not leave the request half closed
            closing = asyncio.ensure_future(run.close(http))
            try:
                await asyncio.shield(closing)
            except asyncio.CancelledError:
                await closing
        if self.s.response is r:
            self.s.response = None
        if not r.quiet:
            await self._finish(r, status, details, chunker, wants_audio, run.trace.usage())

    @staticmethod
    def _failure(exc: Exception) -> tuple[str, int, dict[str, str]]:
        """A failed response's status, HTTP status (for the metrics) and OpenAI-shaped error
        (``failures.failure``; a fault of this server is logged, and the session goes on)."""
        what = "realtime response"
        f = failure(exc, what) or internal_failure(exc, what)
        return "failed", f.status, {"type": f.type, "code": f.code, "message": f.line}

    async def _on_event(
        self, r: Response, event: Any, chunker: Any, wants_audio: bool, seconds: float
    ) -> None:
        rt = self.s.rt
        if isinstance(event, TextDelta) and event.stage in rt.transcript_stages:
            r.transcript.append(event.text)
        elif (
            isinstance(event, StageEvent)
            and event.kind == "done"
            and event.stage in rt.transcript_stages
        ):
            await self._tell_user(r, seconds)
        elif isinstance(event, TextDelta) and event.stage in rt.reply_stages:
            await self._tell_user(r, seconds)
            r.mark("first_token")
            r.text.append(event.text)
            if chunker is not None:
                cut = chunker.feed(event.text)
                if cut:
                    r.mark("first_sentence")
                r.chunks += cut
            await self._emit(
                r,
                "response.audio_transcript.delta" if wants_audio else "response.text.delta",
                response_id=r.id,
                item_id=r.item_id,
                output_index=0,
                content_index=0,
                delta=event.text,
            )
        elif isinstance(event, AudioChunk) and event.stage in rt.audio_stages and wants_audio:
            await self._tell_user(r, seconds)
            pcm = pcm16_bytes(resample(event.audio, event.sample_rate, self.s.out_rate))
            await self._emit(
                r,
                "response.audio.delta",
                response_id=r.id,
                item_id=r.item_id,
                output_index=0,
                content_index=0,
                delta=base64.b64encode(pcm).decode("ascii"),
            )
            r.audio_chunks += 1
            r.audio_ms += 1000.0 * (len(pcm) // 2) / self.s.out_rate

    async def _tell_user(self, r: Response, seconds: float) -> None:
        """The user's turn as the conversation's item, with its transcript (once per response)."""
        if r.told_user:
            return
        r.told_user = True
        r.mark("transcript")
        text = " ".join(t.strip() for t in r.transcript if t.strip())
        await self._emit(
            r,
            "conversation.item.created",
            previous_item_id=None,
            item={
                "id": r.user_item_id,
                "object": "realtime.item",
                "type": "message",
                "role": "user",
                "status": "completed",
                "content": [{"type": "input_audio", "transcript": text}],
            },
        )
        await self._emit(
            r,
            "conversation.item.input_audio_transcription.completed",
            item_id=r.user_item_id,
            content_index=0,
            transcript=text,
            usage={"type": "duration", "seconds": seconds},
        )

    async def _finish(
        self,
        r: Response,
        status: str,
        details: JsonObject | None,
        chunker: Any,
        wants_audio: bool,
        usage: dict[str, int] | None,
    ) -> None:
        """The reply is over: what was heard of it, the conversation, ``response.done``."""
        if chunker is not None:
            r.chunks += chunker.flush()
        text = "".join(r.text)
        heard = (
            text
            if status == "completed" or not wants_audio or chunker is None
            else " ".join(c.strip() for c in r.chunks[: r.audio_chunks])
        )
        if status == "cancelled" and wants_audio:
            await self._emit(
                r,
                "conversation.item.truncated",
                item_id=r.item_id,
                content_index=0,
                audio_end_ms=int(r.audio_ms),
            )
        said = " ".join(t.strip() for t in r.transcript if t.strip())
        if said and status != "failed":
            r.history = [ChatMessage(role="user", content=said)]
            if heard.strip():
                r.history.append(ChatMessage(role="assistant", content=heard.strip()))
        if r.held is None:  # held: added when the turn is confirmed (_adopt)
            self.s.history += r.history
        await self._emit(
            r, "response.done", response=self._response_doc(r, status, details, heard, usage)
        )
