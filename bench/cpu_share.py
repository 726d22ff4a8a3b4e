"""The CPU split's policies side by side in one run: the default pipeline.

    python bench/cpu_share.py [--config configs/voice-assistant.yaml] [--repeat 2]
                              [--concurrency 1 4] [--json FILE]

The plan splits the CPU's cores between the thinker (llama.cpp) and the voice (ONNX Runtime):
one thread each on 2 cores. Three ``Pipeline``s of the config are started at once, the same plan
in each, ``OMNI_EDGE_CPU_SHARE`` set in its device actors' environment before they start
(``stages.cpu_share``): **static** (every stage on its planned threads), **prefill** (the
default: a step that reads a prompt also takes the idle stages' threads) and **follow** (while
the voice is idle, every decoder step takes its thread). Each round sends every prompt of
``PROMPTS`` (greedy: ``temperature`` 0, so the variants speak the same replies) to each variant
in turn, the order rotated every round so that the machine's other work weighs on all, at each
``--concurrency`` (1: one request at a time; N: N at once, the prompts in
groups of N). Per request: time to first audio and to the last audio chunk from the request's
submission, and the thinker's decode rate (its own ``decode_tokens_per_s``). Reported: medians
per variant and concurrency after one warm-up round, throughput (requests over a group's wall
time, summed), and the ratios to static. Each actor's policy is read back from the stage's
load report (``cpu_share``) before any request: a variant that did not take is an error, not a
row. Progress goes to stderr.
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
VARIANTS = ("static", "prefill", "follow")
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


def thinker_load(pipe: Any) -> list[dict[str, Any]]:
    """The thinker's load report (each replica's): what its runner says it runs with."""
    return [
        dict(r["load_info"])
        for h, r in pipe.runtime.load_results.items()
        if h.split("#")[0] == "thinker"
    ]


def med(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarise(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per concurrency and variant: the medians, the throughput; then each variant / static."""
    out: dict[str, Any] = {}
    for c, by_variant in runs.items():
        figs = {}
        for v in VARIANTS:
            rows, wall = by_variant[v]["rows"], by_variant[v]["wall_s"]
            figs[v] = {k: med([r[k] for r in rows]) for k, _ in FIGURES}
            figs[v]["requests_per_s"] = len(rows) / wall if wall else None
        ratios: dict[str, dict[str, float | None]] = {}
        for v in VARIANTS[1:]:
            ratios[v] = {}
            for k in (*(k for k, _ in FIGURES), "requests_per_s"):
                a, b = figs["static"][k], figs[v][k]
                ratios[v][k] = b / a if a and b else None
        out[c] = {"figures": figs, "over_static": ratios}
    return out


def report(summary: dict[str, Any], repeat: int) -> str:
    lines = [
        f"default pipeline, {len(PROMPTS)} prompts, greedy; medians of {repeat} round(s) after a warm-up",
        "",
        f"{'':5}{'figure':15}{'static':>9}{'prefill':>9}{'follow':>9}"
        f"{'prefill/static':>16}{'follow/static':>15}",
    ]
    f = lambda x, spec=".3f": "n/a" if x is None else f"{x:{spec}}"  # noqa: E731
    for c, s in summary.items():
        lines.append(f"concurrency {c}")
        for k, label in (*FIGURES, ("requests_per_s", "requests/s")):
            figs = "".join(f"{f(s['figures'][v][k]):>9}" for v in VARIANTS)
            ratios = "".join(
                f"{f(s['over_static'][v][k], '.2f'):>{w}}"
                for v, w in zip(VARIANTS[1:], (16, 15), strict=True)
            )
            lines.append(f"{'':5}{label:15}{figs}{ratios}")
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
            # not started: the actors' environment is read when they are created
            pipe = Pipeline.from_config(args.config, start=False)
            for env in pipe.runtime.actor_envs.values():
                env[SHARE_ENV] = v
            t = time.perf_counter()
            pipes[v] = pipe.start()
            log(f"{v}: started in {time.perf_counter() - t:.1f} s")
            took = {r.get("threads_share") for r in thinker_load(pipes[v])}
            if took != {v}:
                raise SystemExit(f"{v}: the thinker's actor runs policy {took}, not {v!r}")
        plan = pipes["follow"].plan
        log("CPU threads: " + ", ".join(f"{s.name} {s.cpu_threads}" for s in plan.stages))

        async def rounds() -> dict[str, dict[str, Any]]:
            runs: dict[str, dict[str, Any]] = {
                str(c): {v: {"rows": [], "wall_s": 0.0} for v in VARIANTS} for c in args.concurrency
            }
            for i in range(args.repeat + 1):
                k = i % len(VARIANTS)
                order = VARIANTS[k:] + VARIANTS[:k]
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
