"""A realtime session's responses: one turn's reply run through the pipeline, its events sent
as OpenAI's Realtime events (held while the reply is early), the user's item and its
transcript, and ``response.done`` with what was heard of it.

:class:`Replies` runs each response of one session (``realtime.Session``) and speaks through
it; a response's own state is ``realtime_early.Response``.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable
from typing import Any

import numpy as np
from starlette.websockets import WebSocketDisconnect

from orchestrator.core.documents import JsonObject
from orchestrator.runtime.audio import pcm16_bytes, resample
from orchestrator.runtime.events import AudioChunk, StageEvent, TextDelta
from orchestrator.server.chat_tools import CallWatch, looks_like_call
from orchestrator.server.failures import failure, internal_failure
from orchestrator.server.realtime_early import Response
from orchestrator.server.realtime_events import new_id
from orchestrator.server.realtime_transcribe import Heard
from stages.ar_decode.tool_grammar import parse_call
from stages.requests import AudioRequest, ChatMessage, Sampling, TextRequest


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
        output = [
            r.call
            if r.call is not None
            else {
                "id": r.item_id,
                "object": "realtime.item",
                "type": "message",
                "role": "assistant",
                "status": "completed" if status == "completed" else "incomplete",
                "content": [content],
            }
        ]
        return {
            "id": r.id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "modalities": self.s.modalities,
            "output_audio_format": "pcm16",
            "voice": self.s.voice,
            "output": output,
            "usage": {
                "total_tokens": u.get("total_tokens", 0),
                "input_tokens": u.get("prompt_tokens", 0),
                "output_tokens": u.get("completion_tokens", 0),
            },
        }

    async def run(
        self,
        r: Response,
        audio: np.ndarray,
        rate: int,
        entry: str | None,
        heard: Heard | Awaitable[Heard] | None = None,
    ) -> None:
        """One turn's reply: the segment through the pipeline — or, with the session's own
        transcript (``heard``: a closing pass of ``realtime_transcribe``, or one on its way), the
        transcript from the stage after the asr stage (``Realtime.text_entry``) — its events as
        the session's (held while the response is early), then :meth:`_finish`."""
        rt = self.s.rt
        run = await self._request(r, audio, rate, entry, heard)
        chunker = rt.chunker() if rt.chunker else None
        watch = CallWatch(r.tool_call is not None)
        status, http = "completed", 499  # 499 (the client went away) unless it ends otherwise
        details: JsonObject | None = None
        wants_audio = "audio" in self.s.modalities
        seconds = round(audio.size / float(rate) if r.seconds is None else r.seconds, 3)
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
                if await self._on_event(r, event, chunker, wants_audio, seconds, watch):
                    break  # a call is whole: the voice's work on it is dropped (closed below)
            await self._tell_user(r, seconds)
            if watch.is_call:
                await self._tell_call(r, "".join(r.text))
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

    async def _request(
        self,
        r: Response,
        audio: np.ndarray,
        rate: int,
        entry: str | None,
        heard: Heard | Awaitable[Heard] | None,
    ) -> Any:
        """The pipeline request of ``r`` (``served.Run``): the audio at ``entry``, or the
        session's transcript at the stage after the asr stage. The response's work starts with
        the transcript's pass (``request``), which ends at ``transcript``."""
        rt = self.s.rt
        r.mark("request")
        if not r.own_tools:
            r.tool_call = self.s.tool_call
        sampling = (
            None if r.tool_call is None else Sampling(tool_call=r.tool_call, min_tokens=0)
        )  # a call ends where its JSON does: the config's min_tokens would hold it past
        context = self.s.context(sampling)
        if r.typed:  # the conversation's last user item is the request, at the stage that answers
            r.told_user = True  # its user item is the client's own (conversation.item.create)
            assert rt.reply_entry is not None and context is not None  # check_answerable
            (item,) = context[rt.reply_entry]
            msgs = item["messages"]
            at = max((j for j, m in enumerate(msgs) if m["role"] == "user"), default=len(msgs) - 1)
            context[rt.reply_entry] = [{**item, "messages": msgs[:at] + msgs[at + 1 :]}]
            return rt.make_run(
                rt.app,
                TextRequest(msgs[at]["content"]),
                "realtime",
                entry=rt.reply_entry,
                context=context,
                conversation=self.s.id,
            )
        transcript = None
        if heard is not None:
            found = heard if isinstance(heard, Heard) else await heard
            r.marks["request"] = min(r.marks["request"], found.started)
            r.mark("transcript", found.at)
            transcript = found.text
            r.transcript = [transcript]
        return rt.make_run(
            rt.app,
            AudioRequest(audio, rate) if transcript is None else TextRequest(transcript),
            "realtime",
            entry=entry if transcript is None else rt.text_entry,
            context=context,
            conversation=self.s.id,
        )

    @staticmethod
    def _failure(exc: Exception) -> tuple[str, int, dict[str, str]]:
        """A failed response's status, HTTP status (for the metrics) and OpenAI-shaped error
        (``failures.failure``; a fault of this server is logged, and the session goes on)."""
        what = "realtime response"
        f = failure(exc, what) or internal_failure(exc, what)
        return "failed", f.status, {"type": f.type, "code": f.code, "message": f.line}

    async def _on_event(
        self,
        r: Response,
        event: Any,
        chunker: Any,
        wants_audio: bool,
        seconds: float,
        watch: CallWatch,
    ) -> bool:
        """One event of the request told as the session's; True once the reply is a whole call
        (its decode stage done: nothing more of the response is the client's)."""
        rt = self.s.rt
        if watch.is_call:  # the voice speaks nothing of a call: its text is kept, not sent
            if isinstance(event, TextDelta) and event.stage in rt.reply_stages:
                r.text.append(event.text)
            return (
                isinstance(event, StageEvent)
                and event.kind == "done"
                and event.stage in rt.reply_stages
            )
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
            if watch.text(event.text) is None:
                return False  # a call: told whole once its decode ends (_tell_call)
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
            r.audio_ends.append(r.audio_ms)
        return False

    async def _tell_call(self, r: Response, text: str) -> None:
        """The reply is a call: its ``function_call`` item and its arguments, in OpenAI's events
        (one ``delta`` of the whole arguments: they are JSON only once whole). A call cut short
        (``max_tokens``) is no call: the response says nothing more, as a chat's says no content."""
        found = parse_call(text)
        if found is None:
            return
        name, arguments = found
        item: JsonObject = {
            "id": r.item_id,
            "object": "realtime.item",
            "type": "function_call",
            "status": "in_progress",
            "call_id": new_id("call"),
            "name": name,
            "arguments": "",
        }
        ids = {"response_id": r.id, "item_id": r.item_id, "output_index": 0}
        await self._emit(
            r, "response.output_item.added", response_id=r.id, output_index=0, item=dict(item)
        )
        await self._emit(r, "conversation.item.created", previous_item_id=None, item=dict(item))
        call = {**ids, "call_id": item["call_id"]}
        await self._emit(r, "response.function_call_arguments.delta", **call, delta=arguments)
        await self._emit(r, "response.function_call_arguments.done", **call, arguments=arguments)
        r.call = {**item, "status": "completed", "arguments": arguments}
        await self._emit(
            r, "response.output_item.done", response_id=r.id, output_index=0, item=dict(r.call)
        )

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
        if r.call is not None or (r.tool_call is not None and looks_like_call(text)):
            heard = ""  # a call (its item is kept), or one cut short: no words of it
        if (said or r.typed) and status != "failed":
            r.history = [ChatMessage(role="user", content=said)] if said else []
            if heard.strip():
                r.history.append(ChatMessage(role="assistant", content=heard.strip()))
        if r.held is None:  # held: added when the turn is confirmed (_adopt)
            self.s.items.add_response(r)
        await self._emit(
            r, "response.done", response=self._response_doc(r, status, details, heard, usage)
        )
