"""Throughput of a stage with 1 replica against 2 (docs/benchmarks.md, "Stage replicas";
docs/runtime.md, "Replicas").

Runs the echo pipeline (the test kind ``echo``, no model) on a local one-node Ray cluster,
requests entering at the voice, whose every output takes ``--work-s`` seconds under one
work slot (``work_s``, ``work_slots: 1``): one replica speaks at most ``1 / work_s``
sentences a second, by sleeping, without using the CPU. First the voice as one instance
(on ``cpu``), then as two (``cpu`` and ``igpu:0``, each its own device actor); each serves
``--concurrent`` requests of 4 sentences at once, ``--rounds`` times. Prints per layout the
seconds per round (median), the requests per second, the requests each replica served,
and the ratio of the two throughputs.

    python -m bench.replicas --concurrent 8 --rounds 3

``--json`` prints the figures as JSON.
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

from stages.requests import as_request

TEXT = "One sentence here. Another one there. A third to speak. And the last."
"""Four sentences: four voice outputs per request."""
LAYOUTS = {"1 replica": (), "2 replicas": ("cpu", "igpu:0")}
DEVICES = ["cpu", "igpu:0"]


def run_layout(
    replicas: tuple[str, ...], concurrent: int, rounds: int, work_s: float
) -> dict[str, Any]:
    """One layout started, ``rounds`` rounds of ``concurrent`` requests, closed: the figures."""
    from orchestrator.runtime.runtime import Runtime
    from tests.helpers.echo import echo_pipeline

    plan, config = echo_pipeline(
        Path(tempfile.mkdtemp(prefix="bench-replicas-")),
        voice={"work_s": work_s, "work_slots": 1},
        voice_replicas=replicas,
    )
    rt = Runtime(plan, config)
    rt.start()
    try:
        times = [asyncio.run(_round(rt, concurrent, r)) for r in range(rounds)]
        served = {h: n for h, n in rt.balancer.served.items() if rt.refs[h].stage == "voice"}
    finally:
        rt.close()
    median = statistics.median(times)
    return {
        "replicas": max(1, len(replicas)),
        "devices": list(replicas) or ["cpu"],
        "round_s": [round(t, 3) for t in times],
        "median_round_s": round(median, 3),
        "requests_per_s": round(concurrent / median, 3),
        "served": served,
    }


async def _round(rt: Any, concurrent: int, r: int) -> float:
    async def one(i: int) -> None:
        async for _ in rt.stream(as_request(TEXT), request_id=f"b{r}-{i}", entry="voice"):
            pass

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(concurrent)))
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.replicas", description=__doc__)
    ap.add_argument("--concurrent", type=int, default=8, help="requests at once (8)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per layout (3)")
    ap.add_argument("--work-s", type=float, default=0.1, help="seconds per voice output (0.1)")
    ap.add_argument("--json", action="store_true", help="the figures as JSON")
    args = ap.parse_args(argv)
    if args.concurrent < 1 or args.rounds < 1 or args.work_s <= 0:
        print("error: --concurrent and --rounds must be ≥ 1, --work-s > 0", file=sys.stderr)
        return 2
    from orchestrator.runtime import cluster

    cluster.connect(DEVICES)
    try:
        figures = {
            name: run_layout(reps, args.concurrent, args.rounds, args.work_s)
            for name, reps in LAYOUTS.items()
        }
    finally:
        cluster.release()
    one, two = figures["1 replica"], figures["2 replicas"]
    ratio = round(two["requests_per_s"] / one["requests_per_s"], 3)
    if args.json:
        print(json.dumps({"layouts": figures, "throughput_ratio": ratio}, indent=2))
        return 0
    print(
        f"{args.concurrent} concurrent requests of 4 sentences, {args.work_s:g} s per sentence, "
        f"{args.rounds} rounds"
    )
    print(f"{'layout':<12} {'round s (median)':>17} {'requests/s':>11}  served")
    for name, f in figures.items():
        served = ", ".join(f"{h} {n}" for h, n in f["served"].items())
        print(f"{name:<12} {f['median_round_s']:>17.3f} {f['requests_per_s']:>11.3f}  {served}")
    print(f"throughput, 2 replicas / 1: {ratio:.2f}x (ideal 2.00x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
