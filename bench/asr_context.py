"""Whisper's encoder on 30 s windows or on the segment's length: word errors and time per question.

    python bench/asr_context.py [--turns 22] [--threads 2] [--backend ort-cpu|ort-openvino]
                                [--margin S] [--min-window S] [--no-silent-tail] [--json]

The asr stage's two settings (``audio_context: full`` and ``fit``,
``stages/asr/runner.py``) side by side in one process: two ``AsrRunner`` s planned
from the same graphs (``exports/whisper-tiny-en-*``, built by ``python -m
exports.whisper_asr build``) on the ONNX Runtime CPU EP in this process with
``--threads`` threads each (``--backend ort-openvino``: OpenVINO's EP in the route
worker of ``.venvs/openvino``, both graphs verified there first). Each held-out question of ``bench/voice_latency.py``
(spoken by the project's Piper voice, noise off: the same clip every run, 22 050 Hz
as the voice speaks it) is transcribed by both, alternating which goes first, so
load on the machine falls on both alike. One warm-up question first, not counted.

Per question: the seconds of audio, the frames ``fit`` gave the encoder, each
setting's transcription time (``AsrRunner.transcribe``: resampling, log-mel,
encoder, greedy decoding, detokenising) and word error rate
(``exports.whisper_asr.word_error_rate``: lower-cased, no punctuation, no number
normalisation). Summary: the total WER of each (word errors over all reference
words), p50/p95 of the times, and the ratio fit/full. ``--margin`` and
``--min-window`` override ``FIT_MARGIN_S`` and ``FIT_MIN_S`` to try other rules;
``--no-silent-tail`` feeds the decoder the cut alone (whisper.cpp's ``audio_ctx``),
without the silent window's outputs after it.
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

from voice_latency import QUESTIONS, WARM_UP, speak  # noqa: E402  (bench/ is sys.path[0])

from exports.whisper_asr import DECODER_DIR, ENCODER_DIR, _words, word_error_rate  # noqa: E402
from orchestrator.config import parse_config  # noqa: E402
from orchestrator.core.profile import parse_profile  # noqa: E402
from orchestrator.core.units import GiB  # noqa: E402
from orchestrator.planner import plan_pipeline  # noqa: E402
from stages.asr import runner as asr_runner  # noqa: E402
from stages.registry import get_kind  # noqa: E402

SETTINGS = ("full", "fit")
PROFILE: dict[str, Any] = {
    "format": "omni-edge.profile/1",
    "name": "asr-context bench",
    "host": {"os": "linux", "ram_total_bytes": 16 * GiB, "ram_available_bytes": 8 * GiB},
    "devices": [{"id": "cpu", "kind": "cpu", "name": "this CPU", "backends": ["ort-cpu"]}],
    "routes": [{"name": "this-process"}],
}
"""Enough of a profile to plan the stage on the CPU EP in this process (as tests/stages/asr do)."""
OV_PROFILE: dict[str, Any] = {
    **PROFILE,
    "devices": [
        {
            "id": "cpu",
            "kind": "cpu",
            "name": "this CPU",
            "backends": ["ort-openvino"],
            "backend_routes": {"ort-openvino": "openvino"},
        }
    ],
    "routes": [
        {"name": "this-process"},
        {
            "name": "openvino",
            "kind": "interpreter",
            "python": str(REPO / ".venvs/openvino/bin/python"),
        },
    ],
}
"""…and on OpenVINO's EP in its route worker (as tests/helpers/graphs.machine_profile)."""


