"""``omni-edge verify CONFIG``: run the coverage and numeric gates a plan needs.

For every exported placement the planner would consider it opens a session on
the target EP in the placement's route, counts the nodes the EP took, runs the
artifact's reference inputs against the CPU fp32 reference, prints a table (or
``--json``) and writes the evidence that ``omni-edge plan`` then reads.
Evidence that already matches its key is reused unless ``--force``.

Exit codes: 0 every placement passed, 3 at least one was refused, 2 bad input
(including an artifact that does not even load on the CPU EP).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from orchestrator.verify.pipeline import VerifyReport
    from orchestrator.verify.placement import PlacementResult


def add_arguments(p: argparse.ArgumentParser) -> None:
    from orchestrator.commands.plan import add_pipeline_inputs

    add_pipeline_inputs(p, profile_help="verify against a recorded hardware profile's routes instead of probing this machine")
    p.add_argument("--json", action="store_true", help="print the results as JSON (format omni-edge.verify/1)")
    p.add_argument("--force", action="store_true", help="measure again even where evidence for the same key exists")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from orchestrator.cli import EXIT_BAD_INPUT, EXIT_OK, EXIT_REFUSED
    from orchestrator.commands.plan import load_profile_arg
    from orchestrator.config import load_config
    from orchestrator.planner import parse_mask

    config = load_config(args.config)
    profile = load_profile_arg(args.profile)
    mask = parse_mask(args.mask)
    err = Console(stderr=True)
    report = _run_with_progress(config, profile, mask, args.force, err)
    plan_summary = _replan(config, profile, mask)
    if args.json:
        doc = report.to_json()
        doc["plan"] = plan_summary
        json.dump(doc, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        _print_report(report, plan_summary, Console() if sys.stdout.isatty() else Console(width=120))
    if report.errors:
        return EXIT_BAD_INPUT
    return EXIT_REFUSED if report.refused else EXIT_OK


def _run_with_progress(config: Any, profile: Any, mask: frozenset[str], force: bool, console: Console) -> VerifyReport:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    from orchestrator.verify.pipeline import candidates, require_this_machine, verify_pipeline

    require_this_machine(profile)
    total = len(candidates(config, profile, mask)[0])
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True, disable=not console.is_terminal,
    ) as progress:
        task = progress.add_task("verifying", total=total)

        def on_step(c: Any, what: str) -> None:
            progress.update(task, description=f"{c.stage.name} · {c.device.id} · {c.backend}: {what}")

        def on_done(result: PlacementResult) -> None:
            progress.advance(task)

        return verify_pipeline(config, profile, mask=mask, force=force, on_step=on_step, on_done=on_done)


def _replan(config: Any, profile: Any, mask: frozenset[str]) -> dict[str, Any]:
    """What ``omni-edge plan`` now decides for each stage, with the fresh evidence."""
    from orchestrator.planner import plan_pipeline

    plan = plan_pipeline(config, profile, mask=mask)
    return {
        "admitted": plan.admitted,
        "stages": {
            s.name: {
                "device": s.device, "backend": s.backend,
                "verification": s.verification.status if s.verification else None,
            }
            for s in plan.stages
        },
    }


def _fmt(x: Any, spec: str) -> str:
    if x is None:
        return "-"
    try:
        return format(float(x), spec)
    except (TypeError, ValueError):
        return str(x)


def _print_report(report: VerifyReport, plan_summary: dict[str, Any], console: Console) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"verification of {report.pipeline!r} on {report.profile}", title_justify="left")
    numeric_cols = ("EP nodes", "parts", "rel L2", "max abs", "cosine")
    for col in ("placement", "EP nodes", "parts", "left to CPU", "rel L2", "max abs", "cosine", "verdict"):
        table.add_column(col, justify="right" if col in numeric_cols else "left", overflow="fold", no_wrap=col in numeric_cols)
    for r in report.results:
        rec = r.record or {}
        cov = rec.get("coverage") or {}
        outs = ((rec.get("numeric") or {}).get("outputs") or {}).values()
        rel = max((m.get("rel_l2", 0.0) for m in outs), default=None)
        mab = max((m.get("max_abs", 0.0) for m in outs), default=None)
        cos = min((m.get("cosine", 1.0) for m in outs), default=None)
        nodes = "-"
        if cov.get("total"):
            nodes = f"{cov['taken']}/{cov['total']} {cov['fraction']:.0%}"
        elif cov.get("source") == "session_error":
            nodes = "no session"
        left = ", ".join(f"{op}×{n}" for op, n in list((cov.get("fallback_op_types") or {}).items())[:4])
        if r.status == "passed":
            verdict = Text("pass" + (" (cached)" if r.cached else ""), style="green")
            if rec.get("suspicious"):
                verdict = Text("pass, SUSPICIOUS", style="yellow")
        elif r.status == "refused":
            verdict = Text(" + ".join(dict.fromkeys(x.code for x in r.refusals)), style="red")
        else:
            verdict = Text("error", style="bold red")
        parts = cov.get("partitions")
        table.add_row(
            Text(f"{r.stage} · {r.device} · {r.backend} [{r.precision or '-'}]"), nodes,
            "-" if parts is None else str(parts), Text(left or ("-" if not cov else "none")),
            _fmt(rel, ".1e"), _fmt(mab, ".1e"), _fmt(cos, ".6f"), verdict,
        )
    console.print(table)
    for r in report.results:
        where = f"{r.stage} · {r.device} · {r.backend}"
        for refusal in r.refusals:
            console.print(Text.assemble((f"[{refusal.code}] ", "bold red"), f"{where}: {refusal.message}"))
            console.print(Text.assemble(("    remedy: ", "bold"), refusal.remedy))
        for warning in r.warnings:
            console.print(Text.assemble(("warning: ", "bold yellow"), f"{where}: {warning}"))
        if r.error:
            console.print(Text.assemble(("error: ", "bold red"), f"{where}: {r.error}"))
    for s in report.skipped:
        console.print(Text(f"not considered: {s['stage']} · {s['device']}: {s['why']}", style="dim"))
    timed = [r for r in report.results if r.verify_s is not None and not r.cached]
    if timed:
        console.print(Text(
            "gate time (excluding interpreter start): "
            + ", ".join(f"{r.stage}·{r.device}·{r.backend} {r.verify_s:.1f} s" for r in timed),
            style="dim",
        ))
    console.print(Text(f"evidence: {report.evidence_dir}", style="dim"))
    for name, s in plan_summary["stages"].items():
        if s["device"]:
            console.print(Text(f"plan now: {name} → {s['device']} ({s['backend']}), {s['verification'] or 'no gates needed'}", style="dim"))
        else:
            console.print(Text(f"plan now: {name} refused (see omni-edge plan)", style="dim"))
