"""``omni-edge pull MODEL_OR_PIPELINE``: download what a pipeline's stages read, after planning it.

1. The pipeline is read — a config file, a shipped pipeline's name, or a model's Hub id (a
   pipeline of one decode stage: ``orchestrator.pipelines``) — and planned for this machine
   (or ``--profile``) as ``omni-edge plan`` plans it: a model that is not downloaded is planned
   from the Hub's metadata, nothing downloaded yet.
2. A refused plan ends here with exit 3 and the plan's own refusals (codes, numbers, remedies):
   the model cannot run on this machine, so its weights are not fetched. ``--force`` fetches
   them anyway.
3. The files each stage reads (the plan lists them, pinned to the commit the reference resolved
   to) that the HF cache lacks are downloaded into it (``orchestrator.core.hub.download``:
   ``huggingface_hub``'s progress bars on stderr, an interrupted download resumed, each file's
   SHA-256 or git blob id checked against the Hub's listing, a mismatch removed and exit 2). The
   free space is checked first. Nothing else is fetched: no file the stages do not read.

The HF cache is the standard one (``HF_HUB_CACHE``, ``HF_HOME``), shared with every tool that
uses ``huggingface_hub``; ``run`` and ``serve`` then find the models there without the network.
Exit codes: 0 pulled (or nothing to pull), 2 bad input or a failed download, 3 plan refused.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import ConfigError

if TYPE_CHECKING:
    from orchestrator.core.hub import RepoFile, Snapshot
    from orchestrator.core.plan import PipelinePlan

PULL_FORMAT = "omni-edge.pull/1"
DISK_MARGIN = 1 << 30
"""Free space kept beside a download: a full disk fails half-way and breaks other programs."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "target",
        metavar="MODEL_OR_PIPELINE",
        help="a pipeline config, a shipped pipeline's name (omni-edge pipelines) or a model's "
        "Hugging Face id (ORG/NAME[@REVISION], ORG/NAME-GGUF:Q4_K_M)",
    )
    p.add_argument(
        "--profile",
        metavar="FILE",
        help="plan for a recorded hardware profile instead of this machine",
    )
    p.add_argument(
        "--mask",
        action="append",
        default=[],
        metavar="DEVICES",
        help="exclude devices or kinds when planning, e.g. --mask gpu:0 (repeatable)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="download even when the plan is refused (the model cannot run on this machine)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="say what would be downloaded; download nothing"
    )
    p.add_argument("--json", action="store_true", help=f"print the result as JSON ({PULL_FORMAT})")


@dataclass
class Pull:
    """One repository at one commit, and the files of it the pipeline's stages read."""

    snapshot: Snapshot
    stages: list[str]

    @property
    def missing(self) -> list[RepoFile]:
        return [f for f in self.snapshot.files if not (self.snapshot.directory / f.path).is_file()]


def pulls_of(plan: PipelinePlan) -> list[Pull]:
    """The repositories the plan's stages read (``artifact["hub"]``), one per commit, each
    with the union of the files its stages read."""
    from orchestrator.core.hub import HubRef, RepoFile, Snapshot

    found: dict[tuple[str, str], Pull] = {}
    for stage in plan.stages:
        record = stage.artifact.get("hub")
        if not isinstance(record, dict):
            continue
        key = (record["repo"], record["commit"])
        files = [
            RepoFile(f["path"], int(f["size"]), f.get("sha256"), f.get("blob_id"))
            for f in record["files"]
        ]
        pull = found.get(key)
        if pull is None:
            ref = HubRef(record["repo"], record["revision"], record.get("select"))
            found[key] = Pull(Snapshot(ref, record["commit"], tuple(files), False), [stage.name])
            continue
        known = {f.path for f in pull.snapshot.files}
        extra = tuple(f for f in files if f.path not in known)
        pull.snapshot = Snapshot(
            pull.snapshot.ref, pull.snapshot.commit, pull.snapshot.files + extra, False
        )
        pull.stages.append(stage.name)
    return list(found.values())


def run(args: argparse.Namespace) -> int:
    from orchestrator.commands.exits import EXIT_OK, EXIT_REFUSED
    from orchestrator.config import load_config
    from orchestrator.planner import parse_mask, plan_pipeline
    from orchestrator.probe import resolve_profile

    config = load_config(args.target)
    profile = resolve_profile(args.profile)
    plan = plan_pipeline(config, profile, mask=parse_mask(args.mask, profile), calibration=None)
    pulls = pulls_of(plan)
    if not plan.admitted and not args.force and pulls:
        _refused(args, plan)
        return EXIT_REFUSED
    _check_space(pulls)
    done: list[JsonObject] = []
    for pull in pulls:
        done.append(_pull_one(args, pull))
    _report(args, config.name, plan, done)
    return EXIT_OK