def make_runner(setting: str, threads: int, base: Path, backend: str = "ort-cpu") -> Any:
    stage = {
        "name": "asr",
        "kind": "asr",
        "encoder": str(ENCODER_DIR),
        "decoder": str(DECODER_DIR),
        "devices": ["cpu"],
        "backends": [backend],
        "cpu_threads": threads,
        "audio_context": setting,
        "final_output": True,
        "final_output_type": "text",
    }
    config = parse_config(
        {"name": f"asr-{setting}", "stages": [stage]}, where=f"asr-{setting}", base_dir=base
    )
    profile = parse_profile(OV_PROFILE if backend == "ort-openvino" else PROFILE)
    if backend == "ort-openvino":
        from orchestrator.verify.run import verify_pipeline

        statuses = [r.status for r in verify_pipeline(config, profile).results]
        if statuses != ["passed", "passed"]:
            raise SystemExit(f"the OpenVINO gates did not pass: {statuses}")
    plan = plan_pipeline(config, profile, runtime=False)
    if plan.stage("asr").backend != backend:
        raise SystemExit(f"planned on {plan.stage('asr').backend}, not {backend}")
    runner = get_kind("asr").runner(plan.stage("asr"), config.stage("asr"))
    runner.load()
    return runner


def timed(runner: Any, clip: np.ndarray, rate: int) -> tuple[str, float]:
    start = time.perf_counter()
    text = runner.transcribe({"audio": clip, "sample_rate": rate})
    return text, time.perf_counter() - start


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def bench(args: argparse.Namespace) -> dict[str, Any]:
    questions = QUESTIONS[: args.turns]
    print(f"speaking {len(questions) + 1} questions with the Piper voice …", file=sys.stderr)
    clips = [speak(q) for q in [WARM_UP, *questions]]
    with tempfile.TemporaryDirectory() as base:
        runners = {s: make_runner(s, args.threads, Path(base), args.backend) for s in SETTINGS}
    fit = runners["fit"]
    if args.margin is not None:
        fit.fit_margin_s = args.margin
    if args.min_window is not None:
        fit.fit_min_s = args.min_window
    fit.silent_tail = not args.no_silent_tail
    try:
        for s in SETTINGS:
            timed(runners[s], *clips[0])
        rows = []
        for i, (text, (clip, rate)) in enumerate(zip(questions, clips[1:], strict=True)):
            row: dict[str, Any] = {
                "question": text,
                "audio_s": round(len(clip) / rate, 2),
                "fit_frames": fit.frames_for(round(len(clip) * fit.rate / rate)),
            }
            for s in SETTINGS if i % 2 == 0 else SETTINGS[::-1]:
                heard, seconds = timed(runners[s], clip, rate)
                row[s] = {
                    "text": heard,
                    "s": round(seconds, 4),
                    "wer": round(word_error_rate(text, heard), 4),
                }
            print(
                f"  {i + 1:>2}/{len(questions)} full {row['full']['s']:.2f} s  fit {row['fit']['s']:.2f} s  {text}",
                file=sys.stderr,
            )
            rows.append(row)
    finally:
        for r in runners.values():
            r.close()
    words = sum(len(_words(r["question"])) for r in rows)
    summary: dict[str, Any] = {}
    for s in SETTINGS:
        times = [r[s]["s"] for r in rows]
        errors = sum(r[s]["wer"] * len(_words(r["question"])) for r in rows)
        summary[s] = {
            "wer_total": round(errors / words, 4),
            "exact": sum(r[s]["wer"] == 0 for r in rows),
            "p50_s": round(pct(times, 50), 4),
            "p95_s": round(pct(times, 95), 4),
            "mean_s": round(float(np.mean(times)), 4),
        }
    ratios = [r["fit"]["s"] / r["full"]["s"] for r in rows]
    summary["ratio_fit_over_full"] = {
        "p50_time": round(summary["fit"]["p50_s"] / summary["full"]["p50_s"], 3),
        "per_question_median": round(pct(ratios, 50), 3),
    }
    summary["wer_points_fit_minus_full"] = round(
        100 * (summary["fit"]["wer_total"] - summary["full"]["wer_total"]), 2
    )
    return {
        "questions": len(rows),
        "reference_words": words,
        "threads": args.threads,
        "cpus": os.cpu_count(),
        "backend": args.backend,
        "fit_rule": {
            "margin_s": fit.fit_margin_s,
            "min_window_s": fit.fit_min_s,
            "frames_per_second": fit.frames_per_second,
            "silent_tail": fit.silent_tail,
        },
        "load_average": os.getloadavg(),
        "rows": rows,
        "summary": summary,
    }


