"""The tiny Omni pipelines: first audio with a chunked hand-over against the whole one, the
pipeline against the same stages in one process, in vLLM-Omni's terms (TTFP, RTF, E2E).

    python bench/omni.py [--thinker-tokens 24] [--frames 64] [--repeat 3]
                         [--concurrency 1 4] [--json FILE]

The tiny Qwen3-Omni checkpoint (``python -m exports.omni_tiny build``) and its exported
code2wav (``python -m exports.qwen3_omni_code2wav build``), greedy, on this machine's plan
(the transformers backend and ONNX Runtime on the CPU here). The thinker's reply and the
talker's frames are fixed in length (min_tokens = max_tokens), so every variant does the same
work whatever the tokens are. Four variants, side by side:

* **in-process, whole**: the stages' runners in this process, called one after the other —
  the thinker's reply, then the talker on its whole hand-over, then code2wav on every frame
  at once (``chunk: {frames: null}``): the plain way to chain them, no orchestrator;
* **in-process, chunked**: the same runners, code2wav fed the talker's frames as they come
  (4 frames first, then 25 with 25 of left context: vLLM-Omni's async_chunk);
* **Ray, whole** and **Ray, chunked**: ``Pipeline`` with the same two code2wav settings — one
  actor per device, the hand-over crossing Ray.

Both pipelines and the in-process runners are started at once, and each round runs the four
in turn, so what else the machine does weighs on all of them alike. Reported (medians over
--repeat rounds after one warm-up): time to first audio and total time of each variant, the
chunked / whole ratio of the first audio, and, on the whole hand-over (where the stages do not
overlap), each stage's time — the thinker to its end, the talker from there to its last frame,
code2wav from there to the audio — on Ray against in-process (the overhead ratio). The audio of
every variant is checked to have the same length. Progress goes to stderr; --json FILE writes
the figures.

**vLLM-Omni's figures**, for both tiny Omni pipelines (``configs/examples/qwen3-omni-tiny.yaml``
as above, and ``qwen2_5-omni-tiny.yaml``: thinker → talker → token2wav, whose DiT attends over
the whole code sequence, so it has the whole variants only), at each ``--concurrency`` (c
requests of a variant at once, each timed from its own submission; 1 and 4 by default, as
vLLM-Omni publishes them): per variant the medians of **TTFP** (time to first audio packet),
**RTF** (real-time factor: a request's end-to-end time over its audio's seconds) and **E2E**
(end-to-end latency). Tiny random weights make the absolute times meaningless, so what is
reported beside them is what holds at any size: chunked / whole hand-over (vLLM-Omni's
``async_chunk`` against none), pipeline / one process (Ray against the runners in this process),
and each stage's share of the three stages' time (whole hand-over, c 1). Under ``vllm_omni`` in
the JSON, with every request's row; the audio of every request of a model has one length.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPT = "Hello there"
VARIANTS = ("inproc_whole", "inproc_chunked", "ray_whole", "ray_chunked")
STAGES = ("thinker", "talker", "code2wav")
QWEN3, QWEN2_5 = "qwen3-omni-tiny", "qwen2_5-omni-tiny"
MODELS: dict[str, dict[str, Any]] = {
    QWEN3: {"stages": STAGES, "chunked": True, "variants": VARIANTS},
    QWEN2_5: {
        "stages": ("thinker", "talker", "token2wav"),
        "chunked": False,
        "variants": ("inproc_whole", "ray_whole"),
    },
}
"""The two tiny Omni pipelines (configs/examples/<name>.yaml): Qwen2.5-Omni's token2wav (a DiT
over the whole code sequence) has no chunked hand-over, so only its whole variants run."""
CHUNKED = {"frames": 25, "left_context": 25, "first_frames": 4}
"""vLLM-Omni's talker2code2wav_async_chunk figures (codec_chunk_frames 25,
codec_left_context_frames 25, initial_codec_chunk_frames 4): the example config's."""
WHOLE = {"frames": None}
"""One code2wav call on every frame when the talker ends (vLLM-Omni without async_chunk)."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def configs(tmp: Path, thinker_tokens: int, frames: int, model: str = QWEN3) -> dict[str, Path]:
    """The model's example config, lengths fixed, paths absolute: Qwen3-Omni's twice (code2wav
    chunked and whole), Qwen2.5-Omni's once (its token2wav takes the whole hand-over)."""
    from exports import omni_tiny, qwen2_5_omni_token2wav, qwen3_omni_code2wav

    checkpoint = omni_tiny.QWEN3_OMNI_DIR if model == QWEN3 else omni_tiny.QWEN2_5_OMNI_DIR
    out = {}
    for name, chunk in (("chunked", CHUNKED), ("whole", WHOLE)):
        if name == "chunked" and not MODELS[model]["chunked"]:
            continue
        doc = yaml.safe_load((REPO / f"configs/examples/{model}.yaml").read_text())
        for stage in doc["stages"]:
            if stage["name"] == "thinker":
                stage["model"] = str(checkpoint)
                stage["sampling"].update(min_tokens=thinker_tokens, max_tokens=thinker_tokens)
                stage["max_model_len"] = thinker_tokens + 64
            elif stage["name"] == "talker":
                stage["model"] = str(checkpoint)
                stage["sampling"].update(min_tokens=frames, max_tokens=frames)
                stage["max_model_len"] = thinker_tokens + frames + 64
            elif stage["name"] == "token2wav":
                stage["dit"] = str(qwen2_5_omni_token2wav.DIT_DIR)
                stage["vocoder"] = str(qwen2_5_omni_token2wav.BIGVGAN_DIR)
            else:
                stage["artifact"] = str(qwen3_omni_code2wav.ARTIFACT_DIR)
                stage["chunk"] = dict(chunk)
        doc["name"] = f"{model}-{name}"
        path = tmp / f"{model}-{name}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        out[name] = path
    return out


