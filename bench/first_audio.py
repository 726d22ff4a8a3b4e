"""Time to first audio, text in, with where the time went: one started pipeline, held-out prompts.

    python bench/first_audio.py [--config configs/voice-assistant.yaml] [--profile FILE]
                                [--repeat 1] [--temperature 0] [--no-warmup] [--voice-rounds N]
                                [--compare | --first-chunk N [N ...]] [--json FILE]

One ``Pipeline`` is started (whatever backends the plan picks for it: the
decode stage's is printed), then every prompt of ``PROMPTS`` is sent in turn,
``--repeat`` times, each greedy (``sampling.temperature`` 0, a request
override, so the config's own sampling is kept otherwise). The first request
after the start is reported on its own ("first request") and is not in the
medians: it is what the first user of a freshly started pipeline waits, and
what a warm-up at load changes (``--no-warmup``: every exported-graph stage
loads with ``warmup: false``, as before the warm-up existed).

Per request, as LiveKit's agents report a turn: time to first token, to the
first complete sentence (the chunker released it) and to the voice's first
samples (they reached the caller), all from the request's submission; and the
hop from the sentence's last token to those samples, split into the steps of
``orchestrator.runtime.hop`` (the voice's ``first_chunk_hop`` figures). Printed:
a row per request, then median and p95 (nearest rank) of each figure and each
step. A reply with no sentence (nothing speakable) has no hop: ``n/a``.

The replies are whatever the model says on this machine (greedy output can
differ between CPUs); the prompts are in this file, not in the test suite, so
nothing is tuned to them.

``--compare`` runs the config three ways in one run, one after the other, and
prints them side by side: the decode stage on ``vllm-cpu`` with the voice fed
whole sentences (the pipeline before the llama.cpp backend), on ``llamacpp-cpu`` with whole
sentences, and on ``llamacpp-cpu`` with the voice's first chunk cut early
(``first_chunk_chars``).

``--first-chunk N [N ...]`` runs the config once per N, one after the other, side by side:
the voice's first chunk cut past N characters, everything else as configured.

``--voice-rounds N`` adds the warm-up's own figure, which one pipeline start
shows only once: the sentence-taking voice stage's runner alone, in this
process and its planned route, loaded N times without and N times with its
warm-up (alternating, so the machine's other work weighs on both), each load
speaking ``VOICE_SENTENCE`` twice; the first request's voice time
(preprocess + session call) against the second's, as wall time and as CPU
time (this process's and the route worker's: what the work costs, whatever
else the machine runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPTS = (
    "What should I pack for a weekend hike?",
    "Why is the sky blue?",
    "Give me a tip for sleeping better.",
    "How do bees make honey?",
    "What is a good name for a grey cat?",
    "How far away is the Sun?",
    "Suggest a quick breakfast idea.",
    "What does a rainbow tell us about light?",
    "How can I remember people's names?",
    "Why do leaves change colour in autumn?",
    "What is the capital of Canada?",
    "Tell me something interesting about octopuses.",
)
"""Held out: written for this benchmark, in no test and no other benchmark."""
VOICE_SENTENCE = "The capital city of Canada is Ottawa."
NA = "n/a"
FIGURES = (
    ("first_token_s", "first token"),
    ("first_sentence_s", "first sentence"),
    ("first_audio_s", "first audio"),
    ("hop_s", "sentence → audio"),
)


def p95(values: list[float]) -> float | None:
    """Nearest-rank 95th percentile (of 10 values: the largest)."""
    vals = sorted(values)
    return vals[max(0, math.ceil(0.95 * len(vals)) - 1)] if vals else None


def summary(values: list[float | None]) -> dict[str, float | None]:
    vals = [v for v in values if v is not None]
    return {"median": statistics.median(vals) if vals else None, "p95": p95(vals), "n": len(vals)}


def ms(x: float | None, width: int) -> str:
    return (NA if x is None else f"{x * 1000:.0f}").rjust(width)


async def one(pipeline: Any, prompt: str, temperature: float, rid: str) -> dict[str, Any]:
    """One request: its figures from the caller's side, and the voice's hop."""
    from orchestrator.runtime.events import AudioChunk, StageEvent, TextDelta

    request = {"prompt": prompt, "sampling": {"temperature": temperature}}
    first_token = first_audio = None
    hop: dict[str, Any] | None = None
    recycles = 0
    text: list[str] = []
    t = time.perf_counter()
    async for e in pipeline.stream(request, request_id=rid):
        if isinstance(e, TextDelta):
            first_token = e.t if first_token is None else first_token
            text.append(e.text)
        elif isinstance(e, AudioChunk):
            first_audio = e.t if first_audio is None else first_audio
        elif isinstance(e, StageEvent) and e.kind == "done" and "first_chunk_hop" in e.stats:
            hop = e.stats["first_chunk_hop"]
            recycles = int(e.stats.get("worker_recycles") or 0)
    return {
        "prompt": prompt,
        "text": "".join(text),
        "total_s": time.perf_counter() - t,
        "first_token_s": first_token,
        "first_audio_s": first_audio,
        "first_sentence_s": hop["first_sentence_s"] if hop else None,
        "hop_s": hop["total_s"] if hop else None,
        "hop": hop,
        "worker_recycles": recycles,
    }


def step_rows(runs: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    from orchestrator.runtime.hop import STEPS

    names = [*STEPS, "in_stage"]
    out = {}
    for name in names:
        vals = [r["hop"]["steps_s"][name] for r in runs if r["hop"] and name in r["hop"]["steps_s"]]
        if vals:
            out[name] = summary(vals)
    return out


def report(
    plan_line: str, cold: dict[str, Any], runs: list[dict[str, Any]]
) -> tuple[list[str], dict[str, Any]]:
    out = [
        plan_line,
        "",
        f"{'#':>3} {'first token':>12}{'sentence':>10}{'audio':>8}{'hop':>7}  ms; reply",
    ]

    def row(label: str, r: dict[str, Any]) -> str:
        reply = r["text"].replace("\n", " ")
        return (
            f"{label:>3} {ms(r['first_token_s'], 12)}{ms(r['first_sentence_s'], 10)}{ms(r['first_audio_s'], 8)}"
            f"{ms(r['hop_s'], 7)}  {reply[:36] + '…' if len(reply) > 37 else reply}"
        )

    out.append(row("1st", cold))
    recycled = runs[-1]["worker_recycles"] if runs else 0
    for i, r in enumerate(runs):
        out.append(row(str(i + 1), r))
    figures = {key: summary([r[key] for r in runs]) for key, _ in FIGURES}
    out += ["", f"{len(runs)} requests after the first:{'median':>12}{'p95':>8}  ms"]
    for key, label in FIGURES:
        out.append(f"  {label:36}{ms(figures[key]['median'], 10)}{ms(figures[key]['p95'], 8)}")
    if recycled:
        out.append(
            f"  the voice's route worker was recycled {recycled} time(s) at its budget (in session_bridge)"
        )
    steps = step_rows(runs)
    cold_steps = (cold["hop"] or {}).get("steps_s", {})
    out += ["", f"the hop, step by step{'median':>23}{'p95':>8}{'1st req':>9}  ms"]
    for name, fig in steps.items():
        first = cold_steps.get(name)
        out.append(
            f"  {name:42}{fig['median'] * 1000 if fig['median'] is not None else 0:>8.1f}"
            f"{fig['p95'] * 1000 if fig['p95'] is not None else 0:>8.1f}"
            f"{NA if first is None else f'{first * 1000:.1f}':>9}"
        )
    doc = {
        "plan": plan_line,
        "figures": figures,
        "steps": steps,
        "first_request": cold,
        "runs": runs,
    }
    return out, doc


def _cpu_s(runner: Any) -> float:
    """CPU seconds so far of this process and of the runner's route worker (if any)."""
    import resource

    import psutil

    own = resource.getrusage(resource.RUSAGE_SELF)
    total = own.ru_utime + own.ru_stime
    for pid in runner.process_ids():
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


