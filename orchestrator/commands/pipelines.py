"""``omni-edge pipelines``: the shipped pipelines, each with a line of description and what it needs.

Every pipeline installed with omni-edge (``orchestrator.pipelines.shipped``: the repository's
``configs/``, installed as ``omni_edge_configs``) by the name ``plan``, ``run``, ``serve`` and
``pull`` take, its description's first sentence, and per stage what it needs
(``StageKind.needs``): the model or artifact, its size, whether it is here — a model named by
Hub id is looked up in the HF cache, and when it is not there, in the Hub's listing (sizes only,
nothing downloaded; ``--offline`` or ``HF_HUB_OFFLINE`` ask nothing) — and the ``omni-edge pull``
that fetches it. A pipeline that cannot be read is listed with why. ``--json`` beside the list.
Exit 0; exit 2 when no shipped pipeline is installed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys

from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import ConfigError

PIPELINES_FORMAT = "omni-edge.pipelines/1"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--json", action="store_true", help=f"print the list as JSON (format {PIPELINES_FORMAT})"
    )
    p.add_argument(
        "--offline",
        action="store_true",
        help="do not ask the Hub about models that are not downloaded (their sizes stay unknown)",
    )


def describe_pipeline(name: str, path: str, online: bool) -> JsonObject:
    """One shipped pipeline as the list shows it (see the module docstring)."""
    from orchestrator.config import load_config
    from stages.registry import get_kind

    row: JsonObject = {"name": name, "path": path, "description": "", "stages": []}
    try:
        config = load_config(path)
    except ConfigError as exc:
        first = exc.problems[0]
        return {**row, "ready": False, "error": f"{first.where}: {first.what}"}
    row["description"] = config.description
    ready = True
    for stage in config.stages:
        needs = get_kind(stage.kind).needs(stage, online=online)
        ready = ready and all(n.present for n in needs)
        row["stages"].append(
            {"stage": stage.name, "kind": stage.kind, "needs": [n.to_dict() for n in needs]}
        )
    return {**row, "ready": ready, "error": None}


def run(args: argparse.Namespace) -> int:
    from orchestrator.commands.exits import EXIT_OK
    from orchestrator.core import hub
    from orchestrator.pipelines import shipped, shipped_dir

    found = shipped()
    if not found:
        raise ConfigError.single(
            "omni-edge pipelines",
            "no shipped pipelines are installed with this omni-edge",
            "reinstall omni-edge (pip install --force-reinstall omni-edge)",
        )
    online = not (args.offline or hub.offline())
    rows = [describe_pipeline(n, str(p), online) for n, p in found.items()]
    if args.json:
        doc = {"format": PIPELINES_FORMAT, "directory": str(shipped_dir()), "pipelines": rows}
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    width = max(60, min(shutil.get_terminal_size((80, 24)).columns, 120))
    for row in rows:
        for line in _lines(row, width):
            print(line)
    print(f"({len(rows)} pipelines in {shipped_dir()}; omni-edge plan NAME plans one here)")
    return EXIT_OK


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _size(n: int | None) -> str:
    from orchestrator.core.units import fmt_bytes

    return "?" if n is None else fmt_bytes(n)


def _lines(row: JsonObject, width: int) -> list[str]:
    """A pipeline in the list: its name and description, then a line per thing it needs."""
    from orchestrator.core.hub import parse_hub_ref

    first = row["description"].split(". ")[0].strip()
    out = [_cut(f"{row['name']:<24} {first or '(no description)'}", width)]
    if row["error"]:
        return [*out, _cut(f"    cannot be read: {row['error']}", width)]
    for stage in row["stages"]:
        for need in stage["needs"]:
            state = {True: "here", False: "missing", None: "?"}[need["present"]]
            head = f"    {stage['stage']:<10} {_size(need['bytes']):>10}  {state:<7}"
            out.append(_cut(f"{head} {_short(need['what'])}", width))
            if need["present"] is True:
                continue
            if need["note"]:
                out.append(_cut(f"{'':>8}{need['note']}", width))
            if need["present"] is False and parse_hub_ref(need["what"]) is not None:
                out.append(_cut(f"{'':>8}fetch it: omni-edge pull {row['name']}", width))
    return out


def _short(what: str) -> str:
    """A path inside this installation (the checkout or site-packages), relative to it."""
    from pathlib import Path

    from orchestrator.core.settings import INSTALL_ROOT

    try:
        return str(Path(what).relative_to(INSTALL_ROOT))
    except ValueError:
        return what
