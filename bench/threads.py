"""Planned CPU threads against each engine's own default, under concurrent requests, in one run.

    python bench/threads.py [--config configs/voice-assistant.yaml] [--profile FILE]
                            [--rounds 5] [--concurrency 4] [--max-tokens N] [--json FILE]

The pipeline is planned twice on this machine's profile and started once per mode,
one mode after the other:

* **planned**: every CPU stage runs the plan's ``cpu_threads``
  (``orchestrator.core.cpu_threads``: the host's cores shared among the CPU stages);
* **engine defaults**: the same plan with thread budgets off
  (``plan_pipeline(plan_threads=False)``): each engine sizes its own pool —
  ONNX Runtime a thread per core, vLLM's OpenMP team a thread per core
  (``OMP_NUM_THREADS`` unset), llama.cpp its own default.

Each mode: one warm-up request, then ``--rounds`` rounds of ``--concurrency``
text requests at once (held-out prompts, the config's sampling). Reported per
mode: the threads each stage ran, time to first token and to first audio (p50,
p95) measured from each request's submission in this process. Whatever thinker
backend the plan picks is benchmarked (vLLM today, llama.cpp where it is planned).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPTS = (
    "What is the tallest mountain in Africa?",
    "Give me a tip for sleeping better.",
    "Why is the sky blue?",
    "Name a good book for a long train ride.",
    "How do bees make honey?",
    "What should I pack for a day at the beach?",
    "Explain what a leap year is.",
    "Suggest a quick vegetarian dinner.",
)
"""Held out: none is the prompt the other benchmarks or tests use."""
MODES = ("planned", "engine defaults")


def pct(values: list[float], q: float) -> float | None:
    """The q-th quantile (0..1) of ``values``, linear between ranks; None when empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


async def one(pipeline: Any, prompt: Any, rid: str) -> dict[str, Any]:
    from orchestrator.runtime.events import AudioChunk, TextDelta

    t0 = time.perf_counter()
    ttft = ttfa = None
    async for e in pipeline.stream(prompt, request_id=rid):
        if isinstance(e, TextDelta) and ttft is None:
            ttft = time.perf_counter() - t0
        elif isinstance(e, AudioChunk) and ttfa is None:
            ttfa = time.perf_counter() - t0
    return {"ttft": ttft, "ttfa": ttfa, "total": time.perf_counter() - t0}


def run_mode(
    plan: Any, config: Any, profile: Any, prompt_of: Any, rounds: int, concurrency: int
) -> dict[str, Any]:
    from orchestrator.api import Pipeline

    t = time.perf_counter()
    pipeline = Pipeline(
        plan, config, profile=profile, record=Path(tempfile.mkdtemp(prefix="omni-edge-threads-"))
    )
    pipeline.start()
    start_s = time.perf_counter() - t

    async def rounds_of_requests() -> list[dict[str, Any]]:
        await one(pipeline, prompt_of(PROMPTS[0]), "warm")
        rows: list[dict[str, Any]] = []
        for r in range(rounds):
            batch = [
                prompt_of(PROMPTS[(r * concurrency + i) % len(PROMPTS)]) for i in range(concurrency)
            ]
            rows += await asyncio.gather(
                *(one(pipeline, p, f"r{r}-{i}") for i, p in enumerate(batch))
            )
        return rows

    try:
        rows = asyncio.run(rounds_of_requests())
        loads = {
            name: {k: v for k, v in _flat(info).items() if "thread" in k}
            for name, info in pipeline.runtime.load_results.items()
        }
    finally:
        pipeline.close()
    ttft = [r["ttft"] for r in rows if r["ttft"] is not None]
    ttfa = [r["ttfa"] for r in rows if r["ttfa"] is not None]
    return {
        "threads": {s.name: s.cpu_threads for s in plan.stages},
        "engine_load_info": loads,
        "start_s": round(start_s, 1),
        "requests": len(rows),
        "with_audio": len(ttfa),
        "ttft_p50_s": pct(ttft, 0.5),
        "ttft_p95_s": pct(ttft, 0.95),
        "ttfa_p50_s": pct(ttfa, 0.5),
        "ttfa_p95_s": pct(ttfa, 0.95),
        "ttfa_mean_s": statistics.fmean(ttfa) if ttfa else None,
    }


