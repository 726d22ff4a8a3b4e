"""The voice's route worker with and without recycling: peak RSS and time over N sentences.

    .venv/bin/python bench/route_worker_memory.py [--sentences 80]
        [--profile configs/profiles/cpu-only-linux.json] [--json FILE]

OpenVINO's CPU plugin keeps memory for every new shape it meets, and the Piper
voice's output length changes with every sentence, so its route worker grows
~12 MiB a sentence with no plateau (docs/calibration.md). This plans the voice
alone on the CPU with ``ort-openvino`` (the profile's OpenVINO route), opens the
plan's session spec in the route's session host twice — once with no limit,
once with ``recycle_limit`` = the voice's planned budget (what the stage's
runner sets) — and speaks the same N distinct sentences (40–200 characters,
made here from a fixed word list) through each, one call at a time. Reported
per mode: the worker's peak RSS (sampled every 20 ms, following the worker
across recycles), its RSS at the end, recycles, total seconds; and the ratios.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.config import parse_config
from orchestrator.core.memory import rss_of
from orchestrator.core.profile import load_profile
from orchestrator.ort.sessions import WorkerSessions, open_sessions
from orchestrator.planner import plan_pipeline
from stages.exported_graph.kind import ExportedGraphKind
from stages.exported_graph.runner import route_for

ROOT = Path(__file__).resolve().parent.parent
_TEXT = (
    "the quick brown fox jumps over a lazy dog while seven patient engineers measure every "
    "placement on small machines and quiet rivers carry cold water past old stone bridges "
    "under bright morning light as children count red boats near the harbour"
)
WORDS = _TEXT.split(" ")
MiB = 2**20


def sentences(n: int, seed: int = 11) -> list[str]:
    """N distinct sentences of 40–200 characters (so nearly every one is a new output shape)."""
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        target = rng.randint(40, 200)
        words: list[str] = []
        while len(" ".join(words)) < target:
            words.append(rng.choice(WORDS))
        s = " ".join(words)[:200].rsplit(" ", 1)[0].capitalize() + "."
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


class Peak:
    """The worker's RSS every ``interval`` s, following ``host.pid`` across recycles."""

    def __init__(self, host: WorkerSessions, interval: float = 0.02) -> None:
        self.host, self.interval, self.peak = host, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_of(self.host.pid))

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_of(self.host.pid))


def speak(
    route: Any, spec: dict[str, Any], feeds: list[dict[str, Any]], limit: int | None
) -> dict[str, Any]:
    host = open_sessions(route)
    assert isinstance(host, WorkerSessions), "the voice's OpenVINO route runs in a worker"
    try:
        t0 = time.perf_counter()
        handle = host.open(spec, record=True)["handle"]
        open_s = time.perf_counter() - t0
        host.recycle_limit = limit
        t0 = time.perf_counter()
        with Peak(host) as peak:
            for f in feeds:
                host.run(handle, f)
        speak_s = time.perf_counter() - t0
        end = rss_of(host.pid)
    finally:
        host.shutdown()
    return {
        "limit_bytes": limit,
        "peak_rss_bytes": peak.peak,
        "end_rss_bytes": end,
        "recycles": host.recycles,
        "open_s": round(open_s, 2),
        "speak_s": round(speak_s, 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sentences", type=int, default=80)
    ap.add_argument("--profile", default=str(ROOT / "configs/profiles/cpu-only-linux.json"))
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()

    config = parse_config(
        {
            "name": "voice-alone",
            "stages": [
                {
                    "name": "voice",
                    "kind": "exported_graph",
                    "artifact": str(ROOT / "exports/piper-en-us-joe-medium"),
                    "devices": ["cpu"],
                    "backends": ["ort-openvino"],
                    "precision": ["fp32"],
                    "final_output": True,
                    "final_output_type": "audio",
                }
            ],
        },
        where="bench/route_worker_memory.py",
        base_dir=ROOT,
    )
    profile = load_profile(args.profile)
    plan = plan_pipeline(config, profile)
    stage = plan.stage("voice")
    if not stage.admitted or stage.backend != "ort-openvino":
        print(
            f"the voice was not planned on ort-openvino: {stage.to_dict().get('refusals')}",
            file=sys.stderr,
        )
        return 2
    route = route_for(stage, next((r for r in profile.routes if r.name == stage.route), None))
    budget = stage.budget_bytes()
    artifact = ExportedGraphKind().artifact(config.stage("voice"))
    pre = artifact.hook("preprocess")
    assert pre is not None
    texts = sentences(args.sentences)
    feeds = [pre(t, artifact) for t in texts]
    spec = stage.engine_kwargs["session"]
    without = speak(route, spec, feeds, None)
    with_ = speak(route, spec, feeds, budget)
    result = {
        "sentences": len(texts),
        "chars": [min(map(len, texts)), max(map(len, texts))],
        "budget_bytes": budget,
        "route": route.name,
        "without": without,
        "with_recycling": with_,
        "peak_ratio": round(with_["peak_rss_bytes"] / without["peak_rss_bytes"], 3),
        "time_ratio": round(with_["speak_s"] / without["speak_s"], 3),
    }
    print(
        f"voice on ort-openvino ({route.name}), {len(texts)} distinct sentences "
        f"({result['chars'][0]}-{result['chars'][1]} chars); limit = planned budget {budget / MiB:.0f} MiB"
    )
    print(f"{'':16}{'peak RSS':>10}{'end RSS':>10}{'recycles':>10}{'speak s':>10}")
    for name, r in (("no recycling", without), ("recycling", with_)):
        print(
            f"{name:16}{r['peak_rss_bytes'] / MiB:>6.0f} MiB{r['end_rss_bytes'] / MiB:>6.0f} MiB"
            f"{r['recycles']:>10}{r['speak_s']:>10.1f}"
        )
    print(f"{'ratio':16}{result['peak_ratio']:>9.2f}x{'':10}{'':10}{result['time_ratio']:>9.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
