"""Qwen3-Omni's thinker → talker → code2wav: time to first audio with chunked code2wav against
the whole hand-over, and the pipeline's per-stage time against the same stages in one process.

    python bench/omni.py [--thinker-tokens 24] [--frames 64] [--repeat 3] [--json FILE]

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
CHUNKED = {"frames": 25, "left_context": 25, "first_frames": 4}
"""vLLM-Omni's talker2code2wav_async_chunk figures (codec_chunk_frames 25,
codec_left_context_frames 25, initial_codec_chunk_frames 4): the example config's."""
WHOLE = {"frames": None}
"""One code2wav call on every frame when the talker ends (vLLM-Omni without async_chunk)."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def configs(tmp: Path, thinker_tokens: int, frames: int) -> dict[str, Path]:
    """The example config, twice: code2wav chunked and whole; lengths fixed, paths absolute."""
    from exports import omni_tiny, qwen3_omni_code2wav

    out = {}
    for name, chunk in (("chunked", CHUNKED), ("whole", WHOLE)):
        doc = yaml.safe_load((REPO / "configs/examples/qwen3-omni-tiny.yaml").read_text())
        for stage in doc["stages"]:
            if stage["name"] == "thinker":
                stage["model"] = str(omni_tiny.QWEN3_OMNI_DIR)
                stage["sampling"].update(min_tokens=thinker_tokens, max_tokens=thinker_tokens)
                stage["max_model_len"] = thinker_tokens + 64
            elif stage["name"] == "talker":
                stage["model"] = str(omni_tiny.QWEN3_OMNI_DIR)
                stage["sampling"].update(min_tokens=frames, max_tokens=frames)
                stage["max_model_len"] = thinker_tokens + frames + 64
            else:
                stage["artifact"] = str(qwen3_omni_code2wav.ARTIFACT_DIR)
                stage["chunk"] = dict(chunk)
        doc["name"] = f"qwen3-omni-tiny-{name}"
        path = tmp / f"{name}.yaml"
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


async def in_process(runners: dict[str, Any], chunked: bool, rid: str) -> dict[str, Any]:
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
    code2wav = runners["code2wav_chunked" if chunked else "code2wav_whole"]
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
        "code2wav_done": total,
        "audio_s": audio_s,
        "frames": len(frames),
    }


async def orchestrated(pipeline: Any, rid: str) -> dict[str, Any]:
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
        "code2wav_done": done.get("code2wav"),
        "audio_s": audio_s,
        "frames": frames,
    }


def stage_times(row: dict[str, Any]) -> dict[str, float | None]:
    """Each stage's own time on the whole hand-over: the thinker to its end, the talker from
    there to its last frame, code2wav from there to its audio."""
    marks = [0.0, row.get("thinker_done"), row.get("talker_done"), row.get("code2wav_done")]
    return {
        s: (marks[i + 1] - marks[i]) if marks[i] is not None and marks[i + 1] is not None else None  # type: ignore[operator]
        for i, s in enumerate(STAGES)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--thinker-tokens", type=int, default=24, help="the thinker's reply, in tokens (fixed)"
    )
    parser.add_argument("--frames", type=int, default=64, help="the talker's codec frames (fixed)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds measured after one warm-up")
    parser.add_argument("--profile", help="hardware profile file (default: probe this machine)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    if args.thinker_tokens < 1 or args.frames < 1 or args.repeat < 1:
        parser.error("--thinker-tokens, --frames and --repeat must be at least 1")

    from exports import omni_tiny, qwen3_omni_code2wav
    from orchestrator.api import Pipeline
    from orchestrator.config import load_config
    from orchestrator.planner import plan_pipeline
    from orchestrator.probe import resolve_profile
    from stages.registry import get_kind

    omni_tiny.ensure_built()
    if (
        not (qwen3_omni_code2wav.ARTIFACT_DIR / "manifest.yaml").is_file()
        and qwen3_omni_code2wav.build() != 0
    ):
        log("the tiny code2wav could not be exported (python -m exports.qwen3_omni_code2wav build)")
        return 3
    profile = resolve_profile(args.profile)
    with tempfile.TemporaryDirectory(prefix="omni-edge-bench-") as tmp:
        paths = configs(Path(tmp), args.thinker_tokens, args.frames)
        cfg = {k: load_config(p) for k, p in paths.items()}
        plans = {k: plan_pipeline(c, profile) for k, c in cfg.items()}
        if not all(p.admitted for p in plans.values()):
            log(
                "the plan was refused; run `omni-edge plan configs/examples/qwen3-omni-tiny.yaml` to see why"
            )
            return 3
        routes = {r.name: r for r in profile.routes}
        runners: dict[str, Any] = {}
        pipelines: dict[str, Any] = {}
        try:
            t = time.perf_counter()
            for name, key in (
                ("thinker", "whole"),
                ("talker", "whole"),
                ("code2wav", "whole"),
                ("code2wav", "chunked"),
            ):
                sp = plans[key].stage(name)
                kind = get_kind(sp.kind)
                route = routes.get(sp.route or "")
                runner = (
                    kind.runner(sp, cfg[key].stage(name), route=route)
                    if route
                    else kind.runner(sp, cfg[key].stage(name))
                )
                runner.load()
                runners[name if name != "code2wav" else f"code2wav_{key}"] = runner
            log(
                f"in-process: thinker, talker and both code2wav loaded in {time.perf_counter() - t:.1f} s"
            )
            for key in ("whole", "chunked"):
                t = time.perf_counter()
                pipelines[key] = Pipeline(
                    plans[key], cfg[key], profile=profile, record=None, calibration=None
                )
                pipelines[key].start()
                log(f"Ray, {key}: started in {time.perf_counter() - t:.1f} s")

            async def rounds() -> dict[str, list[dict[str, Any]]]:
                runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
                for i in range(args.repeat + 1):
                    got = {
                        "inproc_whole": await in_process(runners, False, f"iw{i}"),
                        "inproc_chunked": await in_process(runners, True, f"ic{i}"),
                        "ray_whole": await orchestrated(pipelines["whole"], f"rw{i}"),
                        "ray_chunked": await orchestrated(pipelines["chunked"], f"rc{i}"),
                    }
                    log(
                        f"round {i}{' (warm-up)' if not i else ''}: first audio "
                        + ", ".join(f"{v} {fmt(r['ttfa'], '.3f', ' s')}" for v, r in got.items())
                    )
                    if i:
                        for v, r in got.items():
                            runs[v].append(r)
                return runs

            runs = asyncio.run(rounds())
        finally:
            for p in pipelines.values():
                p.close()
            for r in runners.values():
                r.close()
    summary = summarise(runs)
    print("\n".join(report(summary, args)))
    if args.json:
        doc = {
            "thinker_tokens": args.thinker_tokens,
            "frames": args.frames,
            "repeat": args.repeat,
            "chunk": {"chunked": CHUNKED, "whole": WHOLE},
            "placement": {
                s.name: {"device": s.device, "backend": s.backend} for s in plans["chunked"].stages
            },
            **summary,
            "runs": runs,
        }
        args.json.write_text(json.dumps(doc, indent=2))
    return 0 if summary["same_audio_length"] else 1


if __name__ == "__main__":
    sys.exit(main())
