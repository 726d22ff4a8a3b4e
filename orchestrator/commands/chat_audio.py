"""``omni-edge chat --url URL --audio-in FILE.wav``: a recording spoken to ``/v1/realtime``, each turn printed.

The recording is checked first (``orchestrator.api.audio_request``: a 16-bit
PCM WAV at 8-192 kHz; exit 2 before anything connects), then streamed by
:class:`orchestrator.client.realtime.VoiceSession` at the pace of the
audio (``--audio-speed``). Per turn, on stdout: the transcript, the reply's
text as it streams, and the latency — end of the user's speech → first reply
audio byte — with the steps the client saw; ``--json``: one JSON object per
turn instead. ``--out`` collects every reply's audio in one WAV at 24 kHz
(written as it comes, complete only when the session ended well).

Exit codes: 0 every turn was answered; 1 the server sent an ``error`` event,
refused or lost the connection, heard no speech, or did not answer in time;
2 bad input (the recording, the flags, a key the server refused); 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.client.realtime import SessionError, Turn, VoiceSession
from orchestrator.core.errors import terminal_text

if TYPE_CHECKING:
    from collections.abc import Mapping

WIDTH = 80
"""Human output's width (the project's: reads well in 80 columns)."""
STEPS = (
    ("end_of_turn", "end of turn"),
    ("transcript", "transcript"),
    ("first_token", "first token"),
    ("first_sentence", "first sentence"),
    ("first_audio", "first audio"),
)


class TurnPrinter:
    """What a turn shows as it happens: human lines, or one JSON object per turn (``as_json``)."""

    def __init__(self, as_json: bool, out_rate: int = 24000) -> None:
        self.as_json, self.out_rate = as_json, out_rate
        self.in_reply: Turn | None = None

    def __call__(self, kind: str, turn: Turn, text: str) -> None:
        if self.as_json:
            if kind == "done":
                print(json.dumps(turn.as_json(self.out_rate), ensure_ascii=False), flush=True)
            return
        if kind == "transcript":
            self._end_reply()
            print(
                textwrap.fill(
                    terminal_text(f"turn {turn.index}  you: {text.strip() or '(nothing heard)'}"),
                    WIDTH,
                    subsequent_indent=" " * 8,
                ),
                flush=True,
            )
        elif kind == "delta":
            if self.in_reply is not turn:
                self._end_reply()
                sys.stdout.write(f"  reply (turn {turn.index}): ")
                self.in_reply = turn
            sys.stdout.write(terminal_text(text))
            sys.stdout.flush()
        elif kind == "done":
            if self.in_reply is turn:
                self._end_reply()
            print(latency_text(turn), flush=True)

    def _end_reply(self) -> None:
        if self.in_reply is not None:
            sys.stdout.write("\n")
            self.in_reply = None


def latency_text(turn: Turn) -> str:
    """``  latency 0.93 s: end of turn 0.45 + transcript 0.20 + …`` wrapped in 80 columns."""
    status = (
        ""
        if turn.status == "completed"
        else f" (reply {turn.status}{f': {turn.reason}' if turn.reason else ''})"
    )
    latency = turn.latency_s
    if latency is None:
        return f"  turn {turn.index}: no reply audio{status}"
    steps = turn.breakdown_s()
    parts = [f"{label} {steps[name]:.2f}" for name, label in STEPS if steps.get(name) is not None]
    text = f"  latency {latency:.2f} s (end of speech → first reply audio){status}: " + " + ".join(
        parts
    )
    lines = textwrap.fill(text, WIDTH, subsequent_indent="    ")
    server = server_text(turn.server_timing)
    return lines + (
        "\n" + textwrap.fill(server, WIDTH, initial_indent="    ", subsequent_indent="    ")
        if server
        else ""
    )


SERVER_MARKS = (
    ("turn_end_ms", "turn end"),
    ("transcript_ms", "transcript"),
    ("first_token_ms", "first token"),
    ("first_sentence_ms", "first sentence"),
    ("first_audio_ms", "first audio"),
)


def server_text(timing: Mapping[str, object]) -> str:
    """The server's own marks (``response.done``'s ``timing``), ms after the end of speech."""
    marks = [
        f"{label} {timing[key]}" for key, label in SERVER_MARKS if isinstance(timing.get(key), int)
    ]
    if not marks:
        return ""
    early = " (started early, in the pause)" if timing.get("early_start") else ""
    return f"server, ms after the end of speech{early}: " + ", ".join(marks)


def run_audio_in(args: argparse.Namespace, api_key: str | None) -> int:
    """The command (see the module docstring); ``ConfigError``/``BadRequest`` (exit 2) for bad input."""
    from orchestrator.api import audio_request
    from orchestrator.core.fileio import check_writable

    request = audio_request(args.audio_in, where=f"--audio-in {args.audio_in}")
    out = Path(args.out) if args.out else None
    if out is not None:
        check_writable(out, what="--out")
    printer = TurnPrinter(args.json)
    session = VoiceSession(
        args.url, api_key=api_key, speed=args.audio_speed, out=out, on_event=printer
    )
    written: list[Path | None] = []
    try:
        asyncio.run(
            _talk(session, request["audio"], int(request["sample_rate"]), args.system, written)
        )
    except SessionError as exc:
        printer._end_reply()
        print(terminal_text(f"error: {exc}"), file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        printer._end_reply()
        print(
            "interrupted: the session closed" + (f", nothing written to {out}" if out else ""),
            file=sys.stderr,
        )
        return 130
    return _summary(session, args, written[0] if written else None)


async def _talk(
    session: VoiceSession,
    audio: Any,
    rate: int,
    instructions: str | None,
    written: list[Path | None],
) -> None:
    ok = False
    try:
        await session.connect()
        await session.configure(instructions)
        await session.speak(audio, rate)
        ok = True
    finally:
        written.append(await session.close(keep_audio=ok))


def _summary(session: VoiceSession, args: argparse.Namespace, written: Path | None) -> int:
    answered = [t for t in session.turns if t.status is not None]
    if not answered:
        print(
            f"error: the server heard no speech in {terminal_text(args.audio_in)} (no turn was detected); "
            "give a recording with speech, louder than the noise around it",
            file=sys.stderr,
        )
        return 1
    latencies = sorted(t.latency_s for t in answered if t.latency_s is not None)
    line = f"{len(answered)} turn{'s' * (len(answered) != 1)} answered"
    if latencies:
        line += f"; latency median {latencies[len(latencies) // 2]:.2f} s"
    print(line, file=sys.stderr)
    if args.audio_speed != 1.0:
        print(
            f"note: streamed at {args.audio_speed:g}× real time: the end-of-turn pause passed that much faster, "
            "so the latency is not the real-time figure",
            file=sys.stderr,
        )
    if written is not None and session.writer is not None:
        print(
            terminal_text(
                f"audio: {written} ({session.writer.seconds:.2f} s at {session.out_rate} Hz)"
            ),
            file=sys.stderr,
        )
    return 0
