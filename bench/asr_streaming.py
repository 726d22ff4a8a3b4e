"""Whisper while the user speaks against Whisper on the closed segment: word errors, and the
work left when the speech ends.

    python bench/asr_streaming.py [--turns 22] [--threads 2] [--step 0.5] [--espeak] [--json]

What a realtime session does (``orchestrator/server/realtime_transcribe.py``), replayed in this
process on the held-out questions of ``bench/voice_latency.py`` (spoken by the project's Piper
voice, noise off; ``--espeak``: by espeak-ng as well), with the method of
``bench/asr_context.py``: one ``AsrRunner`` (``audio_context: fit``, the voice-chat pipeline's
setting) on the ONNX Runtime CPU EP, ``--threads`` threads.

* **whole segment**: ``AsrRunner.transcribe`` on the question once it is over — what the asr
  stage does, and what a turn waited for before streaming;
* **streaming**: a partial pass every ``--step`` seconds of the question (the audio so far,
  decoded with the words committed before forced as its head), LocalAgreement committing the
  words two passes agree on (``stages.asr.streaming``), then the closing pass on the whole
  question — the only pass left once the speech ends; its time is the transcript's delay
  after the end of speech, less the VAD's own (a window or two) and any wait for a pass that
  was running.

Beside the closing pass, the **quiet pass** a session runs where the audio turned quiet
(``realtime_transcribe.QUIET_FRAMES`` frames ``QUIET_DB`` below the loudest, after the last loud
one): the same pass on the question cut there, its words against the closing pass's (the
server takes it for the closing pass when nothing loud follows).

The two alternate which goes first per question. Per question: the passes, the words committed
before the end, each side's time and word error rate (``exports.whisper_asr.word_error_rate``).
Summary: the total WER of each, p50/p95 of the whole-segment time and of the closing pass, and
their ratio. One warm-up question first, not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from asr_context import make_runner, pct  # noqa: E402  (bench/ is sys.path[0])
from voice_latency import QUESTIONS, WARM_UP, espeak, espeak_problem, speak  # noqa: E402

from exports.whisper_asr import DECODER_DIR, ENCODER_DIR, _words, word_error_rate  # noqa: E402
from orchestrator.runtime.audio import rms_dbfs  # noqa: E402
from orchestrator.server.realtime_transcribe import QUIET_FRAMES, Level  # noqa: E402
from stages.asr.streaming import LocalAgreement  # noqa: E402


def whole(runner: Any, clip: np.ndarray, rate: int) -> tuple[str, float]:
    start = time.perf_counter()
    text = runner.transcribe({"audio": clip, "sample_rate": rate})
    return text, time.perf_counter() - start


def streamed(runner: Any, clip: np.ndarray, rate: int, step_s: float) -> dict[str, Any]:
    """The session's passes over ``clip`` as it grows; the closing pass timed."""
    agreement = LocalAgreement()
    step = int(step_s * rate)
    passes = 0
    for end in range(step, clip.size, step):
        tokens = runner.decode_tokens(
            {"audio": clip[:end], "sample_rate": rate}, agreement.committed
        )
        agreement.update(tokens, runner.word_starts(tokens))
        passes += 1
    before = len(runner.text(agreement.committed).split())
    cut = quiet_end(clip, rate)
    quiet = runner.decode_tokens({"audio": clip[:cut], "sample_rate": rate}, agreement.committed)
    start = time.perf_counter()
    tokens = runner.decode_tokens({"audio": clip, "sample_rate": rate}, agreement.committed)
    closing = time.perf_counter() - start
    agreement.final(tokens)
    return {
        "text": runner.text(agreement.committed),
        "quiet_text": runner.text(quiet),
        "quiet_cut_s": round((clip.size - cut) / rate, 3),
        "closing_s": closing,
        "passes": passes + 1,
        "words_before_end": before,
    }