def voice_rounds(
    plan: Any, config: Any, profile: Any, rounds: int
) -> tuple[list[str], dict[str, Any]]:
    """The voice's first and second request after a load, without and with its warm-up."""
    from stages.registry import get_kind

    routes = {r.name: r for r in profile.routes}
    voice = next(
        s
        for s in plan.stages
        if s.kind == "exported_graph" and get_kind(s.kind).text_input == "sentences"
    )
    runs: dict[str, list[dict[str, float]]] = {"without": [], "with": []}
    for _ in range(rounds):
        for label in ("without", "with"):
            kind = get_kind(voice.kind)
            runner: Any = kind.runner(
                voice, config.stage(voice.name), route=routes.get(voice.route or "")
            )
            runner.warmup = label == "with"
            t = time.perf_counter()
            runner.load()
            load_s = time.perf_counter() - t
            row: dict[str, float] = {"load_s": load_s}
            try:
                for request in ("first", "second"):
                    st: dict[str, float] = {}
                    cpu = _cpu_s(runner)
                    runner.run_one(VOICE_SENTENCE, st)
                    row[f"{request}_cpu_s"] = _cpu_s(runner) - cpu
                    row[f"{request}_s"] = st["ran"] - st["started"]
                    row[f"{request}_preprocess_s"] = st["preprocessed"] - st["started"]
            finally:
                runner.close()
            runs[label].append(row)
    keys = (
        "load_s",
        "first_s",
        "second_s",
        "first_cpu_s",
        "second_cpu_s",
        "first_preprocess_s",
        "second_preprocess_s",
    )
    out = [
        "",
        f"the voice ({voice.name}, {voice.backend}) loaded {rounds}x without and with its warm-up; medians, ms",
        f"{'':16}{'load':>7}{'1st wall':>9}{'2nd wall':>9}{'1st CPU':>8}{'2nd CPU':>8}{'1st pre':>8}{'2nd pre':>8}",
    ]
    doc: dict[str, Any] = {"sentence": VOICE_SENTENCE, "runs": runs}
    for label, rows in runs.items():
        fig = {k: statistics.median(r[k] for r in rows) for k in keys}
        doc[label] = fig
        out.append(
            f"{label + ' warm-up':16}"
            + "".join(ms(fig[k], w) for k, w in zip(keys, (7, 9, 9, 8, 8, 8, 8), strict=True))
        )
    return out, doc


