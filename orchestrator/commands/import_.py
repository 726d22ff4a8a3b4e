"""``omni-edge import vllm-omni FILE [--model DIR] -o CONFIG``: another project's
pipeline config turned into an omni-edge config (orchestrator/importers/)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from orchestrator.core.errors import ConfigError
from orchestrator.core.fileio import check_writable, write_text_atomic


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "source",
        choices=["vllm-omni"],
        help="the format of FILE (vllm-omni: a stage_args: file or a deploy YAML)",
    )
    p.add_argument("file", metavar="FILE", help="the vLLM-Omni stage config or deploy YAML")
    p.add_argument(
        "--model",
        metavar="DIR",
        help="the checkpoint directory (its config.json's architectures selects the topology when "
        "the file's pipeline: key or name does not)",
    )
    p.add_argument(
        "-o",
        "--out",
        metavar="CONFIG",
        required=True,
        help="where to write the omni-edge config (YAML)",
    )
    p.add_argument("--name", help="the pipeline's name (default: from FILE's name)")
    p.add_argument(
        "--only",
        metavar="STAGES",
        help="keep only these stages (comma-separated names, e.g. thinker,talker)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the import report as JSON (format omni-edge.import/1)",
    )


def render_yaml(config: dict, report: dict) -> str:
    import yaml

    head = [
        f"# Imported by `omni-edge import vllm-omni` from {report['source']}",
        f"# topology: {report['topology']['name']} (selected by {report['topology']['selected_by']})",
        f"# {len(report['mapped'])} keys mapped, {len(report['no_equivalent'])} with no equivalent here "
        "(`--json` lists each with why).",
    ]
    return (
        "\n".join(head)
        + "\n"
        + yaml.safe_dump(config, sort_keys=False, allow_unicode=True, width=120)
    )


def run(args: argparse.Namespace) -> int:
    from orchestrator.commands.exits import EXIT_OK
    from orchestrator.importers.vllm_omni import check_imported, import_vllm_omni

    out = Path(args.out)
    check_writable(out, what="-o")
    if out.exists() and Path(args.file).exists() and out.resolve() == Path(args.file).resolve():
        raise ConfigError.single(
            f"-o {out}",
            "this is FILE: writing the config there would replace it",
            "write it to another file",
        )
    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    imported = import_vllm_omni(args.file, model=args.model, output=out, only=only, name=args.name)
    report = imported.report.to_json()
    report["output"] = str(out)
    problems = check_imported(imported, out)
    report["loads"] = not problems
    report["problems"] = problems
    write_text_atomic(out, render_yaml(imported.config, report))
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    print(
        f"wrote {out}: {len(imported.config['stages'])} stages, topology {report['topology']['name']} "
        f"(selected by {report['topology']['selected_by']})"
    )
    for s in report["stages"]:
        print(
            f"  {s['name']:<9} {s['kind']:<15} stage_id {s['stage_id']}, inputs {', '.join(s['inputs'])}: {s['carries']}"
        )
    print(
        f"mapped {len(report['mapped'])} keys; {len(report['no_equivalent'])} have no equivalent here:"
    )
    for f in report["no_equivalent"]:
        print(f"  {f['key']}: {f['why']}")
    for n in report["notes"]:
        print(f"note: {n}")
    if problems:
        print(
            f"the written config does not load yet ({len(problems)} problem{'s' * (len(problems) > 1)}):"
        )
        for p in problems:
            print(f"  {p}")
    return EXIT_OK
