"""Human-readable plan output (rich). The JSON form is ``PipelinePlan.to_json``."""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from orchestrator.plan import PipelinePlan, StagePlan
from orchestrator.units import fmt_bytes


def _verification(stage: StagePlan) -> str:
    v = stage.verification
    if v is None:
        return "-"
    if v.status == "verified":
        return f"verified ({v.evidence or 'M'})"
    return v.status


def plan_table(plan: PipelinePlan) -> Group:
    head = Text()
    verdict = "ADMITTED" if plan.admitted else "REFUSED"
    head.append(f"{verdict} ", style="bold green" if plan.admitted else "bold red")
    head.append(f"pipeline {plan.pipeline!r} on {plan.profile}")

    stages = Table(title="stages", title_justify="left", show_lines=False)
    for col in ("stage", "kind", "device", "backend", "budget", "KV / token", "verification"):
        stages.add_column(col, justify="right" if col in ("budget", "KV / token") else "left")
    for s in plan.stages:
        kv = fmt_bytes(s.kv_cache["bytes_per_token"]) if s.kv_cache else "-"
        stages.add_row(
            s.name, s.kind,
            s.device or Text("refused", style="red"), s.backend or "-",
            fmt_bytes(s.budget_bytes()) if s.admitted else "-", kv, _verification(s),
        )

    res = Table(title="reservations", title_justify="left")
    for col in ("stage", "pool", "purpose", "bytes", "lifetime", "ev", "note"):
        res.add_column(col, justify="right" if col == "bytes" else "left", overflow="fold")
    for s in plan.stages:
        for r in s.reservations:
            res.add_row(s.name, r.pool, r.purpose, fmt_bytes(r.bytes), r.lifetime + ("" if r.at_load or r.lifetime != "session" else " (after load)"), r.evidence, Text(r.note))
    for r in plan.shared_reservations:
        res.add_row("(pipeline)", r.pool, r.purpose, fmt_bytes(r.bytes), r.lifetime, r.evidence, Text(r.note))

    pools = Table(title="pools", title_justify="left")
    for col in ("pool", "peak", "capacity", "use", "contributors"):
        pools.add_column(col, justify="right" if col in ("peak", "capacity", "use") else "left", overflow="fold")
    for p in plan.pools:
        use = p.peak_bytes / p.capacity_bytes if p.capacity_bytes else 0.0
        contributors = ", ".join(f"{h} {fmt_bytes(b)}" for h, b in sorted(p.contributors.items(), key=lambda kv: -kv[1]))
        pools.add_row(p.id, fmt_bytes(p.peak_bytes), fmt_bytes(p.capacity_bytes), Text(f"{use:.0%}", style="red" if use > 1 else ""), Text(contributors))

    parts: list[object] = [head, stages, res, pools]
    skipped = [(s.name, r) for s in plan.stages if s.admitted for r in s.refusals]
    if skipped:
        ref = Table(title="devices not used", title_justify="left", show_lines=True)
        for col in ("stage", "device", "code", "why", "remedy"):
            ref.add_column(col, overflow="fold", no_wrap=col == "code")
        for name, refusal in skipped:
            ref.add_row(name, refusal.device, Text(refusal.code, style="yellow"), Text(refusal.message), Text(refusal.remedy))
        parts.append(ref)
    for s in plan.stages:
        if s.admitted:
            continue
        block = Text()
        block.append(f"stage {s.name!r} refused:\n", style="bold red")
        for refusal in s.refusals:
            block.append(f"  [{refusal.code}] ", style="bold red")
            block.append(f"{refusal.device}: {refusal.message}\n")
            block.append("    remedy: ", style="bold")
            block.append(f"{refusal.remedy}\n")
        parts.append(block)
    for s in plan.stages:
        if s.admitted and s.engine_kwargs:
            kw = ", ".join(f"{k}={v}" for k, v in s.engine_kwargs.items() if k != "model")
            parts.append(Text(f"{s.name} engine: {kw}", style="dim"))
    for note in plan.notes:
        parts.append(Text(f"note: {note}", style="dim"))
    return Group(*parts)  # type: ignore[arg-type]


def print_plan(plan: PipelinePlan, console: Console | None = None) -> None:
    (console or Console()).print(plan_table(plan))