FIRST_CHUNK_CHARS = 40
"""``--compare``'s first-chunk cut when the config's voice names none."""


def compare_variants(base: dict[str, Any], path: Path) -> list[tuple[str, dict[str, Any]]]:
    """The config three ways (``--compare``): its decode stage on ``vllm-cpu`` then on
    ``llamacpp-cpu``, its sentence-taking voice on whole sentences, then with the first chunk cut early."""
    import copy

    def variant(backend: str, first: int | None) -> dict[str, Any]:
        doc = copy.deepcopy(base)
        decode = [s for s in doc["stages"] if s.get("kind") == "ar_decode"]
        voices = [s for s in doc["stages"] if s.get("kind") == "exported_graph" and s.get("inputs")]
        if len(decode) != 1 or not voices:
            raise ValueError(
                "--compare needs one ar_decode stage and a voice (exported_graph) fed by it"
            )
        decode[0]["backends"] = [backend]
        decode[0]["devices"] = ["cpu"]
        for v in voices:
            v["first_chunk_chars"] = first
        return doc

    first = next(
        (s.get("first_chunk_chars") for s in base["stages"] if s.get("first_chunk_chars")), None
    )
    return [
        ("vLLM, sentences", variant("vllm-cpu", None)),
        ("llama.cpp, sentences", variant("llamacpp-cpu", None)),
        ("llama.cpp, first chunk early", variant("llamacpp-cpu", first or FIRST_CHUNK_CHARS)),
    ]


def chunk_variants(base: dict[str, Any], cuts: list[int]) -> list[tuple[str, dict[str, Any]]]:
    """The config once per first-chunk cut (``--first-chunk``): its voices' ``first_chunk_chars``
    set to each, everything else as configured."""
    import copy

    out = []
    for cut in cuts:
        doc = copy.deepcopy(base)
        voices = [s for s in doc["stages"] if s.get("kind") == "exported_graph" and s.get("inputs")]
        if not voices:
            raise ValueError("--first-chunk needs a voice (an exported_graph stage fed by another)")
        for v in voices:
            v["first_chunk_chars"] = cut
        out.append((f"first chunk past {cut} chars", doc))
    return out


