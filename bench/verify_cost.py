"""What verification costs: gate time per artifact, and re-planning with warm evidence.

    python bench/verify_cost.py [--repeat 30] [--profile FILE]

Prints, measured side by side in one run:

* per artifact and backend, the gate time in the route (open the target
  session with assignment recording, run the reference inputs, run the CPU fp32
  reference, compare), excluding the route interpreter's start, which is shown
  on its own line;
* the in-process planning time of the default pipeline (median of --repeat,
  the two variants interleaved) with a warm evidence cache, against the same
  plan with the evidence lookup switched off (every exported placement left
  unverified). Target: warm within 10 % of unverified.

The evidence cache is a temporary directory (OMNI_EDGE_CACHE_DIR), so the
run neither reads nor disturbs your own.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _tiny_artifact(root: Path) -> Path:
    from tests.helpers.graphs import write_artifact

    return write_artifact(root / "tiny-matmul", "full", name="tiny-matmul")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--repeat", type=int, default=30, help="planning runs per variant (median reported)"
    )
    ap.add_argument("--profile", help="a profile JSON; default: probe this machine (cached routes)")
    args = ap.parse_args()
    os.environ["OMNI_EDGE_CACHE_DIR"] = tempfile.mkdtemp(prefix="omni-edge-bench-")

    from orchestrator.config import load_config, parse_config
    from orchestrator.ort.routes import resolve
    from orchestrator.ort.sessions import open_sessions
    from orchestrator.planner import plan_pipeline
    from orchestrator.probe import resolve_profile
    from orchestrator.verify.placement import placement_for, verify_placement
    from orchestrator.verify.run import candidates
    from stages.exported_graph.kind import ExportedGraphKind

    profile = resolve_profile(args.profile)
    default = load_config(REPO / "configs" / "voice-assistant.yaml")
    tiny = _tiny_artifact(Path(os.environ["OMNI_EDGE_CACHE_DIR"]))
    tiny_config = parse_config(
        {
            "name": "tiny",
            "stages": [
                {
                    "name": "net",
                    "kind": "exported_graph",
                    "artifact": str(tiny),
                    "devices": ["cpu"],
                    "final_output": True,
                }
            ],
        },
        where="bench",
        base_dir=REPO,
    )

    print(f"machine: {profile.name}; evidence cache: {os.environ['OMNI_EDGE_CACHE_DIR']}")
    print("\n== gate time per artifact (in the route, interpreter start excluded) ==")
    hosts: dict[str, object] = {}
    for config in (default, tiny_config):
        found, _ = candidates(config, profile)
        for c in found:
            gate = c.kind.gate_spec(c.stage, c.info, c.device, c.backend)
            if gate is None:
                continue
            placement = placement_for(gate, c.route)
            if c.route.name not in hosts:
                t0 = time.perf_counter()
                host = open_sessions(resolve(c.route))
                host.probe()
                hosts[c.route.name] = host
                print(
                    f"  route {c.route.name}: interpreter start + probe {time.perf_counter() - t0:.2f} s"
                )
            result = verify_placement(placement, hosts[c.route.name], force=True)  # type: ignore[arg-type]
            cov = (result.record or {}).get("coverage") or {}
            timings = (result.record or {}).get("timings") or {}
            print(
                f"  {placement.gate.artifact_name:<24} {c.device.id:<6} {c.backend:<13} {result.status:<8} "
                f"gates {result.verify_s or 0:7.3f} s  (open {timings.get('open_target_s', 0):.3f}, "
                f"run {timings.get('run_target_s', 0):.3f}, reference {timings.get('reference_s', 0):.3f})  "
                f"nodes {cov.get('taken')}/{cov.get('total')}"
            )
    for host in hosts.values():
        host.shutdown()  # type: ignore[attr-defined]

    print(
        f"\n== planning {default.name!r}: warm evidence vs no verification (median of {args.repeat}) =="
    )
    real = ExportedGraphKind.gate_spec
    off = lambda self, *a, **k: None  # noqa: E731 - the base class's "no gates" answer

    def timed(verify: bool) -> float:
        ExportedGraphKind.gate_spec = real if verify else off  # type: ignore[method-assign]
        t0 = time.perf_counter()
        plan_pipeline(default, profile)
        return time.perf_counter() - t0

    timed(True), timed(False)  # warm both paths (imports, graph-stat memo, lru caches)
    warm, unverified = [], []
    for _ in range(args.repeat):
        warm.append(timed(True))
        unverified.append(timed(False))
    ExportedGraphKind.gate_spec = real  # type: ignore[method-assign]
    plan = plan_pipeline(default, profile)
    voice = plan.stage("voice")
    mw, mu = statistics.median(warm), statistics.median(unverified)
    print(
        f"  warm evidence   {mw * 1e3:7.2f} ms   (voice → {voice.device}/{voice.backend}, {voice.verification.status if voice.verification else '-'})"
    )
    print(f"  no verification {mu * 1e3:7.2f} ms")
    ratio = mw / mu
    print(
        f"  ratio warm / unverified = {ratio:.3f}  (target ≤ 1.10: {'met' if ratio <= 1.10 else 'MISSED'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
