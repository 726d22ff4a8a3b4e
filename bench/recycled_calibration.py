"""Does the voice's budget converge? Repeated long runs of the voice alone against one store.

    python bench/recycled_calibration.py [--runs 3] [--sentences 60]
        [--profile FILE] [--store DIR] [--json FILE]

The Piper voice on ``ort-openvino`` (this machine's OpenVINO route worker, which
grows ~12 MiB per new sentence and is recycled at the stage's budget,
docs/calibration.md), alone in a pipeline, run ``--runs`` times against one
measurement store (a new temporary directory unless ``--store``): each run
plans from the store, starts the pipeline (a fresh Ray), speaks the same
``--sentences`` distinct sentences (40-200 characters,
``bench/route_worker_memory.py``'s), one request each, and closes (which
records). Reported per run: the budget it was planned with (E: estimate, M:
measured), the peak the device actor measured, the worker's recycles, the
largest rise of one call, and whether the peak stayed within the budget.

The work on recycled route workers measured, from a fresh store, 2008 → 3345 → 3533 MiB over three such
runs (the first run's peak 1238 MB against a 1229 MB budget): the budget was
the last peak plus a margin, and the peak was wherever the limit let the
worker grow.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.route_worker_memory import sentences

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20


def one_run(config: Path, profile: str | None, store: Path, texts: list[str]) -> dict[str, Any]:
    from orchestrator.api import Pipeline
    from orchestrator.calibration import CalibrationStore

    pipeline = Pipeline.from_config(
        config, profile=profile, record=None, calibration=CalibrationStore(store)
    )
    voice = pipeline.plan.stage("voice")
    ray = next((r for r in pipeline.plan.shared_reservations if r.purpose == "ray_runtime"), None)
    t0 = time.perf_counter()
    try:
        for text in texts:
            pipeline.run(text, record=None)
        row = next(r for r in pipeline.build_record()["stages"] if r["stage"] == "voice")
        ray_measured = pipeline.runtime.ray_memory.get("bytes")
    finally:
        pipeline.close()
    worker = row.get("worker") or {}
    return {
        "budget_bytes": voice.budget_bytes(),
        "evidence": "M" if voice.calibration else "E",
        "need": (voice.calibration or {}).get("need"),
        "peak_bytes": row["measured_peak_bytes"],
        "within_budget": row["within_budget"],
        "recycles": worker.get("worker_recycles"),
        "call_rise_bytes": worker.get("call_rise_bytes"),
        "recycle_limit_bytes": worker.get("recycle_limit_bytes"),
        "resident_bytes": row.get("resident_bytes"),
        "speak_s": round(time.perf_counter() - t0, 1),
        "ray_planned_bytes": ray.bytes if ray else None,
        "ray_evidence": ray.evidence if ray else None,
        "ray_measured_bytes": ray_measured,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sentences", type=int, default=60)
    ap.add_argument(
        "--profile",
        help="a profile of this machine (default: probe it; the runs verify their gates)",
    )
    ap.add_argument("--store", help="the measurement store (default: a new temporary directory)")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    if args.runs < 1 or args.sentences < 1:
        print("error: --runs and --sentences must be at least 1", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="omni-edge-recycled-"))
    store = Path(args.store) if args.store else work / "calibration"
    config = work / "voice.yaml"
    config.write_text(
        json.dumps(
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
            }
        )
    )
    texts = sentences(args.sentences)
    runs = []
    print(f"the voice on ort-openvino, {len(texts)} distinct sentences a run, store {store}")
    print(
        f"{'run':>3} {'budget':>12} {'peak':>9} {'within':>7} {'recycles':>8} {'rise':>8} {'speak s':>8}"
    )
    for i in range(args.runs):
        r = one_run(config, args.profile, store, texts)
        runs.append(r)
        print(
            f"{i + 1:>3} {r['budget_bytes'] / MiB:>7.0f} MiB {r['evidence']} {r['peak_bytes'] / MiB:>5.0f} MiB "
            f"{'yes' if r['within_budget'] else 'NO':>7} {r['recycles'] if r['recycles'] is not None else '-':>8} "
            f"{(r['call_rise_bytes'] or 0) / MiB:>4.0f} MiB {r['speak_s']:>8.1f}",
            flush=True,
        )
    print(
        "Ray: "
        + ", ".join(
            f"{(r['ray_planned_bytes'] or 0) / MiB:.0f} MiB {r['ray_evidence']} planned / "
            f"{(r['ray_measured_bytes'] or 0) / MiB:.0f} measured"
            for r in runs
        )
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"sentences": len(texts), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
