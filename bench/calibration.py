"""Plans that learn from measurement: budget/measured before and after one calibration run.

    python bench/calibration.py [--config configs/voice-assistant.yaml] [--profile FILE]
                                [--store DIR] [--json FILE]

Two sessions of the pipeline, each in its own process (a fresh Ray, fresh actors),
against one measurement store (a new temporary directory unless ``--store``):

1. **calibration run**: planned from metadata alone (the store is empty), then the
   test matrix — each prompt of ``PROMPTS`` (short, medium, long) alone
   (concurrency 1), then four copies of it at once (concurrency 4). Closing the
   pipeline records every stage's measured peaks, and Ray's, in the store.
2. **calibrated run**: planned again, now from the store (evidence M), and the same
   matrix.

Replies are greedy (temperature 0), so both runs — and the four copies at
concurrency 4 — speak the same sentences: what differs between the runs is the
machine, not what the model chose to say (with sampled replies the voice's peak
at concurrency 4 moved by 12 % between two runs here, the length of the longest
sentence deciding it).

After every cell, each stage's measured peak so far (``Runtime.measure()``) is set
against its budget. Targets (the calibration work): in the calibrated run, every stage's
budget/measured over the whole run is between 1.00 and 1.15, and in no cell
does a stage measure above its budget. (A stage of the calibration run measured
above its *estimated* budget is reported as a finding: the estimates are what
calibration replaces.) ``chars`` is the longest sentence the voice spoke in the
cell. A figure that is an upper bound
(a load that overlapped another in one process) is shown with ``(bound)`` and not
judged. The Ray runtime's planned and measured memory are shown for both runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPTS = {
    "short": "Hi!",
    "medium": "Tell me one fact about the Moon.",
    "long": (
        "I am planning a week-long trip through the mountains in early autumn with two friends who have "
        "never camped before. We will carry our own tents and cook on a small stove, and the weather can "
        "turn quickly from sunny to cold rain. Explain in a few sentences what we should pack, how we "
        "should plan each day's walking distance, and what we should do if one of us gets hurt far "
        "from the nearest road."
    ),
}
CONCURRENCY = (1, 4)
RATIO_LOW, RATIO_HIGH = 1.00, 1.15


async def cell(pipeline: Any, prompt: str, concurrency: int, tag: str) -> tuple[float, int]:
    """Run one cell; (seconds, the longest sentence the voice spoke, in characters)."""
    t0 = time.perf_counter()
    # greedy replies: both runs (and the copies at concurrency 4) speak the same sentences,
    # so what differs between them is the machine, not what the model chose to say
    request = {"messages": [{"role": "user", "content": prompt}], "sampling": {"temperature": 0.0}}
    results = await asyncio.gather(
        *(pipeline.arun(request, request_id=f"{tag}-{i}") for i in range(concurrency))
    )
    longest = max((len(c) for r in results for c in r.chunks), default=0)
    return time.perf_counter() - t0, longest


def session(config: str, profile: str | None, store_dir: str) -> dict[str, Any]:
    """One pipeline session: plan from the store, the matrix, close (which records)."""
    from orchestrator.api import Pipeline
    from orchestrator.calibration import CalibrationStore

    store = CalibrationStore(Path(store_dir))
    t0 = time.perf_counter()
    pipeline = Pipeline.from_config(config, profile=profile, record=None, calibration=store)
    start_s = time.perf_counter() - t0
    plan = pipeline.plan
    ray_planned = next((r for r in plan.shared_reservations if r.purpose == "ray_runtime"), None)
    cells = []
    try:
        for name, prompt in PROMPTS.items():
            for c in CONCURRENCY:
                seconds, longest = asyncio.run(cell(pipeline, prompt, c, f"{name}-c{c}"))
                measured = pipeline.runtime.measure()
                cells.append(
                    {
                        "prompt": name,
                        "prompt_chars": len(prompt),
                        "concurrency": c,
                        "seconds": round(seconds, 2),
                        "longest_sentence_chars": longest,
                        "stages": {
                            s: {
                                k: m.get(k)
                                for k in (
                                    "measured_peak_bytes",
                                    "budget_bytes",
                                    "within_budget",
                                    "upper_bound",
                                    "max_in_flight",
                                )
                            }
                            for s, m in measured.items()
                        },
                    }
                )
        ray_measured = pipeline.runtime.ray_memory.get("bytes")
    finally:
        pipeline.close()
    recorded = getattr(pipeline.runtime, "calibration_recorded", None)
    return {
        "start_s": round(start_s, 1),
        "stages": {
            s.name: {
                "budget_bytes": s.budget_bytes(),
                "calibration": s.calibration,
                "device": s.device,
                "backend": s.backend,
            }
            for s in plan.stages
        },
        "ray": {
            "planned_bytes": ray_planned.bytes if ray_planned else None,
            "planned_evidence": ray_planned.evidence if ray_planned else None,
            "measured_bytes": ray_measured,
        },
        "cells": cells,
        "recorded": recorded,
    }


def mib(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**20:.0f}"


def judge(run: dict[str, Any]) -> dict[str, Any]:
    """Per stage: final measured peak, budget, ratio; whether any cell measured above budget."""
    out: dict[str, Any] = {}
    last = run["cells"][-1]["stages"] if run["cells"] else {}
    for name, st in run["stages"].items():
        m = last.get(name, {})
        peak, budget = m.get("measured_peak_bytes"), st["budget_bytes"]
        over_cells = [
            f"{c['prompt']}@{c['concurrency']}"
            for c in run["cells"]
            if (c["stages"].get(name) or {}).get("within_budget") is False
        ]
        out[name] = {
            "budget_bytes": budget,
            "measured_peak_bytes": peak,
            "ratio": round(budget / peak, 3) if peak else None,
            "upper_bound": bool(m.get("upper_bound")),
            "over_budget_cells": over_cells,
        }
    return out


def report(runs: list[dict[str, Any]]) -> tuple[str, bool]:
    lines = []
    ok = True
    for label, run in zip(
        ("calibration run (metadata estimates)", "calibrated run (from the store)"),
        runs,
        strict=True,
    ):
        lines.append(f"{label}: started in {run['start_s']} s")
        lines.append(
            f"  {'cell':<12}{'s':>6}{'chars':>6}  "
            + "  ".join(f"{n + ' MiB (budget/measured)':>28}" for n in run["stages"])
        )
        for c in run["cells"]:
            row = f"  {c['prompt'] + '@' + str(c['concurrency']):<12}{c['seconds']:>6.1f}{c['longest_sentence_chars']:>6}  "
            parts = []
            for n in run["stages"]:
                m = c["stages"].get(n, {})
                peak, budget = m.get("measured_peak_bytes"), m.get("budget_bytes")
                ratio = f"{budget / peak:.3f}" if peak and budget else "-"
                flag = (
                    " OVER"
                    if m.get("within_budget") is False
                    else " (bound)"
                    if m.get("upper_bound")
                    else ""
                )
                parts.append(f"{mib(budget)}/{mib(peak)} = {ratio}{flag}".rjust(28))
            lines.append(row + "  ".join(parts))
        ray = run["ray"]
        lines.append(
            f"  ray runtime: planned {mib(ray['planned_bytes'])} MiB ({ray['planned_evidence']}), "
            f"measured {mib(ray['measured_bytes'])} MiB"
        )
        calibrated_run = run is runs[1]
        for name, j in judge(run).items():
            cal = run["stages"][name]["calibration"]
            how = (
                (
                    f"calibrated ({cal['match']}, {cal['provenance']['samples']} run(s)): "
                    f"{mib(cal['before_bytes'])} → {mib(cal['after_bytes'])} MiB"
                )
                if cal
                else "metadata estimate"
            )
            lines.append(
                f"  {name}: budget {mib(j['budget_bytes'])} MiB, measured {mib(j['measured_peak_bytes'])} "
                f"MiB, budget/measured {j['ratio']} — {how}"
            )
            if j["over_budget_cells"]:
                ok = ok and not calibrated_run
                lines.append(
                    f"    {'FAIL' if calibrated_run else 'finding'}: measured above "
                    f"{'its calibrated' if calibrated_run else 'the estimated'} budget in "
                    f"{', '.join(j['over_budget_cells'])}"
                )
        lines.append("")
    second = judge(runs[1])
    for name, j in second.items():
        good = j["upper_bound"] or (
            j["ratio"] is not None and RATIO_LOW <= j["ratio"] <= RATIO_HIGH
        )
        ok = ok and good
        lines.append(
            f"target {name}: {RATIO_LOW:.2f} <= budget/measured <= {RATIO_HIGH:.2f} after one calibration "
            f"run: {j['ratio']} {'PASS' if good else 'FAIL'}"
        )
    safe = all(not j["over_budget_cells"] for j in second.values())
    lines.append(
        f"target: no stage measured above its calibrated budget in any cell: {'PASS' if safe else 'FAIL'}"
    )
    return "\n".join(lines), ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(REPO / "configs/voice-assistant.yaml"))
    ap.add_argument("--profile", help="hardware profile file (default: probe this machine)")
    ap.add_argument(
        "--store", metavar="DIR", help="measurement store (default: a new temporary directory)"
    )
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    ap.add_argument("--one-session", metavar="OUT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    store = args.store or tempfile.mkdtemp(prefix="omni-edge-calibration-")
    if args.one_session:
        Path(args.one_session).write_text(
            json.dumps(session(args.config, args.profile, store), default=str)
        )
        return 0
    runs = []
    for i in (1, 2):
        out = Path(tempfile.mkdtemp(prefix="omni-edge-bench-")) / f"session{i}.json"
        cmd = [
            sys.executable,
            __file__,
            "--config",
            args.config,
            "--store",
            store,
            "--one-session",
            str(out),
        ]
        if args.profile:
            cmd += ["--profile", args.profile]
        print(
            f"session {i}: {'calibration run' if i == 1 else 'calibrated run'} …",
            file=sys.stderr,
            flush=True,
        )
        subprocess.run(cmd, check=True)
        runs.append(json.loads(out.read_text()))
    text, ok = report(runs)
    print(f"store: {store}\n")
    print(text)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"store": store, "runs": runs, "ok": ok}, indent=1, default=str)
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