def report(result: dict[str, Any]) -> None:
    rule = result["fit_rule"]
    print(
        f"asr audio_context full vs fit: {result['questions']} Piper-spoken questions, "
        f"{result['backend']}, "
        f"{result['threads']} threads\nfit: audio + {rule['margin_s']:g} s, whole seconds, "
        f"at least {rule['min_window_s']:g} s, "
        + (
            "the silent window's outputs after the cut"
            if rule["silent_tail"]
            else "the cut alone (no silent tail)"
        )
    )
    print(
        f"{'#':>2} {'audio':>5} {'frames':>6} {'full s':>6} {'fit s':>6} {'wer full':>8} {'wer fit':>7}  question"
    )
    for i, r in enumerate(result["rows"], 1):
        print(
            f"{i:>2} {r['audio_s']:5.2f} {r['fit_frames']:>6} {r['full']['s']:6.3f} {r['fit']['s']:6.3f} "
            f"{r['full']['wer']:8.2f} {r['fit']['wer']:7.2f}  {r['question'][:34]}"
        )
        if r["full"]["text"] != r["fit"]["text"]:
            print(f"{'':>5}full: {r['full']['text'][:68]}\n{'':>5}fit:  {r['fit']['text'][:68]}")
    s = result["summary"]
    print(f"\n{'':>6}{'WER':>7}{'exact':>7}{'p50 s':>8}{'p95 s':>8}{'mean s':>8}")
    for k in SETTINGS:
        print(
            f"{k:>6}{s[k]['wer_total']:7.3f}{s[k]['exact']:>5}/{result['questions']:<2}"
            f"{s[k]['p50_s']:7.3f}{s[k]['p95_s']:8.3f}{s[k]['mean_s']:8.3f}"
        )
    ratio = s["ratio_fit_over_full"]
    print(
        f"fit/full: p50 time {ratio['p50_time']:.2f}, per-question median {ratio['per_question_median']:.2f}; "
        f"WER {s['wer_points_fit_minus_full']:+.1f} points"
    )
    print(
        f"load average at the end: {', '.join(f'{x:.1f}' for x in result['load_average'])} "
        f"on {result['cpus']} CPUs"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--turns",
        type=int,
        default=len(QUESTIONS),
        help=f"questions counted (at most {len(QUESTIONS)})",
    )
    p.add_argument(
        "--threads", type=int, default=2, help="CPU EP threads of each runner (cpu_threads)"
    )
    p.add_argument("--backend", choices=["ort-cpu", "ort-openvino"], default="ort-cpu")
    p.add_argument(
        "--margin",
        type=float,
        help=f"fit's margin in seconds (default FIT_MARGIN_S = {asr_runner.FIT_MARGIN_S:g})",
    )
    p.add_argument(
        "--min-window",
        type=float,
        help=f"fit's shortest window in seconds (default FIT_MIN_S = {asr_runner.FIT_MIN_S:g})",
    )
    p.add_argument(
        "--no-silent-tail",
        action="store_true",
        help="fit: the decoder sees the cut alone (audio_ctx)",
    )
    p.add_argument(
        "--json", action="store_true", help="print the whole result as JSON instead of the table"
    )
    args = p.parse_args()
    if not 1 <= args.turns <= len(QUESTIONS):
        p.error(f"--turns must be 1..{len(QUESTIONS)}")
    if (
        args.threads < 1
        or (args.margin is not None and not 0 <= args.margin <= 30)
        or (args.min_window is not None and not 0 < args.min_window <= 30)
    ):
        p.error("--threads must be >= 1, --margin 0..30 s, --min-window (0, 30] s")
    missing = [
        d / "fp32.onnx" for d in (ENCODER_DIR, DECODER_DIR) if not (d / "fp32.onnx").is_file()
    ]
    if missing:
        print(
            f"{missing[0]}: the exported graph is missing; run: python -m exports.whisper_asr build",
            file=sys.stderr,
        )
        return 2
    result = bench(args)
    if args.json:
        print(json.dumps(result, indent=1, ensure_ascii=False))
    else:
        report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