def quiet_end(clip: np.ndarray, rate: int) -> int:
    """Where the server's quiet pass cuts ``clip`` (``realtime_transcribe.Level``, the server's
    own rule): QUIET_FRAMES quiet frames after its last loud 10 ms frame."""
    frame = rate // 100
    level = Level(0, frame)
    for i in range(0, clip.size - frame + 1, frame):
        level.add(rms_dbfs(clip[i : i + frame]))
    return min((level.loud_until or 0) + QUIET_FRAMES * frame, clip.size)


def bench(args: argparse.Namespace) -> dict[str, Any]:
    questions = QUESTIONS[: args.turns]
    voices = ["piper", "espeak-ng"] if args.espeak else ["piper"]
    print(f"speaking {len(questions) + 1} questions ({', '.join(voices)}) …", file=sys.stderr)
    said = {"piper": [speak(q) for q in [WARM_UP, *questions]]}
    if args.espeak:
        said["espeak-ng"] = [espeak(q) for q in [WARM_UP, *questions]]
    with tempfile.TemporaryDirectory() as base:
        runner = make_runner("fit", args.threads, Path(base))
    rows = []
    try:
        whole(runner, *said["piper"][0])
        streamed(runner, *said["piper"][0], args.step)
        for voice in voices:
            for i, (text, (clip, rate)) in enumerate(zip(questions, said[voice][1:], strict=True)):
                row: dict[str, Any] = {"voice": voice, "question": text}
                for side in ("whole", "streaming") if i % 2 == 0 else ("streaming", "whole"):
                    if side == "whole":
                        heard, seconds = whole(runner, clip, rate)
                        row["whole"] = {"text": heard, "s": round(seconds, 4)}
                    else:
                        s = streamed(runner, clip, rate, args.step)
                        row["streaming"] = {**s, "closing_s": round(s["closing_s"], 4)}
                for side in ("whole", "streaming"):
                    row[side]["wer"] = round(word_error_rate(text, row[side]["text"]), 4)
                row["streaming"]["quiet_wer"] = round(
                    word_error_rate(text, row["streaming"]["quiet_text"]), 4
                )
                print(
                    f"  {voice:>9} {i + 1:>2}/{len(questions)} whole {row['whole']['s']:.3f} s  "
                    f"closing pass {row['streaming']['closing_s']:.3f} s  {text}",
                    file=sys.stderr,
                )
                rows.append(row)
    finally:
        runner.close()
    return {
        "questions": len(questions),
        "voices": voices,
        "threads": args.threads,
        "step_s": args.step,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "rows": rows,
        "summary": summarise(rows),
    }


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    words = sum(len(_words(r["question"])) for r in rows)
    out: dict[str, Any] = {"reference_words": words}
    for side in ("whole", "streaming"):
        errors = sum(r[side]["wer"] * len(_words(r["question"])) for r in rows)
        out[f"wer_{side}"] = round(errors / words, 4)
        out[f"exact_{side}"] = sum(r[side]["wer"] == 0 for r in rows)
    errors = sum(r["streaming"]["quiet_wer"] * len(_words(r["question"])) for r in rows)
    out["wer_quiet"] = round(errors / words, 4)
    out["exact_quiet"] = sum(r["streaming"]["quiet_wer"] == 0 for r in rows)
    out["quiet_same"] = sum(r["streaming"]["quiet_text"] == r["streaming"]["text"] for r in rows)
    cuts = [r["streaming"]["quiet_cut_s"] for r in rows]
    out["quiet_cut_s"] = {"p50": round(pct(cuts, 50), 3), "p95": round(pct(cuts, 95), 3)}
    times = [r["whole"]["s"] for r in rows]
    closing = [r["streaming"]["closing_s"] for r in rows]
    out["whole_s"] = {"p50": round(pct(times, 50), 4), "p95": round(pct(times, 95), 4)}
    out["closing_s"] = {"p50": round(pct(closing, 50), 4), "p95": round(pct(closing, 95), 4)}
    out["closing_over_whole_p50"] = round(out["closing_s"]["p50"] / out["whole_s"]["p50"], 3)
    out["words_before_end"] = sum(r["streaming"]["words_before_end"] for r in rows)
    out["passes_mean"] = round(float(np.mean([r["streaming"]["passes"] for r in rows])), 2)
    return out


