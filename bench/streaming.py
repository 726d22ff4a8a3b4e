"""The driver's share of a pipeline's requests, relay vs direct (docs/benchmarks.md, "The
driver's share: relay vs direct"; docs/cluster.md, "Payloads").

Runs the echo pipeline (the test kind ``echo``: a thinker's words → a voice's tone, no model)
on a running Ray cluster under ``runtime.STREAMING = "relay"`` (every item through the driver)
then ``"direct"`` (producer → consumer), ``--requests`` requests each, one after another, and
prints per mode the driver's CPU seconds per request (``time.process_time``, every thread of
this process, while requests were in flight), the outputs it read and the feeds it sent, and
each edge's node crossings per item, from the run record's ``runtime.streaming``.

    python -m bench.streaming --address 127.0.0.1:6379 --thinker second/cpu --voice second/cpu

``--address`` omitted: a local one-node cluster (devices ``cpu``). ``--json`` prints the figures
as JSON (the two-node test reads it: tests/orchestrator/runtime/test_cluster_nodes.py).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from stages.requests import as_request

PROMPT = "hello"
REQUESTS = 20
"""Requests per mode: the issue's measure (docs/benchmarks.md)."""


def echo_plan(tmp: Path, thinker: str, voice: str, final: bool = True) -> tuple[Any, Any]:
    """The echo pipeline with its stages on ``thinker`` and ``voice`` (``node/device`` on a
    cluster: each reservation then goes to that node's ``host_ram``); ``final``: the thinker's
    text is a final output (a voice assistant shows it), else it reaches only the voice."""
    from orchestrator.core.plan import PoolPlan
    from orchestrator.core.units import GiB
    from tests.helpers.echo import echo_pipeline

    plan, config = echo_pipeline(tmp, thinker={"delay_s": 0.0}, voice={"delay_s": 0.0})

    def pool(device: str) -> str:
        node = device.rpartition("/")[0]
        return f"{node}/host_ram" if node else "host_ram"

    def moved(s: Any, device: str) -> Any:
        rs = tuple(dataclasses.replace(r, pool=pool(device)) for r in s.reservations)
        return dataclasses.replace(s, device=device, reservations=rs)

    first = dataclasses.replace(plan.stages[0], final_output=final)
    stages = (moved(first, thinker), moved(plan.stages[1], voice))
    pools = sorted({pool(thinker), pool(voice)})
    shared = tuple(dataclasses.replace(r, pool=p) for p in pools for r in plan.shared_reservations)
    plan = dataclasses.replace(
        plan,
        stages=stages,
        pools=tuple(PoolPlan(p, 8 * GiB, 0, {}) for p in pools),
        shared_reservations=shared,
    )
    return plan, config


def measure(
    mode: str,
    address: str | None,
    thinker: str,
    voice: str,
    requests: int,
    tmp: Path,
    final: bool = True,
) -> dict[str, Any]:
    """``requests`` echo requests under ``mode``: the record's ``runtime.streaming`` and its
    ``edges[]``, and the driver's CPU seconds per request."""
    from orchestrator.runtime import record
    from orchestrator.runtime import runtime as runtime_mod
    from orchestrator.runtime.events import collect

    plan, config = echo_plan(tmp, thinker, voice, final)
    runtime_mod.STREAMING = mode
    rt = runtime_mod.Runtime(plan, config, address=address)
    rt.start()
    try:

        async def one(i: int) -> Any:
            events = [e async for e in rt.stream(as_request(PROMPT), request_id=f"{mode}{i}")]
            return collect(f"{mode}{i}", PROMPT, events, 0.0)

        results = [asyncio.run(one(i)) for i in range(requests)]
        doc = record.build(rt, results)
    finally:
        rt.close()
    streaming = doc["runtime"]["streaming"]
    driver = streaming["driver"]
    return {
        "mode": mode,
        "requests": requests,
        "driver_cpu_s_per_request": round(driver["cpu_s"] / requests, 5),
        "driver": driver,
        "streaming_edges": streaming["edges"],
        "driver_node": streaming["driver_node"],
        "edges": doc["edges"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--address", help="a running Ray cluster (default: a local one)")
    ap.add_argument("--thinker", default="cpu", help="the thinker's device (node/device)")
    ap.add_argument("--voice", default="cpu", help="the voice's device (node/device)")
    ap.add_argument("--requests", type=int, default=REQUESTS)
    ap.add_argument("--modes", default="relay,direct")
    ap.add_argument(
        "--thinker-not-final",
        action="store_true",
        help="the thinker's text reaches only the voice (not a final output)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    import tempfile

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            out.append(
                measure(
                    mode,
                    args.address,
                    args.thinker,
                    args.voice,
                    args.requests,
                    Path(tmp),
                    not args.thinker_not_final,
                )
            )
    if args.json:
        print(json.dumps(out))
        return 0
    final = "not final" if args.thinker_not_final else "final"
    print(
        f"echo pipeline, thinker {args.thinker} ({final}) → voice {args.voice}, "
        f"{args.requests} requests"
    )
    print(
        f"{'mode':<8}{'driver CPU s/req':>18}{'items read':>12}{'feeds sent':>12}{'crossings':>11}"
    )
    for m in out:
        d = m["driver"]
        crossings = m["streaming_edges"][0]["crossings_per_item"]
        print(
            f"{m['mode']:<8}{m['driver_cpu_s_per_request']:>18.4f}"
            f"{d['items_read']:>12}{d['feeds_sent']:>12}{crossings:>11}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
