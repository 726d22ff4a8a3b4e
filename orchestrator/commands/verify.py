"""``omni-edge verify CONFIG``: run the coverage and numeric gates a plan needs.

For every exported placement the planner would consider it opens a session on
the target EP in the placement's route, counts the nodes the EP took, runs the
artifact's reference inputs against the CPU fp32 reference, prints a table (or
``--json``) and writes the evidence that ``omni-edge plan`` then reads.
Evidence that already matches its key is reused unless ``--force``.

With ``--address`` the placements on each node of a Ray cluster are verified
on that node (a Ray task pinned to it: ``orchestrator.runtime.cluster_verify``),
with its own routes; the evidence is keyed by that node's machine and kept here,
where ``plan`` reads it.

Exit codes: 0 every placement passed, 3 at least one was refused, 2 bad input
(including an artifact that does not even load on the CPU EP).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from orchestrator.commands.common import verify_with_progress
from orchestrator.core.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console, Group
    from rich.text import Text

    from orchestrator.core.documents import JsonObject
    from orchestrator.verify.gates import Coverage
    from orchestrator.verify.placement import PlacementResult
    from orchestrator.verify.run import VerifyReport


def add_arguments(p: argparse.ArgumentParser) -> None:
    from orchestrator.commands.plan import add_pipeline_inputs

    add_pipeline_inputs(
        p,
        profile_help="verify against a recorded hardware profile's routes instead of probing this machine",
    )
    p.add_argument(
        "--json", action="store_true", help="print the results as JSON (format omni-edge.verify/1)"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="measure again even where evidence for the same key exists",
    )
    p.add_argument(
        "--address",
        metavar="HOST:PORT",
        help="verify on the nodes of the Ray cluster at this address, each placement on its "
        "own node (without --profile the cluster is probed live; docs/cluster.md)",
    )


def run(args: argparse.Namespace) -> int:
    from orchestrator.commands.exits import EXIT_BAD_INPUT, EXIT_OK, EXIT_REFUSED
    from orchestrator.config import load_config
    from orchestrator.core.console import make_console
    from orchestrator.ort.routes import require_startable_routes
    from orchestrator.planner import parse_mask
    from orchestrator.probe import resolve_profile

    config = load_config(args.config)
    err = make_console(stderr=True)
    if args.address:
        profile, report = _verify_on_cluster(args, config, err)
        mask = parse_mask(args.mask, profile)
    else:
        profile = resolve_profile(args.profile)
        require_startable_routes(profile, args.profile)  # the gates start its interpreters
        mask = parse_mask(args.mask, profile)
        report = verify_with_progress(config, profile, mask, args.force, err)
    plan_summary = _replan(config, profile, mask, report)
    if args.json:
        doc = report.to_json()
        doc["plan"] = plan_summary
        json.dump(doc, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        _print_report(report, plan_summary, make_console())
    if report.errors:
        return EXIT_BAD_INPUT
    return EXIT_REFUSED if report.refused else EXIT_OK


def _verify_on_cluster(
    args: argparse.Namespace, config: Any, console: Console
) -> tuple[Any, VerifyReport]:
    """``--address``: join the cluster, take its profile (``--profile``, or probed live),
    verify each node's placements on that node, leave."""
    from orchestrator.planner import parse_mask
    from orchestrator.probe import resolve_profile
    from orchestrator.runtime import cluster
    from orchestrator.runtime.cluster_probe import gather_profile, nodes_found
    from orchestrator.runtime.cluster_verify import verify_on_cluster

    given = resolve_profile(args.profile) if args.profile else None
    if given is not None and not given.nodes:  # before joining anything
        raise ConfigError.single(
            f"--profile {args.profile}",
            f"the profile {given.name!r} is one machine's, not a cluster's",
            "leave out --profile (the cluster is probed live), or pass a cluster profile "
            "(omni-edge probe --address ADDRESS --save cluster.json)",
        )
    try:
        cluster.connect([], address=args.address)
    except ConfigError:  # nothing listens there (cluster.check_address): said as it is
        raise
    except Exception as exc:
        raise ConfigError.single(
            "--address",
            f"could not join the Ray cluster at {args.address}: {exc}",
            "check the address (ray status on the head) and the auth settings (docs/cluster.md)",
        ) from None
    try:
        profile = given or gather_profile(f"Ray cluster at {args.address}")
        mask = parse_mask(args.mask, profile)
        console.print(
            f"verifying on the cluster at {args.address}: {nodes_found(profile)}", markup=False
        )

        def on_node(name: str, placements: int) -> None:
            console.print(
                f"  {name}: {placements} placement(s), verified on that node", markup=False
            )

        report = verify_on_cluster(config, profile, mask, force=args.force, on_node=on_node)
    finally:
        cluster.release()
    return profile, report