async def _one(item: Any) -> AsyncIterator[Any]:
    yield item


async def _iterate(items: list[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


def _audio_seconds(item: Any) -> float:
    return float(item["audio"].shape[-1]) / int(item["sample_rate"])


async def in_process(
    runners: dict[str, Any], chunked: bool, rid: str, audio: str = "code2wav"
) -> dict[str, Any]:
    """The three runners called in this process: the thinker, then the talker on its whole
    hand-over, then code2wav on the frames at the end (whole) or as they come (chunked)."""
    from stages.payloads import untag

    t0 = time.perf_counter()
    text, hidden = "", []
    async for item in runners["thinker"].stream(rid, _one(PROMPT)):
        port, value = untag(item)
        if port == "hidden_states":
            hidden.append(value)
        else:
            text += str(value)
    thinker_done = time.perf_counter() - t0
    joined = {"thinker.hidden_states": hidden, "thinker.text": [text]}
    marks: dict[str, float] = {}
    frames: list[Any] = []

    async def talk() -> AsyncIterator[Any]:
        async for codes in runners["talker"].stream(rid, _one(joined)):
            frames.append(list(codes))
            yield codes
        marks["talker_done"] = time.perf_counter() - t0

    audio_s, first_audio = 0.0, None
    code2wav = runners[f"{audio}_chunked" if chunked else f"{audio}_whole"]
    if chunked:
        feed: AsyncIterator[Any] = talk()
    else:
        async for _ in talk():
            pass
        feed = _iterate(frames)
    async for out in code2wav.stream(rid, feed):
        first_audio = first_audio if first_audio is not None else time.perf_counter() - t0
        audio_s += _audio_seconds(out)
    total = time.perf_counter() - t0
    return {
        "ttfa": first_audio,
        "total": total,
        "thinker_done": thinker_done,
        "talker_done": marks["talker_done"],
        f"{audio}_done": total,
        "audio_s": audio_s,
        "frames": len(frames),
    }


async def orchestrated(pipeline: Any, rid: str, audio: str = "code2wav") -> dict[str, Any]:
    """The request through the Ray runtime: each stage's end from its ``done`` event."""
    from orchestrator.runtime.events import AudioChunk, OutputItem, StageEvent

    t0 = time.perf_counter()
    first_audio, audio_s, frames = None, 0.0, 0
    done: dict[str, float] = {}
    async for e in pipeline.stream(PROMPT, request_id=rid):
        if isinstance(e, AudioChunk):
            first_audio = first_audio if first_audio is not None else e.t
            audio_s += e.seconds
        elif isinstance(e, OutputItem) and e.stage == "talker":
            frames += 1
        elif isinstance(e, StageEvent) and e.kind == "done":
            done[e.stage] = e.t
    return {
        "ttfa": first_audio,
        "total": time.perf_counter() - t0,
        "thinker_done": done.get("thinker"),
        "talker_done": done.get("talker"),
        f"{audio}_done": done.get(audio),
        "audio_s": audio_s,
        "frames": frames,
    }


def stage_times(row: dict[str, Any], stages: tuple[str, ...] = STAGES) -> dict[str, float | None]:
    """Each stage's own time on the whole hand-over: the thinker to its end, the talker from
    there to its last frame, the audio stage (code2wav, token2wav) from there to its audio."""
    marks = [0.0, *(row.get(f"{s}_done") for s in stages)]
    return {
        s: (marks[i + 1] - marks[i]) if marks[i] is not None and marks[i + 1] is not None else None  # type: ignore[operator]
        for i, s in enumerate(stages)
    }


def med(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def fmt(x: float | None, spec: str = ".3f", unit: str = "", width: int = 0) -> str:
    return ("n/a" if x is None else f"{x:{spec}}{unit}").rjust(width)


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The medians, the ratios, and whether every variant gave the same audio length."""
    figures = {
        v: {k: med([r.get(k) for r in runs[v]]) for k in ("ttfa", "total", "audio_s", "frames")}
        for v in VARIANTS
    }
    stages = {
        v: {s: med([stage_times(r)[s] for r in runs[v]]) for s in STAGES}
        for v in ("inproc_whole", "ray_whole")
    }
    overhead = {s: ratio(stages["ray_whole"][s], stages["inproc_whole"][s]) for s in STAGES}
    overhead["total"] = ratio(figures["ray_whole"]["total"], figures["inproc_whole"]["total"])
    ttfa_ratio = {
        "in_process": ratio(figures["inproc_chunked"]["ttfa"], figures["inproc_whole"]["ttfa"]),
        "ray": ratio(figures["ray_chunked"]["ttfa"], figures["ray_whole"]["ttfa"]),
    }
    lengths = {round(r["audio_s"], 6) for v in VARIANTS for r in runs[v]}
    return {
        "figures": figures,
        "stage_s": stages,
        "overhead_ratio": overhead,
        "ttfa_chunked_over_whole": ttfa_ratio,
        "same_audio_length": len(lengths) == 1,
    }


def report(summary: dict[str, Any], args: argparse.Namespace) -> list[str]:
    f = summary["figures"]
    out = [
        f"tiny Qwen3-Omni: {args.thinker_tokens} thinker tokens, {fmt(f['ray_whole']['frames'], 'g')} talker "
        f"frames, {fmt(f['ray_whole']['audio_s'], '.2f', ' s')} of audio",
        f"medians of {args.repeat} rounds after a warm-up, the four variants side by side",
        "",
        f"{'':22}{'in-process':>12}{'Ray':>10}{'Ray/in-proc':>13}",
    ]
    for label, key in (("first audio, whole", "whole"), ("first audio, chunked", "chunked")):
        a, b = f[f"inproc_{key}"]["ttfa"], f[f"ray_{key}"]["ttfa"]
        out.append(
            f"{label:22}{fmt(a, '.3f', ' s', 12)}{fmt(b, '.3f', ' s', 10)}{fmt(ratio(b, a), '.2f', '', 13)}"
        )
    r = summary["ttfa_chunked_over_whole"]
    out.append(
        f"{'  chunked / whole':22}{fmt(r['in_process'], '.2f', '', 12)}{fmt(r['ray'], '.2f', '', 10)}"
    )
    for label, key in (("total, whole", "whole"), ("total, chunked", "chunked")):
        a, b = f[f"inproc_{key}"]["total"], f[f"ray_{key}"]["total"]
        out.append(
            f"{label:22}{fmt(a, '.3f', ' s', 12)}{fmt(b, '.3f', ' s', 10)}{fmt(ratio(b, a), '.2f', '', 13)}"
        )
    out += [
        "",
        "per stage, whole hand-over (the stages do not overlap):",
        f"{'':22}{'in-process':>12}{'Ray':>10}{'Ray/in-proc':>13}",
    ]
    st, oh = summary["stage_s"], summary["overhead_ratio"]
    for s in STAGES:
        out.append(
            f"{s:22}{fmt(st['inproc_whole'][s], '.3f', ' s', 12)}{fmt(st['ray_whole'][s], '.3f', ' s', 10)}"
            f"{fmt(oh[s], '.2f', '', 13)}"
        )
    out.append(f"same audio length in every variant: {summary['same_audio_length']}")
    return out


METRICS = (("ttfp_s", "TTFP s"), ("rtf", "RTF"), ("e2e_s", "E2E s"))
"""vLLM-Omni's names: time to first audio packet, real-time factor (end-to-end time over the
audio's length), end-to-end latency; each a median over a variant's requests."""


def request_metrics(row: dict[str, Any]) -> dict[str, float | None]:
    """One request in vLLM-Omni's terms: TTFP, RTF (its total over its audio's seconds), E2E."""
    audio = row.get("audio_s")
    return {
        "ttfp_s": row.get("ttfa"),
        "rtf": row["total"] / audio if audio else None,
        "e2e_s": row.get("total"),
    }


def _ratios(num: dict[str, Any], den: dict[str, Any]) -> dict[str, float | None]:
    return {k: ratio(num[k], den[k]) for k, _ in METRICS}


def vllm_omni_figures(
    runs: dict[str, dict[str, list[dict[str, Any]]]], model: str
) -> dict[str, Any]:
    """A model's runs by concurrency and variant in vLLM-Omni's terms: each variant's medians,
    the ratios that hold at any model size (chunked / whole hand-over, pipeline / one process)
    and, at concurrency 1 on the whole hand-over, each stage's share of the three stages' time.
    A ratio with no chunked variant (Qwen2.5-Omni's token2wav) is None."""
    spec = MODELS[model]
    out: dict[str, Any] = {"concurrency": {}}
    for c, by_variant in runs.items():
        figs = {
            v: {
                **{k: med([request_metrics(r)[k] for r in by_variant[v]]) for k, _ in METRICS},
                "requests": len(by_variant[v]),
            }
            for v in spec["variants"]
        }
        chunked = spec["chunked"]
        out["concurrency"][c] = {
            "figures": figs,
            "chunked_over_whole": {
                "in_process": _ratios(figs["inproc_chunked"], figs["inproc_whole"])
                if chunked
                else None,
                "ray": _ratios(figs["ray_chunked"], figs["ray_whole"]) if chunked else None,
            },
            "pipeline_over_one_process": {
                "whole": _ratios(figs["ray_whole"], figs["inproc_whole"]),
                "chunked": _ratios(figs["ray_chunked"], figs["inproc_chunked"])
                if chunked
                else None,
            },
        }
    share: dict[str, dict[str, float | None]] = {}
    for where, v in (("in_process", "inproc_whole"), ("ray", "ray_whole")):
        times = {
            s: med([stage_times(r, spec["stages"])[s] for r in runs["1"][v]])
            for s in spec["stages"]
        }
        total = sum(t for t in times.values() if t is not None)
        share[where] = {s: ratio(t, total) for s, t in times.items()}
    out["stage_share"] = share
    lengths = {round(r["audio_s"], 6) for per in runs.values() for rs in per.values() for r in rs}
    out["same_audio_length"] = len(lengths) == 1
    return out


def omni_report(model: str, figures: dict[str, Any]) -> list[str]:
    """A model's vLLM-Omni figures: medians per variant, then the ratios (80 columns)."""
    spec = MODELS[model]
    names = {
        "inproc_whole": "in-proc whole",
        "inproc_chunked": "in-proc chunk",
        "ray_whole": "Ray whole",
        "ray_chunked": "Ray chunked",
    }
    out = [
        "",
        f"{model} in vLLM-Omni's terms (medians; c: requests at once):",
        f"{'':8}{'c':>3}" + "".join(f"{names[v]:>14}" for v in spec["variants"]),
    ]
    for c, per in figures["concurrency"].items():
        for k, label in METRICS:
            out.append(
                f"{label:8}{c:>3}"
                + "".join(fmt(per["figures"][v][k], ".3f", "", 14) for v in spec["variants"])
            )
    out.append(f"{'ratios':30}{'c':>3}" + "".join(f"{label:>8}" for _, label in METRICS))
    for c, per in figures["concurrency"].items():
        rows = (
            ("chunked / whole, in-process", per["chunked_over_whole"]["in_process"]),
            ("chunked / whole, Ray", per["chunked_over_whole"]["ray"]),
            ("Ray / in-process, whole", per["pipeline_over_one_process"]["whole"]),
            ("Ray / in-process, chunked", per["pipeline_over_one_process"]["chunked"]),
        )
        for label, r in rows:
            if r is not None:
                cells = "".join(fmt(r[k], ".2f", "", 8) for k, _ in METRICS)
                out.append(f"{label:30}{c:>3}{cells}")
    if not spec["chunked"]:
        out.append(f"(no chunked hand-over: {spec['stages'][-1]} takes the whole code sequence)")
    for where, label in (("in_process", "in-process"), ("ray", "Ray")):
        parts = ", ".join(f"{s} {fmt(v, '.2f')}" for s, v in figures["stage_share"][where].items())
        out.append(f"stage share (whole, c 1), {label}: {parts}")
    return out


def load_runners(
    plan: Any, cfg: Any, routes: dict[str, Any], names: list[tuple[str, str]]
) -> dict[str, Any]:
    """Each named stage's runner of the plans (``(stage, "whole"|"chunked")``), loaded here."""
    from stages.registry import get_kind

    runners: dict[str, Any] = {}
    for name, key in names:
        sp = plan[key].stage(name)
        kind = get_kind(sp.kind)
        route = routes.get(sp.route or "")
        runner = (
            kind.runner(sp, cfg[key].stage(name), route=route)
            if route
            else kind.runner(sp, cfg[key].stage(name))
        )
        runner.load()
        runners[name if name in ("thinker", "talker") else f"{name}_{key}"] = runner
    return runners


async def _variant(
    variant: str, runners: dict[str, Any], pipelines: dict[str, Any], rid: str, audio: str
) -> dict[str, Any]:
    if variant.startswith("inproc_"):
        return await in_process(runners, variant.endswith("chunked"), rid, audio)
    return await orchestrated(pipelines[variant.split("_")[1]], rid, audio)


def measure(model: str, args: argparse.Namespace, profile: Any, tmp: Path) -> dict[str, Any] | None:
    """The model's runners in this process and its pipelines, started at once; each round runs
    every variant in turn, at each concurrency (c requests of the variant at once, each timed
    from its own submission). None when the plan is refused."""
    from orchestrator.api import Pipeline
    from orchestrator.config import load_config
    from orchestrator.planner import plan_pipeline

    spec = MODELS[model]
    audio = spec["stages"][-1]
    paths = configs(tmp, args.thinker_tokens, args.frames, model)
    cfg = {k: load_config(p) for k, p in paths.items()}
    plans = {k: plan_pipeline(c, profile) for k, c in cfg.items()}
    if not all(p.admitted for p in plans.values()):
        log(f"the plan was refused; run `omni-edge plan configs/examples/{model}.yaml` to see why")
        return None
    routes = {r.name: r for r in profile.routes}
    runners: dict[str, Any] = {}
    pipelines: dict[str, Any] = {}
    try:
        t = time.perf_counter()
        names = [("thinker", "whole"), ("talker", "whole")] + [(audio, k) for k in paths]
        runners = load_runners(plans, cfg, routes, names)
        log(
            f"{model} in-process: {', '.join(n for n, _ in names)} loaded in {time.perf_counter() - t:.1f} s"
        )
        for key in paths:
            t = time.perf_counter()
            pipelines[key] = Pipeline(
                plans[key], cfg[key], profile=profile, record=None, calibration=None
            )
            pipelines[key].start()
            log(f"{model} Ray, {key}: started in {time.perf_counter() - t:.1f} s")

        async def rounds() -> dict[str, dict[str, list[dict[str, Any]]]]:
            runs = {str(c): {v: [] for v in spec["variants"]} for c in args.concurrency}
            for i in range(args.repeat + 1):
                for c in args.concurrency:
                    got = {}
                    for v in spec["variants"]:
                        got[v] = await asyncio.gather(
                            *(
                                _variant(v, runners, pipelines, f"{v}{i}c{c}r{j}", audio)
                                for j in range(c)
                            )
                        )
                    log(
                        f"{model} round {i}{' (warm-up)' if not i else ''}, c {c}: first audio "
                        + ", ".join(
                            f"{v} {fmt(med([r['ttfa'] for r in rs]), '.3f', ' s')}"
                            for v, rs in got.items()
                        )
                    )
                    if i:
                        for v, rs in got.items():
                            runs[str(c)][v] += rs
            return runs

        runs = asyncio.run(rounds())
    finally:
        for p in pipelines.values():
            p.close()
        for r in runners.values():
            r.close()
    placement = {s.name: {"device": s.device, "backend": s.backend} for s in plans["whole"].stages}
    return {"runs": runs, "placement": placement}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--thinker-tokens", type=int, default=24, help="the thinker's reply, in tokens (fixed)"
    )
    parser.add_argument("--frames", type=int, default=64, help="the talker's codec frames (fixed)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds measured after one warm-up")
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[1, 4],
        help="requests at once, each level in every round (1 must be among them; default 1 4)",
    )
    parser.add_argument("--profile", help="hardware profile file (default: probe this machine)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    if args.thinker_tokens < 1 or args.frames < 1 or args.repeat < 1:
        parser.error("--thinker-tokens, --frames and --repeat must be at least 1")
    if 1 not in args.concurrency or min(args.concurrency) < 1:
        parser.error(
            "--concurrency: each level at least 1, and 1 among them (the per-stage figures)"
        )
    args.concurrency = sorted(set(args.concurrency))

    from exports import omni_tiny, qwen2_5_omni_token2wav, qwen3_omni_code2wav
    from orchestrator.probe import resolve_profile

    omni_tiny.ensure_built()
    if (
        not (qwen3_omni_code2wav.ARTIFACT_DIR / "manifest.yaml").is_file()
        and qwen3_omni_code2wav.build() != 0
    ):
        log("the tiny code2wav could not be exported (python -m exports.qwen3_omni_code2wav build)")
        return 3
    try:
        qwen2_5_omni_token2wav.ensure_built()
    except RuntimeError as exc:
        log(str(exc))
        return 3
    profile = resolve_profile(args.profile)
    measured: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="omni-edge-bench-") as tmp:
        for model in MODELS:
            got = measure(model, args, profile, Path(tmp))
            if got is None:
                return 3
            measured[model] = got
    runs = measured[QWEN3]["runs"]["1"]
    summary = summarise(runs)
    omni = {m: vllm_omni_figures(got["runs"], m) for m, got in measured.items()}
    lines = report(summary, args)
    for m in MODELS:
        lines += omni_report(m, omni[m])
    print("\n".join(lines))
    if args.json:
        doc = {
            "thinker_tokens": args.thinker_tokens,
            "frames": args.frames,
            "repeat": args.repeat,
            "concurrency": args.concurrency,
            "chunk": {"chunked": CHUNKED, "whole": WHOLE},
            "placement": measured[QWEN3]["placement"],
            **summary,
            "runs": runs,
            "vllm_omni": {
                m: {**omni[m], "placement": measured[m]["placement"], "runs": measured[m]["runs"]}
                for m in MODELS
            },
        }
        args.json.write_text(json.dumps(doc, indent=2))
    same = summary["same_audio_length"] and all(o["same_audio_length"] for o in omni.values())
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
