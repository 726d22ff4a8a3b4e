"""The CPU split, static against following the work, side by side in one run: the default pipeline.

    python bench/cpu_share.py [--config configs/voice-assistant.yaml] [--repeat 2]
                              [--concurrency 1 4] [--json FILE]

The plan splits the CPU's cores between the thinker (llama.cpp) and the voice (ONNX Runtime):
one thread each on 2 cores. Two ``Pipeline``s of the config are started at once, the same plan
in each: **static** (every stage on its planned threads; the default, ``prefill``, lends the
voice's thread to a step that reads a prompt only) and **follow**
(``OMNI_EDGE_CPU_SHARE=follow`` in the device actor's environment: while the voice is idle, the
decoder's steps also take its thread; ``stages.cpu_share``). Each round sends every prompt
of ``PROMPTS`` (greedy: ``temperature`` 0, so both variants speak the same replies) to one
variant then the other, the order swapped every round so that the machine's other work weighs
on both, at each ``--concurrency`` (1: one request at a time; N: N at once, the prompts in
groups of N). Per request: time to first audio and to the last audio chunk from the request's
submission, and the thinker's decode rate (its own ``decode_tokens_per_s``). Reported: medians
per variant and concurrency after one warm-up round, throughput (requests over a group's wall
time, summed), and the ratios follow / static. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPTS = (
    "What is a simple way to keep houseplants alive?",
    "Why does bread go stale?",
    "How do I start learning to draw?",
    "What makes thunder so loud?",
)
"""Held out: written for this benchmark, in no test and no other benchmark."""
VARIANTS = ("static", "follow")
FIGURES = (
    ("ttfa_s", "first audio s"),
    ("last_audio_s", "last audio s"),
    ("decode_tps", "decode tok/s"),
)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def one(pipe: Any, prompt: str, rid: str) -> dict[str, Any]:
    """One request: its first and last audio chunk (seconds from submission), the thinker's rate."""
    from orchestrator.runtime.events import AudioChunk, StageEvent

    first = last = None
    tps = None
    request = {"prompt": prompt, "sampling": {"temperature": 0.0}}
    async for e in pipe.stream(request, request_id=rid):
        if isinstance(e, AudioChunk):
            first = e.t if first is None else first
            last = e.t
        elif isinstance(e, StageEvent) and e.kind == "done" and e.stage == "thinker":
            rate = e.stats.get("decode_tokens_per_s")
            tps = float(rate) if isinstance(rate, (int, float)) else None
    return {"ttfa_s": first, "last_audio_s": last, "decode_tps": tps}


async def group(pipe: Any, prompts: list[str], tag: str) -> tuple[list[dict[str, Any]], float]:
    t0 = time.perf_counter()
    rows = await asyncio.gather(*(one(pipe, p, f"{tag}-{i}") for i, p in enumerate(prompts)))
    return list(rows), time.perf_counter() - t0


def med(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarise(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per concurrency and variant: the medians, the throughput; then follow / static."""
    out: dict[str, Any] = {}
    for c, by_variant in runs.items():
        figs = {}
        for v in VARIANTS:
            rows, wall = by_variant[v]["rows"], by_variant[v]["wall_s"]
            figs[v] = {k: med([r[k] for r in rows]) for k, _ in FIGURES}
            figs[v]["requests_per_s"] = len(rows) / wall if wall else None
        ratio = {}
        for k in (*(k for k, _ in FIGURES), "requests_per_s"):
            a, b = figs["static"][k], figs["follow"][k]
            ratio[k] = b / a if a and b else None
        out[c] = {"figures": figs, "follow_over_static": ratio}
    return out


def report(summary: dict[str, Any], repeat: int) -> str:
    lines = [
        f"default pipeline, {len(PROMPTS)} prompts, greedy; medians of {repeat} round(s) after a warm-up",
        "",
        f"{'concurrency':12}{'figure':16}{'static':>10}{'follow':>10}{'follow/static':>15}",
    ]
    for c, s in summary.items():
        for k, label in (*FIGURES, ("requests_per_s", "requests/s")):
            a, b, r = (
                s["figures"]["static"][k],
                s["figures"]["follow"][k],
                s["follow_over_static"][k],
            )
            f = lambda x, spec=".3f": "n/a" if x is None else f"{x:{spec}}"  # noqa: E731
            lines.append(f"{c:12}{label:16}{f(a):>10}{f(b):>10}{f(r, '.2f'):>15}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=REPO / "configs/voice-assistant.yaml")
    ap.add_argument("--repeat", type=int, default=2, help="rounds measured after one warm-up")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    if args.repeat < 1 or min(args.concurrency) < 1:
        ap.error("--repeat and each --concurrency must be at least 1")
    if not args.config.is_file():
        print(f"error: {args.config}: no such config", file=sys.stderr)
        return 2

    from orchestrator.api import Pipeline
    from stages.cpu_share import SHARE_ENV

    pipes: dict[str, Any] = {}
    try:
        for v in VARIANTS:
            pipe = Pipeline.from_config(args.config)
            for env in pipe.runtime.actor_envs.values():
                env[SHARE_ENV] = v
            t = time.perf_counter()
            pipes[v] = pipe.start()
            log(f"{v}: started in {time.perf_counter() - t:.1f} s")
        plan = pipes["follow"].plan
        log("CPU threads: " + ", ".join(f"{s.name} {s.cpu_threads}" for s in plan.stages))

        async def rounds() -> dict[str, dict[str, Any]]:
            runs: dict[str, dict[str, Any]] = {
                str(c): {v: {"rows": [], "wall_s": 0.0} for v in VARIANTS} for c in args.concurrency
            }
            for i in range(args.repeat + 1):
                order = VARIANTS if i % 2 == 0 else VARIANTS[::-1]
                for c in args.concurrency:
                    for v in order:
                        for g in range(0, len(PROMPTS), c):
                            rows, wall = await group(
                                pipes[v], list(PROMPTS[g : g + c]), f"{v}{i}c{c}g{g}"
                            )
                            if i:
                                runs[str(c)][v]["rows"] += rows
                                runs[str(c)][v]["wall_s"] += wall
                if i:  # the figures so far, in case the run is cut short
                    log(f"after round {i}: " + json.dumps(summarise(runs)))
                else:
                    log("round 0 (warm-up) done")
            return runs

        runs = asyncio.run(rounds())
    finally:
        for p in pipes.values():
            p.close()
    summary = summarise(runs)
    print(report(summary, args.repeat))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