def _replan(config: Any, profile: Any, mask: frozenset[str], report: VerifyReport) -> JsonObject:
    """What ``omni-edge plan`` now decides for each stage, with the fresh evidence
    and what this verification refused."""
    from orchestrator.planner import plan_pipeline, verification_refusals

    plan = plan_pipeline(config, profile, mask=mask, refused=verification_refusals(report.results))
    return {
        "admitted": plan.admitted,
        "stages": {
            s.name: {
                "device": s.device,
                "backend": s.backend,
                "verification": s.verification.status if s.verification else None,
                # each replica's, only for a stage with several (issue 24)
                **(
                    {
                        "replicas": [
                            {
                                "device": r.device,
                                "backend": r.backend,
                                "verification": r.verification.status if r.verification else None,
                            }
                            for r in s.replicas
                        ]
                    }
                    if s.replicas
                    else {}
                ),
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


def _placement(r: PlacementResult) -> str:
    return f"{r.stage} · {r.device} · {r.backend} [{r.precision or '-'}]"


def report_view(report: VerifyReport, plan_summary: JsonObject) -> Group:
    """What ``omni-edge verify`` prints: two tables keyed by ``#``, then the details.

    One table with every figure is ~110 columns; split in two (the gates, then
    the numerics) each fits 80, and refusals, warnings and errors follow as
    blocks that name the row's ``#`` and placement, then the notes (what was
    not considered, the gate time, the evidence, the plan now).
    """
    from rich.console import Group
    from rich.text import Text

    from orchestrator.commands.render import labelled, spaced

    sections: list[Any] = [
        labelled("verification", f"of {report.pipeline!r} on {report.profile}", style="bold")
    ]
    if report.results:
        sections += _tables(report)
    else:
        sections.append(Text("no exported placement to verify"))
    details = _details(report)
    if details:
        sections.append(Group(*details))
    sections.append(Group(*_notes(report, plan_summary)))
    return spaced(sections)


def _tables(report: VerifyReport) -> list[Any]:
    """The gates table and the numerics table, one row per placement, keyed by ``#``."""
    from orchestrator.commands.render import Col, Sheet

    gates = Sheet(
        "gates",
        (
            Col("#", "right"),
            Col("stage"),
            Col("device"),
            Col("backend"),
            Col("prec"),
            Col("EP nodes", "right"),
            Col("parts", "right"),
            Col("verdict"),
        ),
    )
    numerics = Sheet(
        "numerics (worst output against the CPU fp32 reference)",
        (
            Col("#", "right"),
            Col("rel L2", "right"),
            Col("max abs", "right"),
            Col("cosine", "right"),
            Col("left to CPU", wrap=True),
        ),
    )
    for n, r in enumerate(report.results, 1):
        rec = r.record or {}
        cov = rec.get("coverage") or {}
        outs = ((rec.get("numeric") or {}).get("outputs") or {}).values()
        rel = max((m.get("rel_l2", 0.0) for m in outs), default=None)
        mab = max((m.get("max_abs", 0.0) for m in outs), default=None)
        cos = min((m.get("cosine", 1.0) for m in outs), default=None)
        left = ", ".join(
            f"{op}×{k}" for op, k in list((cov.get("fallback_op_types") or {}).items())[:4]
        )
        parts = cov.get("partitions")
        gates.add_row(
            str(n),
            r.stage,
            r.device,
            r.backend,
            r.precision or "-",
            _ep_nodes(cov),
            "-" if parts is None else str(parts),
            _verdict(r),
        )
        numerics.add_row(
            str(n),
            _fmt(rel, ".1e"),
            _fmt(mab, ".1e"),
            _fmt(cos, ".6f"),
            left or ("-" if not cov else "none"),
        )
    return [gates, numerics]


def _ep_nodes(cov: Coverage) -> str:
    """The ``EP nodes`` cell: taken/total and the fraction, ``no session``, or ``-``."""
    if cov.get("total"):
        return f"{cov['taken']}/{cov['total']} {cov['fraction']:.0%}"
    if cov.get("source") == "session_error":
        return "no session"
    return "-"


def _verdict(r: PlacementResult) -> Text:
    """The ``verdict`` cell: pass (cached, or SUSPICIOUS), refused or error."""
    from rich.text import Text

    if r.status == "passed":
        if (r.record or {}).get("suspicious"):
            return Text("pass, SUSPICIOUS", style="bold yellow")
        return Text("pass" + (" (cached)" if r.cached else ""), style="green")
    if r.status == "refused":
        return Text("refused", style="bold red")
    return Text("error", style="bold red")


def _details(report: VerifyReport) -> list[Any]:
    """Each row's refusals, warnings and error, naming its ``#`` and placement."""
    from orchestrator.commands.render import labelled, problem

    details: list[Any] = []
    for n, r in enumerate(report.results, 1):
        where = f"#{n} {_placement(r)}"
        for refusal in r.refusals:
            details.append(problem(refusal.code, where, refusal.message, refusal.remedy))
        for warning in r.warnings:
            details.append(labelled("warning:", f"{where}: {warning}", style="bold yellow"))
        if r.error:
            details.append(labelled("error:", f"{where}: {r.error}", style="bold red"))
    return details


def _notes(report: VerifyReport, plan_summary: JsonObject) -> list[Any]:
    """The dim lines at the end: not considered, gate time, evidence, the plan now."""
    from orchestrator.commands.render import labelled

    notes: list[Any] = [
        labelled("not considered:", f"{s['stage']} · {s['device']}: {s['why']}", style="dim")
        for s in report.skipped
    ]
    timed = [r for r in report.results if r.verify_s is not None and not r.cached]
    if timed:
        notes.append(
            labelled(
                "gate time:",
                "; ".join(f"{r.stage} · {r.device} · {r.backend} {r.verify_s:.1f} s" for r in timed)
                + " (excluding interpreter start)",
                style="dim",
            )
        )
    for node, ray_node in report.nodes.items():
        notes.append(labelled("on node:", f"{node} (Ray node {ray_node[:12]}…)", style="dim"))
    notes.append(labelled("evidence:", report.evidence_dir, style="dim"))
    for name, s in plan_summary["stages"].items():
        if s.get("replicas"):
            now = f"{name} ×{len(s['replicas'])} → " + ", ".join(
                f"{r['device']} ({r['backend']}) {r['verification'] or 'no gates needed'}"
                for r in s["replicas"]
            )
        elif s["device"]:
            now = (
                f"{name} → {s['device']} ({s['backend']}), {s['verification'] or 'no gates needed'}"
            )
        else:
            now = f"{name} refused (see omni-edge plan)"
        notes.append(labelled("plan now:", now, style="dim"))
    return notes


def _print_report(report: VerifyReport, plan_summary: JsonObject, console: Console) -> None:
    console.print(report_view(report, plan_summary))