def compare_table(summaries: dict[str, dict[str, Any]]) -> list[str]:
    """Median and p95 of each figure per variant, and each variant over the first."""
    names = list(summaries)
    out = [
        "side by side (ms; ratio: over the first variant's median)",
        f"{'':18}" + "".join(f"{n[:20]:>22}" for n in names),
    ]
    for key, label in FIGURES:
        cells = []
        base = summaries[names[0]][key]["median"]
        for n in names:
            fig = summaries[n][key]
            med_, p = fig["median"], fig["p95"]
            ratio = f" {med_ / base:4.2f}x" if med_ is not None and base else ""
            cells.append(f"{ms(med_, 5)}/{ms(p, 5)}{ratio}".rjust(22))
        out.append(f"{label:18}" + "".join(cells))
    out.append(f"{'':18}" + "median/p95 per cell".rjust(22))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(REPO / "configs/voice-assistant.yaml"))
    ap.add_argument("--profile", help="hardware profile file (default: probe this machine)")
    ap.add_argument("--repeat", type=int, default=1, help="passes over the prompts (default 1)")
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="the requests' sampling temperature (0: greedy)",
    )
    ap.add_argument(
        "--no-warmup", action="store_true", help="load exported-graph stages with warmup: false"
    )
    ap.add_argument(
        "--voice-rounds",
        type=int,
        default=0,
        metavar="N",
        help="also load the voice alone N times without and with its warm-up (default 0)",
    )
    ap.add_argument(
        "--compare",
        action="store_true",
        help="run the config three ways in one run, side by side: the thinker on vLLM and the voice on "
        "whole sentences; on llama.cpp with whole sentences; on llama.cpp with the first chunk cut "
        f"early (first_chunk_chars, the config's or {FIRST_CHUNK_CHARS})",
    )
    ap.add_argument(
        "--first-chunk",
        metavar="N",
        type=int,
        nargs="+",
        help="run the config once per N, side by side: the voice's first chunk cut past N "
        "characters (first_chunk_chars)",
    )
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()
    if args.compare and args.first_chunk:
        ap.error("--compare and --first-chunk are two different runs: give one")
    if args.first_chunk and any(not 8 < n <= 200 for n in args.first_chunk):
        ap.error("--first-chunk: each N must lie in 9..200 (first_chunk_chars' bounds)")
    if args.repeat < 1 or args.voice_rounds < 0:
        print("error: --repeat must be 1 or more, --voice-rounds 0 or more", file=sys.stderr)
        return 2
    import yaml

    from orchestrator import api
    from orchestrator.config import parse_config
    from orchestrator.core.errors import ConfigError
    from orchestrator.core.fileio import check_writable
    from orchestrator.planner import plan_pipeline

    if args.json:
        try:
            check_writable(Path(args.json), what="--json")
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    path = Path(args.config)
    try:
        base = yaml.safe_load(path.read_text(encoding="utf-8"))
        variants = (
            compare_variants(base, path)
            if args.compare
            else chunk_variants(base, args.first_chunk)
            if args.first_chunk
            else [("as configured", base)]
        )
        configs = []
        for name, doc in variants:
            for stage in doc.get("stages", []):
                if args.no_warmup and stage.get("kind") == "exported_graph":
                    stage["warmup"] = False
            configs.append(
                (name, parse_config(doc, where=f"{path} ({name})", base_dir=path.parent))
            )
    except (OSError, yaml.YAMLError, ConfigError, ValueError) as exc:
        print(f"error: {args.config}: {exc}", file=sys.stderr)
        return 2
    lines: list[str] = []
    doc: dict[str, Any] = {"variants": {}}
    summaries: dict[str, dict[str, Any]] = {}
    for name, config in configs:
        t = time.perf_counter()
        profile = api.plan_profile(args.profile, None)
        store = api.calibration_store(True)
        plan = plan_pipeline(config, profile, calibration=store)
        if api.unverified_stages(plan):
            plan = api.verify_then_replan(config, profile, frozenset(), calibration=store)
        if not plan.admitted:
            print(
                f"{name}: the plan was refused; run `omni-edge plan` on the config to see why",
                file=sys.stderr,
            )
            return 3
        # planned from the measurement store as `omni-edge run` plans, but records nothing in it: a
        # benchmark must not move the next plan's budgets (a voice worker recycled at a tighter budget
        # is seconds inside session_bridge)
        pipeline = api.Pipeline(
            plan, config, profile=profile, record=None, calibration=None
        ).start()
        start_s = time.perf_counter() - t
        stages = ", ".join(
            f"{s.name} {s.backend} on {s.device}"
            + (f" ({s.cpu_threads} thr)" if s.cpu_threads else "")
            for s in pipeline.runtime.stages
        )
        plan_line = (
            f"[{name}] {pipeline.plan.pipeline}: {stages}; started in {start_s:.1f} s; "
            f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}; temperature {args.temperature:g}"
            f"{'; no warm-up' if args.no_warmup else ''}"
        )

        async def requests(pipeline: Any = pipeline) -> tuple[dict[str, Any], list[dict[str, Any]]]:
            cold = await one(pipeline, PROMPTS[0], args.temperature, "first")
            runs = []
            for rep in range(args.repeat):
                for i, prompt in enumerate(PROMPTS):
                    runs.append(await one(pipeline, prompt, args.temperature, f"r{rep}-{i}"))
            return cold, runs

        try:
            cold, runs = asyncio.run(requests())
        finally:
            pipeline.close()
        more, vdoc = report(plan_line, cold, runs)
        lines += [*more, ""]
        doc["variants"][name] = vdoc
        summaries[name] = vdoc["figures"]
        if args.voice_rounds and name == configs[-1][0]:
            extra, doc["voice_warmup"] = voice_rounds(plan, config, profile, args.voice_rounds)
            lines += extra
    if len(summaries) > 1:
        lines += compare_table(summaries)
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                doc
                if len(configs) > 1
                else doc["variants"][configs[0][0]]
                | ({"voice_warmup": doc["voice_warmup"]} if "voice_warmup" in doc else {}),
                indent=2,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