def report(result: dict[str, Any]) -> None:
    print(
        f"Whisper tiny.en (fit, CPU EP, {result['threads']} threads): whole segment vs streaming "
        f"(a pass every {result['step_s']:g} s), {result['questions']} questions × "
        f"{', '.join(result['voices'])}"
    )
    print(
        f"{'voice':>9} {'#':>2} {'whole s':>7} {'close s':>7} {'passes':>6} {'wer w':>5} {'wer s':>5}  question"
    )
    for i, r in enumerate(result["rows"], 1):
        print(
            f"{r['voice']:>9} {(i - 1) % result['questions'] + 1:>2} {r['whole']['s']:7.3f} "
            f"{r['streaming']['closing_s']:7.3f} {r['streaming']['passes']:>6} {r['whole']['wer']:5.2f} "
            f"{r['streaming']['wer']:5.2f}  {r['question'][:30]}"
        )
        if r["streaming"]["quiet_text"] != r["streaming"]["text"]:
            print(f"{'':>12}quiet:     {r['streaming']['quiet_text'][:60]}")
        if r["whole"]["text"] != r["streaming"]["text"]:
            print(
                f"{'':>12}whole:     {r['whole']['text'][:60]}\n{'':>12}streaming: {r['streaming']['text'][:60]}"
            )
    s = result["summary"]
    n = len(result["rows"])
    print(
        f"\nWER: whole {s['wer_whole']:.3f} ({s['exact_whole']}/{n} exact), streaming "
        f"{s['wer_streaming']:.3f} ({s['exact_streaming']}/{n} exact) over {s['reference_words']} words"
    )
    print(
        f"the closing pass on the audio up to where it turned quiet (a quiet pass): WER "
        f"{s['wer_quiet']:.3f} ({s['exact_quiet']}/{n} exact), the same words as the closing "
        f"pass on all of it in {s['quiet_same']}/{n}; audio not heard p50 "
        f"{s['quiet_cut_s']['p50']:.3f} s / p95 {s['quiet_cut_s']['p95']:.3f} s"
    )
    print(
        f"time after the end of speech: whole segment p50 {s['whole_s']['p50']:.3f} s / p95 "
        f"{s['whole_s']['p95']:.3f} s; closing pass p50 {s['closing_s']['p50']:.3f} s / p95 "
        f"{s['closing_s']['p95']:.3f} s ({s['closing_over_whole_p50']:.2f}×)"
    )
    print(
        f"words committed before the end: {s['words_before_end']} of {s['reference_words']}; "
        f"{s['passes_mean']:.1f} passes a question"
    )
    print(
        f"load average at the end: {', '.join(f'{x:.1f}' for x in result['load_average'])} "
        f"on {result['cpus']} CPUs"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--turns", type=int, default=len(QUESTIONS), help=f"questions (at most {len(QUESTIONS)})"
    )
    p.add_argument("--threads", type=int, default=2, help="CPU EP threads (cpu_threads)")
    p.add_argument(
        "--step", type=float, default=0.5, help="seconds of speech between partial passes"
    )
    p.add_argument("--espeak", action="store_true", help="espeak-ng's voice as well as Piper's")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    args = p.parse_args()
    if not 1 <= args.turns <= len(QUESTIONS):
        p.error(f"--turns must be 1..{len(QUESTIONS)}")
    if args.threads < 1 or not 0.1 <= args.step <= 5:
        p.error("--threads must be >= 1 and --step 0.1..5 s")
    missing = [
        d / "fp32.onnx" for d in (ENCODER_DIR, DECODER_DIR) if not (d / "fp32.onnx").is_file()
    ]
    if missing:
        print(
            f"{missing[0]}: the exported graph is missing; run: python -m exports.whisper_asr build",
            file=sys.stderr,
        )
        return 2
    if args.espeak and (problem := espeak_problem()):
        print(problem, file=sys.stderr)
        return 2
    result = bench(args)
    print(json.dumps(result, indent=1, ensure_ascii=False)) if args.json else report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