def _flat(info: Any, prefix: str = "") -> dict[str, Any]:
    """A stage's load result as ``a.b`` keys (what each engine says about its threads is in it)."""
    if not isinstance(info, dict):
        return {prefix.rstrip("."): info} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in info.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def table(doc: dict[str, Any]) -> list[str]:
    def s(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f}"

    lines = [
        f"{doc['pipeline']} on {doc['profile']} ({doc['cpu_cores']} logical CPUs), "
        f"{doc['concurrency']} concurrent requests x {doc['rounds']} rounds per mode",
        "",
        f"{'mode':<16} {'threads':<20} {'TTFT p50':>8} {'p95':>6} {'TTFA p50':>8} {'p95':>6} {'audio':>6}",
        "-" * 76,
    ]
    for mode, m in doc["modes"].items():
        threads = ", ".join(f"{k} {'-' if v is None else v}" for k, v in m["threads"].items())
        lines.append(
            f"{mode:<16} {threads:<20} {s(m['ttft_p50_s']):>8} {s(m['ttft_p95_s']):>6} "
            f"{s(m['ttfa_p50_s']):>8} {s(m['ttfa_p95_s']):>6} {m['with_audio']:>3}/{m['requests']:<2}"
        )
    p, d = doc["modes"]["planned"], doc["modes"]["engine defaults"]
    if p["ttfa_p50_s"] and d["ttfa_p50_s"]:
        lines += [
            "",
            f"time to first audio, engine defaults / planned: p50 {d['ttfa_p50_s'] / p['ttfa_p50_s']:.2f}x, "
            f"p95 {d['ttfa_p95_s'] / p['ttfa_p95_s']:.2f}x (seconds, from submission)",
        ]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(REPO / "configs/voice-assistant.yaml"))
    ap.add_argument("--profile", help="hardware profile file (default: probe this machine)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, help="most tokens per reply (default: the config's)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()

    from orchestrator.api import prepare_models, unverified_stages, verify_then_replan
    from orchestrator.commands.progress import ProgressBars
    from orchestrator.config import load_config
    from orchestrator.planner import plan_pipeline
    from orchestrator.probe import resolve_profile

    config = load_config(args.config)
    profile = resolve_profile(args.profile)
    planned = plan_pipeline(config, profile)
    if unverified_stages(planned):
        planned = verify_then_replan(config, profile, frozenset())
    defaults = plan_pipeline(config, profile, plan_threads=False)
    if not (planned.admitted and defaults.admitted):
        print("the plan was refused; run `omni-edge plan` to see why", file=sys.stderr)
        return 3
    if [(s.device, s.backend) for s in planned.stages] != [
        (s.device, s.backend) for s in defaults.stages
    ]:
        print(
            "the two modes were placed differently; the comparison would not be of threads alone",
            file=sys.stderr,
        )
        return 3
    prepare_models(planned, progress=ProgressBars())

    def prompt_of(text: str) -> Any:
        return (
            {"prompt": text, "sampling": {"max_tokens": args.max_tokens}}
            if args.max_tokens
            else text
        )

    modes = {}
    for mode, plan in zip(MODES, (planned, defaults), strict=True):
        print(f"{mode}: starting ...", file=sys.stderr)
        modes[mode] = run_mode(plan, config, profile, prompt_of, args.rounds, args.concurrency)
        print(f"{mode}: {json.dumps(modes[mode])}", file=sys.stderr)
    doc = {
        "pipeline": config.name,
        "profile": profile.name,
        "cpu_cores": profile.host.cpu_cores,
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "backends": {s.name: s.backend for s in planned.stages},
        "modes": modes,
    }
    print("\n".join(table(doc)))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
