"""``omni-edge plan CONFIG``: decide placements without loading anything.

CONFIG is a file, a shipped pipeline's name or a model's Hub id (``orchestrator.pipelines``);
a model named by Hub id that is not downloaded is planned from the Hub's metadata, nothing
downloaded (the plan's model lines and ``artifact.hub`` say what ``omni-edge pull`` would fetch)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from orchestrator.core.errors import ConfigError
from orchestrator.core.fileio import check_writable, write_json_atomic

if TYPE_CHECKING:
    from orchestrator.calibration import CalibrationStore


def add_pipeline_inputs(p: argparse.ArgumentParser, *, profile_help: str) -> None:
    """CONFIG, --profile and --mask: what every command that plans takes."""
    p.add_argument(
        "config",
        help="a pipeline config (YAML or JSON), a shipped pipeline's name (omni-edge pipelines "
        "lists them; a file of that name wins) or a model's Hugging Face id (one decode stage)",
    )
    p.add_argument("--profile", metavar="FILE", help=profile_help)
    p.add_argument(
        "--mask",
        action="append",
        default=[],
        metavar="DEVICES",
        help="exclude devices or kinds, e.g. --mask npu,gpu:0 (repeatable)",
    )


def add_calibration_flag(p: argparse.ArgumentParser) -> None:
    """--no-calibration: what ``plan``, ``run`` and ``serve`` take."""
    p.add_argument(
        "--no-calibration",
        action="store_true",
        help="plan from metadata alone, ignoring the peaks measured on this machine "
        "(the measurement store, docs/calibration.md); run/serve then record none",
    )


def calibration_store(args: argparse.Namespace) -> CalibrationStore | None:
    """The measurement store the command reads (and run/serve write), or None."""
    from orchestrator.calibration import CalibrationStore

    return None if getattr(args, "no_calibration", False) else CalibrationStore()


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_pipeline_inputs(
        p, profile_help="plan for a recorded hardware profile instead of this machine"
    )
    add_calibration_flag(p)
    p.add_argument(
        "--json", action="store_true", help="print the plan as JSON (format omni-edge.plan/1)"
    )
    p.add_argument("--out", metavar="FILE", help="also write the plan JSON to FILE")
    p.add_argument(
        "--address",
        metavar="HOST:PORT",
        help="without --profile: plan on the Ray cluster at this address, probed live on each "
        "node (docs/cluster.md)",
    )


def run(args: argparse.Namespace) -> int:
    from orchestrator.commands.exits import EXIT_OK, EXIT_REFUSED
    from orchestrator.config import load_config
    from orchestrator.planner import parse_mask, plan_pipeline
    from orchestrator.probe import resolve_profile

    if args.out:
        check_writable(args.out, what="--out")
        for given, what in ((args.config, "CONFIG"), (args.profile, "--profile")):
            if (
                given
                and os.path.exists(given)
                and os.path.exists(args.out)
                and os.path.samefile(given, args.out)
            ):
                raise ConfigError.single(
                    f"--out {args.out}",
                    f"this is the {what} file: writing the plan there would replace it",
                    "write the plan to another file",
                )
    config = load_config(args.config)
    if args.address and not args.profile:
        from orchestrator.runtime.cluster_probe import gather_at

        profile = gather_at(args.address)
    else:
        profile = resolve_profile(args.profile)
    store = calibration_store(args)
    plan = plan_pipeline(config, profile, mask=parse_mask(args.mask, profile), calibration=store)
    doc = plan.to_json()
    if args.out:
        write_json_atomic(args.out, doc)
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        from orchestrator.commands.render import print_plan

        print_plan(plan)
    return EXIT_OK if plan.admitted else EXIT_REFUSED