def _check_space(pulls: list[Pull]) -> None:
    """Exit 2 before any byte arrives when the HF cache's disk cannot hold the downloads."""
    from orchestrator.core.hub import free_bytes, hub_cache
    from orchestrator.core.units import fmt_bytes

    need = sum(f.size for p in pulls for f in p.missing)
    free = free_bytes()
    if need and free is not None and free < need + DISK_MARGIN:
        raise ConfigError.single(
            str(hub_cache()),
            f"the download needs {fmt_bytes(need)} (and {fmt_bytes(DISK_MARGIN)} to spare), and "
            f"{fmt_bytes(free)} is free there",
            "free space on that disk, or point HF_HUB_CACHE (or HF_HOME) at a larger one",
        )


def _pull_one(args: argparse.Namespace, pull: Pull) -> JsonObject:
    from orchestrator.core import hub
    from orchestrator.core.units import fmt_bytes

    snapshot, missing = pull.snapshot, pull.missing
    names = {f.path for f in missing}
    where = f"{snapshot.ref.text} (stages {', '.join(pull.stages)})"
    if not args.json:
        print(
            f"{snapshot.ref.repo} @ {snapshot.commit[:12]} ({snapshot.ref.branch}): "
            f"{len(missing)} of {len(snapshot.files)} file(s) to download, "
            f"{fmt_bytes(sum(f.size for f in missing))}",
            file=sys.stderr,
        )
    if missing and not args.dry_run:

        def announce(entry: RepoFile, i: int, n: int) -> None:
            if not args.json:
                print(f"  [{i + 1}/{n}] {entry.path} ({fmt_bytes(entry.size)})", file=sys.stderr)

        hub.download(snapshot, missing, where, announce)
    elif not missing and not args.dry_run:
        hub.write_ref(snapshot.ref, snapshot.commit)
    return {
        "repo": snapshot.ref.repo,
        "revision": snapshot.ref.branch,
        "commit": snapshot.commit,
        "stages": pull.stages,
        "directory": str(snapshot.directory),
        "files": [
            {
                **f.to_dict(),
                "status": ("would download" if args.dry_run else "downloaded, verified")
                if f.path in names
                else "already here",
            }
            for f in snapshot.files
        ],
        "missing_bytes": sum(f.size for f in missing),
        "downloaded_bytes": 0 if args.dry_run else sum(f.size for f in missing),
    }


def _refused(args: argparse.Namespace, plan: PipelinePlan) -> None:
    refusals = [
        {"stage": s.name, **r.to_dict()} for s in plan.stages if not s.admitted for r in s.refusals
    ]
    if args.json:
        doc = {"format": PULL_FORMAT, "pipeline": plan.pipeline, "admitted": False}
        json.dump({**doc, "refusals": refusals, "models": []}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    from orchestrator.commands.render import print_plan

    print_plan(plan)
    codes = ", ".join(sorted({str(r["code"]) for r in refusals}))
    print(
        f"pull refused: the plan of {plan.pipeline!r} is refused on {plan.profile} ({codes}), so "
        "nothing was downloaded; --force downloads it anyway",
        file=sys.stderr,
    )


def _report(
    args: argparse.Namespace, name: str, plan: PipelinePlan, done: list[JsonObject]
) -> None:
    from orchestrator.core.hub import hub_cache
    from orchestrator.core.units import fmt_bytes

    total = sum(d["missing_bytes" if args.dry_run else "downloaded_bytes"] for d in done)
    if args.json:
        doc = {
            "format": PULL_FORMAT,
            "pipeline": name,
            "admitted": plan.admitted,
            "forced": bool(args.force and not plan.admitted),
            "dry_run": bool(args.dry_run),
            "cache_dir": str(hub_cache()),
            "models": done,
            "missing_bytes": sum(d["missing_bytes"] for d in done),
            "downloaded_bytes": sum(d["downloaded_bytes"] for d in done),
        }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    if not done:
        print(f"nothing to pull: no stage of {name!r} names a model by Hub id")
        return
    verb = "would download" if args.dry_run else "downloaded and verified"
    print(f"{verb}: {fmt_bytes(total)} into {hub_cache()}")
    for d in done:
        print(f"  {d['repo']} @ {d['commit'][:12]}: {d['directory']}")
    if not args.dry_run:
        print(f"next: omni-edge run {args.target} --prompt '...'")
