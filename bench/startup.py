"""Cold start against its bound, in one run: Ray alone, each stage alone, the whole pipeline.

    python bench/startup.py [--config configs/voice-assistant.yaml] [--profile FILE] [--repeat 3]
                            [--settle LOAD] [--json FILE]

Side by side, interleaved repetition by repetition, each with a fresh local Ray
cluster (started, then shut down) and the weights already prepared:

* (a) **Ray start alone**: ``cluster.connect`` (``ray.init``), then released;
* (b) **each stage's load alone**: a one-stage pipeline per stage (the stage
  fed by the request), started; its load timed by the runtime from the load
  being sent to the device actor to the answer (``startup.stage_load_s``),
  and by the actor around ``runner.load()`` (``load_s``);
* (c) **the whole pipeline's cold start** (``Runtime.start``: Ray, the ledger
  and device actors, Ray's memory measured, every stage loaded), with loads in
  parallel where the ledger admits them together — and the same with
  ``startup.PARALLEL_LOADS = False`` (every stage loaded one after another,
  as before this work), for comparison.

Reported: medians over ``--repeat`` repetitions (after one warm-up start that
is not counted), the ratio cold start / (Ray start + the slowest stage's load
alone) against the target 1.15 (the serving work's "start fast"), the sequential start's
ratio, the same ratios per repetition (each against its own repetition's
figures, so a busy minute weighs on both sides), the machine's load average
around each repetition (other work on a small machine moves every figure),
and where the parallel start's time went (Ray, actors, loads, and the decode
stage's import / engine start as its runner reports them). ``--settle LOAD``
waits (at most ``SETTLE_MAX_S`` per step) before each timed step until the
1-minute load average is below LOAD, so that a burst of other work does not
land on one variant only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TARGET = 1.15
SETTLE_MAX_S = 60.0


def med(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def settle(limit: float | None) -> float:
    """Wait until the 1-minute load average is below ``limit`` (at most
    ``SETTLE_MAX_S``); returns the load average then."""
    deadline = time.monotonic() + SETTLE_MAX_S
    while limit is not None and os.getloadavg()[0] >= limit and time.monotonic() < deadline:
        time.sleep(2.0)
    return os.getloadavg()[0]


def ray_alone(devices: list[str]) -> float:
    """Seconds for ``ray.init`` of a fresh local cluster (then shut down)."""
    from orchestrator.runtime import cluster

    c = cluster.connect(devices)
    try:
        return c.started_s
    finally:
        cluster.release()


def cold_start(plan: Any, config: Any, routes: dict[str, Any], *, parallel: bool) -> dict[str, Any]:
    """One ``Runtime.start`` on a fresh cluster; its wall time, its own timings and load results."""
    from orchestrator.runtime import startup
    from orchestrator.runtime.runtime import Runtime

    rt = Runtime(plan, config, routes=routes)
    startup.PARALLEL_LOADS = parallel
    try:
        t0 = time.perf_counter()
        rt.start()
        wall = time.perf_counter() - t0
    finally:
        startup.PARALLEL_LOADS = True
        final = rt.close()
    if final.get("held_bytes"):
        raise SystemExit(f"the ledger held {final['held_bytes']} bytes after close")
    return {
        "wall_s": wall,
        "startup": dict(rt.startup),
        "load_s": {k: v["load_s"] for k, v in rt.load_results.items()},
        "load_info": {k: v.get("load_info", {}) for k, v in rt.load_results.items()},
        "overlapped": {k: v.get("overlapped") for k, v in rt.load_results.items()},
    }


def one_stage(plan: Any, name: str) -> Any:
    """``plan`` with only stage ``name``, fed by the request."""
    s = plan.stage(name)
    return dataclasses.replace(plan, stages=(dataclasses.replace(s, inputs=("request",)),))


def report(
    args: argparse.Namespace, plan: Any, rows: dict[str, list[Any]]
) -> tuple[list[str], dict[str, Any]]:
    names = [s.name for s in plan.stages]
    ray_s = med(rows["ray"])
    alone = {n: med([r["startup"]["stage_load_s"][n] for r in rows[f"alone:{n}"]]) for n in names}
    alone_actor = {n: med([r["load_s"][n] for r in rows[f"alone:{n}"]]) for n in names}
    slowest = max(names, key=lambda n: alone[n] or 0.0)
    par = med([r["wall_s"] for r in rows["parallel"]])
    seq = med([r["wall_s"] for r in rows["sequential"]])
    bound = (ray_s or 0.0) + (alone[slowest] or 0.0)
    ratio, seq_ratio = (par / bound if par else None), (seq / bound if seq else None)
    out = [
        f"{args.config}: {args.repeat} repetitions after a warm-up; medians; fresh Ray",
        "",
        f"(a) Ray start alone (ray.init)             {ray_s:8.2f} s",
    ]
    for n in names:
        out.append(
            f"(b) {n[:10]:10} load alone {alone[n]:8.2f} s  (in its actor {alone_actor[n]:.2f} s)"
        )
    out += [
        f"(c) cold start, loads in parallel          {par:8.2f} s",
        f"    cold start, loads one after another    {seq:8.2f} s",
        "",
        f"bound: Ray start + slowest load alone ({slowest}) = {ray_s:.2f} + {alone[slowest]:.2f}"
        f" = {bound:.2f} s",
        f"cold start / bound: parallel {ratio:.2f}, sequential {seq_ratio:.2f}; target <= {TARGET:.2f}: "
        f"{'met' if ratio is not None and ratio <= TARGET else 'NOT met'}",
        "",
        "where the parallel start's time went (medians):",
    ]
    keys = ("ray_init_s", "actors_s", "loads_s", "start_s")
    phases = {k: med([r["startup"].get(k) for r in rows["parallel"]]) for k in keys}
    other = med(
        [r["startup"]["start_s"] - sum(r["startup"][k] for k in keys[:3]) for r in rows["parallel"]]
    )
    out.append(
        "  " + "  ".join(f"{k[:-2]} {phases[k]:.2f} s" for k in keys) + f"  other {other:.2f} s"
    )
    for n in names:
        in_par = med([r["startup"]["stage_load_s"][n] for r in rows["parallel"]])
        info = rows["parallel"][-1]["load_info"].get(n, {})
        parts = ", ".join(
            f"{k[:-2]} {info[k]:.2f} s"
            for k in ("import_s", "model_resolve_s", "engine_start_s")
            if isinstance(info.get(k), (int, float))
        )
        out.append(
            f"  {n[:10]:10} loaded {in_par:.2f} s after its load was sent (alone {alone[n]:.2f} s)"
        )
        if parts:
            out.append(f"  {'':10} last run: {parts}")
    waves = rows["parallel"][-1]["startup"].get("load_waves")
    out.append(f"  waves: {waves}")
    out.append("")
    out.append("per repetition: parallel / bound, sequential / bound (1-min load average)")
    for i in range(len(rows["ray"])):
        b = rows["ray"][i] + max(rows[f"alone:{n}"][i]["startup"]["stage_load_s"][n] for n in names)
        out.append(
            f"  {i + 1}: {rows['parallel'][i]['wall_s'] / b:.2f}  {rows['sequential'][i]['wall_s'] / b:.2f}"
            f"  (bound {b:.2f} s; load {rows['loadavg'][i]:.1f} on {os.cpu_count()} CPUs)"
        )
    for n in names:
        out.append(
            f"  {n[:10]}: loaded after (parallel / sequential / alone) "
            f"{med([r['startup']['stage_load_s'][n] for r in rows['parallel']]):.2f} / "
            f"{med([r['startup']['stage_load_s'][n] for r in rows['sequential']]):.2f} / {alone[n]:.2f} s"
        )
    doc = {
        "config": args.config,
        "repeat": args.repeat,
        "ray_start_s": ray_s,
        "stage_load_alone_s": alone,
        "stage_load_alone_in_actor_s": alone_actor,
        "slowest_stage": slowest,
        "bound_s": bound,
        "cold_start_parallel_s": par,
        "cold_start_sequential_s": seq,
        "ratio": ratio,
        "sequential_ratio": seq_ratio,
        "target": TARGET,
        "phases_parallel": phases,
        "runs": rows,
    }
    return out, doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/voice-assistant.yaml")
    ap.add_argument("--profile", help="hardware profile file (default: probe this machine)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--settle",
        type=float,
        metavar="LOAD",
        help="before each step, wait for a load average below LOAD",
    )
    ap.add_argument("--json", metavar="FILE", help="also write the figures and every run as JSON")
    args = ap.parse_args()

    import ray  # noqa: F401  - imported once, outside every timing

    from orchestrator.api import prepare_models
    from orchestrator.commands.progress import ProgressBars
    from orchestrator.config import load_config
    from orchestrator.planner import plan_pipeline
    from orchestrator.probe import resolve_profile

    config = load_config(REPO / args.config if not Path(args.config).is_absolute() else args.config)
    profile = resolve_profile(args.profile)
    plan = plan_pipeline(config, profile)
    if not plan.admitted:
        print("the plan was refused; run `omni-edge plan` to see why", file=sys.stderr)
        return 3
    prepare_models(plan, progress=ProgressBars())
    routes = {r.name: r for r in profile.routes}
    devices = list(dict.fromkeys(s.device or "?" for s in plan.stages))
    names = [s.name for s in plan.stages]

    rows: dict[str, list[Any]] = {
        "ray": [],
        "parallel": [],
        "sequential": [],
        "loadavg": [],
        **{f"alone:{n}": [] for n in names},
    }
    warm = cold_start(plan, config, routes, parallel=True)
    print(f"warm-up start (not counted): {warm['wall_s']:.2f} s {warm['startup']}", file=sys.stderr)
    for i in range(args.repeat):
        steps = [
            ("ray", lambda: ray_alone(devices)),
            ("parallel", lambda: cold_start(plan, config, routes, parallel=True)),
            *(
                (
                    f"alone:{n}",
                    lambda n=n: cold_start(one_stage(plan, n), config, routes, parallel=True),
                )
                for n in names
            ),
            ("sequential", lambda: cold_start(plan, config, routes, parallel=False)),
        ]
        rows["loadavg"].append(settle(args.settle))
        k = i % len(steps)  # rotate the order, so that no variant always runs first
        for key, step in steps[k:] + steps[:k]:
            settle(args.settle)
            value = step()
            rows[key].append(value)
            shown = value if isinstance(value, float) else value["wall_s"]
            print(f"  [{i + 1}/{args.repeat}] {key:18} {shown:7.2f} s", file=sys.stderr)

    lines, doc = report(args, plan, rows)
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
