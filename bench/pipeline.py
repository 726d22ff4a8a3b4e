"""The orchestrator's cost: the same two stages with and without Ray, in one run.

    python bench/pipeline.py [--config configs/voice-assistant.yaml] [--repeat 3] [--json FILE]
                             [--min-tokens N] [--max-tokens N]

Side by side, same plan, same prompt, same sampling seed:

* (a)  **sequential, one process, no orchestrator**: the decode stage's runner
  produces the whole reply, the text is cut into sentences, then the TTS
  runner speaks them one after another — the plain way to chain two stages;
* (a2) **overlapped, one process, no orchestrator**: the same runners, with
  the TTS speaking each sentence while decoding continues (asyncio and a
  thread) — what streaming gains without Ray, so (b)/(a2) isolates Ray's cost;
* (b)  **orchestrated**: ``Pipeline`` — Ray, one actor per device, the ledger
  actor, streaming generators between stages.

Reported (medians over --repeat requests after one warm-up each): time to
first token, time to first audio, total time, and the ratios. Targets
(the Ray runtime's first work): total (b)/(a) ≤ 1.10; time to first audio (b) ≤ first-sentence
time + that sentence's TTS time (both measured in (a)) + 100 ms; for every
stage, measured peak ≤ budget with budget/measured ≤ 1.5.

The reply is whatever the model says on this machine (greedy/seeded output
differs between CPUs and batch sizes): one sentence, or none, is a possible
reply. A figure that a reply does not have — no first sentence before the end,
no audio — is printed as ``n/a`` and its target is not evaluated (neither
PASS nor FAIL). ``--min-tokens N --max-tokens N`` fixes the reply's length in
tokens (vLLM's own bounds), so the three variants do the same decoding work
whatever the tokens are.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPT = "Tell me one fact about the Moon."
TTFA_SLACK_S = 0.100
NA = "n/a"


async def _one(item: Any) -> Any:
    yield item


async def sequential(thinker: Any, voice: Any, prompt: Any, rid: str) -> dict[str, Any]:
    """(a): decode everything, then speak each sentence in turn."""
    from stages.text_chunks import SentenceChunker

    t0 = time.perf_counter()
    first_token = first_sentence = None
    chunker, chunks, parts = SentenceChunker(), [], []
    async for delta in thinker.stream(rid, _one(prompt)):
        now = time.perf_counter() - t0
        first_token = first_token if first_token is not None else now
        parts.append(delta)
        for c in chunker.feed(delta):
            chunks.append(c)
            first_sentence = first_sentence if first_sentence is not None else now
    text_done = time.perf_counter() - t0
    for c in chunker.flush():
        chunks.append(c)
        first_sentence = first_sentence if first_sentence is not None else text_done
    first_audio, tts, audio_s = None, [], 0.0
    for i, c in enumerate(chunks):
        ts = time.perf_counter()
        async for out in voice.stream(f"{rid}-{i}", _one(c)):
            audio_s += out["audio"].size / out["sample_rate"]
        tts.append(time.perf_counter() - ts)
        first_audio = first_audio if first_audio is not None else time.perf_counter() - t0
    return {
        "ttft": first_token,
        "ttfa": first_audio,
        "total": time.perf_counter() - t0,
        "text_done": text_done,
        "first_sentence": first_sentence,
        "first_sentence_tts": tts[0] if tts else None,
        "chunks": len(chunks),
        "audio_s": audio_s,
        "text": "".join(parts),
    }


async def overlapped(thinker: Any, voice: Any, prompt: Any, rid: str) -> dict[str, Any]:
    """(a2): the TTS speaks each sentence as soon as it is complete."""
    from stages.text_chunks import chunk_text

    t0 = time.perf_counter()
    marks: dict[str, float] = {}
    parts: list[str] = []

    async def deltas() -> Any:
        async for d in thinker.stream(rid, _one(prompt)):
            marks.setdefault("ttft", time.perf_counter() - t0)
            parts.append(d)
            yield d

    audio_s, n = 0.0, 0
    async for out in voice.stream(f"{rid}-v", chunk_text(deltas())):
        marks.setdefault("ttfa", time.perf_counter() - t0)
        audio_s += out["audio"].size / out["sample_rate"]
        n += 1
    return {
        "ttft": marks.get("ttft"),
        "ttfa": marks.get("ttfa"),
        "total": time.perf_counter() - t0,
        "chunks": n,
        "audio_s": audio_s,
        "text": "".join(parts),
    }


async def orchestrated(pipeline: Any, prompt: Any, rid: str) -> dict[str, Any]:
    """(b): the request through the Ray runtime."""
    from orchestrator.runtime.events import AudioChunk, StageEvent, TextDelta
    from stages.text_chunks import SentenceChunker

    t0 = time.perf_counter()
    ttft = ttfa = first_sentence = last_text = in_run_tts = None
    audio_s, parts, n = 0.0, [], 0
    chunker = SentenceChunker()  # the executor's own cut, replayed to time the first sentence
    async for e in pipeline.stream(prompt, request_id=rid):
        if isinstance(e, TextDelta):
            ttft = ttft if ttft is not None else e.t
            last_text = e.t
            parts.append(e.text)
            if first_sentence is None and chunker.feed(e.text):
                first_sentence = e.t
        elif isinstance(e, AudioChunk):
            ttfa = ttfa if ttfa is not None else e.t
            audio_s += e.seconds
            n += 1
        elif isinstance(e, StageEvent) and e.kind == "done" and e.stats.get("item_latency_s"):
            in_run_tts = e.stats["item_latency_s"][0]
    if first_sentence is None and chunker.flush():
        first_sentence = last_text  # a one-sentence reply: complete when the text ends
    tts = ttfa - first_sentence if ttfa is not None and first_sentence is not None else None
    return {
        "ttft": ttft,
        "ttfa": ttfa,
        "total": time.perf_counter() - t0,
        "chunks": n,
        "audio_s": audio_s,
        "text": "".join(parts),
        "first_sentence": first_sentence,
        "first_sentence_tts": tts,
        "first_sentence_tts_in_stage": in_run_tts,
        "critical_path_overhead": tts - in_run_tts
        if tts is not None and in_run_tts is not None
        else None,
    }


def med(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def fmt(x: float | None, spec: str, unit: str = "", width: int = 0) -> str:
    """``x`` formatted, or ``n/a`` when the runs did not have it."""
    return (NA if x is None else f"{x:{spec}}{unit}").rjust(width)


def verdict(ok: bool | None) -> str:
    return NA if ok is None else ("PASS" if ok else "FAIL")


def report(
    prompt: Any,
    repeat: int,
    a: list[dict[str, Any]],
    a2: list[dict[str, Any]],
    b: list[dict[str, Any]],
    record: dict[str, Any],
    final: dict[str, Any],
    engine_start: float,
    start_b: float,
) -> tuple[list[str], dict[str, Any], bool]:
    """The printed report, the figures for --json, and whether every target that
    could be evaluated passed. Never formats a figure the replies did not have."""
    out: list[str] = []
    figures = {
        k: {"a": med(a, k), "a2": med(a2, k), "b": med(b, k)} for k in ("ttft", "ttfa", "total")
    }
    first_sentence, first_tts = med(a, "first_sentence"), med(a, "first_sentence_tts")
    ttfa_bound = (
        first_sentence + first_tts + TTFA_SLACK_S
        if first_sentence is not None and first_tts is not None
        else None
    )
    total_ratio = ratio(figures["total"]["b"], figures["total"]["a"])
    out.append(f"\nprompt: {prompt!r}; {repeat} requests each after one warm-up; medians")
    out.append(
        f"{'':24}{'(a) sequential':>16}{'(a2) overlapped':>17}{'(b) Ray':>10}{'(b)/(a)':>9}{'(b)/(a2)':>10}"
    )
    for key, label in (
        ("ttft", "time to first token"),
        ("ttfa", "time to first audio"),
        ("total", "total time"),
    ):
        f = figures[key]
        out.append(
            f"{label:24}{fmt(f['a'], '.3f', 's', 16)}{fmt(f['a2'], '.3f', 's', 17)}{fmt(f['b'], '.3f', 's', 10)}"
            f"{fmt(ratio(f['b'], f['a']), '.2f', '', 9)}{fmt(ratio(f['b'], f['a2']), '.2f', '', 10)}"
        )
    out.append(
        f"sentences spoken per reply: (a) {fmt(med(a, 'chunks'), 'g')}, (a2) {fmt(med(a2, 'chunks'), 'g')}, "
        f"(b) {fmt(med(b, 'chunks'), 'g')}"
    )
    out.append(
        f"\nfirst sentence complete at {fmt(first_sentence, '.3f', ' s')}, its TTS took {fmt(first_tts, '.3f', ' s')} "
        f"(in (a)); in (b): complete at {fmt(med(b, 'first_sentence'), '.3f', ' s')}, "
        f"first audio {fmt(med(b, 'first_sentence_tts'), '.3f', ' s')} later"
    )
    overhead = med(b, "critical_path_overhead")
    out.append(
        f"in (b), the voice stage took {fmt(med(b, 'first_sentence_tts_in_stage'), '.3f', ' s')} to speak the first "
        f"sentence (decoding ran alongside); Ray's hops on the way to the first audio (feed + return): "
        f"{fmt(None if overhead is None else overhead * 1000, '.0f', ' ms')}"
    )
    ok_total = None if total_ratio is None else total_ratio <= 1.10
    ttfa_b = figures["ttfa"]["b"]
    ok_ttfa = None if ttfa_bound is None or ttfa_b is None else ttfa_b <= ttfa_bound
    out.append(f"target total (b)/(a) <= 1.10: {fmt(total_ratio, '.2f')} {verdict(ok_total)}")
    out.append(
        f"target first audio (b) <= {fmt(first_sentence, '.3f')} + {fmt(first_tts, '.3f')} + 0.100 = "
        f"{fmt(ttfa_bound, '.3f', ' s')}: {fmt(ttfa_b, '.3f', ' s')} {verdict(ok_ttfa)}"
    )
    if ok_ttfa is None:
        out.append("  (no audio in some variant: the replies had nothing to speak)")
    mem = record["runtime"]["ray"]["memory"]
    out.append(
        f"\nstart-up: engine (in-process) {engine_start:.1f} s; orchestrated start {start_b:.1f} s "
        f"({record['runtime']['startup']}); Ray memory {mem.get('bytes', 0) / 2**20:.0f} MiB ({mem.get('measure')})"
    )
    ok_mem = True
    out.append(f"\n{'stage':10}{'budget':>12}{'measured':>12}{'budget/measured':>17}  verdict")
    for row in record["stages"]:
        peak, budget = row["measured_peak_bytes"], row["budget_bytes"]
        r = budget / peak if peak else None
        ok = peak is not None and r is not None and peak <= budget and r <= 1.5
        ok_mem &= ok
        out.append(
            f"{row['stage']:10}{budget / 2**20:>10.0f}Mi{fmt(None if peak is None else peak / 2**20, '.0f', 'Mi', 12)}"
            f"{fmt(r, '.2f', '', 17)}  "
            f"{'PASS' if ok else ('OVER BUDGET' if peak and peak > budget else ('NOT MEASURED' if not peak else 'BUDGET > 1.5x MEASURED'))}"
        )
    out.append(f"\nledger after close: {final.get('held_bytes')} bytes held")
    # Informational, never a target: seeded output can differ with the engine's batch.
    out.append(f"same reply text in every run: {len({r.get('text', '') for r in a + a2 + b}) == 1}")
    ok_overhead = None if overhead is None else overhead <= TTFA_SLACK_S
    out.append(
        f"target (in-run reading) first audio (b) <= first sentence (b) + its TTS in (b) + 0.100 s: "
        f"overhead {fmt(None if overhead is None else overhead * 1000, '.0f', ' ms')} {verdict(ok_overhead)}"
    )
    doc = {
        "figures": figures,
        "first_sentence_s": first_sentence,
        "first_sentence_tts_s": first_tts,
        "ttfa_bound_s": ttfa_bound,
        "total_ratio": total_ratio,
        "engine_start_s": engine_start,
        "orchestrated_start_s": start_b,
        "runtime": record["runtime"],
        "stages": record["stages"],
        "runs": {"a": a, "a2": a2, "b": b},
        "versions": record["versions"],
        "targets": {
            "total": ok_total,
            "ttfa": ok_ttfa,
            "memory": ok_mem,
            "in_run_overhead": ok_overhead,
        },
    }
    return out, doc, ok_total is not False and ok_ttfa is not False and ok_mem


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(REPO / "configs/voice-assistant.yaml"))
    ap.add_argument("--profile", help="hardware profile file (default: probe this machine)")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--min-tokens", type=int, help="fewest tokens per reply (vLLM min_tokens)")
    ap.add_argument("--max-tokens", type=int, help="most tokens per reply (default: the config's)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()

    from orchestrator.api import Pipeline, prepare_models
    from orchestrator.commands.progress import ProgressBars
    from orchestrator.config import load_config
    from orchestrator.planner import plan_pipeline
    from orchestrator.probe import resolve_profile
    from stages.registry import get_kind

    sampling = {
        k: v
        for k, v in (("min_tokens", args.min_tokens), ("max_tokens", args.max_tokens))
        if v is not None
    }
    prompt: Any = {"prompt": args.prompt, "sampling": sampling} if sampling else args.prompt
    config = load_config(args.config)
    profile = resolve_profile(args.profile)
    plan = plan_pipeline(config, profile)
    if not plan.admitted:
        print("the plan was refused; run `omni-edge plan` to see why", file=sys.stderr)
        return 3
    # The baseline runs its engines in this process: the environment each stage's
    # device actor would get, set before anything (a GGUF conversion) imports torch.
    for s in plan.stages:
        for k, v in get_kind(s.kind).actor_env(s).items():
            os.environ.setdefault(k, v)
    prepare_models(plan, progress=ProgressBars())
    thinker_plan, voice_plan = plan.stages[0], plan.stages[1]
    routes = {r.name: r for r in profile.routes}

    # -- (a) and (a2): the runners in this process ------------------------------------
    t = time.perf_counter()
    thinker = get_kind(thinker_plan.kind).runner(thinker_plan, config.stage(thinker_plan.name))
    thinker.load()
    engine_start = time.perf_counter() - t
    voice_kind = get_kind(voice_plan.kind)
    route = routes.get(voice_plan.route or "")
    voice = (
        voice_kind.runner(voice_plan, config.stage(voice_plan.name), route=route)
        if route
        else voice_kind.runner(voice_plan, config.stage(voice_plan.name))
    )
    t = time.perf_counter()
    voice.load()
    voice_load = time.perf_counter() - t
    print(
        f"in-process: {thinker_plan.name} loaded in {engine_start:.1f} s ({getattr(thinker, 'load_info', {})}), "
        f"{voice_plan.name} in {voice_load:.1f} s",
        file=sys.stderr,
    )

    # -- (b): the orchestrated pipeline, started next to the in-process runners ----------
    tmp = Path(tempfile.mkdtemp(prefix="omni-edge-bench-"))
    t = time.perf_counter()
    pipeline = Pipeline(plan, config, profile=profile, record=tmp)
    pipeline.start()
    start_b = time.perf_counter() - t

    async def interleaved() -> tuple[list[dict[str, Any]], ...]:
        # One warm-up each, then (a), (a2), (b) in turn, so that whatever else the
        # machine does at the time weighs on all three alike.
        await sequential(thinker, voice, prompt, "warm-a")
        await overlapped(thinker, voice, prompt, "warm-a2")
        await orchestrated(pipeline, prompt, "warm-b")
        a, a2, b = [], [], []
        for i in range(args.repeat):
            a.append(await sequential(thinker, voice, prompt, f"a{i}"))
            a2.append(await overlapped(thinker, voice, prompt, f"a2-{i}"))
            b.append(await orchestrated(pipeline, prompt, f"b{i}"))
        return a, a2, b

    try:
        a, a2, b = asyncio.run(interleaved())
        record = pipeline.build_record([])
    finally:
        final = pipeline.close()
        thinker.close()
        voice.close()

    lines, doc, ok = report(
        args.prompt if not sampling else prompt,
        args.repeat,
        a,
        a2,
        b,
        record,
        final,
        engine_start,
        start_b,
    )
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
