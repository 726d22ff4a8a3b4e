"""Whisper's route worker on OpenVINO: RSS after each transcript, with and without recycling.

    .venv/bin/python bench/asr_route_worker_memory.py [--items 16] [--recycle]
        [--audio-context full] [--profile configs/profiles/cpu-only-linux.json] [--json FILE]

OpenVINO's CPU plugin keeps memory for every new input shape, and Whisper's
decoder step meets a new cache shape at every step. This plans the asr stage
alone on the CPU with ``ort-openvino`` (the profile's OpenVINO route), loads
its runner there, and transcribes N distinct sentences the Piper voice says
(40-200 characters, ``bench/route_worker_memory.py``'s), one item (one window)
at a time. Printed per item: seconds, the worker's RSS after it and its peak so
far (sampled every 20 ms, following the worker), recycles so far. ``--recycle``
recycles the worker at the stage's planned budget (what the runner does at a
calibrated budget); without it the worker is never recycled (what the runner
does at an estimate: ``AsrRunner.recycles_at_estimate``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.route_worker_memory import sentences
from orchestrator.config import parse_config
from orchestrator.core.memory import rss_of
from orchestrator.core.profile import load_profile
from orchestrator.planner import plan_pipeline
from stages.registry import get_kind
from tests.helpers.speech import speak

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=16)
    ap.add_argument(
        "--recycle", action="store_true", help="recycle the worker at the planned budget"
    )
    ap.add_argument("--audio-context", default="full", choices=("full", "fit"))
    ap.add_argument("--profile", default=str(ROOT / "configs/profiles/cpu-only-linux.json"))
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    config = parse_config(
        {
            "name": "asr-alone",
            "stages": [
                {
                    "name": "asr",
                    "kind": "asr",
                    "encoder": str(ROOT / "exports/whisper-tiny-en-encoder"),
                    "decoder": str(ROOT / "exports/whisper-tiny-en-decoder"),
                    "devices": ["cpu"],
                    "backends": ["ort-openvino"],
                    "precision": ["fp32"],
                    "audio_context": args.audio_context,
                    "final_output": True,
                    "final_output_type": "text",
                }
            ],
        },
        where="bench/asr_route_worker_memory.py",
        base_dir=ROOT,
    )
    profile = load_profile(args.profile)
    stage = plan_pipeline(config, profile).stage("asr")
    if not stage.admitted or stage.backend != "ort-openvino":
        print(
            f"the asr stage was not planned on ort-openvino: {stage.to_dict().get('refusals')}",
            file=sys.stderr,
        )
        return 2
    if args.recycle:  # the runner recycles at a calibrated budget only; this one is the estimate
        stage = dataclasses.replace(
            stage, calibration={"provenance": "bench/asr_route_worker_memory.py --recycle"}
        )
    route = next((r for r in profile.routes if r.name == stage.route), None)
    runner: Any = get_kind("asr").runner(stage, config.stage("asr"), route)
    t0 = time.perf_counter()
    runner.load()
    load_s = time.perf_counter() - t0
    host = runner._host
    peak, stop = [rss_of(host.pid)], threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            peak[0] = max(peak[0], rss_of(host.pid))

    threading.Thread(target=sample, daemon=True).start()
    rows = []
    print(
        f"asr on ort-openvino ({stage.route}), audio_context {args.audio_context}: budget "
        f"{stage.budget_bytes() / MiB:.0f} MiB, limit {(host.recycle_limit or 0) / MiB:.0f} MiB "
        f"(0: none); loaded in {load_s:.1f} s, worker {rss_of(host.pid) / MiB:.0f} MiB"
    )
    print(
        f"{'item':>4}{'audio s':>9}{'words':>7}{'took s':>8}{'RSS MiB':>9}{'peak MiB':>10}{'recycles':>10}"
    )
    try:
        for i, text in enumerate(sentences(args.items, seed=5)):
            audio, rate = speak(text)
            t0 = time.perf_counter()
            heard = runner.transcribe({"audio": audio, "sample_rate": rate})
            row = {
                "audio_s": round(len(audio) / rate, 2),
                "words": len(heard.split()),
                "s": round(time.perf_counter() - t0, 2),
                "rss_bytes": rss_of(host.pid),
                "peak_bytes": peak[0],
                "recycles": host.recycles,
            }
            rows.append(row)
            print(
                f"{i:>4}{row['audio_s']:>9.2f}{row['words']:>7}{row['s']:>8.2f}{row['rss_bytes'] / MiB:>9.0f}"
                f"{row['peak_bytes'] / MiB:>10.0f}{row['recycles']:>10}"
            )
    finally:
        stop.set()
        runner.close()
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "budget_bytes": stage.budget_bytes(),
                    "load_s": round(load_s, 2),
                    "recycle": args.recycle,
                    "rows": rows,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
